"""Bundled device profiles (YAML), loaded by :func:`infscaler.base.device.load_profile`."""
