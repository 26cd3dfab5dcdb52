"""Unit tests of infscaler.runtime.scaling."""
