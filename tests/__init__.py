"""InfScaler-Edge tests: unit/ (no processes; the fast loop) and integration/ (services,
instances, eBPF, CLI subprocesses, real models end to end). See README, "Quick start"."""

from pathlib import Path

#: tests/ (stage functions, helpers) and the repository root, wherever a test file sits
TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
