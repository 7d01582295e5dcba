"""Terms of a step: compute, communication and the pipeline bubble, each stated once.
layout_time.step_time (the one step model) adds them up:

    step = compute + bubble + tp_comm + pp_comm + exposed_dp_comm (+ layout_time's axes)

compute   matmuls + memory-bound elementwise work (a two-term roofline):
          hardware FLOPs (model + recomputation) / (GPUs x peak x matmul efficiency)
          + elementwise passes x activation bytes / achieved memory bandwidth, where
          the activation bytes per token and layer are Korthikanti et al.'s (memory.py):
          norms, softmax, activations and dropout read and write about that much
          memory several times per step. Small models are dominated by the second
          term, large ones by the first, which is why MFU grows with model size.
          The memory bandwidth is the achieved one (efficiency.toml mem_bw: a STREAM
          triad measured on the GPU, or carried), not the datasheet's.
          On a catalog GPU (``hw.gemm_shapes``) each GEMM of a layer is priced at its
          own shape (:func:`gemm_seconds`): a fixed cost per GEMM (small GEMMs) and its
          operand traffic at the achieved bandwidth (skinny GEMMs: MoE experts with few
          tokens each, small hidden sizes), combined with the compute time by the
          p-norm of hardware_profile.shape_model, both read off measured GEMM sweeps.
          Large GEMMs run at the matmul efficiency's rate as before. The routed
          experts' GEMMs run as one grouped GEMM per matrix, each expert with
          m = ep x tokens x top_k / (t x experts) rows (its share of the tokens the ep
          ranks route): their seconds are ``expert_gemm_s``.
          With flash attention, attention's scores and values do not run as layer GEMMs
          but in the fused kernel, at the fraction of peak that kernel reaches on the
          GPU and for the stack's kernel (efficiency.toml: the GH100's measured curves
          by sequence, FlashAttention-2 and cuDNN; elsewhere one figure, measured on
          the A100, MI300X and MI355X and carried to their siblings): the causal half
          of their FLOPs at that rate (see :func:`flash_attention_s`).
bubble    the schedule's theoretical idle fraction f (strategies/schedules.py's
          :func:`theoretical_bubble`, the one place for it): bubble = blocks x f / (1 - f),
          for 1F1B (p - 1) / m of a block stage's micro-batches, interleaving over v
          chunks (p - 1) / (v m)

Pipeline stages are not equal: Megatron-LM gives every stage ceil(L / p) blocks and the
last one the output layer too (the first has the embedding, a lookup with no FLOPs: not
priced). In 1F1B the slowest stage sets the pace: with t_L one micro-batch of a block
stage and t_H that of the output layer (its 6 h V FLOPs per token, never recomputed, all
on the last stage), a step takes (m - 1)(t_L + t_H) + sum of every stage's t =
m (t_L + t_H) + (p - 1) t_L. So ``compute`` is the last stage's busy time
m (t_L + t_H) and the bubble (p - 1) t_L. With p = 1 this is the even split. The MTP
modules run on the last stage too: their own FLOPs (:func:`block_flops_per_token`) and a
mean block's other terms each. A run that gives the last stage
fewer blocks (Layout.pp_last_layers; plan's balanced split, :func:`balanced_last_layers`)
leaves t_L the other stages' and lets the output layer pace the pipeline only by what the
missing blocks do not cover (layout_time.step_time).
tp_comm   all-reduces of s b h 16-bit activations over the tensor-parallel group, not
          overlapped (Megatron-LM, Narayanan et al. 2021, section 3.3)
pp_comm   sends of one micro-batch's activations across each stage boundary, on the
          critical path
          (how many of each a step issues: :func:`collective_counts`, the one statement)
dp_comm   gradient all-reduce (ZeRO 0/1), reduce-scatter + all-gather (ZeRO 2), or
          all-gathers (:func:`zero3_gathers`: twice per micro-batch, once per step for
          the pipelines whose FSDP stages stay unsharded) + reduce-scatter (ZeRO 3),
          overlapped with backward compute by the ``overlap`` fraction of the window it
          can hide in (:func:`dp_window_fraction`: none for the split-backward pipelines
          the runner all-reduces after the schedule)

Collectives follow the alpha-beta model of ring algorithms: an all-reduce on n ranks
takes 2 (n - 1) alpha + 2 (n - 1) / n x bytes / bandwidth; all-gather and
reduce-scatter half of that. A group that fits in a node runs on the node's links
(NVLink/PCIe); one that spans k nodes with g ranks on each runs as NCCL's rings do
(:func:`group_collective_time`): the channels spread over the node's NICs, so each
rank's NIC carries 1 / g of the ring's bytes. Pipeline sends go over one NIC a rank. Rank order is
tensor-parallel fastest, then data-parallel, then pipeline (Megatron-LM's default).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import MgbenchError
from ..hardware_profile import gemm_kernel_seconds
from ..model_shape import MLA_UP_PROJECTIONS, ModelShape
from ..strategies.schedules import grad_sync, theoretical_bubble
from .hardware import Hardware, stack_attention_kernel
from .memory import (act_bytes, attention_recomputed_share, elementwise_recomputed, matmul_recomputed_share,
                     max_last_layers, moe_mlp_extra, pipeline_fsdp_unsharded_from_forward, recomputed_share)
from .memory import stage_layers as memory_stage_layers

DEFAULT_OVERLAP = 1.0


def ring_time(nbytes: Any, n: Any, bw: Any, alpha: Any, factor: float) -> Any:
    """Alpha-beta ring collective: factor 2 for all-reduce, 1 for all-gather/reduce-scatter."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, factor * (n - 1) * alpha + factor * (n - 1) / n * nbytes / bw, 0.0)


def group_collective_time(nbytes: Any, n: Any, span: Any, hw: Hardware, factor: float) -> Any:
    """Seconds of a ring collective (``factor`` 2: all-reduce; 1: all-gather or
    reduce-scatter) of ``nbytes`` a rank over ``n`` ranks that span ``span`` consecutive
    GPUs. Inside a node: :func:`ring_time` on the node's links. Across k nodes with g of
    the group's ranks on each, NCCL spreads its ring channels over the node's NICs: each
    ring passes a node's g ranks over its links and leaves it through one NIC, so every
    rank's NIC carries factor (n - 1) / n x nbytes / g and its node links (g - 1) / g of
    the ring's factor (n - 1) / n x nbytes; the longer of the two (they run at once), plus
    the ring's steps' latencies, factor (k - 1) across nodes and factor (n - k) inside
    them (an assumption: NCCL's ring tuning counts 2 (k - 1) or 2 k steps across nodes
    for an all-reduce, by version). A collective's bus bandwidth across nodes is
    so g x the per-GPU network rate, as NCCL maintainers give it (46-48 GB/s a 400 Gb/s NIC,
    NVIDIA/nccl-tests#290; 24 a 200 Gb/s one, nccl-tests#160); published multi-node
    tables check it (data/published_collectives.toml, `python -m
    mgbench.planner.collective_validation`). With one rank a node it is the flat ring on
    one NIC a rank, which is what this charged every group before 2026-11-27 (a 4 GiB
    all-reduce on 4 x 8 B200 at 229 ms against 22 ms measured). Approximations: g is the
    mean ranks a node (a node holding fewer ranks of the group is slower); a rack of
    gb200-nvl72 counts as 72 GPUs where a plan spreads 64 a rack; on PCIe nodes the NIC
    traffic also crosses each GPU's PCIe link, which the intra term does not count."""
    n = np.asarray(n, dtype=float)
    n1 = np.maximum(n, 1.0)  # a group of at least one rank (n <= 1 costs nothing: below)
    span = np.asarray(span, dtype=float)
    flat = ring_time(nbytes, n, hw.intra_bw, hw.intra_alpha_s, factor)
    k = np.minimum(np.ceil(span / float(hw.gpus_per_node)), n1)  # nodes the group reaches
    g = n1 / np.maximum(k, 1.0)  # its ranks on each of them
    ring = factor * (n1 - 1.0) / n1 * np.asarray(nbytes, dtype=float)
    latency = factor * (k - 1.0) * hw.inter_alpha_s + factor * (n1 - k) * hw.intra_alpha_s
    wire = np.maximum(ring / (g * hw.inter_bw), ring * (g - 1.0) / g / hw.intra_bw)
    return np.where(n > 1, np.where(_inside_node(span, hw), flat, latency + wire), 0.0)


def link_from_all_reduce_fit(alpha_s: float, algbw: float, n: int) -> dict[str, float]:
    """The alpha-beta ring's link figures from a measured all-reduce fit t = alpha + S /
    algbw on ``n`` ranks (``mgbench comm``, ``mgbench probe``): a ring all-reduce takes
    2 (n - 1) steps (:func:`ring_time`), so the per-step latency is alpha / (2 (n - 1)),
    and moves 2 (n - 1) / n of the bytes over each link, so the link's (bus) bandwidth
    is algbw x 2 (n - 1) / n. ``bw`` in the unit of ``algbw``."""
    return {"bw": algbw * 2.0 * (n - 1) / n, "alpha_s": alpha_s / (2.0 * (n - 1))}


def reduces_after_schedule(pp: Any, schedule: str) -> Any:
    """Where a pipeline's data-parallel all-reduce (ZeRO 0-2) runs after the schedule's
    step instead of inside its last backward: the schedules whose replicas the registry
    reduces with "allreduce_after_schedule" (strategies/schedules.grad_sync: the split
    weight pass bypasses DDP's reducer hooks, so the runner all-reduces each stage's
    gradients once the schedule is done, with no compute left to hide behind)."""
    return (np.asarray(pp) > 1) & (grad_sync(schedule, "ddp") == "allreduce_after_schedule")


def dp_window_fraction(num_micro: Any, zero: Any, pp: Any = 1, schedule: str = "1f1b") -> Any:
    """The share of a step's compute that data-parallel traffic can hide behind: the
    last micro-batch's backward (2/3 of its compute: 1 / m of the step's) for ZeRO 0-2,
    where gradients are reduced once per step, and none where the reduction runs after
    the pipeline schedule (:func:`reduces_after_schedule`); for ZeRO-3 the gathers
    prefetch through the whole step's compute."""
    window = np.where(reduces_after_schedule(pp, schedule), 0.0, (2.0 / 3.0) / np.asarray(num_micro, dtype=float))
    return np.where(np.asarray(zero) >= 3, 1.0, window)


def zero3_gathers(num_micro: Any, pp: Any = 1, schedule: str = "1f1b") -> Any:
    """Weight all-gathers per step under ZeRO-3: two per micro-batch (forward, and
    backward after the reshard that follows forward), or one per step in a pipeline
    whose stages FSDP keeps unsharded from forward to the end of the step
    (memory.pipeline_fsdp_unsharded_from_forward: the split-backward schedules).
    The other schedules are priced at two per micro-batch, an upper bound: torch's
    pipelining stops resharding a stage after its first backward."""
    held = pipeline_fsdp_unsharded_from_forward(pp, schedule)
    return np.where(held, 1.0, 2.0 * np.asarray(num_micro, dtype=float))


def collective_counts(layers: int, tp: Any, pp: Any, dp: Any, zero: Any, num_micro: Any, recompute: Any,
                      schedule: str = "1f1b", pp_last_layers: Any = None,
                      shape: ModelShape | None = None) -> dict[str, Any]:
    """Collectives a step issues in these terms, per group (0 where its degree is 1); the
    one statement of them, which :func:`compute_terms` and layout_time.step_time price
    and planner/against.py counts:

    tp  4 all-reduces per layer per micro-batch (2 forward, 2 backward), 2 more per
        recomputed block (memory.recomputed_blocks: all under full, every second under
        every_2nd), over a stage's ceil(L / p) layers (the first stage's share where
        the run sets its last stage's: memory.stage_layers); half of them, attention's,
        on a layer whose MLP runs no tensor-parallel collective (:func:`tp_mlp_layers`,
        from ``shape``: an MoE layer without shared experts)
    pp  one send forward and one backward per micro-batch and stage boundary, on the
        critical path (m + p - 1) times
    dp  one gradient all-reduce (ZeRO 0-2: ZeRO-2's reduce-scatter and all-gather move
        an all-reduce's bytes), or under ZeRO-3 :func:`zero3_gathers` all-gathers and
        one reduce-scatter"""
    t, p, d = (np.asarray(x, dtype=float) for x in (tp, pp, dp))
    m = np.asarray(num_micro, dtype=float)
    stage = memory_stage_layers(layers, p, pp_last_layers)[0]
    # Attention's and the MLP's two each (one forward, one backward; a recomputed block's
    # forward runs its own again), the MLP's on the layers whose MLP has them.
    per_half = 2.0 + recomputed_share(stage, recompute)
    mlp = stage if shape is None else tp_mlp_layers(shape, stage)
    return {"tp": np.where(t > 1, per_half * (stage + mlp) * m, 0.0),
            "pp": np.where(p > 1, 2.0 * (m + p - 1.0), 0.0),
            "dp": np.where(d > 1, np.where(np.asarray(zero) >= 3, zero3_gathers(m, p, schedule) + 1.0, 1.0), 0.0)}


def gemm_rate(hw: Hardware) -> float:
    """FLOP/s the planner prices a training GEMM at on ``hw``: its dense peak at its
    achievable fraction (compute_eff)."""
    return hw.peak_tflops * 1e12 * hw.compute_eff


def tp_mlp_layers(shape: ModelShape, stage: Any) -> Any:
    """Of a first pipeline stage's ``stage`` blocks, those whose MLP runs tensor-parallel
    collectives (an all-gather in, a reduce-scatter out under sequence parallelism: an
    all-reduce's bytes each way): every dense block, and an MoE block only where it has
    shared experts. Megatron-Core's MoE layer, which tensor parallelism requires to run
    with sequence parallelism (core_v0.14.0 megatron/core/transformer/moe/moe_layer.py
    lines 258-262), routes the stage's own sequence shard over the expert-parallel group:
    its dispatcher gathers over the expert tensor-parallel group only (token_dispatcher.py
    lines 650-661: ``self.tp_size`` is the etp degree; priced apart, layout_time.etp_comm_s),
    and the shared experts gather and reduce-scatter over the tensor-parallel ranks as a
    dense MLP does (shared_experts.py lines 159-160, 238-239). The dense blocks lead the
    model, so a first stage holds them first, and the dense blocks an MoE model interleaves
    (ModelShape.moe_interval) with them."""
    s = np.asarray(stage, dtype=float)
    if not shape.is_moe or shape.shared_experts:
        return s
    return s - shape.leading_moe_layers(s)


def distinct_pairs(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs of two arrays broadcast together, as (their a values, their
    b values, each element's index into them, shaped as the arrays): a plan prices millions
    of layouts whose few distinct pairs a term need only see once. The pairs are keyed as
    complex numbers a + b i: an exact 1-D key numpy sorts many times faster than columns."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    flat_a, flat_b = a.ravel(), b.ravel()
    counted = _counted_pairs(flat_a, flat_b)
    if counted is not None:
        pa, pb, inverse = counted
        return pa, pb, inverse.reshape(a.shape)
    pairs, inverse = np.unique(flat_a + 1j * flat_b, return_inverse=True)
    return pairs.real, pairs.imag, inverse.reshape(a.shape)


def _counted_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`distinct_pairs` of two flat arrays of small non-negative integers (the search's
    degrees, micro-batch counts and recompute codes) without sorting: each pair's key
    a x (max b + 1) + b marks a table of every possible key, whose marked entries are the
    distinct pairs in np.unique's order; a second table maps each of them to its place.
    Linear in the elements where a sort is n log n (measured: tests/perf/bench_plan.py
    --pairs). None where the values are not such integers or the table would be much
    larger than the arrays: np.unique then decides."""
    if not a.size or a.min() < 0 or b.min() < 0:
        return None
    width = float(b.max()) + 1.0
    span = (float(a.max()) + 1.0) * width
    whole = np.array_equal(a, np.floor(a)) and np.array_equal(b, np.floor(b))
    if span > max(4.0 * a.size, float(1 << 20)) or not whole:
        return None
    w = int(width)
    key = a.astype(np.int64) * w + b.astype(np.int64)
    marked = np.zeros(int(span), dtype=bool)
    marked[key] = True
    keys = np.flatnonzero(marked)
    place = np.empty(int(span), dtype=np.intp)  # read only at marked keys, so left unset elsewhere
    place[keys] = np.arange(keys.size)
    return (keys // w).astype(float), (keys % w).astype(float), place[key]


def bubble_fraction(pp: Any, num_micro: Any, schedule: str, virtual_stages: int) -> Any:
    """:func:`theoretical_bubble` over arrays; NaN where the schedule's paper gives no
    figure (ZB-V with fewer than 2 p micro-batches), 0 for pp = 1."""
    p, m = np.broadcast_arrays(np.asarray(pp, dtype=float), np.maximum(np.asarray(num_micro, dtype=float), 1.0))
    ps, ms, inverse = distinct_pairs(p, m)  # one call per distinct (p, m)
    values = np.array([np.nan if (f := theoretical_bubble(int(a), int(b), schedule, virtual_stages)) is None
                       else float(f) for a, b in zip(ps, ms)])
    return np.where(p == 1, 0.0, values[inverse])


def _inside_node(span: Any, hw: Hardware) -> Any:
    """Whether a group whose ranks span ``span`` consecutive GPUs fits in one node."""
    return np.asarray(span) <= hw.gpus_per_node


def _group_link(span: Any, hw: Hardware) -> tuple[Any, Any]:
    """Bandwidth and latency for a group whose ranks span ``span`` consecutive GPUs."""
    inside = _inside_node(span, hw)
    return np.where(inside, hw.intra_bw, hw.inter_bw), np.where(inside, hw.intra_alpha_s, hw.inter_alpha_s)


def head_flops_per_token(shape: ModelShape) -> float:
    """FLOPs of the output projection per token, forward + backward: 6 h V (2 per weight
    forward, 4 backward), padded vocabulary as built, once more per MTP module (they share
    it). Never recomputed."""
    return 6.0 * shape.hidden * shape.padded_vocab * (1 + shape.mtp_layers)


def block_flops_per_token(shape: ModelShape, seq: Any, recompute: Any) -> tuple[Any, Any]:
    """(FLOPs a token of the L blocks, of the MTP modules), recomputation included: the
    model's hardware FLOPs less the output layer's, split by pricing the same model without
    its MTP modules (Megatron-Core builds them on the last pipeline stage)."""
    every = hardware_flops_per_token(shape, seq, recompute) - head_flops_per_token(shape)
    if not shape.mtp_layers:
        return every, 0.0 * every
    plain = dataclasses.replace(shape, mtp_layers=0)
    blocks = hardware_flops_per_token(plain, seq, recompute) - head_flops_per_token(plain)
    return blocks, every - blocks


def balanced_last_layers(shape: ModelShape, seq: int, pp: Any, recompute: Any = 0) -> Any:
    """Blocks a balanced split gives the last pipeline stage, which also runs the output
    layer (NaN without a pipeline): the fewest blocks n on every other stage such that the
    last, with the rest (k = L - (p - 1) n, at least 0) and the output layer, is no slower
    than n blocks, or the n that minimises the slower of the two. The output layer counts
    as its FLOPs in blocks (h V over a block's mean FLOPs a token, at ``seq``), as
    practitioners size these layouts (Megatron-LM's account_for_loss_in_pipeline_split
    counts it as one block; DeepSeek-V3's recipes give the last stage 3 blocks fewer), and
    the MTP modules, which run there too (layout_time.step_time), as their own FLOPs in
    blocks (:func:`block_flops_per_token`);
    never more blocks than memory.max_last_layers allows (NaN where no lighter last stage
    beats the even split: that split is the even one). A block's FLOPs include what ``recompute`` (layout.RECOMPUTE's codes, one per ``pp``
    entry or one for all) runs again, which the output layer never does: recomputation
    makes the output layer lighter in blocks."""
    ps, rs, inverse = distinct_pairs(pp, recompute)  # one pass per distinct (p, recompute)
    return _balanced_last_layers(shape, seq, ps, rs.astype(np.asarray(recompute).dtype))[inverse]


def _balanced_last_layers(shape: ModelShape, seq: int, pp: Any, recompute: Any) -> Any:
    """:func:`balanced_last_layers` of each (``pp``, ``recompute``) entry."""
    L = shape.layers
    head = head_flops_per_token(shape)
    blocks, mtp = block_flops_per_token(shape, seq, recompute)
    block = blocks / L
    p = np.asarray(pp, dtype=float)
    h = np.broadcast_to((head + mtp) / block, p.shape)
    first = np.ceil(L / p)
    most = max_last_layers(L, p, shape.mtp_layers)  # what the layout rule lets a set last stage hold
    best_t = np.full(p.shape, np.inf)
    best_k = np.full(p.shape, np.nan)
    for j in range(L + 1):
        n = first + j
        k = L - (p - 1.0) * n
        t = np.maximum(n, np.maximum(k, 0.0) + h)
        better = (p > 1) & (k >= 0) & (k <= most) & (t < best_t)
        best_t = np.where(better, t, best_t)
        best_k = np.where(better, k, best_k)
        if not np.any((p > 1) & (k > 0)):
            break
    return np.where(best_k >= first, np.nan, best_k)  # as many blocks as the even split's: that split


def hardware_flops_per_token(shape: ModelShape, seq: Any, recompute: Any) -> Any:
    """Model FLOPs plus recomputation (layout.RECOMPUTE's modes): full recompute repeats
    every block's forward (2 FLOPs a block weight + the attention forward, a third of
    ModelShape.attention_flops_per_token); every_2nd repeats the forward of every second
    block, ceil(L / 2) of the L blocks' share of it; selective repeats every block's core
    attention forward only; op (torchtitan's op-level checkpointing) half of every block's
    matmul forward. The output layer is not recomputed: Megatron-LM's count with
    full recompute, 96 B s l h^2 (1 + s / 6h + V / (16 l h)) (Narayanan et al. 2021, eq. 3),
    has 6 B s h V for it, the same as without."""
    s = np.asarray(seq, dtype=float)
    model = shape.flops_per_token(s)
    # The blocks' matmul weights a token uses (an MoE block's active experts only).
    block_weights = shape.num_matmul_params() - shape.num_head_matmul_params()
    attn_fwd = shape.attention_flops_per_token(s) / 3.0
    return (model + 2.0 * block_weights * matmul_recomputed_share(shape.layers, recompute)
            + attn_fwd * attention_recomputed_share(shape.layers, recompute))


def attention_flops_per_token(shape: ModelShape, seq: Any, recompute: Any) -> Any:
    """Attention scores and values FLOPs per token (ModelShape.attention_flops_per_token,
    forward + backward), plus the recomputed forward's third of it: all of it with full
    or selective recompute, half the blocks with every_2nd; not halved for causal masking."""
    s = np.asarray(seq, dtype=float)
    attn = shape.attention_flops_per_token(s)
    return attn + attn / 3.0 * attention_recomputed_share(shape.layers, recompute)


def causal_attention_flops_per_token(shape: ModelShape, seq: Any, recompute: Any) -> Any:
    """:func:`attention_flops_per_token` as a causal kernel computes them
    (ModelShape.causal_attention_flops_per_token: half a full layer's, nearly all of a
    sliding window's), with the recomputed forward's third."""
    attn = shape.causal_attention_flops_per_token(np.asarray(seq, dtype=float))
    return attn + attn / 3.0 * attention_recomputed_share(shape.layers, recompute)


# The FLOPs a fused attention kernel's forward + backward is credited with, in forward
# passes: FlashAttention's convention (flash-attention benchmarks/benchmark_flash_attention.py
# flops(): backward 2.5 x forward, as its backward recomputes the scores; Dao 2023, section
# 4.1), in which every attention fraction of efficiency.toml is stated and the probe's is
# converted (probe/profile.py). The planner's model FLOPs count backward as 2 x forward
# (ModelShape.attention_flops_per_token): pricing those at a fraction stated in this
# convention made attention 3 / 3.5 of the kernel's time.
FLASH_FWD_BWD_PASSES = 3.5


def flash_attention_s(shape: ModelShape, hw: Hardware, seq: Any, recompute: Any, rank_tokens: Any,
                      fraction: Any = None) -> Any:
    """Seconds attention's scores and values take in the flash-attention kernel for one
    rank's ``rank_tokens`` (its share of the layers); None where the GPU has no recorded
    kernel fraction (:func:`attention_fraction`): the GEMM term then prices them, as it
    always has. ``fraction``: the kernel's fraction of the bf16 peak to price at instead
    of the GPU's (layout_time.step_time gives the one measured beside an FP8 / BF16 ratio).

    The fused kernel is not a layer GEMM, and its fraction of peak differs by generation,
    kernel and sequence far more than the GEMMs' does: FlashAttention-2 reaches up to 73%
    of an A100's peak (Dao 2023, arXiv:2307.08691, section 4.1), on an H200 causal 19-29%
    at 2K-8K and cuDNN's 31-53% (efficiency.toml [attention_curves]), where best GEMMs
    reach 87% and 80% (MAMF). Its FLOPs are the causal kernel's (halved for a full
    layer, as that paper counts them; a sliding window's nearly whole:
    :func:`causal_attention_flops_per_token`), counted as the kernel fraction is stated:
    FLASH_FWD_BWD_PASSES forward passes, plus the recomputed forward's share."""
    frac = attention_fraction(hw, seq) if fraction is None else fraction
    if frac is None:
        return None
    forward = shape.causal_attention_flops_per_token(np.asarray(seq, dtype=float)) / 3.0
    passes = FLASH_FWD_BWD_PASSES + attention_recomputed_share(shape.layers, recompute)
    return forward * passes * rank_tokens / (hw.peak_tflops * 1e12 * frac)


def log2_interp(points: Any, seq: Any) -> Any:
    """The value at ``seq`` of ``points`` ((sequence, value), ... by sequence): linear in
    log2 of the sequence between them, held at the ends (how every by-sequence table of
    efficiency.toml is read)."""
    seqs, values = zip(*points)
    return np.interp(np.log2(np.asarray(seq, dtype=float)), np.log2(seqs), values)


def attention_fraction(hw: Hardware, seq: Any) -> Any:
    """The fused attention kernel's fraction of peak at ``seq``: the curve of the stack's
    kernel (stacks.toml attention_kernel) where the GPU has one (efficiency.toml
    [attention_curves], linear in log2 of the sequence, held at its ends), else the GPU's
    single figure (``hw.attn_eff``)."""
    curve = dict(hw.attn_curves).get(stack_attention_kernel(hw.stack)) if hw.attn_curves else None
    if not curve:
        return hw.attn_eff
    return log2_interp(curve, seq)


def gemm_seconds(flops: Any, nbytes: Any, hw: Hardware, rate: float) -> Any:
    """Seconds of one GEMM of ``flops`` FLOPs moving ``nbytes`` bytes (operands read,
    result written) on ``hw`` at the large-GEMM ``rate`` (FLOP/s): the fixed cost
    ``hw.gemm_fixed_s`` plus the p-norm (``hw.gemm_norm``) of the compute time and the
    memory time at the achieved bandwidth (hardware_profile.gemm_kernel_seconds)."""
    return gemm_kernel_seconds(flops, nbytes, rate, hw.mem_bw * hw.mem_bw_fraction, hw.gemm_fixed_s, hw.gemm_norm)


def _gemm(m: Any, k: Any, n: Any, e: float) -> tuple[Any, Any]:
    """(FLOPs, bytes) of an m x k by k x n product with ``e``-byte elements."""
    return 2.0 * m * k * n, e * (m * k + k * n + m * n)


def block_gemm_classes(shape: ModelShape) -> dict[str, Any]:
    """The GEMMs of one block, by the widths that set their shapes (the rest of a block's
    matmul weights, if any, is priced at the large-GEMM rate): attention's input
    projection (q, k, v, or MLA's down / up chain as one: its weights / h columns) and
    output projection; a dense block's MLP; an MoE block's router, shared experts and
    routed experts (each of width moe_ffn_hidden, two or three matrices)."""
    h = shape.hidden
    out_w = shape.heads * shape.v_dim * h
    mlp_mats = 3 if shape.gated_mlp else 2
    return {"attn_in_n": (shape._attn_params() - out_w) / h, "attn_out_k": shape.heads * shape.v_dim,
            "mlp_up_n": (mlp_mats - 1) * shape.ffn_hidden, "mlp_down_k": shape.ffn_hidden,
            "expert_up_n": 2 * shape.moe_ffn_hidden, "expert_down_k": shape.moe_ffn_hidden,
            "moe_frac": shape.moe_layers / shape.layers}


def shaped_gemms(shape: ModelShape, hw: Hardware, *, tokens_micro: Any, tp: Any, ep: Any, passes: Any,
                 rate: float, precision: str) -> dict[str, Any]:
    """Seconds per block and micro-batch pass-weighted (``passes``: forward, the two
    backward GEMMs and the recomputed forward share) of a block's GEMMs at their shapes,
    averaged over dense and MoE blocks, and their FLOPs; ``expert_s`` the routed experts'
    part. Column-parallel widths and row-parallel depths are split over ``tp``; routed
    experts are not (memory.stage_param_split): the tp ranks split the tokens instead."""
    c = block_gemm_classes(shape)
    h = float(shape.hidden)
    e = act_bytes(precision)
    T = np.asarray(tokens_micro, dtype=float)
    t = np.asarray(tp, dtype=float)
    f_in, b_in = _gemm(T, h, c["attn_in_n"] / t, e)
    f_out, b_out = _gemm(T, c["attn_out_k"] / t, h, e)
    flops = f_in + f_out
    secs = gemm_seconds(f_in, b_in, hw, rate) + gemm_seconds(f_out, b_out, hw, rate)
    expert = 0.0 * T
    if c["moe_frac"] < 1.0:  # dense blocks' MLP
        f_up, b_up = _gemm(T, h, c["mlp_up_n"] / t, e)
        f_dn, b_dn = _gemm(T, c["mlp_down_k"] / t, h, e)
        w = 1.0 - c["moe_frac"]
        flops = flops + w * (f_up + f_dn)
        secs = secs + w * (gemm_seconds(f_up, b_up, hw, rate) + gemm_seconds(f_dn, b_dn, hw, rate))
    if c["moe_frac"] > 0.0:
        w = c["moe_frac"]
        E, k_top = float(shape.experts), float(shape.top_k)
        f_r, b_r = _gemm(T / t, h, E, e)  # the router, on the rank's share of the tokens
        moe_f, moe_s = f_r, gemm_seconds(f_r, b_r, hw, rate)
        if shape.shared_experts:
            ws = float(shape.shared_experts)
            f_su, b_su = _gemm(T, h, ws * c["expert_up_n"] / t, e)
            f_sd, b_sd = _gemm(T, ws * c["expert_down_k"] / t, h, e)
            moe_f = moe_f + f_su + f_sd
            moe_s = moe_s + gemm_seconds(f_su, b_su, hw, rate) + gemm_seconds(f_sd, b_sd, hw, rate)
        n_ep = np.asarray(ep, dtype=float)
        local = E / n_ep  # experts on this rank
        m_e = n_ep * (T / t) * k_top / E  # rows each local expert gets (balanced routing)
        f_eu, b_eu = _gemm(m_e, h, c["expert_up_n"], e)
        f_ed, b_ed = _gemm(m_e, c["expert_down_k"], h, e)
        # One grouped GEMM per matrix: one fixed cost, every local expert's own shape.
        each = gemm_seconds(f_eu, b_eu, hw, rate) + gemm_seconds(f_ed, b_ed, hw, rate) - 2.0 * hw.gemm_fixed_s
        grouped = 2.0 * hw.gemm_fixed_s + local * each
        expert = w * grouped
        flops = flops + w * (moe_f + local * (f_eu + f_ed))
        secs = secs + w * moe_s + expert
    pw = np.asarray(passes, dtype=float)
    return {"seconds": secs * pw, "flops": flops * pw, "expert_s": expert * pw}


def host_terms(shape: ModelShape, hw: Hardware, seq: Any, recompute: Any, rank_tokens: Any,
               host_ops: dict[str, float]) -> tuple[Any, Any, Any]:
    """The probed CPU terms of one rank's step: (attention seconds the matmul term had
    priced at the GEMM rate, the same FLOPs at the probed SDPA rate, the non-matmul ops).

    attention  SDPA runs its own kernel, not the layer GEMMs: its FLOPs (halved for the
               causal mask, as the probe counts them) over the causal SDPA forward +
               backward rate probed at the nearest sequence length;
    ops        ops x per-op overhead + bytes / elementwise bandwidth: every aten op of
               the step that is neither a matmul nor SDPA (compute and view ops) pays
               the probed fixed cost, and the bytes compute ops read and write stream at
               the bandwidth probed on operands of the workload's activation size;
               plus ``host_ops["fixed_s"]`` when given: per-step costs priced by the
               caller from probed figures (planner/against.py: the latency of the
               collectives the layout terms do not count).

    ``rank_tokens``: the tokens whose blocks this rank computes per step (its share of
    the layers)."""
    attn_hw_flops = attention_flops_per_token(shape, seq, recompute) * rank_tokens
    attn_mm = attn_hw_flops / gemm_rate(hw)
    pts = sorted(hw.attn_points or ())
    if pts:
        rate = np.interp(np.asarray(seq, dtype=float), [p[0] for p in pts], [p[1] for p in pts])
        attention = causal_attention_flops_per_token(shape, seq, recompute) * rank_tokens / rate
    else:  # no SDPA probed: keep the GEMM rate
        attention = attn_mm
    ops = host_ops["ops"] * hw.op_overhead_s + host_ops["bytes"] / hw.ew_bw + host_ops.get("fixed_s", 0.0)
    return attn_mm, attention, ops


def elementwise_rerun(recompute: Any) -> Any:
    """The factor on a step's elementwise traffic where the blocks' forward runs again in
    backward (memory.elementwise_recomputed): a third more, else 1 (the one statement of
    it, for the dense elementwise term and the MoE traffic)."""
    return np.where(elementwise_recomputed(recompute), 4.0 / 3.0, 1.0)


def moe_traffic_seconds(shape: ModelShape, hw: Hardware, *, tokens: Any, tp: Any, precision: str, load: float,
                        moe_layers: Any, num_micro: Any, recompute: Any, sp: Any = True) -> Any:
    """Seconds of the memory-bound work an MoE block does beyond a dense MLP of width
    ffn_hidden, which :func:`compute_terms`' elementwise term prices (Korthikanti's count):
    the same elementwise passes (``hw.elementwise_passes``) over what an MoE block keeps
    beyond it (memory.moe_mlp_extra: top_k routed rows of the hidden size and of the
    expert's width at the busiest rank's ``load``, the shared experts, the router's
    scores). A model whose top_k x expert width exceeds its ffn_hidden (gpt-oss: 4 x 2880
    against 2880) does that much more activation work than the dense count says.
    ``tokens``: a rank's tokens of one micro-batch before sequence parallelism splits them
    over ``tp`` (moe_mlp_extra splits the experts' rows over tp as the tokens are); per MoE layer and
    micro-batch, a third more where the blocks' elementwise work runs again (full
    recompute), as the dense part."""
    per_token = moe_mlp_extra(shape, 1.0, tp, precision, load, sp=sp)
    nbytes = hw.elementwise_passes * np.maximum(per_token, 0.0) * np.asarray(tokens, dtype=float)
    again = elementwise_rerun(recompute)
    return nbytes * again / (hw.mem_bw * hw.mem_bw_fraction) * np.asarray(moe_layers, dtype=float) \
        * np.asarray(num_micro, dtype=float)


# Bytes an FP8 linear's operand costs to cast, per element, by scaling recipe (Megatron-Core's
# names, TransformerConfig.fp8_recipe; torchao's for rowwise). Every recipe reads the bf16
# tensor (2) and writes it twice in FP8 (1 + 1), row-wise for the GEMM that consumes it and
# column-wise for the backward GEMM that consumes it the other way round (Transformer
# Engine's cast-transpose: Hopper's FP8 GEMMs take TN operands only, and MXFP8 scales
# 1 x 32 blocks along one axis, so both copies are made); besides:
#   delayed     nothing: the scale comes from the amax history of earlier steps
#   tensorwise  per-tensor current scaling (Megatron-Bridge's "FP8-CS", torchao's default
#               dynamic scaling): a pass that reads the tensor for its amax first (2)
#   rowwise     torchao's per-row dynamic scaling: the same amax read
#   mxfp8       one E8M0 scale byte per 32 elements, for each copy
#   blockwise   one fp32 scale per 128 elements (1 x 128 tiles), for each copy
# Unfused: few of Megatron-Core's casts are fused into the ops that make their operands.
# A review against Transformer Engine's code and every FP8 row's recipe, with sources:
# docs/research/fp8_recipes.md. Where FP8 GEMMs take any operand layout (hardware.toml
# fp8_any_layout: B200, GB200) Transformer Engine's per-tensor recipes make no column copy
# (one byte less; fp8_cast_seconds ``any_layout``); MXFP8 scales along one axis, so it
# still makes both.
FP8_CAST_BYTES = {"delayed": 4.0, "tensorwise": 6.0, "rowwise": 6.0, "mxfp8": 4.0 + 2.0 / 32.0,
                  "blockwise": 4.0 + 2.0 * 4.0 / 128.0}
FP8_RECIPES = tuple(FP8_CAST_BYTES)
# Transformer Engine's per-tensor recipes: the ones whose column copy is a transpose of the
# row-wise one (none where FP8 GEMMs take any layout).
TE_PER_TENSOR_RECIPES = ("delayed", "tensorwise")


def fp8_cast_bytes(recipe: str, any_layout: bool = False) -> float:
    """Bytes an element costs to cast under ``recipe`` (:data:`FP8_CAST_BYTES`), one less
    for Transformer Engine's per-tensor recipes where the GPU's FP8 GEMMs take any layout
    (no column copy)."""
    return FP8_CAST_BYTES[recipe] - (1.0 if any_layout and recipe in TE_PER_TENSOR_RECIPES else 0.0)


def row_recipe_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a published row's FP8 recipe (the validation files): an FP8 row
    names one of :data:`FP8_RECIPES`, a row in another precision none; None if right."""
    from ..layout import fp8_recipe_problem

    recipe = row.get("fp8_recipe")
    if row.get("precision") == "fp8" and recipe not in FP8_RECIPES:
        return f"an FP8 row names its scaling recipe: fp8_recipe one of {', '.join(FP8_RECIPES)}, got {recipe!r}"
    return fp8_recipe_problem(row.get("precision", "bf16"), recipe)


def _attention_cast_widths(shape: ModelShape) -> dict[str, float]:
    """Widths attention's linears (ModelShape.attention_parts) cast a token: ``seq_*`` on
    tensors a rank holds 1 / tp of only under sequence parallelism (a column-parallel or
    replicated linear's input, a row-parallel or replicated one's output gradient: MLA's
    down-projections run whole on every tensor-parallel rank), ``tp_*`` on widths tensor
    parallelism splits (a column-parallel linear's output gradient, a row-parallel one's
    input); ``*_f`` forward inputs, ``*_b`` backward output gradients."""
    parts = [p for p in shape.attention_parts() if p.split != "norm"]
    el = {"seq_f": float(sum(p.k for p in parts if p.split != "row")),
          "seq_b": float(sum(p.n for p in parts if p.split != "column")),
          "tp_f": float(sum(p.k for p in parts if p.split == "row")),
          "tp_b": float(sum(p.n for p in parts if p.split == "column"))}
    if not shape.is_mla:  # Megatron-Core fuses q, k and v into one linear (linear_qkv): h cast once
        el["seq_f"] = float(shape.hidden)
    return el


def fp8_cast_elements(shape: ModelShape, load: float = 1.0) -> dict[str, float]:
    """Elements a token casts to FP8 in one block, averaged over dense and MoE blocks, by
    how parallelism splits them (:func:`_attention_cast_widths`): ``*_f`` forward every
    linear's input, ``*_b`` backward every linear's output gradient (the dgrad and wgrad
    GEMMs' FP8 operand). ``routed_*``: what the routed experts' rows cast (top_k x ``load``
    rows a token, the busiest rank's), split over tensor-parallel ranks only under sequence
    parallelism (memory.moe_mlp_extra). The shared experts run as one MLP of their summed
    width (Megatron-Core's shared-expert MLP), so its input and output gradient are cast
    once. The router and the output layer stay in bf16 (Megatron-LM's fp8 covers the
    transformer blocks' linears), so neither is counted; weights are cast once a step, not
    counted. ``rerun``: by Megatron-Core recompute module ("mlp", "moe", "mla_up_proj"), the
    forward casts it runs again, split as the rest (sequence, tensor, routed)."""
    c = block_gemm_classes(shape)
    h = float(shape.hidden)
    el = _attention_cast_widths(shape)
    w = c["moe_frac"]
    # a dense MLP: the up projection column-parallel, the down projection row-parallel
    el["seq_f"] += (1.0 - w) * h
    el["seq_b"] += (1.0 - w) * h
    el["tp_f"] += (1.0 - w) * c["mlp_down_k"]
    el["tp_b"] += (1.0 - w) * c["mlp_up_n"]
    el["routed_f"] = el["routed_b"] = 0.0
    # what each recompute module's forward casts again: (sequence-split, tensor-split, routed)
    el["rerun"] = {"mlp": ((1.0 - w) * h, (1.0 - w) * c["mlp_down_k"], 0.0), "moe": (0.0, 0.0, 0.0),
                   "mla_up_proj": (float(sum(p.k for p in shape.attention_parts() if p.name in MLA_UP_PROJECTIONS)),
                                   0.0, 0.0)}
    if w > 0.0:
        n = float(shape.shared_experts)  # tensor-parallel like a dense MLP, n experts' width
        el["seq_f"] += w * (h if n else 0.0)
        el["seq_b"] += w * (h if n else 0.0)
        el["tp_f"] += w * n * c["expert_down_k"]
        el["tp_b"] += w * n * c["expert_up_n"]
        rows = float(shape.top_k) * load
        el["routed_f"] = w * rows * (h + c["expert_down_k"])
        el["routed_b"] = w * rows * (c["expert_up_n"] + h)
        el["rerun"]["moe"] = (w * (h if n else 0.0), w * n * c["expert_down_k"], el["routed_f"])
    return el


def fp8_cast_seconds(shape: ModelShape, hw: Hardware, *, tokens: Any, tp: Any, blocks: Any, num_micro: Any,
                     recompute: Any, load: float = 1.0, sp: Any = True, recipe: str = "delayed",
                     modules: tuple[str, ...] = (), any_layout: bool = False) -> Any:
    """Seconds a rank's step spends casting its linears' operands to FP8 (what ``precision
    fp8`` adds beside faster GEMMs): :func:`fp8_cast_elements` x the ``recipe``'s
    :data:`FP8_CAST_BYTES` at the achieved memory bandwidth, for ``tokens`` (a rank's
    tokens of one micro-batch before tensor parallelism splits them over ``tp``) through
    ``blocks`` blocks, ``num_micro`` micro-batches. The forward casts run again for the
    share ``recompute`` reruns, and for what Megatron-Core's recompute ``modules`` rerun
    beyond it (moe.RECOMPUTE_MODULES: "mlp", "moe", "mla_up_proj").
    Widths split over tp are 1 / tp a rank; sequence-split tensors are 1 / tp only under
    sequence parallelism ``sp``, where a rank casts its share before the all-gather. Under
    the per-tensor recipes (delayed, tensorwise) Transformer Engine gathers only the
    row-wise FP8 copy and makes the column-wise one by transposing the gathered tensor on
    every rank (transformer_engine/pytorch/module/linear.py: "All-gather is not supported
    with FP8 column-wise data"), so a sequence-split element costs its bytes less the
    column copy over tp, plus a read and a write of the gathered one (2 bytes).
    ``any_layout``: the GPU's FP8 GEMMs take any operand layout (catalog
    accelerator_fp8_any_layout), so the per-tensor recipes make no column copy at all
    (Transformer Engine reuses the row-wise data, gathered or not)."""
    if recipe not in FP8_CAST_BYTES:
        raise MgbenchError(f"FP8 recipe {recipe!r} is not one of {', '.join(FP8_RECIPES)}")
    el = fp8_cast_elements(shape, load)
    t = np.asarray(tp, dtype=float)
    split = np.asarray(sp, dtype=bool) & (t > 1)
    share = np.where(split, t, 1.0)
    shared_rec = matmul_recomputed_share(shape.layers, recompute)
    again = 1.0 + shared_rec
    B = fp8_cast_bytes(recipe, any_layout)
    transposed = recipe in TE_PER_TENSOR_RECIPES and not any_layout
    seq_bytes = np.where(split & transposed, (B - 1.0) / share + 2.0, B / share)
    seq_el = el["seq_f"] * again + el["seq_b"]
    routed_el = el["routed_f"] * again + el["routed_b"]
    tp_el = el["tp_f"] * again + el["tp_b"]
    # recompute modules: their forward casts once more, where a whole-block rerun does not
    # already (the share of blocks recomputed whole)
    for module, (seq_r, tp_r, routed_r) in el["rerun"].items():
        if module in modules:
            left = 1.0 - np.minimum(shared_rec, 1.0)
            seq_el, tp_el, routed_el = seq_el + seq_r * left, tp_el + tp_r * left, routed_el + routed_r * left
    per_token_bytes = seq_el * seq_bytes + routed_el * B / share + tp_el * B / t
    nbytes = per_token_bytes * np.asarray(tokens, dtype=float) * np.asarray(blocks, dtype=float) \
        * np.asarray(num_micro, dtype=float)
    return nbytes / (hw.mem_bw * hw.mem_bw_fraction)


def compute_terms(shape: ModelShape, hw: Hardware, *, seq: Any, global_batch: Any, micro_batch: Any,
                  tp: Any, pp: Any, dp: Any, recompute: Any, precision: str = "bf16", sp: Any = False,
                  flash: Any = True, host_ops: dict[str, float] | None = None, ep: Any = 1,
                  pp_last_layers: Any = None) -> dict[str, Any]:
    """The compute of the busiest GPU's step and its tensor- and pipeline-parallel
    communication, in seconds (arrays broadcast): the terms of the step model that
    depend on neither the schedule's bubble nor data-parallel traffic, which
    :func:`mgbench.planner.layout_time.step_time` (the one step model) adds.

    ``host_ops`` (``ops``, ``bytes``: what one rank's step dispatches besides matmuls and
    SDPA, planner/opcount.py) with a probed CPU Hardware (``ew_bw`` set) prices the
    non-matmul work op by op instead of by elementwise passes (see :func:`host_terms`).
    ``ep``: the expert-parallel degree, which sets how many rows each routed expert's GEMM
    has (:func:`shaped_gemms`).
    ``pp_last_layers``: the last pipeline stage's blocks where the run sets them
    (memory.stage_layers); the blocks priced are then the first stage's share of the rest.

    Terms (seconds of the busiest GPU's step; ``*_s`` before the stack's efficiency except
    ``blocks_s`` and ``head_s``): ``matmul_s`` every GEMM, ``linear_s`` the blocks' GEMMs
    but attention's scores and values (what fp8 speeds up), ``gemm_shape_s`` what the
    GEMMs lose to their shapes beyond the large-GEMM rate (0 without ``hw.gemm_shapes``),
    ``expert_gemm_s`` the routed experts' GEMMs (inside ``linear_s``), ``elementwise_s``,
    ``attention_s`` (the fused kernel's), ``scores_s`` attention's scores and values as
    priced, whichever way (the fused kernel's seconds, else their FLOPs at the GEMM rate),
    ``flash_unit_s`` their seconds in a fused kernel at the whole bf16 peak (divided by a
    kernel's measured fraction: what FP8 attention saves, layout_time.step_time),
    ``tp_comm_s``, ``pp_comm_s``."""
    from .memory import korthikanti_bytes_per_layer

    s = np.asarray(seq, dtype=float)
    B = np.asarray(global_batch, dtype=float)
    b = np.asarray(micro_batch, dtype=float)
    t, p, d = (np.asarray(x, dtype=float) for x in (tp, pp, dp))
    rc = np.asarray(recompute)
    m = B / (b * d)  # micro-batches per pipeline per step

    tokens = B * s
    rate = gemm_rate(hw)
    head_tok = head_flops_per_token(shape)
    stage_layers = memory_stage_layers(shape.layers, p, pp_last_layers)[0]
    # The busiest GPU: ceil(L / p) blocks of its pipeline's 1 / (t d) share of the tokens
    # (or the share of a first stage where the run sets the last one's: memory.stage_layers),
    # and (on the last stage; every GPU when p = 1) the output layer: layout_time.step_time
    # puts the two on the critical path.
    blocks_mm = (hardware_flops_per_token(shape, s, rc) - head_tok) * tokens * stage_layers / shape.layers / (t * d) / rate
    head_mm = head_tok * tokens / (t * d) / rate
    act_per_token = korthikanti_bytes_per_layer(shape, s, 1, t, sp, flash, precision) / s
    ew_bytes = hw.elementwise_passes * act_per_token * (tokens / d) * stage_layers
    elementwise = ew_bytes * elementwise_rerun(rc) / (hw.mem_bw * hw.mem_bw_fraction)
    rank_tokens = tokens * stage_layers / shape.layers / (t * d)
    # The block linears: every block GEMM but attention's scores and values (what fp8 speeds up).
    scores = attention_flops_per_token(shape, s, rc) * rank_tokens / rate
    linear = blocks_mm - scores
    shape_loss = 0.0 * linear
    block_loss = shape_loss
    expert = 0.0 * linear
    if hw.gemm_shapes:
        # Each block GEMM at its shape, per micro-batch, over the stage's blocks; the rest
        # of the linears' FLOPs (MTP modules, norms) at the rate, so that large GEMMs give
        # exactly the rate's seconds.
        g = shaped_gemms(shape, hw, tokens_micro=b * s, tp=t, ep=ep, rate=rate, precision=precision,
                         passes=3.0 + matmul_recomputed_share(shape.layers, rc))
        per_step = m * stage_layers
        shape_loss = per_step * (g["seconds"] - g["flops"] / rate)
        expert = per_step * g["expert_s"]
        # The output projection: m = b s rows, h deep, V / t wide, forward and two backward
        # GEMMs per micro-batch (never recomputed), once more per MTP module.
        f_h, b_h = _gemm(b * s, float(shape.hidden), shape.padded_vocab / t, act_bytes(precision))
        head_loss = 3.0 * (1 + shape.mtp_layers) * m * (gemm_seconds(f_h, b_h, hw, rate) - f_h / rate)
        linear = linear + shape_loss
        blocks_mm = blocks_mm + shape_loss
        head_mm = head_mm + head_loss
        block_loss = shape_loss
        shape_loss = shape_loss + head_loss
    attention = 0.0 * linear
    if hw.ew_bw is not None and host_ops is not None:
        _, attention, elementwise = host_terms(shape, hw, s, rc, rank_tokens, host_ops)
        blocks_mm = linear
        scores = attention
    elif (fused := flash_attention_s(shape, hw, s, rc, rank_tokens)) is not None:
        on = np.asarray(flash, dtype=bool)
        attention = np.where(on, fused, 0.0)
        blocks_mm = np.where(on, linear, blocks_mm)
        scores = np.where(on, fused, scores)
    blocks = (blocks_mm + attention + elementwise) / hw.stack_eff
    head = head_mm / hw.stack_eff
    # What of ``blocks`` is priced from the model's FLOPs per token, which count the MTP
    # modules' blocks with the others (layout_time.step_time moves their share to the last
    # stage); the elementwise traffic and the GEMMs' shape losses are the stage's own blocks'.
    spread = (blocks_mm - block_loss + attention) / hw.stack_eff

    act = s * b * shape.hidden * act_bytes(precision)
    counts = collective_counts(shape.layers, t, p, d, 0, m, rc, pp_last_layers=pp_last_layers, shape=shape)
    tp_comm = counts["tp"] * group_collective_time(act, t, t, hw, 2.0)
    # Pipeline neighbours are t * d ranks apart: same node only if that fits in one.
    pp_bw, pp_alpha = _group_link(t * d + 1, hw)
    p2p = pp_alpha + act / t / pp_bw  # scatter-gather: each TP rank sends 1/t
    pp_comm = np.where(p > 1, counts["pp"] * p2p, 0.0)
    return {
        "num_micro_batches": m,
        "blocks_s": blocks,
        "flop_spread_s": spread,
        "block_shape_loss_s": block_loss,
        "head_s": head,
        "matmul_s": blocks_mm + head_mm,
        "elementwise_s": elementwise,
        "attention_s": attention,
        "scores_s": scores,
        "flash_unit_s": flash_attention_s(shape, hw, s, rc, rank_tokens, fraction=1.0),
        "linear_s": linear,
        "gemm_shape_s": shape_loss,
        "expert_gemm_s": expert,
        "tp_comm_s": tp_comm,
        "pp_comm_s": pp_comm,
    }
