"""Integration tests of infscaler.runtime.scaling."""
