"""Integration tests of infscaler.runtime.processes."""
