"""A decoder-only transformer LM in plain torch, with seeded random-token data.

RMSNorm, rotary position embeddings, grouped-query attention through
``scaled_dot_product_attention`` and a SwiGLU (or GELU) MLP. Its shape, parameter count
and FLOPs per token come from :class:`mgbench.model_shape.ModelShape`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model_shape import ModelShape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 for stability under bf16/fp16 autocast.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rotary_tables(head_dim: int, seq_len: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, head_dim / 2) for rotary embeddings."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of a (batch, heads, seq, d) tensor."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos = cos[: x.shape[-2]].to(x.dtype)
    sin = sin[: x.shape[-2]].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim_head = shape.heads, shape.kv_heads, shape.dim_head
        self.wq = nn.Linear(shape.hidden, shape.heads * shape.dim_head, bias=False)
        self.wk = nn.Linear(shape.hidden, shape.kv_heads * shape.dim_head, bias=False)
        self.wv = nn.Linear(shape.hidden, shape.kv_heads * shape.dim_head, bias=False)
        self.wo = nn.Linear(shape.heads * shape.dim_head, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 instead of self.heads keeps the module correct when a tensor-parallel plan
        # shards the projections and each rank holds only some of the heads.
        q = self.wq(x).view(b, s, -1, self.dim_head).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.dim_head).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.dim_head).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if k.shape[1] != q.shape[1]:
            # Grouped-query attention: repeat each kv head for its group of q heads.
            # (An explicit repeat works on every torch >= 2.6 and every SDPA backend.)
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(shape.hidden)
        self.attn = Attention(shape)
        self.mlp_norm = RMSNorm(shape.hidden)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class DecoderLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, shape: ModelShape, max_seq_len: int) -> None:
        super().__init__()
        self.shape = shape
        self.tok_emb = nn.Embedding(shape.vocab, shape.hidden)
        # A ModuleDict keyed by index (not a ModuleList) so pipeline stages can delete
        # blocks and keep the original parameter names.
        self.blocks = nn.ModuleDict({str(i): Block(shape) for i in range(shape.layers)})
        self.norm = RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        cos, sin = rotary_tables(shape.dim_head, max_seq_len)
        # Non-persistent buffers: not parameters, not in state_dict, moved with .to().
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 style init: normal(0, 0.02), output projections scaled by depth."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                std = 0.02 / (2 * self.shape.layers) ** 0.5
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(tokens) if self.tok_emb is not None else tokens
        for block in self.blocks.values():
            x = block(x, self.rope_cos, self.rope_sin)
        x = self.norm(x) if self.norm is not None else x
        return self.head(x) if self.head is not None else x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def random_batch(seed: int, step: int, rows: int, seq_len: int, vocab: int) -> torch.Tensor:
    """The global batch of one step: (rows, seq_len + 1) random token ids.

    Drawn from a generator seeded with (seed, step) so every rank and the
    single-process reference see the same tokens whatever their layout; inputs are
    ``[:, :-1]`` and targets ``[:, 1:]``.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (rows, seq_len + 1), generator=g)
