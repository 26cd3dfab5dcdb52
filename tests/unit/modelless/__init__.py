"""Unit tests of infscaler.modelless."""
