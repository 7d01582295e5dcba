"""Collective microbenchmarks (nccl-tests style), alpha-beta fits, interconnect facts."""
