"""mgbench: benchmarking and capacity planning for multi-GPU training."""

from .step_events import step  # the one call a user's training script makes (torch-free, cheap)

__version__ = "0.1.0"
__all__ = ["step"]
