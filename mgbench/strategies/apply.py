"""Turn a freshly built model into a trained-under-strategy model + optimizer.

Every strategy here is data parallel over all ranks: rank r holds micro-batches
r * grad_accum ... of each global batch. What differs is what each rank stores and
which collectives run (see the registry in :mod:`mgbench.strategies`). The pieces they
are made of live in strategies/pieces.py.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from ..config import RunConfig
from ..workloads.gpt import DecoderLM
from .pieces import (LossScaler, Prepared, _bucket_cap_mb, _data_parallel, _finish_module, _fsdp, _fsdp_no_sync,
                     device_mesh, make_optimizer, place, register_compression)
from . import BY_NAME


def builder(strategy: str) -> Callable[..., Prepared]:
    """The function of this module that builds ``strategy`` (the registry names it)."""
    return globals()[BY_NAME[strategy].prepare]


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


def prepare_reference(cfg: RunConfig, device: torch.device) -> Prepared:
    """The single-process reference: same seed and weights, no wrapper, no checkpointing
    or compilation (neither changes the mathematics); fp8 weights cast to float8 from the
    precision the config's strategy casts them from (:func:`_converted`)."""
    model = _converted(cfg, build_model(cfg), reference=True)
    return _with_moe(_data_parallel("single", model, device, cfg.precision))


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
