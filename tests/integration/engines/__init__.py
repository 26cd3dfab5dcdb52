"""Integration tests of infscaler.engines."""
