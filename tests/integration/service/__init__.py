"""Integration tests of infscaler.service."""
