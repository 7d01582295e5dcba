"""Pipeline schedules: one registry entry each, and their theoretical bubble.

Torch-free (the suite validator, the config schema and the planner read it without
loading the rank side); :mod:`mgbench.strategies.pipeline` builds the stages and the
torch schedule an entry names.

Stage placement: the model is cut into ``pp x chunks_per_rank`` chunks. "loop"
placement gives rank r the chunks r, r + pp, r + 2 pp ... (GPipe, 1F1B and the
interleaved schedules); "v" placement gives rank r the chunks r and 2 pp - 1 - r, so
that the first rank also holds the last chunk and the activations go down the ranks and
back up (ZB-V and DualPipeV, which torch builds for exactly two stages per rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Schedule:
    name: str
    torch_class: str  # in torch.distributed.pipelining
    help: str
    placement: str = "loop"  # "loop" or "v" (see the module docstring)
    fixed_chunks: int | None = 1  # chunks per rank; None: the config's virtual_stages
    # Backward split into input-gradient and weight-gradient passes (Qi et al. 2023):
    # torch runs it through autograd.grad, which torch.compile'd blocks do not support.
    split_backward: bool = False


REGISTRY: tuple[Schedule, ...] = (
    Schedule("gpipe", "ScheduleGPipe", "GPipe: every forward, then every backward"),
    Schedule("1f1b", "Schedule1F1B", "1F1B: one forward, one backward in the steady state"),
    Schedule("interleaved", "ScheduleInterleaved1F1B", "interleaved 1F1B over virtual_stages chunks per rank",
             fixed_chunks=None),
    Schedule("interleaved_zb", "ScheduleInterleavedZeroBubble", "zero bubble ZB1P (Qi et al. 2023) over "
             "virtual_stages chunks per rank: weight gradients fill the bubble", fixed_chunks=None,
             split_backward=True),
    Schedule("zbv", "ScheduleZBVZeroBubble", "ZB-V zero bubble (Qi et al. 2023, section 6): two chunks per rank "
             "in a V", placement="v", fixed_chunks=2, split_backward=True),
    Schedule("dualpipev", "ScheduleDualPipeV", "DualPipeV (DeepSeek-V3's DualPipe cut in half): two chunks per "
             "rank in a V, needs grad_accum >= 2 pp", placement="v", fixed_chunks=2, split_backward=True),
)
BY_NAME: dict[str, Schedule] = {s.name: s for s in REGISTRY}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# Schedules whose chunk count per rank is the virtual_stages key.
VIRTUAL: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.fixed_chunks is None)


def chunks_per_rank(schedule: str, virtual_stages: int) -> int:
    """Model chunks each pipeline rank holds under ``schedule``."""
    fixed = BY_NAME[schedule].fixed_chunks
    return virtual_stages if fixed is None else fixed


def too_few_chunks(schedule: str, virtual_stages: int) -> bool:
    """Whether ``schedule`` takes virtual stages and is given fewer than 2: with one chunk a
    rank an interleaved schedule is 1F1B under another name."""
    return schedule in VIRTUAL and virtual_stages < 2


def v_shaped(schedule: str) -> bool:
    """Whether ``schedule`` places its chunks in a V: rank 0 holds the first chunk and the
    last (the embedding and the output layer on one rank)."""
    return BY_NAME[schedule].placement == "v"


def rank_chunks(schedule: str, pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """The chunk ids pipeline rank ``pp_rank`` holds, in the order torch expects its stages."""
    if v_shaped(schedule):
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(chunks_per_rank(schedule, virtual_stages))]


# How a pipeline's data-parallel replicas reduce their gradients (the record's
# pp_grad_sync). torch's pipelining drives DDP and FSDP itself
# (torch/distributed/pipelining/stage.py: backward_maybe_with_nosync, perform_reduce_grad).
# DDP's reducer only reduces through its autograd hooks on the parameters' gradient
# accumulators; the split schedules' weight pass (pipelining/_backward.py,
# stage_backward_weight) calls torch.autograd.grad with those accumulators as its
# inputs, which returns the gradients without running them, so the hooks never fire
# (torch 2.13: the reducer's "rebuilt parameter indices" assert on the first step, after
# stage.py's prepare_for_backward at the last backward). Those schedules' stages are
# therefore not wrapped: mgbench all-reduces their gradients itself. The other schedules'
# stages are wrapped by strategies/pipeline.py ddp_stage (which says why DDP's own arming
# of the reducer is off there). FSDP2 has the path
# torch supports (perform_reduce_grad at the schedule's REDUCE_GRAD action), which needs
# the stages kept unsharded from forward to backward (see strategies/apply.py).
GRAD_SYNC: dict[str, str] = {
    "ddp_reducer": "each stage wrapped in DDP; torch's schedule runs the last micro-batch's backward through "
                   "DDP's reducer, which all-reduces (mean) the stage's gradients in buckets (only that backward: "
                   "DDP's own forward never arms the reducer, strategies/pipeline.py ddp_stage)",
    "allreduce_after_schedule": "stages not wrapped in DDP (the split weight pass bypasses DDP's reducer hooks); "
                                "after the schedule's step, one flattened all-reduce (mean over the dp group) "
                                "per stage, before the optimizer",
    "fsdp_reduce_grad": "each stage sharded with FSDP2; torch's schedule reduce-scatters the stage's gradients "
                        "after its last backward (PipelineStage.perform_reduce_grad)",
    "fsdp_reduce_grad_unsharded": "each stage sharded with FSDP2, kept unsharded from forward to backward "
                                  "(reshard_after_forward = False: the split input pass must see the parameters "
                                  "the forward used); torch's schedule reduce-scatters the stage's gradients after "
                                  "its last weight pass (PipelineStage.perform_reduce_grad)",
}


def grad_sync(schedule: str, dp_mode: str | None) -> str | None:
    """The key of :data:`GRAD_SYNC` a pipelined config's data-parallel replicas use
    (``dp_mode``: "ddp", "fsdp", "hsdp"; None without data parallelism: None)."""
    if dp_mode is None:
        return None
    split = BY_NAME[schedule].split_backward
    if dp_mode == "ddp":
        return "allreduce_after_schedule" if split else "ddp_reducer"
    return "fsdp_reduce_grad_unsharded" if split else "fsdp_reduce_grad"


def grad_sync_of(cfg: Any) -> str | None:
    """:func:`grad_sync` of a config: None unless it is pipelined with data-parallel
    replicas (what the runner builds, strategies/apply.nd_parallel, and records)."""
    return grad_sync(cfg.pp_schedule, cfg.dp_mode) if cfg.pipelined and cfg.dp > 1 else None


def schedule_problem(schedule: str, pp: int, num_micro: int, compile: bool) -> str | None:
    """Why a schedule cannot run a config (None when it can): what torch 2.13's classes
    refuse, said before a rank starts. Every schedule runs with data-parallel replicas
    of any dp_mode (:func:`grad_sync` says how their gradients are reduced)."""
    s = BY_NAME[schedule]
    if s.fixed_chunks is None and num_micro % pp:
        return (f"the {schedule} schedule needs grad_accum, the micro-batches per step ({num_micro}), to be a "
                f"multiple of pp ({pp})")
    if schedule == "dualpipev" and num_micro < 2 * pp:
        return (f"the dualpipev schedule needs at least as many micro-batches as stages (2 x pp = {2 * pp}); "
                f"set grad_accum >= {2 * pp}")
    if compile and s.split_backward:
        return (f"the {schedule} schedule splits backward into input and weight gradients, which torch does not "
                "support for compiled blocks; set compile = false")
    return None


def memory_tracker_problem(schedule: str) -> str | None:
    """Why torch's memory tracker cannot follow a step of ``schedule`` (None when it can).

    Seen on torch 2.13 (gloo, pp 2, with and without replicas): the tracker's module
    hooks (torch.autograd.graph.register_multi_grad_hook) raise inside the split input
    pass. The step then fails on the ranks holding the last stage while their
    neighbours wait for its gradients: not a figure to be had, and a hang to avoid."""
    if BY_NAME[schedule].split_backward:
        return (f"the {schedule} schedule's input-gradient pass runs torch.autograd.grad, inside which torch "
                "2.13's memory tracker fails (its multi-grad hooks: \"A leaf node was passed to "
                "_will_engine_execute_node ... not supported\"); the pipeline's neighbours would wait for it")
    return None


def theoretical_bubble(pp: int, num_micro: int, schedule: str, virtual_stages: int) -> float | None:
    """Idle fraction of each pipeline rank in theory, with equal-cost micro-batches.

    - GPipe and 1F1B: (p - 1) / (m + p - 1); interleaved 1F1B over v chunks per rank:
      (p - 1) / (v m + p - 1) (Narayanan et al. 2021, sections 2.2.1-2.2.2).
    - Zero-bubble schedules split a chunk's backward into an input-gradient pass B and a
      weight-gradient pass W, and assume T_F = T_B = T_W (Qi et al. 2023, "Zero Bubble
      Pipeline Parallelism", arXiv 2401.10241, the assumption of its handcrafted
      schedules). One rank then works 3 units per chunk per micro-batch.
      ZB1P (ZB-H1, section 3): bubble (p - 1)(T_F + T_B - T_W) = p - 1 units against
      1F1B's 3 (p - 1), over 3 m units of work: (p - 1) / (3 m + p - 1). Interleaved over
      v chunks (torch's ScheduleInterleavedZeroBubble) the warm-up shrinks v-fold as it
      does for interleaved 1F1B, and the work is 3 v m chunk units: (p - 1) / (3 v m + p - 1).
    - ZB-V (section 6): zero bubble under T_F = T_B = T_W once m >= 2 p, with 1F1B's
      memory. With fewer micro-batches the paper gives no figure: None (see
      :func:`bubble_unknown_reason`), not a guess.
    - DualPipeV: bubble (PP/2 - 1)(F&B + B - 3 W) over PP = 2 p stages (DeepSeek-V3
      technical report, arXiv 2412.19437, table 2; github.com/deepseek-ai/DualPipe),
      F, B (full backward = input + weight pass), W per chunk. Without communication to
      hide, F&B = F + B: (p - 1)(1 + 2 + 2 - 3) = 2 (p - 1) units over 2 chunks x 3 m:
      (p - 1) / (3 m + p - 1). (DualPipe's gain is in hiding communication under
      compute, which a bubble fraction of compute does not show.)
    """
    p, m = pp, num_micro
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (virtual_stages * m + p - 1)
    if schedule == "interleaved_zb":
        return (p - 1) / (3 * virtual_stages * m + p - 1)
    if schedule == "zbv":
        return 0.0 if m >= 2 * p else None
    if schedule == "dualpipev":
        return (p - 1) / (3 * m + p - 1)
    raise ValueError(f"unknown pipeline schedule {schedule!r}; one of {', '.join(NAMES)}")


def bubble_unknown_reason(pp: int, num_micro: int, schedule: str) -> str | None:
    """Why :func:`theoretical_bubble` is None for a config (None when it has a value)."""
    if schedule == "zbv" and num_micro < 2 * pp:
        return (f"ZB-V's zero bubble (Qi et al. 2023, section 6) needs grad_accum >= 2 x pp = {2 * pp} micro-batches; "
                f"with {num_micro} the paper gives no figure")
    return None
