"""Integration tests of infscaler.modelless."""
