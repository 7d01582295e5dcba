"""Parallelism strategies: one registry entry each, holding every fact about it.

An entry knows its name, its help text, which parallel degrees a suite's ``layout`` may
set and their defaults, its ZeRO stage (for the planner and calibration), whether it is
pipelined, and the function that builds it (named, so this module stays torch-free: the
suite validator and the launcher read the registry without importing torch; the rank
side resolves ``prepare`` in :mod:`mgbench.strategies.apply`). Adding a strategy is one
entry here and its build function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..parallel_dims import ParallelDims


@dataclass(frozen=True)
class Strategy:
    name: str
    help: str
    # Degrees a layout may name; ``None`` for a data-parallel strategy (dp = every rank).
    degrees: tuple[str, ...] | None
    # The degree that takes every rank when the layout does not set it ("" for none).
    fills: str = ""
    defaults: tuple[tuple[str, int], ...] = ()  # other degrees' defaults, e.g. (("tp", 2),)
    zero_stage: int | None = None  # ZeRO stage of its data parallelism (None: not ZeRO-style)
    pipelined: bool = False
    prepare: str = "data_parallel"  # build function in strategies/apply.py


REGISTRY: tuple[Strategy, ...] = (
    Strategy("single", "one process, no wrapper: the reference every other strategy is checked against",
             degrees=(), zero_stage=0),
    Strategy("ddp", "DistributedDataParallel: full replica per rank, gradient all-reduce", None, zero_stage=0),
    Strategy("zero1", "ZeroRedundancyOptimizer + DDP: optimizer states sharded (ZeRO-1)", None, zero_stage=1),
    Strategy("fsdp", "FSDP2 fully_shard, reshard after forward: params, grads, optimizer sharded (ZeRO-3)", None,
             zero_stage=3),
    Strategy("fsdp_grad_op", "FSDP2 fully_shard without reshard after forward: grads and optimizer sharded "
             "(ZeRO-2-like)", None, zero_stage=2),
    Strategy("tp", "tensor parallel (DTensor): Megatron column/row splits of attention and MLP", ("tp",), fills="tp",
             prepare="nd_parallel"),
    Strategy("tp_sp", "tensor parallel + sequence parallel: norms and residual stream sharded over the sequence",
             ("tp",), fills="tp", prepare="nd_parallel"),
    Strategy("pp", "pipeline parallel (torch.distributed.pipelining): stages balanced by layer count", ("pp",),
             fills="pp", pipelined=True, prepare="nd_parallel"),
    Strategy("fsdp+tp", "2D: FSDP over dp, tensor parallel over tp (layout {dp, tp}; default tp = 2)", ("dp", "tp"),
             fills="dp", defaults=(("tp", 2),), zero_stage=3, prepare="nd_parallel"),
    Strategy("pp+tp+dp", "3D: pipeline stages, each tensor parallel, replicated over dp with DDP or FSDP (dp_mode)",
             ("pp", "tp", "dp"), fills="dp", defaults=(("tp", 2), ("pp", 2)), pipelined=True, prepare="nd_parallel"),
)
BY_NAME: dict[str, Strategy] = {s.name: s for s in REGISTRY}
# name -> one-line description (shown by --help and in errors).
STRATEGIES: dict[str, str] = {s.name: s.help for s in REGISTRY}
DATA_PARALLEL = tuple(s.name for s in REGISTRY if s.degrees is None)
PIPELINED = tuple(s.name for s in REGISTRY if s.pipelined)
ZERO_STAGE: dict[str, int] = {s.name: s.zero_stage for s in REGISTRY if s.zero_stage is not None}


def dims_for(strategy: str, nproc: int, layout: dict[str, int] | None) -> tuple[ParallelDims | None, str | None]:
    """The degrees a strategy runs with on ``nproc`` ranks: from the suite's ``layout``
    where given, otherwise the strategy's default. Returns (dims, problem)."""
    s = BY_NAME[strategy]
    lay = dict(layout or {})
    if s.degrees == ():
        if nproc != 1:
            return None, f"strategy {strategy} runs one process, not {nproc}; use ddp/fsdp for more ranks"
        return ParallelDims(), None
    if s.degrees is None:
        if lay and set(lay) - {"dp"}:
            return None, f"strategy {strategy} is data parallel only; layout {lay} names other degrees (use fsdp+tp or pp+tp+dp)"
        return ParallelDims(dp=nproc), None
    extra = set(lay) - set(s.degrees)
    if extra:
        return None, f"strategy {strategy} takes degrees {', '.join(s.degrees)}; layout also names {', '.join(sorted(extra))}"
    deg = {"dp": 1, "tp": 1, "pp": 1, **dict(s.defaults), **lay}
    if s.fills not in lay:
        others = 1
        for k in s.degrees:
            if k != s.fills:
                others *= deg[k]
        deg[s.fills] = max(1, nproc // others)
    return ParallelDims(dp=deg["dp"], tp=deg["tp"], pp=deg["pp"]), None


def builder(strategy: str) -> Callable[..., object]:
    """The function of strategies/apply.py that builds this strategy (imports torch)."""
    from . import apply

    return getattr(apply, BY_NAME[strategy].prepare)
