"""Integration tests of infscaler.partitioner."""
