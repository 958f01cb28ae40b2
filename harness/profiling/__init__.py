"""What a pair's calls spent their time on: the torch profiler's events, their categories, Nsight Compute."""
