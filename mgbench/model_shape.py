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
    # Mixture of experts (0 experts: a dense model; workloads/moe.py builds the rest).
    # Each MoE layer's MLP is ``experts`` routed SwiGLU experts of width
    # ``expert_ffn_hidden`` (default ffn_hidden), of which each token uses ``top_k``, plus
    # ``shared_experts`` experts every token uses (one SwiGLU of width shared_experts x
    # expert_ffn_hidden, DeepSeek's layout). The first ``dense_layers`` layers keep a dense
    # MLP of width ffn_hidden (DeepSeek-V3: 3).
    experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0

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
        self._check_moe()

    def _check_moe(self) -> None:
        """MoE dims: all neutral for a dense model, consistent for an MoE one."""
        for f in ("experts", "top_k", "shared_experts", "dense_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise MgbenchError(f"model dim {f} must be an integer >= 0, got {v!r}")
        e = self.expert_ffn_hidden
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e <= 0):
            raise MgbenchError(f"model dim expert_ffn_hidden must be a positive integer, got {e!r}")
        if not self.experts:
            extra = [f for f in ("top_k", "shared_experts", "dense_layers") if getattr(self, f)]
            extra += ["expert_ffn_hidden"] if e is not None else []
            if extra:
                raise MgbenchError(f"model dim(s) {', '.join(extra)} apply to MoE models only: set experts > 0 "
                                   "or leave them out")
            return
        if not 1 <= self.top_k <= self.experts:
            raise MgbenchError(f"model top_k must be between 1 and experts ({self.experts}), got {self.top_k}")
        if self.dense_layers >= self.layers:
            raise MgbenchError(f"model dense_layers ({self.dense_layers}) must be fewer than layers "
                               f"({self.layers}), or the model has no MoE layer")
        if self.mlp != "swiglu":
            raise MgbenchError(f"MoE experts are SwiGLU MLPs: set mlp = \"swiglu\", not {self.mlp!r}")

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
        for f, neutral in (("experts", 0), ("top_k", 0), ("expert_ffn_hidden", None), ("shared_experts", 0),
                           ("dense_layers", 0)):
            if d[f] == neutral:  # the same, for the MoE dims of a dense model
                del d[f]
        return d

    # -- mixture of experts ----------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_ffn_hidden(self) -> int:
        """Width of one routed (and one shared) expert."""
        return self.expert_ffn_hidden if self.expert_ffn_hidden is not None else self.ffn_hidden

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is routed experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether block ``index`` (from 0) has routed experts."""
        return self.is_moe and index >= self.dense_layers

    def expert_params(self) -> int:
        """Weights of one routed expert (SwiGLU: three hidden x width matrices)."""
        return 3 * self.hidden * self.moe_ffn_hidden

    def _attn_params(self) -> int:
        h, d = self.hidden, self.dim_head
        return h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h

    def _moe_mlp_params(self, active: bool) -> int:
        """One MoE layer's MLP: router, routed experts (all, or the top_k a token uses) and shared experts."""
        routed = self.top_k if active else self.experts
        return self.hidden * self.experts + (routed + self.shared_experts) * self.expert_params()

    def _block_params(self, active: bool) -> int:
        """Weights of all blocks (active: only the experts a token uses)."""
        dense_mlp = (3 if self.mlp == "swiglu" else 2) * self.hidden * self.ffn_hidden
        base = self._attn_params() + 2 * self.hidden
        dense = self.layers - self.moe_layers
        return dense * (base + dense_mlp) + self.moe_layers * (base + self._moe_mlp_params(active))

    def num_expert_params(self) -> int:
        """Parameters of every routed expert of every layer: what expert parallelism shards."""
        return self.moe_layers * self.experts * self.expert_params()

    def num_active_params(self) -> int:
        """Parameters one token uses: num_params with each MoE layer's routed experts cut to
        its top_k (Mixtral 8x7B: 12.9B of 46.7B). Equals num_params for a dense model."""
        return self.num_params() - self._block_params(active=False) + self._block_params(active=True)

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

    def params_per_layer(self) -> int | float:
        """Weights of one block: q, k, v, o projections, the MLP and two RMSNorm scales.
        For an MoE model, whose dense and MoE layers differ, the mean over its blocks, with
        every expert counted (a float)."""
        total = self._block_params(active=False)
        # Dense blocks are all alike: the division is exact, and the count stays an int.
        return total / self.layers if self.is_moe else total // self.layers

    def num_params(self) -> int:
        """All trainable parameters as built (embedding counted once when tied)."""
        emb = self.padded_vocab * self.hidden
        head = 0 if self.tie_embeddings else emb
        return emb + self._block_params(active=False) + self.hidden + head

    def num_embedding_params(self) -> int:
        """Parameters of the input token-embedding table (a lookup: no FLOPs)."""
        return self.padded_vocab * self.hidden

    def num_matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every block, the final norm
        and the output projection (counted even when tied to the embedding, because the
        projection is real compute). This is the N of 6N below; it equals torchtitan's
        "params minus embedding" for untied models. For an MoE model only the ACTIVE
        parameters count: each MoE layer's router, top_k routed experts and shared experts
        (a token's matmuls touch no other expert)."""
        return self._block_params(active=True) + self.hidden + self.padded_vocab * self.hidden

    def flops_per_token(self, seq_len: int) -> float:
        """Model training FLOPs per token, forward + backward, no recompute.

        6 N + 12 L h s  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models";
        PaLM, Chowdhery et al. 2022, appendix B): 6N for the weight matmuls (2 forward,
        4 backward per parameter) and 12 L h s for attention scores and values, with
        h = heads x head dim and s the sequence length. Used for MFU, which by
        definition ignores recomputation.
        """
        return 6.0 * self.num_matmul_params() + 12.0 * self.layers * self.attn_dim * seq_len
