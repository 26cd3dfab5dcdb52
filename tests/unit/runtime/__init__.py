"""Unit tests of infscaler.runtime."""
