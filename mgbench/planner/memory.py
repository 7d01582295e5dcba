"""Memory per GPU: model states (ZeRO stages), activations (Korthikanti et al.), pipeline
in-flight micro-batches, and a stated allowance.

Every function accepts numpy arrays (or scalars) for the layout, so `mgbench plan` sizes
millions of layouts in one call. Bytes throughout; GB = 1e9 bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model_shape import ModelShape

# Bytes per parameter of (weights, gradients, optimizer states) for Adam.
# Mixed precision: 16-bit weights and gradients, fp32 master weights + m + v = 12
# (Rajbhandari et al. 2020, "ZeRO", section 3.1: 2 + 2 + K with K = 12).
# fp32: weights 4, gradients 4, m + v 8.
STATE_BYTES = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8)}

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "interleaved")

# Allowance for what no formula above counts: the CUDA caching allocator's
# fragmentation, cuBLAS / NCCL workspaces and communication buckets. A stated
# engineering margin (PyTorch's allocator typically reserves 5-10% above allocated
# memory), not a measurement; `mgbench run` records the measured peak to check it.
ALLOWANCE_FRACTION = 0.08


def stage_params(shape: ModelShape, tp: Any, pp: Any) -> Any:
    """Parameters held by one GPU of the heaviest pipeline stage, before ZeRO sharding.

    Blocks are split evenly over pp stages (ceil for the heaviest), every matrix over tp.
    With pp = 1 one GPU holds the embedding and the output projection (once if tied);
    with pp > 1 the first stage holds the embedding and the last the projection, so the
    heaviest holds one of them.
    """
    tp, pp = np.asarray(tp), np.asarray(pp)
    emb = shape.vocab * shape.hidden
    layers_per_stage = np.ceil(shape.layers / pp)
    ends = np.where(pp == 1, emb * (1 if shape.tie_embeddings else 2), emb)
    return (layers_per_stage * shape.params_per_layer() + ends) / tp + shape.hidden


def model_states(params: Any, dp: Any, zero: Any, precision: str) -> dict[str, Any]:
    """Bytes of weights, gradients and optimizer states per GPU under ZeRO stage 0-3.

    Stage 1 shards optimizer states over the data-parallel group, stage 2 also the
    gradients, stage 3 also the weights (ZeRO paper, figure 1).
    """
    w, g, o = STATE_BYTES[precision]
    dp, zero = np.asarray(dp, dtype=float), np.asarray(zero)
    params = np.asarray(params, dtype=float)
    p_b = params * w / np.where(zero >= 3, dp, 1.0)
    g_b = params * g / np.where(zero >= 2, dp, 1.0)
    o_b = params * o / np.where(zero >= 1, dp, 1.0)
    return {"params_bytes": p_b, "grads_bytes": g_b, "optimizer_bytes": o_b, "model_states_bytes": p_b + g_b + o_b}


def activations_per_layer(shape: ModelShape, seq: Any, micro_batch: Any, tp: Any, sp: Any,
                          recompute: Any, flash: Any, precision: str) -> Any:
    """Activation bytes one transformer layer stores for one micro-batch.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", table 2, for 16-bit activations: s b h (34 + 5 a s / h) without
    parallelism; with tensor parallelism t the 24 s b h of attention/MLP internals and
    the 5 a s^2 b of attention scores divide by t, the other 10 s b h (norm inputs,
    first-linear inputs, dropout masks) only with sequence parallelism. Selective
    recompute and flash attention both drop the 5 a s^2 b term; full recompute keeps
    only each layer's input, 2 s b h (/ t with sequence parallelism).

    Generalised here to grouped-query attention (K, V are kv_heads / heads as wide) and
    to an MLP of width F: 4 s b F for a GELU MLP (16 s b h at F = 4h, the paper's
    value) and 8 s b F for SwiGLU (two input projections, the SiLU output and the
    product). Both generalisations reduce to the paper's numbers for its GPT shape.
    ``recompute``: 0 none, 1 selective, 2 full (array or scalar).
    """
    s, b = np.asarray(seq, dtype=float), np.asarray(micro_batch, dtype=float)
    t = np.asarray(tp, dtype=float)
    sp, flash, rc = np.asarray(sp, dtype=bool), np.asarray(flash, dtype=bool), np.asarray(recompute)
    h, a, F = shape.hidden, shape.heads, shape.ffn_hidden
    g = shape.kv_heads / shape.heads
    hd_ratio = shape.attn_dim / h  # 1 unless head_dim is set apart from hidden / heads
    replicated = 10.0 * h  # 4 (two norm inputs) + 2 (QKV input) + 2 (MLP input) + 2 (two dropout masks)
    sharded = (2.0 + 4.0 * g + 2.0) * h * hd_ratio + (8.0 if shape.mlp == "swiglu" else 4.0) * F
    scores = 5.0 * a * s  # per s b: softmax output 2, dropout mask 1, dropout output 2 (bytes x a s)
    keep_scores = (rc == 0) & ~flash
    per_sb = np.where(sp, (replicated + sharded) / t, replicated + sharded / t) + np.where(keep_scores, scores / t, 0.0)
    full = 2.0 * h * np.where(sp, 1.0 / t, 1.0)
    per_sb = np.where(rc == 2, full, per_sb)
    scale = 2.0 if precision == "fp32" else 1.0  # 16-bit activations in the paper
    return s * b * per_sb * scale


def logits_bytes(shape: ModelShape, seq: Any, micro_batch: Any, tp: Any, precision: str) -> Any:
    """Output-layer activations of one micro-batch: 16-bit logits plus the fp32 copy the
    cross-entropy keeps (2 + 4 bytes per vocab entry; 4 + 4 in fp32), vocab-parallel over tp."""
    per = 8.0 if precision == "fp32" else 6.0
    return np.asarray(seq, dtype=float) * np.asarray(micro_batch) * shape.vocab * per / np.asarray(tp)


def in_flight(pp: Any, num_micro: Any, schedule: str, virtual_stages: int = 1) -> Any:
    """How many micro-batches' activations the first pipeline stage holds at its peak.

    GPipe keeps all m; 1F1B keeps p (at most m); interleaved 1F1B with v virtual stages
    keeps p (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, section 4.2.3). pp = 1: one.
    """
    p = np.asarray(pp, dtype=float)
    m = np.asarray(num_micro, dtype=float)
    if schedule == "gpipe":
        n = m
    elif schedule == "interleaved":
        n = np.minimum(p * (1.0 + (p - 1.0) / (p * virtual_stages)), m)
    else:
        n = np.minimum(p, m)
    return np.where(p == 1, 1.0, n)


def memory_per_gpu(shape: ModelShape | None, *, params: Any = None, seq: Any = 2048, micro_batch: Any = 1,
                   num_micro: Any = 1, tp: Any = 1, pp: Any = 1, dp: Any = 1, zero: Any = 0,
                   precision: str = "bf16", recompute: Any = 0, sp: Any = False, flash: Any = True,
                   schedule: str = "1f1b", virtual_stages: int = 1) -> dict[str, Any]:
    """Everything one GPU holds, in bytes. With ``shape=None`` and ``params`` given, only
    model states are counted (activations unknown without the shape)."""
    if shape is None:
        states = model_states(params, dp, zero, precision)
        zero_a = np.zeros_like(states["model_states_bytes"])
        return {**states, "activations_bytes": zero_a, "allowance_bytes": zero_a,
                "total_bytes": states["model_states_bytes"]}
    states = model_states(stage_params(shape, tp, pp), dp, zero, precision)
    layer = activations_per_layer(shape, seq, micro_batch, tp, sp, recompute, flash, precision)
    layers_per_stage = np.ceil(shape.layers / np.asarray(pp, dtype=float))
    nflight = in_flight(pp, num_micro, schedule, virtual_stages)
    # Full recompute rebuilds one layer's complete activations during backward.
    work = np.where(np.asarray(recompute) == 2,
                    activations_per_layer(shape, seq, micro_batch, tp, sp, 0, flash, precision), 0.0)
    logits = logits_bytes(shape, seq, micro_batch, tp, precision)
    first = layer * layers_per_stage * nflight + work
    last = layer * layers_per_stage + work + logits  # the last stage holds one micro-batch
    acts = np.where(np.asarray(pp) == 1, first + logits, np.maximum(first, last))
    # ZeRO-3 gathers one layer's full weights (and prefetches the next): 2 layers' worth.
    w_bytes = STATE_BYTES[precision][0]
    gathered = np.where(np.asarray(zero) >= 3, 2.0 * shape.params_per_layer() * w_bytes / np.asarray(tp), 0.0)
    subtotal = states["model_states_bytes"] + acts + gathered
    allowance = ALLOWANCE_FRACTION * subtotal
    return {**states, "activations_bytes": acts, "gathered_params_bytes": gathered,
            "allowance_bytes": allowance, "total_bytes": subtotal + allowance}
