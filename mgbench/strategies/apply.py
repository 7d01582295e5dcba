"""Turn a freshly built model into a trained-under-strategy model + optimizer.

Every strategy here is data parallel over all ranks: rank r holds micro-batches
r * grad_accum ... of each global batch. What differs is what each rank stores and
which collectives run (see the registry in :mod:`mgbench.strategies`).
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


def apply_compile(model: DecoderLM) -> None:
    """Compile each block separately (as torchtitan does): smaller graphs, and FSDP
    hooks stay between them."""
    for key in block_keys(model):
        model.blocks[key].compile()


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


def build_model(cfg: RunConfig) -> DecoderLM:
    """The full model with the config's seed: identical on every rank and in the reference."""
    torch.manual_seed(cfg.seed)
    from ..workloads import implementation

    impl = implementation(cfg)  # a Hugging Face or vision model (workloads/); None: the DecoderLM
    if impl is not None:
        return impl.build(cfg)
    model = DecoderLM(cfg.shape, max_seq_len=cfg.seq_len)
    if cfg.shape.is_moe:
        from ..workloads.moe import configure

        configure(model, cfg.moe_capacity_factor, cfg.moe_aux_loss_coef)  # routing keys of the config
    return model


def prepare(cfg: RunConfig, device: torch.device) -> Prepared:
    """Build the config's model and wrap it for its strategy and layout."""
    from . import builder

    return _with_moe(builder(cfg.strategy)(cfg, _converted(cfg, build_model(cfg)),
                                           device))


def _with_moe(prep: Prepared) -> Prepared:
    """``prep`` with its MoE layers listed (none for a dense model)."""
    from ..workloads.moe import moe_layers

    prep.moe_layers = list(moe_layers(prep.modules))
    return prep


def _converted(cfg: RunConfig, model: nn.Module, reference: bool = False) -> nn.Module:
    """The model with fp8's float8 linears swapped in (precision = "fp8"), else as built.
    Before any wrapper, as torchtitan orders it: FSDP2 then shards the float8 weights
    (fp8.sharded: tensorwise all-gathers them in float8). ``reference``: the one-process
    reference of ``cfg``, whose float8 weights are cast from bf16 where the config's FSDP2
    all-gathers them in bf16 (fp8.weights_cast_from_gathered)."""
    if cfg.precision == "fp8":
        from . import fp8

        fp8.convert(model, cfg.fp8_recipe, fsdp=not reference and fp8.sharded(cfg),
                    gathered_weights=reference and fp8.weights_cast_from_gathered(cfg))
    return model


def data_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """single, ddp, zero1, fsdp, fsdp_grad_op: every rank holds (a shard of) the whole model."""
    _finish_module(model, cfg)
    prep = _data_parallel(cfg.strategy, model, device, cfg.precision, _bucket_cap_mb(cfg, model, device),
                          replicas=cfg.replicas, offload=cfg.offload)
    if cfg.grad_compression != "none":
        register_compression(prep.model, cfg.grad_compression, cfg.powersgd_rank)
    return prep


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


def prepare_reference(cfg: RunConfig, device: torch.device) -> Prepared:
    """The single-process reference: same seed and weights, no wrapper, no checkpointing
    or compilation (neither changes the mathematics); fp8 weights cast to float8 from the
    precision the config's strategy casts them from (:func:`_converted`)."""
    model = _converted(cfg, build_model(cfg), reference=True)
    return _with_moe(_data_parallel("single", model, device, cfg.precision))


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


def nd_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """tp, tp_sp, pp, fsdp+tp and pp+tp+dp on a (pp, dp, tp) device mesh."""
    from ..workloads import HFModel, hf_tp
    from .pipeline import build_schedule, stage_module
    from .schedules import grad_sync_of, rank_chunks
    from .tensor_parallel import apply_tensor_parallel

    # A Hugging Face model splits by its own plan (workloads/hf_tp.py).
    split = hf_tp.apply_tensor_parallel if isinstance(cfg.model, HFModel) else apply_tensor_parallel
    use_fsdp = cfg.strategy == "fsdp+tp" or (cfg.strategy == "pp+tp+dp" and cfg.dp_mode in ("fsdp", "hsdp"))
    if cfg.strategy == "pp+tp+dp" and cfg.dp_mode == "hsdp":
        # dp split into replicas x shard: FSDP2 shards within dp_shard and all-reduces
        # across dp_replicate. The data-parallel rank is the flattened (replicate, shard)
        # index, the same rank order as the 1-D dp dimension of the other modes.
        shard = cfg.dp // cfg.replicas
        mesh = device_mesh(device, (cfg.pp, cfg.replicas, shard, cfg.tp), ("pp", "dp_replicate", "dp_shard", "tp"))
        dp_mesh = mesh["dp_replicate", "dp_shard"]
        dp_rank = mesh.get_local_rank("dp_replicate") * shard + mesh.get_local_rank("dp_shard")
    else:
        mesh = device_mesh(device, (cfg.pp, cfg.dp, cfg.tp), ("pp", "dp", "tp"))
        dp_mesh, dp_rank = mesh["dp"], mesh.get_local_rank("dp")
    pp_rank = mesh.get_local_rank("pp")
    sequence_parallel = cfg.strategy == "tp_sp"
    # How the pipeline's replicas reduce gradients (schedules.GRAD_SYNC): the split-backward
    # schedules need stages FSDP keeps unsharded from forward to backward, or no DDP wrapper.
    sync = grad_sync_of(cfg)
    if cfg.pipelined:
        # The schedule registry places the chunks (loop or V; strategies/schedules.py).
        chunk_ids = rank_chunks(cfg.pp_schedule, pp_rank, cfg.pp, cfg.virtual_stages)
        num_chunks = cfg.pp * len(chunk_ids)
        # A model per chunk, cut to its blocks. The others are built again (seeded: the
        # same weights), not deep-copied: torch's deepcopy of fake tensors (memory --trace)
        # reads their data pointers, which torch calls undefined behaviour, and it corrupted
        # the heap (a crash at exit after interleaved, zbv and dualpipev traces).
        models = [model] + [_converted(cfg, build_model(cfg)) for _ in chunk_ids[1:]]
        modules = [stage_module(m, c, num_chunks) for m, c in zip(models, chunk_ids)]
    else:
        num_chunks, chunk_ids, modules = 1, [0], [model]
    wrapped = []
    for mod in modules:
        place(mod, device)
        if cfg.tp > 1:
            split(mod, mesh["tp"], sequence_parallel)
        _finish_module(mod, cfg)
        if cfg.dp > 1 and use_fsdp:
            # Split backward: torch's input pass (pipelining/_backward.py, stage_backward_input)
            # collects the weights' gradient edges from the stage's parameters as registered
            # when it starts. A block FSDP resharded after forward registers its sharded
            # parameters then, which the forward's graph never used: their weight
            # gradients are silently never computed (grad norm 30% low, pp 2 x dp 2).
            _fsdp(mod, dp_mesh, cfg.precision, reshard=sync != "fsdp_reduce_grad_unsharded")
        elif cfg.dp > 1 and sync == "allreduce_after_schedule":
            pass  # reduced by mean_allreduce below, not by a wrapper whose hooks the weight pass bypasses
        elif cfg.dp > 1:
            from .pipeline import ddp_stage

            mod = ddp_stage(mod, mesh["dp"].get_group(), device)  # armed by the schedule only: see ddp_stage
        wrapped.append(mod)
    params = [p for m in wrapped for p in m.parameters()]
    opt = make_optimizer(params, device, sharded_fp16=cfg.precision == "fp16")
    scaler = None
    if cfg.precision == "fp16":
        from torch.distributed.tensor import DTensor

        # Every rank holds different gradients (pieces, shards or stages): found-inf is
        # agreed over all of them. Tensor parallelism without FSDP leaves some
        # parameters plain tensors beside the DTensors.
        kinds = {isinstance(p, DTensor) for p in params}
        scaler = LossScaler(device, sharded=True, mixed=len(kinds) > 1)
    holder = (num_chunks - 1) in chunk_ids
    weight = (1.0 / (cfg.dp * cfg.tp)) if holder else 0.0
    if not cfg.pipelined:
        root = wrapped[0]
        no_sync = _fsdp_no_sync(root) if use_fsdp and cfg.dp > 1 else (lambda last: contextlib.nullcontext())
        return Prepared(root, opt, scaler, no_sync, dp_rank=dp_rank, dp_size=cfg.dp, loss_weight=weight,
                        modules=wrapped)

    from torch.distributed.pipelining import PipelineStage

    from .pipeline import StageLoss

    group = mesh["pp"].get_group()
    stages = [PipelineStage(m, c, num_chunks, device, group=group) for m, c in zip(wrapped, chunk_ids)]
    # The schedule calls the loss itself: fp16 scaling happens inside it (StageLoss).
    loss = StageLoss(scaler)
    sched = build_schedule(cfg.pp_schedule, stages, cfg.grad_accum, loss)
    reduce = None
    if sync == "allreduce_after_schedule":
        from .pipeline import mean_allreduce

        reduce = mean_allreduce(wrapped, mesh["dp"].get_group())
    return Prepared(wrapped[0], opt, scaler, lambda last: contextlib.nullcontext(), dp_rank=dp_rank,
                    dp_size=cfg.dp, loss_weight=weight, schedule=sched, is_first=0 in chunk_ids,
                    is_last=holder, modules=wrapped, stage_loss=loss, reduce_grads=reduce)


def context_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """cp: see strategies/context_parallel.py."""
    from .context_parallel import prepare_context_parallel

    return prepare_context_parallel(cfg, model, device)


def expert_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """ep and fsdp+ep (MoE models): see strategies/expert_parallel.py."""
    from .expert_parallel import prepare_expert_parallel

    return prepare_expert_parallel(cfg, model, device)
