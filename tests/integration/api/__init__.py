"""Integration tests of infscaler.api."""
