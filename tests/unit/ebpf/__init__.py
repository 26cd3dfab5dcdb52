"""Unit tests of infscaler.ebpf."""
