"""Unit tests: no process, no service, no eBPF load (enforced by conftest.py here)."""
