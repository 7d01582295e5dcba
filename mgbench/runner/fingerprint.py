"""Global L2 norms of a model's weights or gradients, however a strategy spreads them.

Every rank holds some tensors of the model: a full replica (DDP, ZeRO-1, plain
parameters of a tensor-parallel block), a shard (FSDP2 and tensor-parallel DTensors),
or nothing of a pipeline stage it does not run. The norm of the whole model counts every
element once. Rank r adds, for each of its tensors, the squared norm of its local piece
times ``pieces / stage_ranks`` and the sum runs over all ranks:

- ``pieces``: into how many distinct pieces the tensor is cut, the product of the mesh
  sizes of its non-Replicate placements (1 for a plain tensor or a replicated DTensor);
- ``stage_ranks``: how many ranks hold some piece of the tensor (world / pp: all ranks of
  one pipeline stage; all ranks when not pipelined).

Each distinct piece is held by stage_ranks / pieces ranks, so the weights add up to one
per piece. When replicas that should agree do not (a skipped gradient all-reduce), this
is the mean over replicas of their squared norms, which differs from the agreed value,
so the check still sees it. Squares are summed in float64 so the fingerprint adds no
rounding of its own.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

Piece = tuple[torch.Tensor, int]  # (this rank's local tensor, pieces the whole is cut into)
# Set on expert weights by expert parallelism (strategies/expert_parallel.py): the tensor
# is one of this many expert slices, a cut no placement shows (each rank holds a plain or
# FSDP-sharded tensor of its own experts).
EXPERT_SHARDS_ATTR = "_mgbench_expert_shards"


def _expert_shards(p: nn.Parameter) -> int:
    return getattr(p, EXPERT_SHARDS_ATTR, 1)


def unique_params(modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """Parameters of all of a rank's modules (pipeline chunks, or one wrapped model),
    each once (tied weights are one parameter)."""
    seen: set[int] = set()
    out = []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def local_piece(t: torch.Tensor) -> Piece:
    """This rank's piece of ``t`` and the number of distinct pieces ``t`` is cut into.

    A DTensor with a Partial placement (a gradient not yet reduced over that mesh
    dimension) is reduced first, which is a collective over its mesh: call this in the
    same tensor order on every rank of that mesh."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(t, DTensor):
        return t, 1
    if any(pl.is_partial() for pl in t.placements):
        t = t.redistribute(t.device_mesh, [Replicate() if pl.is_partial() else pl for pl in t.placements])
    # Every mesh dimension that does not replicate splits the tensor: Shard, and also
    # FSDP-over-TP's _StridedShard (which is neither a Shard nor is_shard() in torch 2.13).
    pieces = math.prod(t.device_mesh.size(i) for i, pl in enumerate(t.placements) if not pl.is_replicate())
    return t.to_local(), pieces


def sum_squares(pieces: Iterable[Piece], stage_ranks: int) -> torch.Tensor:
    """This rank's weighted share of the squared global norm (a float64 scalar)."""
    total: torch.Tensor | None = None
    for local, n in pieces:
        sq = local.detach().double().pow(2).sum() * (n / stage_ranks)
        total = sq if total is None else total + sq
    return total if total is not None else torch.zeros((), dtype=torch.float64)


def global_norms(per_quantity: Sequence[Iterable[Piece]], stage_ranks: int, distributed: bool,
                 device: torch.device) -> list[float]:
    """Global L2 norms of several quantities at once (one all-reduce for all of them).

    ``distributed``: sum the shares over every rank of the default process group (all
    ranks must call); False for the single-process reference, whose pieces are whole."""
    shares = torch.stack([sum_squares(q, stage_ranks).to(device) for q in per_quantity])
    if distributed:
        dist.all_reduce(shares)
    return [math.sqrt(max(float(v), 0.0)) for v in shares.cpu()]


def grad_pieces(params: Sequence[nn.Parameter]) -> list[Piece]:
    """Local pieces of the gradients (parameters without a gradient count as zero)."""
    return [_times(local_piece(p.grad), _expert_shards(p)) for p in params if p.grad is not None]


def param_pieces(params: Sequence[nn.Parameter]) -> list[Piece]:
    return [_times(local_piece(p.detach()), _expert_shards(p)) for p in params]


def _times(piece: Piece, shards: int) -> Piece:
    """A piece of a tensor that is itself one of ``shards`` expert slices."""
    return piece[0], piece[1] * shards


def snapshot(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """Copies of this rank's local pieces of the weights (for the change since init)."""
    return [local.detach().clone() for local, _ in param_pieces(params)]


def delta_pieces(params: Sequence[nn.Parameter], before: Sequence[torch.Tensor]) -> list[Piece]:
    """Local pieces of (weights now - weights at ``before``)."""
    return [(local.detach() - old, n) for (local, n), old in zip(param_pieces(params), before)]
