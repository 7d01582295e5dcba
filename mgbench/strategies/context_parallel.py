"""Context parallelism (strategy ``cp``): each sample's sequence split over ``cp`` ranks.

Layout: ``dp x cp`` ranks, cp-minor (rank = dp_rank * cp + cp_rank), so the ranks sharing
a sample are neighbours (one node first). The dp ranks take different samples exactly as
data parallelism does; the cp ranks of a group take the same samples and different tokens.

Causal load balance (as Megatron-Core and torchtitan split it): the sequence is cut into
``2 cp`` equal chunks and cp rank r takes chunks r and 2cp-1-r, so every rank holds one
early and one late chunk and the causal attention work (which grows with position) is the
same on every rank. This is the layout of torch's ``_HeadTailLoadBalancer``, the one its
ring attention's causal block logic assumes (checked in the tests and, before a ring run,
on the rank). Rotary embeddings use the global positions of the local tokens.

Attention, in one of two forms (config key ``cp_attention``; the record's
``cp_attention_impl`` and ``cp_attention_reason`` say which ran and why):

- ``ring_allgather`` / ``ring_alltoall``: torch's ring attention
  (``torch.distributed.tensor.experimental``, torch 2.13): each rank's q, k, v become
  DTensors sharded on the sequence (torch's ``_ContextParallel`` style, as torchtitan
  applies it) and SDPA on them is dispatched to the ring: blockwise flash / efficient /
  cuDNN attention over the K and V of every cp rank, merged by log-sum-exp, no mask
  materialised. K and V travel all-gathered once (``allgather``, torch's default) or rank
  to rank (``alltoall``); the gradients of K and V go back rank to rank. CUDA only: torch
  2.13 rings only those three CUDA kernels. CPU SDPA runs
  ``aten._scaled_dot_product_flash_attention_for_cpu``, for which it has no sharding rule
  (NotImplementedError, tried on gloo), and its math path fails on mixed DTensor and
  tensor operands. ``auto`` takes ``ring_allgather`` on CUDA where torch picks one of the
  three kernels for a rank's q, k, v.
- ``allgather_kv`` (CPU, and CUDA where the ring does not apply): each rank all-gathers K
  and V over its cp group (a differentiable gather: backward returns to every rank the
  sum of the gradients all ranks computed for its K and V, a reduce-scatter) and attends
  its local queries to the whole sequence's K and V with SDPA under an explicit causal
  mask of its positions. The mask is (local tokens x sequence) booleans, seq_len^2 / cp
  bytes per rank: fine for a benchmark's lengths, not for 128k tokens. Flex attention is
  no alternative on CPU: torch 2.13 refuses its backward there ("FlexAttention does not
  support backward on CPU", torch/nn/attention/flex_attention.py), so torch's flex
  context parallelism (the same all-gather with a block mask) can only run forward.

Loss and gradients: every rank holds the same number of tokens (2 chunks of S / 2cp), so
the mean over all tokens of the batch is the mean of the ranks' own token means; the
project's DDP wrap over every rank (dp x cp) averages the gradients over the same ranks,
and the attention's backward routes each rank's loss gradient to the K and V that produced
it, so the averaged gradient is the full batch's (checked against the one-process reference
by the correctness check).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..config import RunConfig
from ..workloads.gpt import Attention, DecoderLM
from . import RING_FORMS, RING_NEEDS_CUDA
from .pieces import AUTOCAST_DTYPES, Prepared, _data_parallel, _finish_module, device_mesh, place

# The SDPA kernels torch 2.13's context_parallel dispatches to the ring (its _sdpa_handler).
RING_KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
# The kernel-choice probe uses at most this many local tokens: torch's choice turns on
# dtype, heads, head dim, mask, gradients and the device (on the length only through rare
# kernel limits), and a 128k-token probe would allocate the whole q, k, v.
PROBE_TOKENS = 128


def local_positions(seq_len: int, cp: int, cp_rank: int) -> list[int]:
    """Global positions of cp rank ``cp_rank``'s tokens, in its local order: chunks
    ``cp_rank`` and ``2 cp - 1 - cp_rank`` of the ``2 cp`` equal chunks of the sequence."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len {seq_len} is not divisible by 2 x cp = {2 * cp}")
    c = seq_len // (2 * cp)
    first, second = cp_rank, 2 * cp - 1 - cp_rank
    return list(range(first * c, (first + 1) * c)) + list(range(second * c, (second + 1) * c))


def torch_ring_positions(seq_len: int, cp: int, cp_rank: int) -> list[int]:
    """The global positions torch's ring attention expects on cp rank ``cp_rank``: the
    sequence reordered by its head-tail load balancer, then split evenly over the cp ranks
    (what ``context_parallel`` does to its buffers)."""
    from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

    order = _HeadTailLoadBalancer(seq_len, cp, "cpu")._generate_indices(restore=False)[0]
    return order.view(cp, -1)[cp_rank].tolist()


def causal_mask(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """(local tokens, seq_len) booleans, True where a local query may attend a key. The keys
    are in the order the all-gather returns them (cp rank 0's tokens, then rank 1's, ...),
    so the gathered K and V are used as they arrive, without reordering."""
    q = torch.tensor(local_positions(seq_len, cp, cp_rank))
    k = torch.tensor([p for r in range(cp) for p in local_positions(seq_len, cp, r)])
    return q[:, None] >= k[None, :]


def sdpa_kernel(cfg: RunConfig, form: str, device: torch.device) -> str:
    """The SDPA kernel torch picks for one cp rank's attention call in ``form`` (its dtype,
    heads, head dim and mask, on ``device``): FLASH_ATTENTION, EFFICIENT_ATTENTION,
    CUDNN_ATTENTION or MATH (torch's SDPBackend names; on CPU FLASH_ATTENTION is its CPU
    flash kernel). Asks torch's own selector (torch._fused_sdp_choice) on empty tensors of
    those shapes, at most PROBE_TOKENS long, needing gradients as in training (some kernels
    have no backward for some shapes)."""
    from torch.nn.attention import SDPBackend

    shape = cfg.shape
    dtype = AUTOCAST_DTYPES[cfg.precision] or torch.float32
    s = min(cfg.seq_len // cfg.cp, PROBE_TOKENS)
    keys = s if form in RING_FORMS else s * cfg.cp  # the ring attends block by block
    q = torch.empty(1, shape.heads, s, shape.dim_head, dtype=dtype, device=device, requires_grad=True)
    k = torch.empty(1, shape.kv_heads, keys, shape.dim_head, dtype=dtype, device=device, requires_grad=True)
    kw: dict[str, Any] = {"enable_gqa": shape.kv_heads != shape.heads}
    if form in RING_FORMS:
        kw["is_causal"] = True
    else:
        kw["attn_mask"] = torch.ones(s, keys, dtype=torch.bool, device=device)
    return SDPBackend(torch._fused_sdp_choice(q, k, k, **kw)).name


def decide_form(asked: str, device_type: str, kernel: str | None, shapes: str = "") -> tuple[str, str]:
    """The attention form a cp config runs, and why: (form, reason), from what was asked
    (``cp_attention``), the device type, and the SDPA kernel torch picks for a rank's ring
    call (:func:`sdpa_kernel`; None where it was not probed: off CUDA or for
    "allgather_kv"). ``shapes``: the call's dtype and shapes, for the reason. ``auto``
    takes torch's ring (allgather rotation) on CUDA where the kernel is one the ring
    dispatches, the all-gather-KV form otherwise. A ring asked for where it cannot run is
    refused (ValueError)."""
    if asked in RING_FORMS and device_type != "cuda":
        raise ValueError(RING_NEEDS_CUDA.format(asked=asked))
    if asked == "allgather_kv":
        return asked, "cp_attention = \"allgather_kv\""
    if device_type != "cuda":
        return ("allgather_kv", "CPU: torch 2.13's ring attention (context_parallel) dispatches only the CUDA flash, "
                "efficient and cuDNN SDPA kernels, not CPU SDPA (aten._scaled_dot_product_flash_attention_for_cpu "
                "has no context-parallel sharding rule), and flex attention has no backward on CPU")
    ring = "ring_allgather" if asked == "auto" else asked
    if kernel not in RING_KERNELS:
        why = (f"torch picks the {kernel} SDPA kernel for this rank's q, k, v{shapes} and its ring attention "
               "dispatches only flash, efficient and cuDNN")
        if asked != "auto":
            raise ValueError(f"cp_attention = \"{asked}\" cannot run: {why}; use \"auto\" or \"allgather_kv\"")
        return "allgather_kv", why
    return ring, (f"torch context_parallel ring attention over the {kernel} SDPA kernel, K and V rotated by "
                  f"{RING_FORMS[ring]}, head-tail load balance" +
                  (" (cp_attention = \"auto\" on CUDA)" if asked == "auto" else ""))


def attention_form(cfg: RunConfig, device: torch.device) -> tuple[str, str]:
    """Which attention form a cp config runs on ``device``, and why: (form, reason), as
    :func:`decide_form` decides it. Probes torch's kernel choice on CUDA only."""
    asked, kernel = cfg.cp_attention, None
    if device.type == "cuda" and asked != "allgather_kv":
        kernel = sdpa_kernel(cfg, "ring_allgather" if asked == "auto" else asked, device)
    shape = cfg.shape
    return decide_form(asked, device.type, kernel, f" ({cfg.precision}, {shape.heads}/{shape.kv_heads} heads, "
                                                   f"head dim {shape.dim_head})")


def cp_fields(cfg: RunConfig, device: torch.device) -> dict[str, Any]:
    """The record's figures of a cp config: the attention form that ran, its SDPA kernel,
    and why (the decision the ranks' prepare made: :func:`attention_form`)."""
    if cfg.strategy != "cp":
        return {}
    form, reason = attention_form(cfg, device)
    return {"cp_attention_impl": form, "cp_sdpa_kernel": sdpa_kernel(cfg, form, device), "cp_attention_reason": reason}


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
    """The all-gather-KV form (set as Attention.attend): local queries against the cp
    group's gathered K and V, causal by global position."""

    def __init__(self, group: Any, cp: int, mask: torch.Tensor) -> None:
        self.group, self.cp, self.mask = group, cp, mask

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k = _GatherSeq.apply(k, self.group, self.cp)
        v = _GatherSeq.apply(v, self.group, self.cp)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=k.shape[1] != q.shape[1])


class RingAttention(nn.Module):
    """The ring form (set as Attention.attend): causal SDPA of this rank's q, k, v, which
    torch's ``_ContextParallel`` style (applied by :func:`ring_attention`) turns into
    sequence-sharded DTensors, so that inside :func:`ring_dispatch` the call runs torch's
    ring attention over the cp mesh. No parameters."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def ring_attention(cp_mesh: Any) -> RingAttention:
    """A :class:`RingAttention` whose inputs are sharded on the sequence over ``cp_mesh``
    (torch's ``_ContextParallel`` SDPA style: its q, k, v in as DTensors, its output back
    as this rank's tensor)."""
    from torch.distributed.tensor.experimental._attention import _ContextParallel
    from torch.distributed.tensor.parallel import parallelize_module

    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    return parallelize_module(RingAttention(), cp_mesh, style)


@contextlib.contextmanager
def ring_dispatch(rotate: str) -> Iterator[None]:
    """Inside: SDPA on sequence-sharded DTensors runs torch's ring attention (forward and
    backward), with head-tail load balancing and ``rotate`` ("allgather" | "alltoall") KV
    rotation. torch keeps these switches process-wide; they are set for one training step
    and put back after it, so another config of the process (a tensor-parallel one with
    DTensor attention, the reference) does not run SDPA through the ring. Not everything
    is put back: torch 2.13 unregisters the ring's sharding rules on disable without
    clearing DTensor's sharding-propagation cache (_disable_cp_dtensor_dispatcher), so a
    decision cached during a ring step can still serve a later op with the same specs."""
    from torch.distributed.tensor.experimental._attention import (
        _cp_options,
        _disable_context_parallel_dispatcher,
        _enable_context_parallel_dispatcher,
        _RotateMethod,
    )

    saved = (_cp_options.enable_load_balance, _cp_options.rotate_method)
    # The ring's causal block skipping must know the layout is head-tail (local_positions).
    _cp_options.enable_load_balance = True
    _cp_options.rotate_method = {"allgather": _RotateMethod.ALL_GATHER, "alltoall": _RotateMethod.ALL_TO_ALL}[rotate]
    _enable_context_parallel_dispatcher()
    try:
        yield
    finally:
        _disable_context_parallel_dispatcher()
        _cp_options.enable_load_balance, _cp_options.rotate_method = saved


class SequenceShard:
    """Prepared.shard_batch of a cp rank: its tokens (inputs and targets) of a micro-batch."""

    def __init__(self, index: torch.Tensor) -> None:
        self.index = index

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.index_select(1, self.index), y.index_select(1, self.index)


def shard_sequence(model: DecoderLM, seq_len: int, cp: int, cp_rank: int, cp_mesh: Any, device: torch.device,
                   form: str = "allgather_kv") -> SequenceShard:
    """Make ``model`` (built whole, identical on every rank) compute this cp rank's tokens:
    rotary tables at their global positions, every attention layer in ``form`` over
    ``cp_mesh``. Returns the batch splitter the training step applies."""
    positions = local_positions(seq_len, cp, cp_rank)
    if form in RING_FORMS:
        attend: Any = ring_attention(cp_mesh)
        if positions != torch_ring_positions(seq_len, cp, cp_rank):
            # The ring's causal logic is written for torch's split; a torch that splits
            # otherwise would compute a different (wrong) attention here.
            raise RuntimeError(f"torch's ring attention no longer splits seq_len {seq_len} over cp = {cp} as "
                               "mgbench's head-tail layout does; use cp_attention = \"allgather_kv\"")
    else:
        attend = GatheredAttention(cp_mesh.get_group(), cp, causal_mask(seq_len, cp, cp_rank).to(device))
    index = torch.tensor(positions, device=device)
    model.positions = index
    for m in model.modules():
        if isinstance(m, Attention):
            m.attend = attend
    return SequenceShard(index)


def prepare_context_parallel(cfg: RunConfig, model: DecoderLM, device: torch.device) -> Prepared:
    """``cp`` on every rank: split the sequence over the cp group, the attention in the form
    :func:`attention_form` picks, and the project's DDP wrap over every rank."""
    form, _ = attention_form(cfg, device)
    mesh = device_mesh(device, (cfg.dp, cfg.cp), ("dp", "cp"))
    cp_rank, dp_rank = mesh.get_local_rank("cp"), mesh.get_local_rank("dp")
    place(model, device)
    shard = shard_sequence(model, cfg.seq_len, cfg.cp, cp_rank, mesh["cp"], device, form)
    _finish_module(model, cfg)
    # DDP over all dp x cp ranks: after its all-reduce every rank holds the same gradients,
    # so fp16's found-inf needs no agreement of its own (the unsharded scaler).
    prep = _data_parallel("ddp", model, device, cfg.precision)
    ring = (lambda: ring_dispatch(RING_FORMS[form])) if form in RING_FORMS else None
    return dataclasses.replace(prep, dp_rank=dp_rank, dp_size=cfg.dp, shard_batch=shard, step_context=ring)
