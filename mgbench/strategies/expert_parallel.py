"""Expert parallelism for MoE models: strategies ``ep`` and ``fsdp+ep``.

The dp ranks are split into groups of ``ep`` neighbours (ranks g*ep ... g*ep + ep - 1);
each group holds every expert once, rank i of a group experts [i E/ep, (i+1) E/ep) of
every MoE layer. The dp / ep groups are replicas of one another: rank i of every group
holds the same experts, and these ranks (the "expert data-parallel" group) reduce those
experts' gradients. Everything else (attention, norms, router, shared experts,
embedding, head) is data parallel over every rank: DDP (``ep``) or FSDP2 (``fsdp+ep``).

In each MoE layer a rank routes its own tokens (workloads/moe.py), then sends each
routed token to the rank of its group holding the chosen expert and gets the expert's
output back: two uneven ``all_to_all_single`` calls forward (and two backward), the
per-peer counts exchanged first by an even one (gloo and NCCL both run it).

Gradients. Every rank's loss is its own tokens' mean; the global loss is their mean over
all W ranks, so every gradient must be (1/W) sum over ranks. A non-expert weight gets
that from DDP / FSDP (mean over W). An expert's copy on rank q receives, through the
all-to-all's backward, the gradient sum_r dL_r / dw over the ranks r of q's ep group;
summing that over q's expert data-parallel group (the dp / ep ranks sharing the expert)
covers every rank once, and dividing by W gives the mean. Reducing over the ep group
instead would add gradients of different experts.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn

from ..config import RunConfig
from ..runner.fingerprint import EXPERT_SHARDS_ATTR
from ..workloads.gpt import DecoderLM
from ..workloads.moe import Experts, moe_layers
from .pieces import (LossScaler, Prepared, _finish_module, _fsdp, _fsdp_no_sync, allreduce_flat, device_mesh,
                    fsdp_mp_policy, make_optimizer, place)


class _AllToAll(torch.autograd.Function):
    """Differentiable uneven all_to_all_single: rows split by ``send`` go out, rows split
    by ``recv`` come in; backward sends the gradients the opposite way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = grad.new_empty((sum(ctx.send),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv,
                               group=ctx.group)
        return out, None, None, None


class Dispatch:
    """Token dispatch and combine of one MoE layer over an ep group (set as MoE.dispatch)."""

    def __init__(self, group: Any, ep: int, local_experts: int) -> None:
        self.group, self.ep, self.local = group, ep, local_experts

    def __call__(self, rows: torch.Tensor, counts: torch.Tensor, experts: Experts) -> torch.Tensor:
        """``rows`` sorted by global expert id with ``counts`` (E,) per expert -> the
        experts' outputs in the same order."""
        ep, local = self.ep, self.local
        send_counts = counts.view(ep, local)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts.contiguous(), group=self.group)  # counts first
        send, recv = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
        got = _AllToAll.apply(rows, send, recv, self.group)  # by source rank, then local expert
        # Regroup by local expert (stable: sources in rank order within each expert).
        expert_of_row = torch.repeat_interleave(torch.arange(local, device=rows.device).repeat(ep),
                                                recv_counts.flatten())
        order = torch.argsort(expert_of_row, stable=True)
        out = experts(got[order], recv_counts.sum(0))
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return _AllToAll.apply(out[back], recv, send, self.group)


def shard_experts(model: nn.Module, ep_rank: int, ep: int, group: Any) -> None:
    """Keep this rank's slice of every MoE layer's experts (every rank built the whole,
    identical model from the config's seed) and route its tokens through ``group``."""
    for layer in moe_layers([model]):
        experts = layer.experts
        local = layer.num_experts // ep
        lo = ep_rank * local
        for name in ("w1", "w3", "w2"):
            full = getattr(experts, name)
            setattr(experts, name, nn.Parameter(full.detach()[lo:lo + local].clone()))
        layer.dispatch = Dispatch(group, ep, local)


def _tag_expert_params(model: nn.Module, ep: int) -> list[nn.Parameter]:
    """Mark expert weights as one of ``ep`` slices (the correctness fingerprint counts each
    slice once); returns them."""
    params = [p for layer in moe_layers([model]) for p in layer.experts.parameters()]
    for p in params:
        setattr(p, EXPERT_SHARDS_ATTR, ep)
    return params


class ExpertGradSync:
    """``ep`` with DDP: expert gradients summed over the expert data-parallel group and
    divided by the world size, in the backward of each step's last micro-batch (DDP
    reduces the other weights in the same backward). ``no_sync(last)`` is the strategy's.

    The gradients are reduced together, as one flat all-reduce queued to run when the
    backward ends, not one blocking all-reduce per expert weight as each gradient lands:
    a collective's fixed cost (tens to hundreds of microseconds on gloo) is paid once
    per step instead of once per weight (3 per expert per MoE layer). Like DDP's last
    bucket, it does not overlap the backward."""

    def __init__(self, params: list[nn.Parameter], group: Any, world: int,
                 ddp_no_sync: Callable[[], ContextManager[Any]]) -> None:
        self.group, self.world, self.sync = group, world, True
        self._ddp_no_sync = ddp_no_sync
        self._ready: list[torch.Tensor] = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._collect)

    def _collect(self, p: torch.Tensor) -> None:
        if not self.sync or p.grad is None:
            return
        if not self._ready:  # the first expert gradient of this backward
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_all)
        self._ready.append(p.grad)

    def _reduce_all(self) -> None:
        grads, self._ready = self._ready, []
        allreduce_flat(grads, self.group, divisor=self.world)  # a group of one (edp = 1): divided only

    def no_sync(self, last: bool) -> ContextManager[Any]:
        # Read in the backward that follows this forward (train_step runs backward
        # after leaving the context).
        self.sync = last
        return contextlib.nullcontext() if last else self._ddp_no_sync()


def prepare_expert_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """``ep`` / ``fsdp+ep`` on every rank: shard the experts, wrap the rest."""
    world, rank = dist.get_world_size(), dist.get_rank()
    ep = cfg.ep
    edp = cfg.dp // ep
    mesh = device_mesh(device, (edp, ep), ("edp", "ep"))
    shard_experts(model, mesh.get_local_rank("ep"), ep, mesh["ep"].get_group())
    place(model, device)
    _finish_module(model, cfg)
    if cfg.strategy == "fsdp+ep":
        from torch.distributed.fsdp import fully_shard

        mp = fsdp_mp_policy(cfg.precision)
        for layer in moe_layers([model]):
            # The experts first, over the ranks sharing them: the blocks' FSDP units below
            # then leave their parameters alone. FSDP averages over those dp / ep ranks; the
            # mean over all W = (dp / ep) x ep ranks needs a further 1 / ep (see the module
            # docstring), applied to the gradient in backward: FSDP2's own divide factor
            # (set_gradient_divide_factor) reduces with PREMUL_SUM, which gloo lacks.
            layer.experts.grad_scale = 1.0 / ep
            fully_shard(layer.experts, mesh=mesh["edp"], reshard_after_forward=True, mp_policy=mp)
        _fsdp(model, device_mesh(device, (world,)), cfg.precision, reshard=True)
        _tag_expert_params(model, ep)
        opt = make_optimizer(model.parameters(), device, sharded_fp16=cfg.precision == "fp16")
        scaler = LossScaler(device, sharded=True) if cfg.precision == "fp16" else None
        return Prepared(model, opt, scaler, _fsdp_no_sync(model), dp_rank=rank, dp_size=world,
                        loss_weight=1.0 / world, modules=[model])

    from torch.nn.parallel import DistributedDataParallel as DDP

    experts = _tag_expert_params(model, ep)
    expert_ids = {id(p) for p in experts}
    ignored = [name for name, p in model.named_parameters() if id(p) in expert_ids]
    DDP._set_params_and_buffers_to_ignore_for_model(model, ignored)  # reduced by ExpertGradSync instead
    wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    sync = ExpertGradSync(experts, mesh["edp"].get_group(), world, wrapped.no_sync)
    opt = make_optimizer(wrapped.parameters(), device)
    # Expert gradients differ between ranks: found-inf is agreed over all of them.
    scaler = LossScaler(device, sharded=True) if cfg.precision == "fp16" else None
    return Prepared(wrapped, opt, scaler, sync.no_sync, dp_rank=rank, dp_size=world, loss_weight=1.0 / world,
                    modules=[wrapped])
