"""Integration tests of infscaler.ebpf."""
