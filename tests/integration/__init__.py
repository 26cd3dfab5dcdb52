"""Integration tests: services, instances, eBPF, CLI subprocesses, real models end to end."""
