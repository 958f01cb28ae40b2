"""attnbench: a benchmarking and profiling harness for attention backends."""

__version__ = "0.1.0"
