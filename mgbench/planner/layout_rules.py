"""The rules a parallel layout must keep to run, stated once and vectorised: `plan`'s
search evaluates them over millions of candidate layouts at a time and `predict` /
`memory` over the one layout given, so both accept and refuse the same layouts (a test
gives predict every layout plan ranks).

Each rule is a mask, True where the layout keeps it; :data:`MESSAGES` says in one line
why a single layout breaks one.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..layout import Layout
from ..model_shape import ModelShape
from ..strategies.schedules import (bubble_unknown_reason, chunks_per_rank, schedule_problem, theoretical_bubble,
                                   too_few_chunks, v_shaped)
from .memory import max_last_layers
from .perf import distinct_pairs


def virtual_stages_problem(schedule: str, virtual_stages: int) -> str | None:
    """Why ``virtual_stages`` cannot be given with ``schedule``, or None: only the
    interleaved schedules take it; the others hold a fixed number of chunks a rank, and
    would otherwise be priced with that number while the option said another."""
    from ..strategies.schedules import VIRTUAL

    if schedule in VIRTUAL or virtual_stages == 1:
        return None
    return (f"--virtual-stages {virtual_stages}: --schedule {schedule} holds a fixed number of chunks a rank "
            f"({chunks_per_rank(schedule, 1)}); virtual stages are for {', '.join(VIRTUAL)}")


def schedule_runs(schedule: str, pp: Any, num_micro: Any, virtual_stages: int) -> Any:
    """Rows whose pipeline can run ``schedule`` with a known theoretical bubble (the
    schedule registry's rules, strategies/schedules.py: e.g. interleaved needs m a
    multiple of p, DualPipeV m >= 2 p, ZB-V's bubble is known from m >= 2 p; GPipe takes
    any m); every row without a pipeline."""
    ps, ms, inverse = distinct_pairs(np.asarray(pp, dtype=np.int64), np.asarray(num_micro, dtype=np.int64))
    # One registry call per distinct (p, m).
    runs = np.array([pi == 1 or (schedule_problem(schedule, int(pi), int(mi), compile=False) is None
                                 and theoretical_bubble(int(pi), int(mi), schedule, virtual_stages) is not None)
                     for pi, mi in zip(ps, ms)], dtype=bool)
    return runs[inverse]


def rules(shape: ModelShape | None, layout: Layout) -> dict[str, Any]:
    """Every rule's mask over ``layout`` (a scalar :class:`mgbench.layout.Layout`, or one
    whose fields are arrays: many layouts at once), True where it is kept. Without a
    ``shape`` (`mgbench memory --params`) the rules about heads, layers and experts are
    not known and left out."""
    L = layout
    N, T, P, C, E, Z, MB, R, X = (np.asarray(x, dtype=np.int64) for x in
                                  (L.num_gpus, L.tp, L.pp, L.cp, L.ep, L.zero, L.micro_batch, L.replicas, L.etp))
    width = T * P * C
    divides = N % width == 0
    D = np.where(divides, N // np.maximum(width, 1), 1)  # data-parallel ranks where the degrees divide
    # Without a global batch, one micro-batch per data-parallel rank (Layout.batch).
    B = np.asarray(L.global_batch, dtype=np.int64) if L.global_batch is not None else MB * D
    batch = (B >= MB * D) & (B % np.maximum(MB * D, 1) == 0)  # one micro-batch a rank at least
    M = np.where(batch, B // np.maximum(MB * D, 1), 1)
    schedule, virtual_stages, seq_len, offload = L.schedule, L.virtual_stages, L.seq_len, L.offload
    chunks = chunks_per_rank(schedule, virtual_stages)
    out = {
        "divides": divides,
        "batch": batch,
        "cp_seq": (C == 1) | (seq_len % (2 * C) == 0),
        "offload": ~np.asarray(offload, dtype=bool) | (Z == 3),
        "hsdp": (R == 1) | ((Z == 3) & ((D * C) % R == 0) & (D * C != R) & (E == 1)),
        "schedule": schedule_runs(schedule, P, M, virtual_stages),
        # An interleaved schedule with one chunk a rank is 1F1B under another name.
        "chunks": (P == 1) | (not too_few_chunks(schedule, virtual_stages)),
    }
    if shape is not None:
        out.update({
            "heads": shape.heads % T == 0,
            "kv_heads": (shape.kv_heads % T == 0) | (T % shape.kv_heads == 0),
            "layers": np.where(P > 1, P * chunks, 1) <= shape.layers,
            # A set last stage (Layout.pp_last_layers) needs a pipeline whose ranks hold
            # their chunks in a loop (in a V the output layer shares rank 0 with the
            # embedding), and is lighter than the other stages, not heavier.
            "last_stage": _last_stage_ok(L.pp_last_layers, P, shape, schedule),
            # Megatron-Core's MoE parallel folding: the ep group is ep of the tp x dp x cp
            # ranks of a pipeline stage (attention's tp folds into it), as the MoE step and
            # memory terms price it (planner/moe.py).
            "experts": (E == 1) | (((T * D * C) % E == 0) & (shape.experts % E == 0)) if shape.is_moe else (E == 1),
            # Expert tensor parallelism: ep x etp ranks of the stage's tp x dp x cp hold
            # one copy of the experts, each split etp ways along its width.
            "etp": (X == 1) | (((T * D * C) % (E * X) == 0) & (shape.moe_ffn_hidden % X == 0)) if shape.is_moe
            else (X == 1),
        })
    return out


def _last_stage_ok(last: Any, pp: Any, shape: ModelShape, schedule: str) -> Any:
    """Where the blocks of the stage that runs the output layer, if set, are 0 to
    memory.max_last_layers (NaN: not set). That stage is the last one of a loop placement
    and rank 0 of a V (zbv, dualpipev: it holds the first chunk and the last, the
    embedding and the output layer), whose two chunks share its blocks: time prices it as
    a loop's last stage (layout_time.step_time), memory holds its in-flight first chunk
    and its logits at once (memory.memory_per_gpu)."""
    if last is None:
        return np.ones(np.shape(pp), dtype=bool)
    k = np.asarray(last, dtype=float)
    return np.isnan(k) | ((pp > 1) & (k >= 0) & (k <= max_last_layers(shape.layers, pp, shape.mtp_layers)))


# The values of the searched axes at which no rule is stricter than at any other value, the
# other fields held: ep 1 (the experts, etp and hsdp rules each hold wherever ep = 1) and no
# CPU offload (the offload rule holds without it); no other rule reads either. So the layouts
# kept at these values are a superset of those kept at any ep or offload, and plan's search
# runs every rule on those alone (search.kept_layouts; tests/unit/test_layout_rules_loosest.py
# checks the superset over random layouts).
LOOSEST = {"ep": 1, "offload": False}


def keeps_all(masks: dict[str, Any]) -> Any:
    """Where every rule is kept."""
    out = None
    for m in masks.values():
        out = m if out is None else out & m
    return out


# One line per rule for a single layout (L: mgbench.layout.Layout, s: ModelShape).
MESSAGES: dict[str, Callable[[Any, ModelShape], str]] = {
    "divides": lambda L, s: (f"tp ({L.tp}) x pp ({L.pp}) x cp ({L.cp}) = {L.tp * L.pp * L.cp} does not divide the "
                             f"{L.num_gpus} GPUs; choose degrees whose product divides --num-gpus"),
    "batch": lambda L, s: (f"global batch {L.batch} is not a positive multiple of micro-batch {L.micro_batch} x dp "
                           f"{L.dp} (dp = {L.num_gpus} GPUs / (tp {L.tp} x pp {L.pp} x cp {L.cp})); give --global-batch "
                           f"{L.micro_batch * L.dp} or a multiple of it"),
    "heads": lambda L, s: f"tp={L.tp} does not divide the {s.heads} attention heads",
    "kv_heads": lambda L, s: f"tp={L.tp} neither divides nor is a multiple of the {s.kv_heads} kv heads",
    "layers": lambda L, s: (f"pp={L.pp} x {chunks_per_rank(L.schedule, L.virtual_stages)} virtual stage(s) exceeds "
                            f"the {s.layers} layers"),
    "experts": lambda L, s: (f"--ep {L.ep} must divide the {s.experts} experts and the {L.tp * L.dp * L.cp} ranks "
                             "of a pipeline stage (tp x dp x cp: Megatron-Core's MoE parallel folding)"),
    "etp": lambda L, s: (f"--etp {L.etp} is for MoE models (a dense model has no experts to split)" if not s.is_moe
                         else f"--ep {L.ep} x --etp {L.etp} must divide the {L.tp * L.dp * L.cp} ranks of a pipeline "
                              f"stage (tp x dp x cp), and --etp the experts' width {s.moe_ffn_hidden}"),
    "last_stage": lambda L, s: (f"--pp-last-layers {L.pp_last_layers} needs a pipeline (--pp 2 or more)" if L.pp == 1
                                else f"--pp-last-layers {L.pp_last_layers}: the last of {L.pp} stages"
                                     + (" (in the V, rank 0, which runs the output layer)" if v_shaped(L.schedule) else "")
                                     + " may hold 0 to "
                                     f"{int(max_last_layers(s.layers, L.pp, s.mtp_layers))} of the {s.layers} layers "
                                     "(with its MTP modules no more than each other stage: it makes room for the "
                                     "output layer)"),
    "cp_seq": lambda L, s: (f"--cp {L.cp}: the sequence ({L.seq_len}) must split into 2 x cp = {2 * L.cp} equal chunks "
                            "(causal load balancing); choose a --seq-len that is a multiple of it"),
    "offload": lambda L, s: "--offload is modelled for FSDP2's ZeRO-3 sharding: add --zero 3",
    "hsdp": lambda L, s: ("--hsdp is modelled for FSDP2's ZeRO-3 sharding: add --zero 3" if L.zero != 3
                          else "--hsdp with --ep is not modelled: give one of them" if L.ep > 1
                          else f"--hsdp {L.replicas} must divide the {L.dp * L.cp} data-parallel ranks (dp x cp) and "
                               "leave at least 2 to shard over"),
    "schedule": lambda L, s: _schedule_message(L),
    "chunks": lambda L, s: (f"--schedule {L.schedule} runs 2 or more model chunks a pipeline rank: give "
                            "--virtual-stages 2 or more (or --schedule 1f1b)"),
}


def _schedule_message(L: Any) -> str:
    """The schedule registry's own reason (strategies/schedules.py), in predict's words."""
    problem = schedule_problem(L.schedule, L.pp, L.num_micro, compile=False)
    if problem is not None:
        return problem.replace("grad_accum,", "--global-batch / (micro-batch x dp),").replace(
            "set grad_accum >= ", "raise --global-batch so that --global-batch / (micro-batch x dp) >= ")
    unknown = bubble_unknown_reason(L.pp, L.num_micro, L.schedule)
    return (f"--schedule {L.schedule}: {(unknown or 'no known bubble').replace('grad_accum', 'micro-batches per step')}"
            "; raise --global-batch")
