"""Integration tests of infscaler.runtime."""
