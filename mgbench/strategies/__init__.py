"""Parallelism strategies: what each needs of the world, and how to apply it.

This module holds the facts the suite validator needs without importing torch
(names, default degrees, layout rules); :mod:`mgbench.strategies.apply` builds them.
"""

from __future__ import annotations

from typing import Any

from ..parallel_dims import ParallelDims

# name -> one-line description (shown by --help and in errors).
STRATEGIES: dict[str, str] = {
    "single": "one process, no wrapper: the reference every other strategy is checked against",
    "ddp": "DistributedDataParallel: full replica per rank, gradient all-reduce",
    "zero1": "ZeroRedundancyOptimizer + DDP: optimizer states sharded (ZeRO-1)",
    "fsdp": "FSDP2 fully_shard, reshard after forward: params, grads, optimizer sharded (ZeRO-3)",
    "fsdp_grad_op": "FSDP2 fully_shard without reshard after forward: grads and optimizer sharded (ZeRO-2-like)",
    "tp": "tensor parallel (DTensor): Megatron column/row splits of attention and MLP",
    "tp_sp": "tensor parallel + sequence parallel: norms and residual stream sharded over the sequence",
    "pp": "pipeline parallel (torch.distributed.pipelining): stages balanced by layer count",
    "fsdp+tp": "2D: FSDP over dp, tensor parallel over tp (layout {dp, tp}; default tp = 2)",
    "pp+tp+dp": "3D: pipeline stages, each tensor parallel, replicated over dp with DDP or FSDP (dp_mode)",
}
DATA_PARALLEL = ("ddp", "zero1", "fsdp", "fsdp_grad_op")
PIPELINED = ("pp", "pp+tp+dp")


def dims_for(strategy: str, nproc: int, layout: dict[str, int] | None) -> tuple[ParallelDims | None, str | None]:
    """The degrees a strategy runs with on ``nproc`` ranks: from the suite's ``layout``
    where given, otherwise the strategy's default. Returns (dims, problem)."""
    lay = dict(layout or {})
    if strategy == "single":
        if nproc != 1:
            return None, f"strategy single runs one process, not {nproc}; use ddp/fsdp for more ranks"
        return ParallelDims(), None
    allowed: dict[str, tuple[str, ...]] = {"tp": ("tp",), "tp_sp": ("tp",), "pp": ("pp",), "fsdp+tp": ("dp", "tp"),
                                           "pp+tp+dp": ("pp", "tp", "dp")}
    if strategy in DATA_PARALLEL:
        if lay and set(lay) - {"dp"}:
            return None, f"strategy {strategy} is data parallel only; layout {lay} names other degrees (use fsdp+tp or pp+tp+dp)"
        return ParallelDims(dp=nproc), None
    extra = set(lay) - set(allowed[strategy])
    if extra:
        return None, f"strategy {strategy} takes degrees {', '.join(allowed[strategy])}; layout also names {', '.join(sorted(extra))}"
    if strategy in ("tp", "tp_sp"):
        return ParallelDims(tp=lay.get("tp", nproc)), None
    if strategy == "pp":
        return ParallelDims(pp=lay.get("pp", nproc)), None
    tp = lay.get("tp", 2)
    pp = lay.get("pp", 2) if strategy == "pp+tp+dp" else 1
    dp = lay.get("dp", max(1, nproc // (tp * pp)))
    return ParallelDims(dp=dp, tp=tp, pp=pp), None
