"""The machine's state while a pair runs: one NVML reader, the GPU's clocks and throttling, energy, the device's ceilings."""
