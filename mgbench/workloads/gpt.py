"""A decoder-only transformer LM in plain torch, with seeded random-token data.

RMSNorm, rotary position embeddings, grouped-query attention through
``scaled_dot_product_attention`` and a SwiGLU (or GELU) MLP. Its shape, parameter count
and FLOPs per token come from :class:`mgbench.model_shape.ModelShape`.

What it keeps for backward is what production trainers keep, so that memory measured
here transfers (the planner's model in mgbench/planner/memory.py counts these tensors
one by one, and `mgbench memory --trace` checks it):

- Residual stream in the compute dtype under mixed precision: the embedding output is
  cast to the autocast dtype, as torchtitan's bf16 parameters (FSDP mixed precision)
  and Megatron-LM's default (no fp32 residual connection) leave it.
- RMSNorm statistics in fp32 without an fp32 copy of its input (a norm accumulated in
  fp32), output in the input's dtype, outside autocast so CPU and CUDA save the same
  tensors: it keeps its input and its output, 2 + 2 bytes an element in bf16.
- Grouped-query attention by SDPA itself (``enable_gqa``, torch >= 2.5), not by
  repeating K and V: the saved K and V are kv_heads wide, as in FlashAttention-2.
- Cross-entropy in fp32 chunk by chunk, each chunk recomputed in backward (torchtune's
  chunked-output loss): no fp32 copy of the whole logits is ever held.
- The vocabulary padded to ``vocab_multiple`` (GPT-2: 50304, nanoGPT's choice).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..model_shape import ModelShape

# Cross-entropy runs over the logits in this many chunks of tokens (fewer when there are
# fewer tokens): each chunk's fp32 working set is 1/8 of what the whole would need.
LOSS_CHUNKS = 8


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32: vector_norm accumulates in fp32 and x * rstd promotes to
        # fp32 element by element, so no fp32 copy of x is stored. Outside autocast,
        # whose fp32 op lists differ between CPU and CUDA.
        with torch.autocast(x.device.type, enabled=False):
            acc = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for fp64 input
            ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=acc).square() / x.shape[-1]
            y = (x * torch.rsqrt(ms + self.eps)).type_as(x)
            return y * self.weight.type_as(y)


def rotary_tables(head_dim: int, seq_len: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, head_dim / 2) for rotary embeddings."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of a (batch, seq, heads, d) tensor by
    the (seq, d/2) tables (already in x's dtype and cut to its length)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim_head = shape.heads, shape.kv_heads, shape.dim_head
        self.wq = nn.Linear(shape.hidden, shape.heads * shape.dim_head, bias=False)
        self.wk = nn.Linear(shape.hidden, shape.kv_heads * shape.dim_head, bias=False)
        self.wv = nn.Linear(shape.hidden, shape.kv_heads * shape.dim_head, bias=False)
        self.wo = nn.Linear(shape.heads * shape.dim_head, shape.hidden, bias=False)
        # (q, k, v) -> attention output in place of causal SDPA over the local sequence:
        # context parallelism sets it (strategies/context_parallel.py); None otherwise.
        self.attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 instead of self.heads keeps the module correct when a tensor-parallel plan
        # shards the projections and each rank holds only some of the heads.
        # Rotated in (batch, seq, heads, d) layout and only then viewed as SDPA's (batch,
        # heads, seq, d): SDPA's output takes its query's layout, so the output
        # projection reads it back without a copy (as CUDA's flash kernel lays it out).
        q = apply_rotary(self.wq(x).view(b, s, -1, self.dim_head), cos, sin).transpose(1, 2)
        k = apply_rotary(self.wk(x).view(b, s, -1, self.dim_head), cos, sin).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.dim_head).transpose(1, 2)
        # Grouped-query attention inside SDPA: K and V stay kv_heads wide.
        if self.attend is not None:
            out = self.attend(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.gated = shape.mlp == "swiglu"
        self.w1 = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)
        self.w2 = nn.Linear(shape.ffn_hidden, shape.hidden, bias=False)
        if self.gated:
            self.w3 = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, shape: ModelShape, index: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(shape.hidden)
        self.attn = Attention(shape)
        self.mlp_norm = RMSNorm(shape.hidden)
        if shape.is_moe_layer(index):
            from .moe import MoE  # routed experts in place of the dense MLP

            self.mlp: nn.Module = MoE(shape)
        else:
            self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class DecoderLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, shape: ModelShape, max_seq_len: int) -> None:
        super().__init__()
        self.shape = shape
        self.tok_emb = nn.Embedding(shape.padded_vocab, shape.hidden)
        # A ModuleDict keyed by index (not a ModuleList) so pipeline stages can delete
        # blocks and keep the original parameter names.
        self.blocks = nn.ModuleDict({str(i): Block(shape, i) for i in range(shape.layers)})
        self.norm = RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.padded_vocab, bias=False)
        if shape.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        cos, sin = rotary_tables(shape.dim_head, max_seq_len)
        # Non-persistent buffers: not parameters, not in state_dict, moved with .to().
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Global positions of the input's tokens where they are not 0..seq-1 (context
        # parallelism: this rank's chunks of the sequence); a plain attribute, not a
        # buffer, so DDP's buffer broadcast does not give every rank rank 0's positions.
        self.positions: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 style init: normal(0, 0.02), output projections scaled by depth."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02
            if name.endswith(("wo.weight", "w2.weight", "experts.w2")):
                std = 0.02 / (2 * self.shape.layers) ** 0.5
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(tokens) if self.tok_emb is not None else tokens
        if self.tok_emb is not None and torch.is_autocast_enabled(x.device.type):
            # The residual stream in the compute dtype (see the module docstring).
            x = x.to(torch.get_autocast_dtype(x.device.type))
        # The rotary tables in the stream's dtype, cut to the sequence length (of the input:
        # under sequence parallelism x holds a slice of it): once per forward, shared by
        # every block.
        pos = self.positions
        cos, sin = ((t[: tokens.shape[1]] if pos is None else t[pos]).to(x.dtype)
                    for t in (self.rope_cos, self.rope_sin))
        for block in self.blocks.values():
            x = block(x, cos, sin)
        x = self.norm(x) if self.norm is not None else x
        return self.head(x) if self.head is not None else x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, computed in fp32 over chunks of tokens.

    Each chunk is upcast, scored and dropped, and recomputed in backward (activation
    checkpointing of the loss alone): the logits are kept once, in their own dtype, and
    fp32 exists for one chunk at a time. The value is the fp32 cross entropy of the whole
    (the chunks' sums, added in fp32, over the token count)."""
    flat, tgt = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    n = flat.shape[0]
    size = -(-n // LOSS_CHUNKS)
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    # One split (not slices): its backward concatenates the chunks' gradients once,
    # where each slice's backward would make a logits-sized gradient of its own.
    for x, y in zip(flat.split(size), tgt.split(size)):
        total = total + checkpoint(_chunk_loss, x, y, use_reentrant=False)
    return total / n


def _chunk_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def random_batch(seed: int, step: int, rows: int, seq_len: int, vocab: int) -> torch.Tensor:
    """The global batch of one step: (rows, seq_len + 1) random token ids.

    Drawn from a generator seeded with (seed, step) so every rank and the
    single-process reference see the same tokens whatever their layout; inputs are
    ``[:, :-1]`` and targets ``[:, 1:]``.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (rows, seq_len + 1), generator=g)
