"""Unit tests of infscaler.runtime.serving."""
