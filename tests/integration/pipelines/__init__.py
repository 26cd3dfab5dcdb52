"""Integration tests of infscaler.pipelines."""
