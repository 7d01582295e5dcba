"""Shape of a decoder-only transformer: parameter counts and FLOPs per token.

Shared by the workload (which builds it) and the planner (which sizes it), so the
formulas live here once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import MgbenchError

# MLP kinds by their nonlinearity. Gated kinds (SwiGLU: Llama, Mistral, Qwen, DeepSeek;
# GeGLU: Gemma) have three hidden x ffn matrices, the others two (GELU: GPT-2, GPT-3;
# squared ReLU: Nemotron-4, Primer).
GATED_MLP_KINDS = ("swiglu", "geglu")
MLP_KINDS = GATED_MLP_KINDS + ("gelu", "squared_relu")
# What mgbench's own decoder (workloads/gpt.py) builds. The planner prices every kind.
RUNNER_MLP_KINDS = ("swiglu", "gelu")
# The largest value a model dimension may take (16 Mi): far past any model's widths, heads or
# vocabulary (the largest vocabularies are about 2**18), so only a typo reaches it; layers
# 64 Ki (models have at most a few hundred; plan's balanced split of the last pipeline stage,
# perf.balanced_last_layers, steps through them one by one).
MAX_DIM = 1 << 24
MAX_DIMS = {"layers": 1 << 16}


class AttnPart(NamedTuple):
    """One weight of a block's attention, in the order the runner registers them
    (workloads/gpt.py; for MLA, Megatron-Core's order too: it fuses GQA's q, k, v): a linear of ``k`` inputs and ``n``
    outputs, or a norm's scale of width ``n`` (``k`` = 1). ``split``: how tensor
    parallelism cuts it, "column" (its outputs), "row" (its inputs), "replicated" (whole
    on every rank: MLA's down-projections) or "norm"."""

    name: str
    k: int
    n: int
    split: str


# MLA's up-projections: the linears from a latent back to the heads (Megatron-Core's
# recompute module "mla_up_proj" reruns them).
MLA_UP_PROJECTIONS = ("wq_b", "wkv_b")


def default_ffn_hidden(hidden: int, mlp: str) -> int:
    """The MLP width a model of this kind conventionally has: 4 h for a two-matrix MLP
    (GPT-2, GPT-3); for a gated one, 2/3 of 4 h (the same parameters with three matrices)
    rounded up to a multiple of 256, Llama's rule (Touvron et al. 2023; e.g. h = 4096
    gives 11008)."""
    if mlp not in GATED_MLP_KINDS:
        return 4 * hidden
    return 256 * -(-int(8 * hidden / 3) // 256)


_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder LM (RMSNorm, rotary positions, no biases): the one model
    spec the runner builds and the planner sizes.

    Counted as published models count them, except for what is under 0.1% of their
    parameters in every published config tested (tests/unit/test_model_spec.py): biases
    (Qwen2's q/k/v, gpt-oss's), per-head q/k norms and extra norm scales (Qwen3, Gemma 2
    and 3), attention sinks and router biases.
    """

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
    # MLP of width ffn_hidden (DeepSeek-V3: 3). After them every ``moe_interval``-th layer
    # is an MoE layer and the rest dense (Llama 4 Maverick: 2, layers 1, 3, 5, ...; Hugging
    # Face's interleave_moe_layer_step / decoder_sparse_step, Megatron-Core's
    # moe_layer_freq = [0, 1] * 24).
    experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    moe_interval: int = 1
    # gpt-oss's experts: their linears carry biases (the second one's scaled by the
    # router's weight), and the gated MLP's inputs are clamped to +-glu_clamp (gpt-oss's
    # swiglu_limit, 7) first. Neither changes weights or FLOPs to speak of; the planner
    # prices the elementwise passes they add where they run unfused (moe.epilogue_seconds).
    expert_bias: bool = False
    glu_clamp: float | None = None
    # Multi-head latent attention (DeepSeek-V2/V3; MLA on when kv_lora_rank is set): keys
    # and values are projected down to kv_lora_rank (plus one shared rotary key of
    # qk_rope_head_dim) and back up per head; queries likewise through q_lora_rank (None:
    # projected directly). Per head, q and k have qk_nope_head_dim + qk_rope_head_dim
    # dims and v has v_head_dim. In training the up-projected keys and values are what
    # attention reads, so memory and FLOPs count heads of those widths.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Multi-token-prediction modules (DeepSeek-V3: 1), each one more block of the last
    # layer's kind, a 2h x h projection and two norms, sharing the embedding and output
    # head; trained (so counted in params and FLOPs) and dropped at inference.
    mtp_layers: int = 0
    # Attention and MLP read the same normed input and are summed (GPT-J, PaLM): the same
    # weights and FLOPs as a sequential block, which is how the planner prices it (its one
    # norm fewer and its fused tensor-parallel all-reduce are not modelled); the runner
    # does not build it.
    parallel_block: bool = False
    # Local attention: layers that are not global attend to the last sliding_window
    # tokens only. global_every = k: every k-th layer (k-1, 2k-1, ...) is global
    # (Gemma 2: 2; Gemma 3: 6; gpt-oss: 2); 0: every layer is local (Mistral 7B v0.1).
    sliding_window: int | None = None
    global_every: int = 0
    # What the config this shape was read from holds beyond it (a multimodal model's vision
    # tower, hf_config.py): priced nowhere, and said in every prediction's notes. Not a
    # dimension: not compared, and never in to_dict (config ids hash it).
    left_out: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for f in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "kv_heads", "vocab_multiple"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise MgbenchError(f"model dim {f} must be a positive integer, got {v!r}")
            if v > (most := MAX_DIMS.get(f, MAX_DIM)):  # a typo, not a model: plan's search would not come back
                raise MgbenchError(f"model dim {f} = {v:,} is past {most:,}, more than any model has; check it")
        if self.mlp not in MLP_KINDS:
            raise MgbenchError(f"model mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        self._check_mla()
        self._check_extras()
        if self.heads % self.kv_heads:
            raise MgbenchError(
                f"model heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim is None and not self.is_mla and self.hidden % self.heads:
            raise MgbenchError(
                f"model hidden ({self.hidden}) must divide by heads ({self.heads}), or set head_dim"
            )
        rotary = self.qk_rope_head_dim if self.is_mla else self.dim_head
        if rotary % 2:
            raise MgbenchError(f"head dim {rotary} must be even for rotary embeddings; give head_dim "
                               "(--head-dim) when it is not hidden / heads (gpt-oss, Gemma, Qwen3)")
        self._check_moe()

    def _check_mla(self) -> None:
        """MLA dims: none, or kv_lora_rank with the three head widths (q_lora_rank optional)."""
        names = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        for f in names:
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise MgbenchError(f"model dim {f} must be a positive integer, got {v!r}")
        if self.kv_lora_rank is None:
            extra = [f for f in names[1:] if getattr(self, f) is not None]
            if extra:
                raise MgbenchError(f"model dim(s) {', '.join(extra)} belong to multi-head latent attention: "
                                   "set kv_lora_rank too, or leave them out")
            return
        missing = [f for f in names[2:] if getattr(self, f) is None]
        if missing:
            raise MgbenchError(f"multi-head latent attention (kv_lora_rank) needs {', '.join(missing)}")
        if self.kv_heads != self.heads or self.head_dim is not None:
            raise MgbenchError("with multi-head latent attention every head has its own keys and values: leave "
                               "kv_heads and head_dim out (qk_nope_head_dim + qk_rope_head_dim and v_head_dim "
                               "give the widths)")

    def _check_extras(self) -> None:
        """MTP modules, parallel blocks and local attention."""
        for f in ("mtp_layers", "global_every"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise MgbenchError(f"model dim {f} must be an integer >= 0, got {v!r}")
        if not isinstance(self.parallel_block, bool):
            raise MgbenchError(f"model parallel_block must be true or false, got {self.parallel_block!r}")
        w = self.sliding_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w <= 0):
            raise MgbenchError(f"model dim sliding_window must be a positive integer, got {w!r}")
        if w is None and self.global_every:
            raise MgbenchError("model global_every says which layers are global among local ones: set "
                               "sliding_window too, or leave it out")

    def _check_moe(self) -> None:
        """MoE dims: all neutral for a dense model, consistent for an MoE one."""
        for f in ("experts", "top_k", "shared_experts", "dense_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise MgbenchError(f"model dim {f} must be an integer >= 0, got {v!r}")
        k = self.moe_interval
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise MgbenchError(f"model moe_interval must be an integer >= 1 (every k-th layer an MoE layer), got {k!r}")
        e = self.expert_ffn_hidden
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e <= 0):
            raise MgbenchError(f"model dim expert_ffn_hidden must be a positive integer, got {e!r}")
        if not isinstance(self.expert_bias, bool):
            raise MgbenchError(f"model expert_bias must be true or false, got {self.expert_bias!r}")
        c = self.glu_clamp
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < math.inf):
            raise MgbenchError(f"model glu_clamp must be a positive number, got {c!r}")
        if not self.experts:
            extra = [f for f in ("top_k", "shared_experts", "dense_layers") if getattr(self, f)]
            extra += ["moe_interval"] if self.moe_interval != 1 else []
            extra += ["expert_ffn_hidden"] if e is not None else []
            extra += [f for f in ("expert_bias", "glu_clamp") if getattr(self, f) not in (False, None)]
            if extra:
                raise MgbenchError(f"model dim(s) {', '.join(extra)} apply to MoE models only: set experts > 0 "
                                   "or leave them out")
            return
        if not 1 <= self.top_k <= self.experts:
            raise MgbenchError(f"model top_k must be between 1 and experts ({self.experts}), got {self.top_k}")
        if self.dense_layers >= self.layers:
            raise MgbenchError(f"model dense_layers ({self.dense_layers}) must be fewer than layers "
                               f"({self.layers}), or the model has no MoE layer")
        if self.moe_layers == 0:
            raise MgbenchError(f"model moe_interval ({self.moe_interval}) leaves no MoE layer among the "
                               f"{self.layers - self.dense_layers} after dense_layers: make it at most that")
        if self.mlp not in GATED_MLP_KINDS:
            raise MgbenchError(f"MoE experts are gated MLPs (SwiGLU): set mlp = \"swiglu\", not {self.mlp!r}")

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
        """Rebuild from a flat result record, whose model dims are stored as model_<dim>
        (a row of a pandas table of records too: record_values.fields_as_written)."""
        from .record_values import fields_as_written

        return cls.from_dict(fields_as_written(cls, rec, prefix=prefix))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["vocab_multiple"] == 1:
            # Left out at its neutral value, so the ids of every config built before this
            # field existed (which hash these dims) stay what they were.
            del d["vocab_multiple"]
        for f, neutral in (("experts", 0), ("top_k", 0), ("expert_ffn_hidden", None), ("shared_experts", 0),
                           ("dense_layers", 0), ("moe_interval", 1), ("expert_bias", False), ("glu_clamp", None),
                           *((f, None) for f in _MLA_FIELDS), ("mtp_layers", 0),
                           ("parallel_block", False), ("sliding_window", None), ("global_every", 0)):
            if d[f] == neutral:  # the same, for the MoE dims of a dense model
                del d[f]
        del d["left_out"]  # a description, not a dimension
        return d

    def runner_problem(self) -> str | None:
        """Why mgbench's own decoder (workloads/gpt.py, moe.py) cannot build this shape,
        or None. The planner prices all of it; the runner measures only what it builds
        (multi-head latent attention included: workloads/gpt.MLAttention)."""
        planner_only = [f for f in ("mtp_layers", "parallel_block", "sliding_window", "expert_bias", "glu_clamp")
                        if getattr(self, f) not in (None, 0, False)]
        if self.mlp not in RUNNER_MLP_KINDS:
            planner_only.append(f"mlp = {self.mlp!r}")
        if not planner_only:
            return None
        return (f"the runner's decoder does not build {', '.join(planner_only)}: `mgbench plan`, `predict` and "
                "`memory` (without --trace) price such a model, `mgbench run` cannot measure it yet")

    # -- attention and MLP widths ----------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def gated_mlp(self) -> bool:
        """Three MLP matrices (SwiGLU, GeGLU) rather than two."""
        return self.mlp in GATED_MLP_KINDS

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (the q.k dot product)."""
        return self.dim_head

    @property
    def v_dim(self) -> int:
        """Per-head width of values (and of each head's output)."""
        return self.v_head_dim if self.is_mla else self.dim_head

    @property
    def num_local_layers(self) -> int:
        """Layers with sliding-window attention (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return self.layers - (self.layers // self.global_every if self.global_every else 0)

    def attention_flops_per_token(self, seq_len: Any) -> Any:
        """Attention-score FLOPs per token, forward + backward, no recompute: per layer
        6 x keys x heads x (qk width + v width) (q.k and the weighted sum of values, 2
        FLOPs a multiply-add, backward twice forward), keys = the sequence (PaLM's
        convention, causality not halved) or, for a local layer, the window; MTP modules'
        blocks included. Equals 12 L h s for full attention with h = heads x head dim.
        ``seq_len`` may be an array."""
        per_key = 6.0 * self.heads * (self.qk_head_dim + self.v_dim)
        local = self.num_local_layers
        full = self.layers + self.mtp_layers - local  # an MTP module's block attends to the whole sequence
        if not local:
            return per_key * full * seq_len
        w = self.sliding_window
        keys_local = seq_len - (seq_len - w) * (seq_len > w)  # min(seq, window), arrays too
        return per_key * (full * seq_len + local * keys_local)

    def causal_attention_flops_per_token(self, seq_len: Any) -> Any:
        """:meth:`attention_flops_per_token` as a causal kernel computes them: a query
        attends to the keys up to its own, so over a sequence of s a full layer's query
        sees s / 2 keys on average and a local layer's min(i, window) at position i, on
        average w - w^2 / (2 s) for s > w (about the whole window when s >> w, not half of
        it), s / 2 otherwise."""
        s = seq_len
        per_key = 6.0 * self.heads * (self.qk_head_dim + self.v_dim)
        local = self.num_local_layers
        full = self.layers + self.mtp_layers - local
        if not local:
            return per_key * full * s / 2.0
        w = float(self.sliding_window)
        keys_local = s / 2.0 + (w - w * w / (2.0 * s) - s / 2.0) * (s > w)
        return per_key * (full * s / 2.0 + local * keys_local)

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
        return (self.layers - self.dense_layers) // self.moe_interval if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether block ``index`` (from 0) has routed experts: past the dense leading
        layers, every ``moe_interval``-th (Hugging Face's Llama 4 and Qwen2-MoE count
        (index + 1) % k == 0, so the k-th, 2k-th, ... layer from 1)."""
        return self.is_moe and index >= self.dense_layers and (index - self.dense_layers + 1) % self.moe_interval == 0

    def leading_moe_layers(self, blocks: Any) -> Any:
        """The MoE layers among the model's first ``blocks`` blocks (arrays broadcast): the
        count :meth:`is_moe_layer` gives a first pipeline stage, its dense leading layers
        first."""
        import numpy as np

        past = np.maximum(np.asarray(blocks, dtype=float) - self.dense_layers, 0.0)
        return np.minimum(np.floor(past / self.moe_interval), float(self.moe_layers))

    def stage_moe_layers(self, blocks: Any, chunks: Any = 1) -> Any:
        """The most MoE layers a pipeline rank's ``blocks`` hold (arrays broadcast), in
        ``chunks`` runs of blocks / chunks consecutive blocks (an interleaved schedule's
        virtual stages, each from another part of the model): all of them up to the model's
        MoE layers, and where MoE layers interleave with dense ones at most one in every
        ``moe_interval`` of a run, rounded up a run (a run of 3 blocks at interval 2 may hold
        2). What a stage's routed experts, memory and host launches are counted for."""
        import numpy as np

        b, c = np.asarray(blocks, dtype=float), np.asarray(chunks, dtype=float)
        return np.minimum(c * np.ceil(b / c / self.moe_interval), float(self.moe_layers))

    def expert_params(self) -> int:
        """Weights of one routed expert (SwiGLU: three hidden x width matrices)."""
        return 3 * self.hidden * self.moe_ffn_hidden

    def attention_parts(self) -> tuple[AttnPart, ...]:
        """The weights of one block's attention (:class:`AttnPart`), the one statement of
        its geometry: grouped-query attention's q, k, v and output projections; MLA's query
        path (down to q_lora_rank, a norm, up to heads x qk; or one projection from h), its
        kv path (down to kv_lora_rank plus the shared rotary key, a norm, up to heads x
        (nope key + value)) and the output projection."""
        h, a = self.hidden, self.heads
        if not self.is_mla:
            d, kv = self.dim_head, self.kv_heads * self.dim_head
            return (AttnPart("wq", h, a * d, "column"), AttnPart("wk", h, kv, "column"),
                    AttnPart("wv", h, kv, "column"), AttnPart("wo", a * d, h, "row"))
        r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
        q = (AttnPart("wq", h, a * self.qk_head_dim, "column"),) if r_q is None else (
            AttnPart("wq_a", h, r_q, "replicated"), AttnPart("q_norm", 1, r_q, "norm"),
            AttnPart("wq_b", r_q, a * self.qk_head_dim, "column"))
        return q + (AttnPart("wkv_a", h, r_kv + self.qk_rope_head_dim, "replicated"),
                    AttnPart("kv_norm", 1, r_kv, "norm"),
                    AttnPart("wkv_b", r_kv, a * (self.qk_nope_head_dim + self.v_dim), "column"),
                    AttnPart("wo", a * self.v_dim, h, "row"))

    def _attn_params(self) -> int:
        return sum(p.k * p.n for p in self.attention_parts())

    def _mlp_params(self) -> int:
        """A dense layer's MLP."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn_hidden

    def _moe_mlp_params(self, active: bool) -> int:
        """One MoE layer's MLP: router, routed experts (all, or the top_k a token uses) and shared experts."""
        routed = self.top_k if active else self.experts
        return self.hidden * self.experts + (routed + self.shared_experts) * self.expert_params()

    def _block_params(self, active: bool) -> int:
        """Weights of all blocks (active: only the experts a token uses)."""
        base = self._attn_params() + 2 * self.hidden
        dense = self.layers - self.moe_layers
        return dense * (base + self._mlp_params()) + self.moe_layers * (base + self._moe_mlp_params(active))

    def _mtp_params(self, active: bool) -> int:
        """The multi-token-prediction modules: one block of the last layer's kind each,
        its 2h -> h projection and two norms (embedding and head are shared)."""
        if not self.mtp_layers:
            return 0
        h = self.hidden
        mlp = self._moe_mlp_params(active) if self.is_moe else self._mlp_params()
        return self.mtp_layers * (self._attn_params() + 2 * h + mlp + 2 * h * h + 2 * h)

    def num_mtp_params(self, active: bool = False) -> int:
        """Parameters of the multi-token-prediction modules (in num_params; DeepSeek-V3's
        published 671B leaves its 14B out, its Hugging Face 685B counts them; the 14B
        counts the MTP module's own embedding and head, which are shared with the main
        model and counted once here: 11.6B). ``active``: only the experts a token uses
        (their share of num_active_params)."""
        return self._mtp_params(active=active)

    def num_expert_params(self) -> int:
        """Parameters of every routed expert of every layer: what expert parallelism shards."""
        return self.moe_layers * self.experts * self.expert_params()

    def num_active_params(self) -> int:
        """Parameters one token uses: num_params with each MoE layer's routed experts cut to
        its top_k (Mixtral 8x7B: 12.9B of 46.7B). Equals num_params for a dense model."""
        return (self.num_params() - self._block_params(active=False) + self._block_params(active=True)
                - self._mtp_params(active=False) + self._mtp_params(active=True))

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and columns of the output projection as built."""
        m = self.vocab_multiple
        return -(-self.vocab // m) * m

    @property
    def dim_head(self) -> int:
        """Per-head dimension of queries and keys (hidden / heads unless given; MLA: nope +
        rope)."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
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
        return emb + self._block_params(active=False) + self.hidden + head + self._mtp_params(active=False)

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
        # each MTP module runs its block, its projection and the shared head once more
        return self._block_params(active=True) + self._mtp_params(active=True) + self.num_head_matmul_params()

    def num_head_matmul_params(self) -> int:
        """Matmul parameters of the output head a token passes through: the final norm and
        the projection to the vocabulary, once, and once more per MTP module (they share
        the head). Never recomputed, and on the last pipeline stage."""
        return (self.hidden + self.padded_vocab * self.hidden) * (1 + self.mtp_layers)

    def flops_per_token(self, seq_len: int) -> float:
        """Model training FLOPs per token, forward + backward, no recompute.

        6 N + 12 L h s  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models";
        PaLM, Chowdhery et al. 2022, appendix B): 6N for the weight matmuls (2 forward,
        4 backward per parameter) and 12 L h s for attention scores and values, with
        h = heads x head dim and s the sequence length (:meth:`attention_flops_per_token`:
        MLA's widths, local layers' windows). Used for MFU, which by definition ignores
        recomputation.
        """
        return 6.0 * self.num_matmul_params() + self.attention_flops_per_token(seq_len)
