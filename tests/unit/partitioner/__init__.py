"""Unit tests of infscaler.partitioner."""
