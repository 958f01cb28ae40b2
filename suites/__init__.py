"""Built-in sweeps: each module defines SUITE (see harness.suite.catalog)."""
