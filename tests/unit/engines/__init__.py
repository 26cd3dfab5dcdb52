"""Unit tests of infscaler.engines."""
