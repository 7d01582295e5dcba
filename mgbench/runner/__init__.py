"""The benchmark runner: launch.py (parent side, torchrun jobs) and worker.py (each rank)."""
