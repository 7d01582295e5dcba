"""Measurements beside the step time: machine fingerprint, memory, energy."""
