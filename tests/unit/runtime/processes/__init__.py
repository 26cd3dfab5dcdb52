"""Unit tests of infscaler.runtime.processes."""
