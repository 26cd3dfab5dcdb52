"""Unit tests of infscaler.runtime.planning."""
