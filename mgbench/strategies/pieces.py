"""The pieces every strategy is built from (torch side): the prepared model and its
optimizer, placement, activation checkpointing and compilation, DDP / ZeRO-1 / FSDP2
wrapping, device meshes, gradient compression and loss scaling. strategies/apply.py
composes them per strategy, as do the tensor-, pipeline-, context- and expert-parallel
modules beside it; none of those is imported here, so imports point one way.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import RunConfig
from ..workloads.gpt import DecoderLM

# fp8: torchao float8 linears (strategies/fp8.py), everything else under bf16 autocast.
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


# AdamW settings of the benchmark. Values from common LM practice (GPT-3 / Llama):
# they matter only in that every strategy and the reference use the same ones.
OPTIMIZER_KW: dict[str, Any] = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}


# Devices whose AdamW runs fused (one kernel for the whole update, as torchtitan does):
# on CUDA the foreach path launches several kernels per parameter group and step. CPU
# keeps torch's default, so the gloo timings and the measured check tolerances stand.
FUSED_OPTIMIZER_DEVICES: tuple[str, ...] = ("cuda",)


def optimizer_kw(device: torch.device, sharded_fp16: bool = False) -> dict[str, Any]:
    """AdamW's keyword arguments on ``device``: OPTIMIZER_KW, fused where supported.

    ``sharded_fp16``: the step goes through torch's ShardedGradScaler, which hands a fused
    optimizer a found-inf flag of shape (1,) that the fused step cannot subtract from its
    0-d step counters ("output with shape [] doesn't match the broadcast shape [1]",
    torch 2.13, seen on gloo with FSDP, tensor and pipeline parallelism): such steps
    stay unfused (foreach)."""
    fused = device.type in FUSED_OPTIMIZER_DEVICES and not sharded_fp16
    return {**OPTIMIZER_KW, "fused": True} if fused else dict(OPTIMIZER_KW)


def make_optimizer(params: Any, device: torch.device, sharded_fp16: bool = False) -> torch.optim.Optimizer:
    """The benchmark's AdamW over ``params`` on ``device`` (``sharded_fp16``: see
    :func:`optimizer_kw`).

    DTensor parameters (tensor-parallel and FSDP shards) and plain ones go into separate
    parameter groups with the same settings: a fused (or foreach) step runs over a
    group's tensors together, and DTensor refuses a list that mixes both kinds (seen
    with tensor parallelism, whose norms stay plain tensors). AdamW updates every
    parameter on its own, so the grouping changes no number. DTensors come first: the
    fp16 scaler's unscale of a mixed list takes its mesh from the first gradient
    (see LossScaler)."""
    from torch.distributed.tensor import DTensor

    params = list(params)
    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return torch.optim.AdamW([{"params": g} for g in groups if g], **optimizer_kw(device, sharded_fp16))


class Checkpointed(nn.Module):
    """Recompute a block's activations in backward instead of storing them."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        # No RNG state saved and restored around the recomputation: the workload draws
        # no random numbers in forward (no dropout), and preserving it costs a device
        # RNG-state copy per block per step. (Keyword arguments: Hugging Face layers.)
        return checkpoint(self.block, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)


def block_keys(model: nn.Module) -> list[Any]:
    """Keys of ``model.blocks``: names of a ModuleDict (mgbench's models), indices of a
    ModuleList (a Hugging Face model's decoder layers, workloads/hf.py)."""
    blocks = model.blocks
    return list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else list(range(len(blocks)))


def apply_activation_checkpointing(model: DecoderLM, mode: str) -> None:
    """none; every_2nd = every second block (torchtitan's layer-wise selective AC with
    frequency 2); full = every block."""
    if mode == "none":
        return
    every = {"every_2nd": 2, "full": 1}[mode]
    for i, key in enumerate(block_keys(model)):
        if i % every == 0:
            model.blocks[key] = Checkpointed(model.blocks[key])


# torch.compile's backend for every compiled block: inductor, torch's default (tests set a
# cheap one, "eager", to exercise dynamo without generating kernels).
COMPILE_BACKEND = "inductor"


def apply_compile(model: DecoderLM) -> None:
    """Compile each block separately (as torchtitan does): smaller graphs, and FSDP
    hooks stay between them."""
    for key in block_keys(model):
        model.blocks[key].compile(backend=COMPILE_BACKEND)


class CompileCounts:
    """Dynamo's recompiles and graph breaks over one compiled config, from a fresh start.

    One worker process runs many configs, and dynamo's caches outlive each config's
    model: the next config's blocks (the same Block.forward code) would be compiled as a
    change of the last one's, from the second micro-batch size on with dynamic shapes
    ("marking L['x'] as dynamic (from automatic dynamic)"), so a config would time graphs
    shaped by the configs before it, and every change counts against
    torch._dynamo.config.recompile_limit (8 per function), past which dynamo runs the
    function eager without a word. So creating one resets dynamo (torch._dynamo.reset()):
    the config compiles as in a fresh process, with static shapes. Create it before the
    config's model is built; :meth:`read` counts what was compiled since."""

    def __init__(self) -> None:
        import torch._dynamo

        torch._dynamo.reset()
        self._breaks = _graph_breaks()

    def read(self) -> dict[str, Any]:
        """num_recompiles, num_graph_breaks and their reason (None when both are known)."""
        from torch._dynamo import convert_frame

        # Compiles per function (dynamo's compile ids k/0, k/1, ...), cleared by reset().
        # A private counter (torch 2.13): its absence makes the recompiles unknown, said so.
        per_frame = getattr(convert_frame, "FRAME_COMPILE_COUNTER", None)
        recompiles = None if per_frame is None else sum(n - 1 for n in per_frame.values() if n > 1)
        return {"num_recompiles": recompiles, "num_graph_breaks": _graph_breaks() - self._breaks,
                "compile_counts_reason": None if recompiles is not None else
                f"torch {torch.__version__} has no torch._dynamo.convert_frame.FRAME_COMPILE_COUNTER to count "
                "recompiles from"}


def _graph_breaks() -> int:
    """Graph breaks dynamo has met in this process (torch._dynamo.utils.counters["graph_break"]:
    a count per reason, which torch._dynamo.reset() leaves as it is)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def compile_counts(cfg: RunConfig) -> CompileCounts | None:
    """A fresh compiler state and its counts for a compiled config (None: not compiled)."""
    return CompileCounts() if cfg.compile else None


@dataclass
class Prepared:
    """A model ready to train under a strategy, and what the training step needs to know."""

    model: nn.Module  # the wrapped model; for pipelines, this rank's first stage module
    optimizer: torch.optim.Optimizer
    scaler: LossScaler | None  # fp16 only
    no_sync: Callable[[bool], ContextManager[Any]]  # no_sync(is_last_micro_step)
    dp_rank: int = 0
    dp_size: int = 1
    loss_weight: float = 1.0  # this rank's share when summing losses over all ranks
    schedule: Any = None  # pipeline schedule (None: not pipelined)
    is_first: bool = True  # holds the pipeline's first chunk (feeds the tokens)
    is_last: bool = True  # holds the last chunk (computes the loss)
    modules: list[nn.Module] = field(default_factory=list)
    stage_loss: Any = None  # pipelines: the schedule's loss function (StageLoss: fp16 scaling, true losses)
    moe_layers: list[nn.Module] = field(default_factory=list)  # MoE layers, whose aux losses join the gradient
    # Context parallelism: (inputs, targets) of a micro-batch -> this rank's tokens of them.
    shard_batch: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    # Entered around each step's forwards and backwards (not the optimizer step): torch's
    # ring attention switches its process-wide dispatch on for them only (cp on CUDA).
    step_context: Callable[[], ContextManager[Any]] | None = None
    # Pipelines whose data-parallel gradients no wrapper reduces (schedules.grad_sync
    # "allreduce_after_schedule"): called after the schedule's step, before the optimizer.
    reduce_grads: Callable[[], None] | None = None


def place(model: nn.Module, device: torch.device) -> nn.Module:
    """Move ``model`` to ``device`` unless every tensor is already there. (Moving to the
    same device does nothing, except under FakeTensorMode, where `mgbench memory --trace`
    builds the model: Module.to would try to swap each fake parameter and fail.)"""
    if all(t.device == device for t in [*model.parameters(), *model.buffers()]):
        return model
    return model.to(device)


def fsdp_mp_policy(precision: str) -> Any:
    """FSDP2's mixed precision for ``precision``: parameters gathered in the autocast
    dtype (bf16/fp16), gradients reduced in fp32; fp32 runs keep FSDP's default."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = AUTOCAST_DTYPES.get(precision)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()


def allreduce_flat(grads: list[torch.Tensor], group: Any, divisor: float = 1) -> None:
    """Sum ``grads`` in place over ``group`` with one all-reduce per dtype: the tensors
    flattened into one buffer, reduced, divided by ``divisor`` (SUM then divide: gloo has
    no AVG reduction), copied back; a collective's fixed cost paid once, not per tensor.
    A group of one rank is not reduced (the divisor still applies). Every rank must pass
    the same tensors in the same order."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    reduce = dist.get_world_size(group) > 1
    for dtype in dict.fromkeys(g.dtype for g in grads):
        same = [g for g in grads if g.dtype == dtype]
        flat = _flatten_dense_tensors(same)
        if reduce:
            dist.all_reduce(flat, group=group)
        if divisor != 1:
            flat.div_(divisor)
        for g, reduced in zip(same, _unflatten_dense_tensors(flat, same)):
            g.copy_(reduced)


def _fsdp(model: DecoderLM, mesh: Any, precision: str, reshard: bool, offload: bool = False) -> None:
    """FSDP2 over ``mesh``: a 1-D mesh shards over all its ranks; a 2-D (replicate,
    shard) mesh is HSDP. ``offload``: CPUOffloadPolicy (parameters, gradients and the
    optimizer step on the host; each use copies to the device)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mp = fsdp_mp_policy(precision)
    # Pinned host memory needs an accelerator (torch refuses it on CPU-only ranks, where
    # the offloaded states stay where they are anyway).
    kw = {"offload_policy": CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if offload else OffloadPolicy()}
    for key in block_keys(model):
        fully_shard(model.blocks[key], mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, **kw)
    # The root holds embedding, final norm and head; it is resharded only at the end.
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, **kw)


def _finish_module(model: DecoderLM, cfg: RunConfig) -> None:
    """Checkpointing, then compilation: after tensor parallelism, before FSDP/DDP
    (the order torchtitan uses, so each wrapper sees the module it expects)."""
    apply_activation_checkpointing(model, cfg.activation_checkpointing)
    if cfg.compile:
        apply_compile(model)


def register_compression(ddp_model: nn.Module, kind: str, rank: int) -> None:
    """DDP communication hooks that compress gradients before the all-reduce: fp16 / bf16
    casts, or PowerSGD (Vogels et al. 2019) with a rank-``rank`` approximation and error
    feedback, switched on from the second step (torch's default waits 1,000 steps)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    if kind == "fp16":
        ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif kind == "bf16":
        ddp_model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif kind == "powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                                   min_compression_rate=1.0)
        ddp_model.register_comm_hook(state, psgd.powerSGD_hook)
    else:
        raise ValueError(kind)


def _bucket_cap_mb(cfg: RunConfig, model: nn.Module, device: torch.device) -> float | None:
    """DDP's gradient bucket size: torch's default (None) except for PowerSGD on gloo.

    PowerSGD runs a chain of all-reduces per bucket, each started from the previous one's
    completion callback. Gloo runs those callbacks on its own threads, so with several
    buckets the chains interleave in a different order on each rank and gloo aborts with a
    size mismatch (seen here: SIGABRT with 2 ranks and a 3M-parameter model; a model that
    fits one bucket ran clean). One bucket holding every gradient leaves one chain per step.
    NCCL enqueues on one stream per communicator and is left at the default."""
    if cfg.grad_compression != "powersgd" or device.type != "cpu":
        return None
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20 + 1


def _data_parallel(strategy: str, model: DecoderLM, device: torch.device, precision: str,
                   bucket_cap_mb: float | None = None, replicas: int = 1, offload: bool = False) -> Prepared:
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    scaler = None
    if strategy in ("single", "ddp", "zero1"):
        model = place(model, device)
        wrapped: nn.Module = model
        if strategy in ("ddp", "zero1"):
            kw = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
            wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kw)
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
                wrapped.parameters(), optimizer_class=torch.optim.AdamW, **optimizer_kw(device)
            )
        else:
            opt = make_optimizer(wrapped.parameters(), device)
        if precision == "fp16":
            scaler = LossScaler(device)

        def no_sync(last: bool) -> ContextManager[Any]:
            if last or strategy == "single":
                return contextlib.nullcontext()
            return wrapped.no_sync()

        size = 1 if strategy == "single" else world
        return Prepared(wrapped, opt, scaler, no_sync, dp_rank=rank if size > 1 else 0, dp_size=size,
                        loss_weight=1.0 / size, modules=[wrapped])

    model = place(model, device)
    # An explicit mesh of the device type: on CPU this is what lets FSDP2 use gloo. HSDP:
    # replicas x shard, rank-major, so a shard group is neighbouring ranks (one node first).
    mesh = (device_mesh(device, (replicas, world // replicas), ("replicate", "shard")) if strategy == "hsdp"
            else device_mesh(device, (world,)))
    _fsdp(model, mesh, precision, reshard=(strategy != "fsdp_grad_op"), offload=offload)
    # Offloaded parameters live on the host: so does their optimizer step.
    opt = make_optimizer(model.parameters(), torch.device("cpu") if offload else device,
                         sharded_fp16=precision == "fp16")
    if precision == "fp16":
        # Gradients are shards: every rank must agree on whether a step overflowed.
        scaler = LossScaler(device, sharded=True)
    return Prepared(model, opt, scaler, _fsdp_no_sync(model), dp_rank=rank, dp_size=world,
                    loss_weight=1.0 / world, modules=[model])


class LossScaler:
    """fp16 loss scaling for every strategy: torch's GradScaler, or, where ranks hold
    different gradients (shards, tensor-parallel pieces, pipeline stages), its
    ShardedGradScaler, which all-reduces found-inf over every rank so that all of them
    skip an overflowing step together and keep one scale. Adds what the strategies need
    beyond torch's scalers:

    - a scale from the start on every rank (``sharded``): torch creates it in the first
      ``scale()`` call, and a pipeline rank without the last stage never scales a loss
      itself (its gradients arrive already scaled from the next stage), so its first
      ``step`` would fail with "_scale is None";
    - ``mixed``: under tensor parallelism the gradients mix DTensors with plain tensors
      (norms are not parallelised) and torch's unscale kernel refuses such a list;
      unscale and step then run under DTensor's implicit replication, which treats the
      plain tensors as replicated (they are: every tensor-parallel rank holds them whole).
    """

    def __init__(self, device: torch.device, sharded: bool = False, mixed: bool = False) -> None:
        if sharded:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.inner: Any = ShardedGradScaler(device.type)  # found-inf agreed over the default group
            self.inner.scale(torch.ones((), device=device))  # creates the scale on this rank now
        else:
            self.inner = torch.amp.GradScaler(device.type)
        self.mixed = mixed

    def _replicating(self) -> ContextManager[Any]:
        if not self.mixed:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import implicit_replication

        stack = contextlib.ExitStack()
        stack.enter_context(implicit_replication())
        # torch's own found-inf flag has shape (1,), which DTensor warns about when it
        # replicates it: nothing mgbench can change, said once per step otherwise.
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")
        return stack

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (what backward runs on)."""
        return self.inner.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale now (and record overflow)."""
        with self._replicating():
            self.inner.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale if not yet done, then step unless a gradient overflowed."""
        with self._replicating():
            self.inner.step(optimizer)

    def update(self) -> None:
        """Grow or back off the scale after a step."""
        self.inner.update()

    def get_scale(self) -> float:
        return float(self.inner.get_scale())


# One device mesh per (device type, shape, dim names) for the life of the process group:
# init_device_mesh creates new process groups (NCCL communicators on GPUs) for its
# dimensions every call, and a sweep builds one model per config.
_MESHES: dict[tuple[Any, ...], Any] = {}


_MESHES_WORLD: list[Any] = [None]  # the default group the cached meshes belong to


def device_mesh(device: torch.device, shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
    """The device mesh of this layout, built once per process group and reused by every
    config with the same layout (a new default group, after destroy and init, starts
    a new cache: meshes hold groups of the old one)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.group.WORLD
    if _MESHES_WORLD[0] is not world:
        _MESHES.clear()
        _MESHES_WORLD[0] = world
    key = (device.type, tuple(shape), names)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device.type, tuple(shape), mesh_dim_names=names)
    return _MESHES[key]


def _fsdp_no_sync(model: nn.Module) -> Callable[[bool], ContextManager[Any]]:
    @contextlib.contextmanager
    def no_sync(last: bool):  # type: ignore[no-untyped-def]
        model.set_requires_gradient_sync(last)
        yield

    return no_sync
