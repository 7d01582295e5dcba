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
    sequence_parallel: bool = False  # norms and the residual stream sharded over the sequence (tp ranks)
    prepare: str = "data_parallel"  # build function in strategies/apply.py

    @property
    def fsdp_sharded(self) -> bool:
        """Its data parallelism is FSDP2's (ZeRO-2/3 here: fsdp_grad_op, fsdp, hsdp, fsdp+tp,
        fsdp+ep); pp+tp+dp's depends on its dp_mode."""
        return self.zero_stage in (2, 3)

    @property
    def ddp_replicated(self) -> bool:
        """Its data parallelism is DDP's reducer (ZeRO-0/1: ddp, zero1, ep, cp; not single,
        which has no data parallelism); pp+tp+dp's depends on its dp_mode."""
        return self.zero_stage in (0, 1) and self.degrees != ()


REGISTRY: tuple[Strategy, ...] = (
    Strategy("single", "one process, no wrapper: the reference every other strategy is checked against",
             degrees=(), zero_stage=0),
    Strategy("ddp", "DistributedDataParallel: full replica per rank, gradient all-reduce", None, zero_stage=0),
    Strategy("zero1", "ZeroRedundancyOptimizer + DDP: optimizer states sharded (ZeRO-1)", None, zero_stage=1),
    Strategy("fsdp", "FSDP2 fully_shard, reshard after forward: params, grads, optimizer sharded (ZeRO-3)", None,
             zero_stage=3),
    Strategy("fsdp_grad_op", "FSDP2 fully_shard without reshard after forward: grads and optimizer sharded "
             "(ZeRO-2-like)", None, zero_stage=2),
    # HSDP is its own entry rather than an fsdp option: it is one more data-parallel
    # strategy (dp = every rank) with its own ZeRO stage and build path, and a registry
    # entry is what the planner, the docs and --help already enumerate; the replica count
    # is the `replicas` key (pp+tp+dp reaches the same through dp_mode = "hsdp").
    Strategy("hsdp", "HSDP: FSDP2 on a 2-D (replicate x shard) mesh: sharded within groups of dp / replicas ranks, "
             "gradients all-reduced across the replicas (ZeRO-3 within a group)", None, zero_stage=3),
    # Expert parallelism (MoE models): ep is carved out of dp (layout {ep = E}, default
    # ep = dp); strategies/expert_parallel.py builds both.
    Strategy("ep", "expert parallel (MoE models): experts sharded over ep ranks (layout {ep}; default every rank) and "
             "replicated over dp / ep, tokens sent to them by all-to-all; everything else DDP over every rank",
             ("dp", "ep"), fills="dp", zero_stage=0, prepare="expert_parallel"),
    Strategy("fsdp+ep", "expert parallel with FSDP2: experts sharded over ep ranks and FSDP-sharded over the dp / ep "
             "ranks that share them; everything else FSDP over every rank", ("dp", "ep"), fills="dp", zero_stage=3,
             prepare="expert_parallel"),
    # Context parallelism: cp ranks per sample, DDP over every rank (dp x cp); the one
    # entry for "cp=2 x dp=2" (strategies/context_parallel.py).
    Strategy("cp", "context parallel: each sample's sequence split over cp ranks (causal load balance: 2 x cp "
             "chunks, rank r takes chunks r and 2cp-1-r); attention by torch's ring attention on CUDA, K and V "
             "all-gathered on CPU (cp_attention); DDP over dp x cp (layout {dp, cp}; default cp = 2)", ("dp", "cp"),
             fills="dp", defaults=(("cp", 2),), zero_stage=0, prepare="context_parallel"),
    Strategy("tp", "tensor parallel (DTensor): Megatron column/row splits of attention and MLP", ("tp",), fills="tp",
             prepare="nd_parallel"),
    Strategy("tp_sp", "tensor parallel + sequence parallel: norms and residual stream sharded over the sequence",
             ("tp",), fills="tp", sequence_parallel=True, prepare="nd_parallel"),
    Strategy("pp", "pipeline parallel (torch.distributed.pipelining): stages balanced by layer count", ("pp",),
             fills="pp", pipelined=True, prepare="nd_parallel"),
    Strategy("fsdp+tp", "2D: FSDP over dp, tensor parallel over tp (layout {dp, tp}; default tp = 2)", ("dp", "tp"),
             fills="dp", defaults=(("tp", 2),), zero_stage=3, prepare="nd_parallel"),
    Strategy("pp+tp+dp", "3D: pipeline stages, each tensor parallel, replicated over dp with DDP or FSDP (dp_mode)",
             ("pp", "tp", "dp"), fills="dp", defaults=(("tp", 2), ("pp", 2)), pipelined=True, prepare="nd_parallel"),
)
BY_NAME: dict[str, Strategy] = {s.name: s for s in REGISTRY}
# torch's ring attention forms for cp (CUDA only), with K and V all-gathered or passed rank
# to rank, each with torch's KV rotate method (set_rotate_method's names): the one place
# that says which values are rings.
RING_FORMS: dict[str, str] = {"ring_allgather": "allgather", "ring_alltoall": "alltoall"}
# cp_attention's choices (strategies/context_parallel.py): auto, a ring form, or mgbench's
# all-gather-KV form.
CP_ATTENTION = ("auto", *RING_FORMS, "allgather_kv")
# Why a ring form cannot run off CUDA (suite expansion and the rank side say the same).
RING_NEEDS_CUDA = ("cp_attention = \"{asked}\" needs CUDA: torch 2.13's ring attention (context_parallel) dispatches "
                   "only the CUDA flash, efficient and cuDNN SDPA kernels; use \"auto\" or \"allgather_kv\" on CPU")
# name -> one-line description (shown by --help and in errors).
STRATEGIES: dict[str, str] = {s.name: s.help for s in REGISTRY}
DATA_PARALLEL = tuple(s.name for s in REGISTRY if s.degrees is None)
PIPELINED = tuple(s.name for s in REGISTRY if s.pipelined)
ZERO_STAGE: dict[str, int] = {s.name: s.zero_stage for s in REGISTRY if s.zero_stage is not None}


EXPERT_PARALLEL = tuple(s.name for s in REGISTRY if s.prepare == "expert_parallel")
# Strategies an MoE model runs under: the data-parallel ones (every rank holds every
# expert) and expert parallelism. Tensor and pipeline parallelism do not split experts.
MOE_STRATEGIES = ("single",) + tuple(s for s in DATA_PARALLEL if s != "hsdp") + EXPERT_PARALLEL


def moe_problem(strategy: str, experts: int) -> str | None:
    """Why a config's strategy cannot run its model's experts (None when it can)."""
    if strategy in EXPERT_PARALLEL and not experts:
        return (f"strategy {strategy} shards experts: it needs an MoE model (experts > 0), e.g. model = "
                "\"tiny-moe\"")
    if experts and strategy not in MOE_STRATEGIES:
        return (f"MoE models run under {', '.join(MOE_STRATEGIES)}; {strategy} does not split experts (tensor and "
                "pipeline parallelism of MoE layers are not built)")
    return None


# torch._scaled_mm (float8 GEMMs on CUDA) needs both dims of a float8 linear a multiple of
# this: strategies/fp8.py converts only such linears; suite.py checks tensor-parallel shards.
FP8_ALIGN = 16
