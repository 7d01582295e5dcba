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
- Multi-head latent attention (DeepSeek-V2/V3, when the shape has ``kv_lora_rank``) as
  DeepSeek's and torchtitan's training code computes it (:class:`MLAttention`): the
  up-projected per-head keys and values are what attention reads and saves, the shared
  rotary key broadcast to every head; on CPU the value is zero-padded to the q/k width
  (its flash kernel needs one width).
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


class MLAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2, DeepSeek-V3): keys and values through a
    low-rank latent, queries through another (or directly from the hidden state).

    Parameters, named as in DeepSeek-V3's and torchtitan's code and counted exactly by
    ``ModelShape._attn_params``:

    - ``wq`` (hidden -> heads x (nope + rope)) when ``q_lora_rank`` is None, else
      ``wq_a`` (hidden -> q_lora_rank), ``q_norm`` (RMSNorm) and ``wq_b`` (q_lora_rank
      -> heads x (nope + rope));
    - ``wkv_a`` (hidden -> kv_lora_rank + rope): the latent and ONE rotary key shared by
      every head; ``kv_norm`` (RMSNorm of the latent); ``wkv_b`` (kv_lora_rank -> heads x
      (nope + v)): each head's non-rotary key and its value;
    - ``wo`` (heads x v -> hidden).

    Rotary embeddings turn the rope parts only (the tables are qk_rope_head_dim wide:
    DecoderLM builds them so for an MLA shape); each head's query and key are its nope
    part and its rope part concatenated, the shared rotary key broadcast to every head
    (an expand, copied once by the concatenation). Causal SDPA at scale
    1/sqrt(nope + rope), values v_head_dim wide.

    What forward saves for backward (per token, e bytes an element; the attention
    RMSNorm's output x is counted with that norm): as an RMSNorm does, q_norm its input
    (wq_a's output), its normalised value and its output (wq_b's input), 3 e q_lora_rank,
    and kv_norm its input, a view of wkv_a's output that keeps all of it
    (e (kv_lora_rank + rope)), its normalised value and its output (wkv_b's input),
    2 e kv_lora_rank, each with two fp32 per-token scalars; SDPA the concatenated q and k
    (e heads (nope + rope) each), v, its output and its fp32 log-sum-exp (4 heads). The
    rotary parts and the up-projections' outputs are read through views and not kept
    otherwise. Where v is narrower than q and k:

    - CUDA (as torchtitan's DeepSeek-V3 runs it): SDPA takes the narrower v itself (its
      memory-efficient kernel checks q's width against k's only; not run on a GPU in
      this project yet); the saved v is a view of wkv_b's output and keeps all of it,
      e heads (nope + v), and the output (e heads v) is read by wo as a view;
    - CPU: torch's one fused CPU kernel (flash) needs q, k and v of one width, and without
      it SDPA falls back to its math path, which saves the s x s attention weights of
      every head. So v is zero-padded to the q/k width and the output cut back (Hugging
      Face's DeepSeek-V3 pads the same way for FlashAttention-2): SDPA saves the padded v
      and the padded output (e heads (nope + rope) each), and wo the cut output copied
      contiguous (e heads v); wkv_b's output is not kept.

    ``attend`` (context parallelism) receives these q, k and v as Attention's hook does
    (k per head: no grouped-query sharing). Tensor parallelism is not built for MLA (its
    plan names wq/wk/wv): the suite refuses it.
    """

    def __init__(self, shape: ModelShape) -> None:
        nn.Module.__init__(self)  # an Attention by type (context parallelism finds it so), not by its projections
        h, a = shape.hidden, shape.heads
        self.heads = a
        self.nope, self.rope, self.v_dim = shape.qk_nope_head_dim, shape.qk_rope_head_dim, shape.v_head_dim
        self.dim_head = self.nope + self.rope  # q and k per head
        self.kv_lora_rank, self.q_lora_rank = shape.kv_lora_rank, shape.q_lora_rank
        if self.q_lora_rank is None:
            self.wq = nn.Linear(h, a * self.dim_head, bias=False)
        else:
            self.wq_a = nn.Linear(h, self.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(self.q_lora_rank)
            self.wq_b = nn.Linear(self.q_lora_rank, a * self.dim_head, bias=False)
        self.wkv_a = nn.Linear(h, self.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = RMSNorm(self.kv_lora_rank)
        self.wkv_b = nn.Linear(self.kv_lora_rank, a * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(a * self.v_dim, h, bias=False)
        self.attend = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x) if self.q_lora_rank is None else self.wq_b(self.q_norm(self.wq_a(x)))
        q_nope, q_rope = q.view(b, s, -1, self.dim_head).split((self.nope, self.rope), dim=-1)
        # (batch, seq, heads, d) as in Attention, so SDPA's output is in wo's layout.
        q = torch.cat((q_nope, apply_rotary(q_rope, cos, sin)), dim=-1).transpose(1, 2)
        latent, k_rope = self.wkv_a(x).split((self.kv_lora_rank, self.rope), dim=-1)
        k_rope = apply_rotary(k_rope.unsqueeze(2), cos, sin)  # (batch, seq, 1, rope): one key for every head
        kv = self.wkv_b(self.kv_norm(latent)).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split((self.nope, self.v_dim), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, -1, k_nope.shape[2], -1)), dim=-1).transpose(1, 2)
        v = v.transpose(1, 2)
        pad = self.dim_head - self.v_dim if x.device.type == "cpu" and self.v_dim < self.dim_head else 0
        if pad:  # CPU's flash kernel needs one width (class docstring)
            v = F.pad(v, (0, pad))
        if self.attend is not None:
            out = self.attend(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if pad:
            out = out[..., : self.v_dim]
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
        self.attn = MLAttention(shape) if shape.is_mla else Attention(shape)
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
        # MLA turns only each head's rope part (qk_rope_head_dim); other attention the whole head.
        cos, sin = rotary_tables(shape.qk_rope_head_dim if shape.is_mla else shape.dim_head, max_seq_len)
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
