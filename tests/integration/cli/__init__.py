"""Integration tests of infscaler.cli."""
