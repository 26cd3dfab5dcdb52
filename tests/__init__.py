"""InfScaler-Edge tests: unit/ (no processes; the fast loop) and integration/ (services,
instances, eBPF, CLI subprocesses, real models end to end). See README, "Quick start"."""
