"""The check engines: `attnbench check` (correctness), `gpu-check` (gpu, gpu_plan) and `stability`, as library functions."""
