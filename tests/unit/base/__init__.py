"""Unit tests of infscaler.base."""
