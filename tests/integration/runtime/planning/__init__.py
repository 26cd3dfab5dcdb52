"""Integration tests of infscaler.runtime.planning."""
