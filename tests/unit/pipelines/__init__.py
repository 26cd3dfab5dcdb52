"""Unit tests of infscaler.pipelines."""
