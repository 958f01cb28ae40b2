"""The machine's state while a pair runs: one NVML reader, the GPU's clocks and throttling, energy, the device's ceilings,
and the session that holds what they open for a runner's pairs."""
