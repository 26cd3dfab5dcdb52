"""Unit tests of infscaler.shm."""
