"""Integration tests of infscaler.shm."""
