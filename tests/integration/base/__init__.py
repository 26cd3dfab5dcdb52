"""Integration tests of infscaler.base."""
