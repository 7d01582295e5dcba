"""Context parallelism (strategy ``cp``): each sample's sequence split over ``cp`` ranks.

Layout: ``dp x cp`` ranks, cp-minor (rank = dp_rank * cp + cp_rank), so the ranks sharing
a sample are neighbours (one node first). The dp ranks take different samples exactly as
data parallelism does; the cp ranks of a group take the same samples and different tokens.

Causal load balance (as Megatron-Core and torchtitan split it): the sequence is cut into
``2 cp`` equal chunks and cp rank r takes chunks r and 2cp-1-r, so every rank holds one
early and one late chunk and the causal attention work (which grows with position) is the
same on every rank. Rotary embeddings use the global positions of the local tokens.

Attention, the all-gather-KV form: each rank all-gathers K and V over its cp group (a
differentiable gather: backward returns to every rank the sum of the gradients all ranks
computed for its K and V, a reduce-scatter) and attends its local queries to the whole
sequence's K and V under the causal mask of its positions. SDPA with an explicit boolean
mask, not flex attention: flex attention runs on CPU only compiled (an inductor C++ build
per config and shape, seconds to minutes on a CI core), while SDPA with a mask runs eager
on CPU and CUDA alike. The mask is (local tokens x sequence) booleans, seq_len^2 / cp bytes
per rank: fine for a benchmark's sequence lengths, not for 128k tokens, where ring
attention (torch's ``context_parallel``, CUDA only) is what production uses. That form is
not wired here: it needs CUDA and could not be tested on this project's CPU machines.

Loss and gradients: every rank holds the same number of tokens (2 chunks of S / 2cp), so
the mean over all tokens of the batch is the mean of the ranks' own token means; DDP over
every rank (dp x cp) averages the gradients over the same ranks, and the gather's backward
routes each rank's loss gradient to the K and V that produced it, so the averaged gradient
is the full batch's (checked against the one-process reference by the correctness check).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..config import RunConfig
from ..workloads.gpt import Attention, DecoderLM
from .apply import LossScaler, Prepared, _finish_module, device_mesh, make_optimizer, place


def local_positions(seq_len: int, cp: int, cp_rank: int) -> list[int]:
    """Global positions of cp rank ``cp_rank``'s tokens, in its local order: chunks
    ``cp_rank`` and ``2 cp - 1 - cp_rank`` of the ``2 cp`` equal chunks of the sequence."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len {seq_len} is not divisible by 2 x cp = {2 * cp}")
    c = seq_len // (2 * cp)
    first, second = cp_rank, 2 * cp - 1 - cp_rank
    return list(range(first * c, (first + 1) * c)) + list(range(second * c, (second + 1) * c))


def causal_mask(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """(local tokens, seq_len) booleans, True where a local query may attend a key. The keys
    are in the order the all-gather returns them (cp rank 0's tokens, then rank 1's, ...),
    so the gathered K and V are used as they arrive, without reordering."""
    q = torch.tensor(local_positions(seq_len, cp, cp_rank))
    k = torch.tensor([p for r in range(cp) for p in local_positions(seq_len, cp, r)])
    return q[:, None] >= k[None, :]


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence dimension (2) over ``group``, differentiably: the
    backward is a reduce-scatter (gloo has none: an all-to-all of the gradient pieces,
    then their sum; NCCL runs reduce_scatter_tensor)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int) -> torch.Tensor:
        ctx.group, ctx.size = group, size
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        pieces = torch.stack(grad.chunk(ctx.size, dim=2)).contiguous()  # (cp, b, h, local, d)
        if dist.get_backend(ctx.group) == dist.Backend.NCCL:
            out = torch.empty_like(pieces[0])
            dist.reduce_scatter_tensor(out, pieces.flatten(0, 1), group=ctx.group)
            return out, None, None
        got = torch.empty_like(pieces)
        dist.all_to_all_single(got, pieces, group=ctx.group)  # piece j <- rank j's gradient of my K/V
        return got.sum(0), None, None


class GatheredAttention:
    """The attention of one rank under context parallelism (set as Attention.attend):
    local queries against the cp group's gathered K and V, causal by global position."""

    def __init__(self, group: Any, cp: int, mask: torch.Tensor) -> None:
        self.group, self.cp, self.mask = group, cp, mask

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k = _GatherSeq.apply(k, self.group, self.cp)
        v = _GatherSeq.apply(v, self.group, self.cp)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=k.shape[1] != q.shape[1])


class SequenceShard:
    """Prepared.shard_batch of a cp rank: its tokens (inputs and targets) of a micro-batch."""

    def __init__(self, index: torch.Tensor) -> None:
        self.index = index

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.index_select(1, self.index), y.index_select(1, self.index)


def shard_sequence(model: DecoderLM, seq_len: int, cp: int, cp_rank: int, group: Any,
                   device: torch.device) -> SequenceShard:
    """Make ``model`` (built whole, identical on every rank) compute this cp rank's tokens:
    rotary tables at their global positions, every attention layer gathering K and V over
    ``group``. Returns the batch splitter the training step applies."""
    index = torch.tensor(local_positions(seq_len, cp, cp_rank), device=device)
    model.positions = index
    attend = GatheredAttention(group, cp, causal_mask(seq_len, cp, cp_rank).to(device))
    for m in model.modules():
        if isinstance(m, Attention):
            m.attend = attend
    return SequenceShard(index)


def prepare_context_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """``cp`` on every rank: split the sequence over the cp group, DDP over every rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size()
    mesh = device_mesh(device, (cfg.dp, cfg.cp), ("dp", "cp"))
    cp_rank, dp_rank = mesh.get_local_rank("cp"), mesh.get_local_rank("dp")
    place(model, device)
    shard = shard_sequence(model, cfg.seq_len, cfg.cp, cp_rank, mesh["cp"].get_group(), device)
    _finish_module(model, cfg)
    wrapped: nn.Module = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = make_optimizer(wrapped.parameters(), device)
    # The cp ranks of a sample compute different tokens: found-inf is agreed over all ranks.
    scaler = LossScaler(device, sharded=True) if cfg.precision == "fp16" else None

    def no_sync(last: bool) -> Any:
        return contextlib.nullcontext() if last else wrapped.no_sync()

    return Prepared(wrapped, opt, scaler, no_sync, dp_rank=dp_rank, dp_size=cfg.dp, loss_weight=1.0 / world,
                    modules=[wrapped], shard_batch=shard)
