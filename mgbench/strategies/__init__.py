"""Parallelism strategies: what each needs of the world, and how to apply it.

This module holds the facts the suite validator needs without importing torch
(names, world-size rules); :mod:`mgbench.strategies.apply` builds them.
"""

from __future__ import annotations

# name -> one-line description (shown by --help and in errors).
STRATEGIES: dict[str, str] = {
    "single": "one process, no wrapper: the reference every other strategy is checked against",
    "ddp": "DistributedDataParallel: full replica per rank, gradient all-reduce",
    "zero1": "ZeroRedundancyOptimizer + DDP: optimizer states sharded (ZeRO-1)",
    "fsdp": "FSDP2 fully_shard, reshard after forward: params, grads, optimizer sharded (ZeRO-3)",
    "fsdp_grad_op": "FSDP2 fully_shard without reshard after forward: grads and optimizer sharded (ZeRO-2-like)",
}


def layout_problem(strategy: str, nproc: int) -> str | None:
    """Why a strategy cannot run on ``nproc`` ranks, or None when it can."""
    if strategy == "single" and nproc != 1:
        return f"strategy single runs one process, not {nproc}; use ddp/fsdp for more ranks"
    return None
