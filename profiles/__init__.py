"""Bundled device profiles (YAML), loaded by :func:`infscaler.device.load_profile`."""
