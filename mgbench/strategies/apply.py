"""Turn a freshly built model into a trained-under-strategy model + optimizer.

Every strategy here is data parallel over all ranks: rank r holds micro-batches
r * grad_accum ... of each global batch. What differs is what each rank stores and
which collectives run (see the registry in :mod:`mgbench.strategies`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import RunConfig
from ..workloads.gpt import DecoderLM

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# AdamW settings of the benchmark. Values from common LM practice (GPT-3 / Llama):
# they matter only in that every strategy and the reference use the same ones.
OPTIMIZER_KW: dict[str, Any] = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}


class Checkpointed(nn.Module):
    """Recompute a block's activations in backward instead of storing them."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, *args, use_reentrant=False)


def apply_activation_checkpointing(model: DecoderLM, mode: str) -> None:
    """none; every_2nd = every second block (torchtitan's layer-wise selective AC with
    frequency 2); full = every block."""
    if mode == "none":
        return
    every = {"every_2nd": 2, "full": 1}[mode]
    for i, key in enumerate(list(model.blocks.keys())):
        if i % every == 0:
            model.blocks[key] = Checkpointed(model.blocks[key])


def apply_compile(model: DecoderLM) -> None:
    """Compile each block separately (as torchtitan does): smaller graphs, and FSDP
    hooks stay between them."""
    for key in list(model.blocks.keys()):
        model.blocks[key].compile()


@dataclass
class Prepared:
    """A model ready to train under a strategy, and what the training step needs to know."""

    model: nn.Module  # the wrapped model; for pipelines, this rank's first stage module
    optimizer: torch.optim.Optimizer
    scaler: Any  # GradScaler or None
    no_sync: Callable[[bool], ContextManager[Any]]  # no_sync(is_last_micro_step)
    dp_rank: int = 0
    dp_size: int = 1
    loss_weight: float = 1.0  # this rank's share when summing losses over all ranks
    schedule: Any = None  # pipeline schedule (None: not pipelined)
    is_first: bool = True  # holds the pipeline's first chunk (feeds the tokens)
    is_last: bool = True  # holds the last chunk (computes the loss)
    modules: list[nn.Module] = field(default_factory=list)


def _fsdp(model: DecoderLM, mesh: Any, precision: str, reshard: bool) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = AUTOCAST_DTYPES[precision]
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
    for block in model.blocks.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    # The root holds embedding, final norm and head; it is resharded only at the end.
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)


def _finish_module(model: DecoderLM, cfg: RunConfig) -> None:
    """Checkpointing, then compilation: after tensor parallelism, before FSDP/DDP
    (the order torchtitan uses, so each wrapper sees the module it expects)."""
    apply_activation_checkpointing(model, cfg.activation_checkpointing)
    if cfg.compile:
        apply_compile(model)


def build_model(cfg: RunConfig) -> DecoderLM:
    """The full model with the config's seed: identical on every rank and in the reference."""
    torch.manual_seed(cfg.seed)
    return DecoderLM(cfg.shape, max_seq_len=cfg.seq_len)


def prepare(cfg: RunConfig, device: torch.device) -> Prepared:
    """Build the config's model and wrap it for its strategy and layout."""
    from . import builder

    return builder(cfg.strategy)(cfg, build_model(cfg), device)


def data_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """single, ddp, zero1, fsdp, fsdp_grad_op: every rank holds (a shard of) the whole model."""
    _finish_module(model, cfg)
    prep = _data_parallel(cfg.strategy, model, device, cfg.precision, _bucket_cap_mb(cfg, model, device))
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
    or compilation (neither changes the mathematics)."""
    return _data_parallel("single", build_model(cfg), device, cfg.precision)


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
                   bucket_cap_mb: float | None = None) -> Prepared:
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    scaler = None
    if strategy in ("single", "ddp", "zero1"):
        model = model.to(device)
        wrapped: nn.Module = model
        if strategy in ("ddp", "zero1"):
            kw = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
            wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kw)
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
                wrapped.parameters(), optimizer_class=torch.optim.AdamW, **OPTIMIZER_KW
            )
        else:
            opt = torch.optim.AdamW(wrapped.parameters(), **OPTIMIZER_KW)
        if precision == "fp16":
            scaler = torch.amp.GradScaler(device.type)

        def no_sync(last: bool) -> ContextManager[Any]:
            if last or strategy == "single":
                return contextlib.nullcontext()
            return wrapped.no_sync()

        size = 1 if strategy == "single" else world
        return Prepared(wrapped, opt, scaler, no_sync, dp_rank=rank if size > 1 else 0, dp_size=size,
                        loss_weight=1.0 / size, modules=[wrapped])

    from torch.distributed.device_mesh import init_device_mesh

    model = model.to(device)
    # An explicit mesh of the device type: on CPU this is what lets FSDP2 use gloo.
    _fsdp(model, init_device_mesh(device.type, (world,)), precision, reshard=(strategy == "fsdp"))
    opt = torch.optim.AdamW(model.parameters(), **OPTIMIZER_KW)
    if precision == "fp16":
        scaler = _sharded_scaler(device)
    return Prepared(model, opt, scaler, _fsdp_no_sync(model), dp_rank=rank, dp_size=world,
                    loss_weight=1.0 / world, modules=[model])


def _sharded_scaler(device: torch.device) -> Any:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    # Gradients are shards: found-inf must be agreed across ranks, which the sharded
    # scaler does with an all-reduce.
    return ShardedGradScaler(device.type)


def _fsdp_no_sync(model: nn.Module) -> Callable[[bool], ContextManager[Any]]:
    @contextlib.contextmanager
    def no_sync(last: bool):  # type: ignore[no-untyped-def]
        model.set_requires_gradient_sync(last)
        yield

    return no_sync


def nd_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """tp, tp_sp, pp, fsdp+tp and pp+tp+dp on a (pp, dp, tp) device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    from .pipeline import schedule_class, stage_module
    from .tensor_parallel import apply_tensor_parallel

    mesh = init_device_mesh(device.type, (cfg.pp, cfg.dp, cfg.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    use_fsdp = cfg.strategy == "fsdp+tp" or (cfg.strategy == "pp+tp+dp" and cfg.dp_mode == "fsdp")
    sequence_parallel = cfg.strategy == "tp_sp"
    if cfg.pipelined:
        v = cfg.virtual_stages if cfg.pp_schedule == "interleaved" else 1
        num_chunks = cfg.pp * v
        chunk_ids = [pp_rank + k * cfg.pp for k in range(v)]
        modules = [stage_module(model, c, num_chunks, copy_model=v > 1) for c in chunk_ids]
    else:
        num_chunks, chunk_ids, modules = 1, [0], [model]
    wrapped = []
    for mod in modules:
        mod.to(device)
        if cfg.tp > 1:
            apply_tensor_parallel(mod, mesh["tp"], sequence_parallel)
        _finish_module(mod, cfg)
        if cfg.dp > 1 and use_fsdp:
            _fsdp(mod, mesh["dp"], cfg.precision, reshard=True)
        elif cfg.dp > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            mod = DDP(mod, process_group=mesh["dp"].get_group(),
                      device_ids=[device.index] if device.type == "cuda" else None)
        wrapped.append(mod)
    params = [p for m in wrapped for p in m.parameters()]
    opt = torch.optim.AdamW(params, **OPTIMIZER_KW)
    scaler = None
    if cfg.precision == "fp16":
        scaler = _sharded_scaler(device) if cfg.tp > 1 or use_fsdp else torch.amp.GradScaler(device.type)
    holder = (num_chunks - 1) in chunk_ids
    weight = (1.0 / (cfg.dp * cfg.tp)) if holder else 0.0
    if not cfg.pipelined:
        root = wrapped[0]
        no_sync = _fsdp_no_sync(root) if use_fsdp and cfg.dp > 1 else (lambda last: contextlib.nullcontext())
        return Prepared(root, opt, scaler, no_sync, dp_rank=dp_rank, dp_size=cfg.dp, loss_weight=weight,
                        modules=wrapped)

    from torch.distributed.pipelining import PipelineStage

    from ..workloads.gpt import lm_loss

    group = mesh["pp"].get_group()
    stages = [PipelineStage(m, c, num_chunks, device, group=group) for m, c in zip(wrapped, chunk_ids)]
    cls = schedule_class(cfg.pp_schedule)
    sched = cls(stages if cfg.pp_schedule == "interleaved" else stages[0], n_microbatches=cfg.grad_accum,
                loss_fn=lm_loss)
    return Prepared(wrapped[0], opt, scaler, lambda last: contextlib.nullcontext(), dp_rank=dp_rank,
                    dp_size=cfg.dp, loss_weight=weight, schedule=sched, is_first=0 in chunk_ids,
                    is_last=holder, modules=wrapped)
