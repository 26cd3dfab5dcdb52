"""Unit tests of infscaler.service."""
