"""mgbench: benchmarking and capacity planning for multi-GPU training."""

__version__ = "0.1.0"
