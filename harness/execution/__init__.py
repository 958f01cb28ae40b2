"""Running one (case, backend) pair: inputs, prepare, timed calls, the check against float64, its Record."""
