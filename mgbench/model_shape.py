"""Shape of a decoder-only transformer: parameter counts and FLOPs per token.

Shared by the workload (which builds it) and the planner (which sizes it), so the
formulas live here once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import MgbenchError

MLP_KINDS = ("swiglu", "gelu")


def default_ffn_hidden(hidden: int, mlp: str) -> int:
    """The MLP width a model of this kind conventionally has: 4 h for a GELU MLP (GPT-2,
    GPT-3); for SwiGLU, 2/3 of 4 h (the same parameters with three matrices) rounded up to
    a multiple of 256, Llama's rule (Touvron et al. 2023; e.g. h = 4096 gives 11008)."""
    if mlp == "gelu":
        return 4 * hidden
    return 256 * -(-int(8 * hidden / 3) // 256)


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder LM (RMSNorm, rotary positions, no biases)."""

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str = "swiglu"
    tie_embeddings: bool = False
    name: str | None = None
    # The embedding and output projection are built with the vocabulary rounded up to a
    # multiple of this (nanoGPT builds GPT-2's 50257 as 50304 = 786 x 64, Megatron pads
    # to a multiple of 128 x tp): matmuls of a round width run faster. The extra rows
    # are never a target; parameters and FLOPs count what is built (padded_vocab).
    vocab_multiple: int = 1

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for f in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "kv_heads", "vocab_multiple"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise MgbenchError(f"model dim {f} must be a positive integer, got {v!r}")
        if self.mlp not in MLP_KINDS:
            raise MgbenchError(f"model mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.heads % self.kv_heads:
            raise MgbenchError(
                f"model heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim is None and self.hidden % self.heads:
            raise MgbenchError(
                f"model hidden ({self.hidden}) must divide by heads ({self.heads}), or set head_dim"
            )
        if self.dim_head % 2:
            raise MgbenchError(f"head dim {self.dim_head} must be even for rotary embeddings")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelShape":
        """Build from a suite's explicit dims, naming any unknown key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise MgbenchError(
                f"unknown model dim(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        missing = [k for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab") if k not in d]
        if missing:
            raise MgbenchError(f"model dims missing: {', '.join(missing)}")
        return cls(**d)

    @classmethod
    def from_record(cls, rec: dict[str, Any], prefix: str = "model_") -> "ModelShape":
        """Rebuild from a flat result record, whose model dims are stored as model_<dim>."""
        return cls(**{f.name: rec[prefix + f.name] for f in dataclasses.fields(cls) if prefix + f.name in rec})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["vocab_multiple"] == 1:
            # Left out at its neutral value, so the ids of every config built before this
            # field existed (which hash these dims) stay what they were.
            del d["vocab_multiple"]
        return d

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and columns of the output projection as built."""
        m = self.vocab_multiple
        return -(-self.vocab // m) * m

    @property
    def dim_head(self) -> int:
        """Per-head dimension (hidden / heads unless given)."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def attn_dim(self) -> int:
        """Width of the concatenated attention heads (heads x head dim)."""
        return self.heads * self.dim_head

    def params_per_layer(self) -> int:
        """Weights of one block: q, k, v, o projections, the MLP and two RMSNorm scales."""
        h, d = self.hidden, self.dim_head
        attn = h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h
        mlp = (3 if self.mlp == "swiglu" else 2) * h * self.ffn_hidden
        return attn + mlp + 2 * h

    def num_params(self) -> int:
        """All trainable parameters as built (embedding counted once when tied)."""
        emb = self.padded_vocab * self.hidden
        head = 0 if self.tie_embeddings else emb
        return emb + self.layers * self.params_per_layer() + self.hidden + head

    def num_embedding_params(self) -> int:
        """Parameters of the input token-embedding table (a lookup: no FLOPs)."""
        return self.padded_vocab * self.hidden

    def num_matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every block, the final norm
        and the output projection (counted even when tied to the embedding, because the
        projection is real compute). This is the N of 6N below; it equals torchtitan's
        "params minus embedding" for untied models."""
        return self.layers * self.params_per_layer() + self.hidden + self.padded_vocab * self.hidden

    def flops_per_token(self, seq_len: int) -> float:
        """Model training FLOPs per token, forward + backward, no recompute.

        6 N + 12 L h s  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models";
        PaLM, Chowdhery et al. 2022, appendix B): 6N for the weight matmuls (2 forward,
        4 backward per parameter) and 12 L h s for attention scores and values, with
        h = heads x head dim and s the sequence length. Used for MFU, which by
        definition ignores recomputation.
        """
        return 6.0 * self.num_matmul_params() + 12.0 * self.layers * self.attn_dim * seq_len
