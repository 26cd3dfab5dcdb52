"""Unit tests of infscaler.cli."""
