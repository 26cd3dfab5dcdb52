"""Integration tests of infscaler.runtime.serving."""
