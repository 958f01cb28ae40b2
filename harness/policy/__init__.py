"""Measured runs → a backend policy a serving or training framework loads: per device model and shape bucket, the backends
ranked with their evidence (build), its check on runs it was not built from (validate), and the copyable reader (reader)."""
