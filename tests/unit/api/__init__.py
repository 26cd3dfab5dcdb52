"""Unit tests of infscaler.api."""
