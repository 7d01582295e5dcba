"""What a strategy's framework costs per step beyond its aten ops, probed on a tiny model.

The probed CPU prediction prices a step op by op (per-op overhead, bytes, matmul and SDPA
rates). The Python around those ops is not an op: nn.Module calls, autograd's engine, the
optimizer's loop, and above all the strategy's own machinery (FSDP2's pre/post forward
and backward hooks per wrapped module, DDP's reducer, ZeRO-1's partitioned step). The
probe measures it directly: the runner's own build and training step of each strategy, on
one rank (a world-1 gloo process group, so collectives cost nothing), for a model with the
probed workload's layers but tiny dimensions (hidden 16), whose data costs nothing. What
is left after its counted ops x the per-op overhead is the framework's residual per step.

On this project's 2-core VM (quiet): single 11.6 ms a step for 1,384 ops (4.7 ms above
ops x 5 us), FSDP 26 ms for 1,610 ops (18 ms above).

At n ranks (probe/concurrent.py runs this in n processes forming a real gloo group) the
same tiny steps also hold what a data-parallel step costs beyond its ops and bytes when
its ranks share the host: every collective the strategy issues (FSDP's gather and
reduce-scatter per wrapped module, ZeRO-1's broadcasts, DDP's reducer), each a
rendezvous that waits for the slowest rank, with the ranks' Python and gloo's threads
time-sharing the cores. Measured on the 2-core VM: FSDP's tiny step 25 ms on one rank,
52 ms on 2, 157 ms on 4; DDP's 12, 16 and 36 ms.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

# The strategies whose residual the probe measures (the default suite's data-parallel ones).
STRATEGIES = ("single", "ddp", "zero1", "fsdp", "fsdp_grad_op")
TINY = {"hidden": 16, "heads": 4, "ffn_hidden": 32, "vocab": 64}
TINY_SEQ = 8
STEPS = 20
WARMUP = 3


def tiny_config(strategy: str, layers: int, ranks: int = 1) -> Any:
    """The fp32 CPU config of ``strategy`` on ``ranks`` ranks for the tiny model with
    ``layers`` blocks, with the strategy's degrees on that many ranks (layout.for_strategy,
    as a suite builds them)."""
    import dataclasses

    from ..config import RunConfig
    from ..layout import for_strategy

    cfg = RunConfig(model={"layers": layers, **TINY}, strategy=strategy, nproc=ranks, micro_batch=1,
                    seq_len=TINY_SEQ, precision="fp32", device="cpu")
    dims, problem = for_strategy(strategy, ranks, None)
    if problem:
        raise ValueError(problem)
    return dataclasses.replace(cfg, **dims.degrees())


def strategies_at(ranks: int) -> tuple[str, ...]:
    """The strategies probed at ``ranks`` ranks ("single" runs on one only)."""
    return STRATEGIES if ranks == 1 else tuple(s for s in STRATEGIES if s != "single")


def residuals(layers: int, op_overhead_s: float, strategies: tuple[str, ...] | None = None, ranks: int = 1,
              rank: int = 0, store: Any = None) -> list[dict[str, Any]]:
    """Per strategy: the tiny model's median step, its counted ops, and the residual
    (step - ops x ``op_overhead_s``, at least 0). One rank in this process, or (``ranks``
    > 1) this process as rank ``rank`` of a gloo group met through ``store`` (a
    torch.distributed Store every rank's process reaches), the others running the same."""
    from ..planner.opcount import count_step, host_ops
    from ..process_group import gloo_group

    strategies = strategies or strategies_at(ranks)
    cfgs = {s: tiny_config(s, layers, ranks) for s in strategies}
    # Counted first: the count runs on a process group of its own, which replaces any other.
    counts = {s: host_ops(count_step(cfg)) for s, cfg in cfgs.items()}
    ops = {s: c["ops"] for s, c in counts.items()}
    with gloo_group(ranks, rank, store):
        times = _step_times(cfgs, ranks, rank)  # the models live in there: see gloo_group
    out = []
    for s in strategies:
        step = statistics.median(times[s])
        out.append({"strategy": s, "step_s": step, "ops": ops[s], "collectives": counts[s].get("collectives", 0.0),
                    "layers": layers, "ranks": ranks, "residual_s": max(0.0, step - ops[s] * op_overhead_s)})
    return out


def _step_times(cfgs: dict[str, Any], ranks: int, rank: int) -> dict[str, list[float]]:
    """The timed steps after the warm-up, per strategy, on the process group in place.
    Strategies take turns step by step, so a burst of load from elsewhere on the machine
    (another process taking a core for a second) lands on all of them alike instead of
    on whichever strategy was running then. With several ranks a barrier starts each
    step together, as the run's steady state has them. The models live and die in here."""
    import torch
    import torch.distributed as dist

    from ..runner.training import rank_batches, train_step
    from ..strategies.apply import prepare

    dev = torch.device("cpu")
    preps = {s: prepare(cfg, dev) for s, cfg in cfgs.items()}
    first = next(iter(cfgs.values()))
    batches = rank_batches(first.seed, range(WARMUP + STEPS), rank, 1, 1, ranks, TINY_SEQ, TINY["vocab"], dev)
    times: dict[str, list[float]] = {s: [] for s in cfgs}
    for i, micro in enumerate(batches):
        for s, prep in preps.items():
            if ranks > 1:
                dist.barrier()
            t0 = time.perf_counter()
            train_step(prep, micro, dev, "fp32")
            if i >= WARMUP:
                times[s].append(time.perf_counter() - t0)
    return times
