"""Memory per GPU: model states (ZeRO stages), what this workload saves for backward,
pipeline in-flight micro-batches, the transient peaks of a training step, and (for a
real GPU) a stated allowance.

Two callers, one model:

- :func:`memory_per_gpu` sizes a layout for `mgbench memory`, `predict` and `plan` (the
  planner: production mixed precision, ZeRO with a flat partition, fused optimizers),
  vectorised over numpy arrays so `mgbench plan` sizes millions of layouts in one call.
- :func:`memory_for_config` sizes a runner config (:class:`mgbench.config.RunConfig`) as
  mgbench's own runner trains it (fp32 weights under autocast, FSDP2, DDP buckets, torch's
  AdamW), which `mgbench memory --trace` and the runner's tracked memory check.

Activations are counted tensor by tensor as :mod:`mgbench.workloads.gpt` saves them
(its docstring lists the choices: bf16 residual stream, fp32 RMSNorm statistics, SDPA's
own GQA, chunked fp32 cross-entropy), not by Korthikanti et al.'s GPT figure, which
:func:`korthikanti_bytes_per_layer` keeps for the step-time model's memory traffic.
Bytes throughout; GB = 1e9 bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..layout import RECOMPUTE
from ..model_shape import ModelShape
from ..strategies.schedules import NAMES as _SCHEDULE_NAMES
from ..strategies.schedules import chunks_per_rank, grad_sync, v_shaped
from ..strategies.schedules import VIRTUAL as _VIRTUAL

# Bytes per parameter of (weights, gradients, optimizer states) for Adam under the
# planner's production mixed precision: 16-bit weights and gradients, fp32 master
# weights + m + v = 12 (Rajbhandari et al. 2020, "ZeRO", section 3.1: 2 + 2 + K with
# K = 12). fp32: weights 4, gradients 4, m + v 8.
# fp8 (torchao float8 training) keeps the same states: its Float8Linear holds the
# high-precision weight and casts it to float8 on every forward (dynamic scaling); the
# optimizer and gradients are untouched.
STATE_BYTES = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8), "fp8": (2, 2, 12)}
# mgbench's runner keeps fp32 weights, fp32 gradients and fp32 AdamW states under every
# precision (bf16 / fp16 are autocast; FSDP2's MixedPrecisionPolicy casts only the
# gathered copy): 4 + 4 + 8 bytes per parameter.
RUNNER_STATE_BYTES = (4, 4, 8)

# Activation recomputation's modes, one name everywhere: mgbench/layout.py says what each
# is and which the runner runs. Their index is the integer form the models take here.
SELECTIVE = RECOMPUTE.index("selective")
OP_SAC = RECOMPUTE.index("op")


def recomputed_blocks(blocks: Any, recompute: Any) -> Any:
    """How many of ``blocks`` blocks run their forward again in backward under
    ``recompute`` (an index into RECOMPUTE, array or scalar): every one under full,
    every second one starting with the first (ceil(n / 2) of n) under every_2nd, none
    otherwise (selective recomputes core attention only: :func:`attention_recomputed_share`).
    The one statement of the rule: FLOPs (perf), memory, communication repeated by
    recomputation (layout_time) and the fit (calibrate) all count it here."""
    n = np.asarray(blocks, dtype=float)
    rc = np.asarray(recompute)
    return np.where(rc == 2, n, np.where(rc == 1, np.ceil(n / 2.0), 0.0))


def recomputed_share(blocks: Any, recompute: Any) -> Any:
    """:func:`recomputed_blocks` as a fraction of ``blocks``."""
    return recomputed_blocks(blocks, recompute) / np.asarray(blocks, dtype=float)


def matmul_recomputed_share(blocks: Any, recompute: Any) -> Any:
    """Fraction of the blocks' matmul forward FLOPs run again in backward: the blocks
    recomputed whole, and half of every block's under op-level selective checkpointing."""
    return np.where(np.asarray(recompute) == OP_SAC, 0.5, recomputed_share(blocks, recompute))


def elementwise_recomputed(recompute: Any) -> Any:
    """Whether every block's elementwise work (norms, rotary, activations) runs again in
    backward: full recompute and op-level selective checkpointing."""
    rc = np.asarray(recompute)
    return (rc == 2) | (rc == OP_SAC)


def attention_recomputed_share(blocks: Any, recompute: Any) -> Any:
    """Fraction of the blocks whose core attention runs again in backward: those
    recomputed whole, and every block under selective."""
    return np.where(np.asarray(recompute) == SELECTIVE, 1.0, recomputed_share(blocks, recompute))


# The runner's pipeline schedules (strategies/schedules.py, the one registry), 1F1B first
# (the planner's default).
SCHEDULES = tuple(sorted(_SCHEDULE_NAMES, key=lambda n: n != "1f1b"))
# Schedules whose chunks per rank are --virtual-stages (the others hold one, or two in a V).
VIRTUAL_SCHEDULES = _VIRTUAL

# Allowance for what no tensor count sees on a GPU: the CUDA caching allocator's
# fragmentation, cuBLAS / NCCL workspaces. A stated engineering margin (PyTorch's
# allocator typically reserves 5-10% above allocated memory), not a measurement; it is
# part of the planner's totals, never of memory_for_config's (tracked tensors only).
ALLOWANCE_FRACTION = 0.08

# Cross-entropy chunks (mgbench.workloads.gpt.LOSS_CHUNKS, repeated here so the planner
# does not import torch; tests/unit/test_memory_model.py checks they agree).
LOSS_CHUNKS = 8
# fp32 per-token scalars RMSNorm keeps: the fp32 norm and its reciprocal square root.
NORM_SCALAR_BYTES = 8.0
# SDPA's log-sum-exp, fp32, one per head and token (flash attention on CPU and CUDA).
LSE_BYTES = 4.0


def act_bytes(precision: str) -> float:
    """Bytes of an activation element: 2 under bf16 / fp16 autocast, 4 in fp32."""
    return 4.0 if precision == "fp32" else 2.0


def stage_layers(layers: int, pp: Any, last: Any = None) -> tuple[Any, Any]:
    """(blocks of the busiest pipeline stage but the last, blocks of the last stage).

    Megatron-LM's default split gives every stage ceil(L / p) blocks, the last one besides
    the output layer (``last`` None: both ceil(L / p)). A run that sets the last stage's
    blocks to ``last`` = k to make room for the output layer (and the MTP module) -
    Megatron-LM's --decoder-last-pipeline-num-layers, a pipeline_model_parallel_layout
    string, torchtitan's split by cost - spreads the other L - k over p - 1 stages,
    ceil((L - k) / (p - 1)) each. Without a pipeline: (L, L); a NaN ``last`` (rows of a
    search whose last stage is not set) is the even split."""
    p = np.asarray(pp, dtype=float)
    even = np.ceil(layers / p)
    if last is None:
        return even, even
    k = np.asarray(last, dtype=float)
    unset = np.isnan(k) | (p <= 1)  # NaN: a row of many whose last stage is not set
    k = np.where(unset, 0.0, k)
    others = np.ceil((layers - k) / np.maximum(p - 1.0, 1.0))
    return np.where(unset, even, others), np.where(unset, even, k)


def max_last_layers(layers: int, pp: Any, mtp: int = 0) -> Any:
    """The most blocks a last stage set lighter (:func:`stage_layers`) may hold: with its
    ``mtp`` MTP modules, no more than each other stage, k + mtp <= ceil((L - k) / (p - 1)),
    which is k < (L - (mtp - 1)(p - 1)) / p. (A heavier last stage is not what the setting
    is for, and memory, which counts the first stage, would miss it.)"""
    p = np.asarray(pp, dtype=float)
    return np.ceil((layers - (mtp - 1.0) * (p - 1.0)) / p) - 1.0


def stage_params(shape: ModelShape, tp: Any, pp: Any, pp_last_layers: Any = None) -> Any:
    """Parameters held by one GPU of the heaviest pipeline stage, before ZeRO sharding.

    Blocks are split evenly over pp stages (ceil for the heaviest; with ``pp_last_layers``
    the first stage's share of the rest: :func:`stage_layers`), every matrix over tp.
    With pp = 1 one GPU holds the embedding and the output projection (once if tied);
    with pp > 1 the first stage holds the embedding and the last the projection, so the
    heaviest holds one of them.
    """
    tp, pp = np.asarray(tp), np.asarray(pp)
    emb = shape.padded_vocab * shape.hidden
    layers_per_stage = stage_layers(shape.layers, pp, pp_last_layers)[0]
    ends = np.where(pp == 1, emb * (1 if shape.tie_embeddings else 2), emb)
    return (layers_per_stage * shape.params_per_layer() + ends) / tp + shape.hidden


def held_state_bytes(precision: str, state_bytes: tuple[float, float, float]) -> tuple[float, float, float]:
    """The bytes a parameter a run holds its weights, gradients and optimizer states at:
    fp32 training keeps fp32 everything (STATE_BYTES["fp32"]), else ``state_bytes`` (the
    run's, or its stack's: stack.memory_of)."""
    return tuple(float(x) for x in (STATE_BYTES["fp32"] if precision == "fp32" else state_bytes))


def rank_runs(pp: Any, schedule: str, virtual_stages: int) -> Any:
    """The runs of consecutive blocks a pipeline rank holds: its schedule's chunks
    (strategies.schedules.chunks_per_rank: an interleaved schedule's virtual stages, each
    from another part of the model), 1 without a pipeline. What ModelShape.stage_moe_layers
    counts a stage's MoE layers in."""
    return np.where(np.asarray(pp) > 1, chunks_per_rank(schedule, virtual_stages), 1)


def expert_ranks(ep: Any, etp: Any = 1) -> Any:
    """The ranks one copy of a layer's routed experts is split over: ep of them each
    holding experts / ep, each of those split etp ways (Megatron-Core's expert tensor
    parallelism)."""
    return np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float)


def stage_param_split(shape: ModelShape, tp: Any, pp: Any, ep: Any = 1, pp_last_layers: Any = None,
                      etp: Any = 1, chunks: Any = 1) -> tuple[Any, Any]:
    """(dense, expert) parameters one GPU of the heaviest pipeline stage holds, before
    ZeRO sharding; their sum is :func:`stage_params` when ep = 1 and the stage's layers
    are all MoE layers.

    Routed experts are sharded over the ep ranks (experts / ep each) and not over tp:
    the runner's expert parallelism does not combine with tensor parallelism (Megatron's
    expert tensor-parallel degree 1); with ``etp`` > 1 each is split over etp ranks too
    (Megatron-Core's expert_tensor_parallel_size). The heaviest stage is taken to hold
    the most MoE layers its ceil(L / p) blocks can, in ``chunks`` runs (an interleaved
    schedule's virtual stages: ModelShape.stage_moe_layers). Everything else (attention, norms, router,
    shared experts, dense MLPs, embedding, head) follows :func:`stage_params`. A dense
    model: (stage_params, 0)."""
    if not shape.is_moe:
        dense = stage_params(shape, tp, pp, pp_last_layers)
        return dense, 0.0 * dense
    tp, pp = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    lps = stage_layers(shape.layers, pp, pp_last_layers)[0]
    per_layer_experts = shape.experts * shape.expert_params()
    emb = shape.padded_vocab * shape.hidden
    ends = np.where(pp == 1, emb * (1 if shape.tie_embeddings else 2), emb)
    non_expert = shape.params_per_layer() - shape.num_expert_params() / shape.layers  # mean over blocks
    dense = (lps * non_expert + ends) / tp + shape.hidden
    expert = shape.stage_moe_layers(lps, chunks) * per_layer_experts / expert_ranks(ep, etp)
    return dense, expert


def moe_mlp_extra(shape: ModelShape, tokens: Any, tp: Any, precision: str, load: float = 1.0,
                  modules: tuple[str, ...] = (), te: bool = False, fp8_act_cache: bool = False,
                  sp: Any = True, clamp_saved: bool = False, etp: Any = 1, eager_saved: bool = False) -> Any:
    """Bytes an MoE block saves for backward beyond a dense block of width ffn_hidden
    (what :func:`layer_activations` counts), for ``tokens`` tokens. Zero for a dense model.

    As Megatron-Core's grouped MLP keeps them, e bytes an element, per token and each of
    its top_k routed rows: the first grouped GEMM's input (e h: the dispatched row), the
    fused SwiGLU's input (2 e F_e: the gate and up projections, with the routing
    probability applied inside the activation since Megatron-Core 0.13, so that the
    second GEMM's output is not kept for the combine) and the second grouped GEMM's
    input (e F_e) - the all-to-alls and the permutation keep nothing; the shared experts'
    MLP likewise, split over tp, 3 e (shared x F_e) / t; the router's logits (e E) and fp32
    probabilities (4 E); less the dense MLP layer_activations counted (4 e F, 2 for GELU).
    ``load``: the busiest expert-parallel rank's routed rows over the mean (planner/moe.py
    MoeOptions.load): that rank holds that many more routed rows. ``modules``:
    Megatron-Core recompute_modules (MoeOptions.recompute_modules): "moe_act" discards
    the activation's output (the second GEMM's input, e F_e a row) and runs it again;
    "moe" checkpoints the whole MoE MLP, which then keeps only its input (counted by
    layer_activations as the norm's output). ``te`` (Transformer Engine under fp8): the
    grouped GEMMs keep their inputs FP8-quantized (1 byte: the dispatched row and the
    second GEMM's input), as layer_activations' linears do. ``fp8_act_cache`` (under fp8
    training only): the experts' SwiGLU input is cached in FP8 (DeepSeek-V3 section 3.3.3),
    1 byte an element instead of e, for the routed and shared experts. ``clamp_saved``
    (gpt-oss's clamp run unfused, planner/moe.py EPILOGUE_BYTES): the clamp keeps its input,
    the first GEMM's output, while the activation keeps the clamped copy: 2 e F_e a routed
    row more, unless the activation is recomputed (moe_act, moe). ``etp``: expert tensor
    parallelism all-gathers the routed rows of its etp ranks before the experts, each of
    which keeps that etp x the first GEMM's input (the hidden-wide rows) and 1 / etp of
    the expert's width for etp x the rows: the same. ``eager_saved`` (torchtitan's MoE layer,
    data/stacks.toml ``moe_eager_saved``): its unfused SwiGLU keeps the activation's input and
    output apart, e F_e a routed row more than the fused count (silu saves the gate
    projection, the product saves silu's output and the up projection), and its combine,
    the router's scores times the routed outputs as a bmm over an fp32 copy of them, keeps
    that copy, 4 h a routed row (torchtitan/models/moe/moe.py @781a146c lines 1030-1047 and
    _run_experts_grouped_mm's unfused path, lines 355-366; the scores-after-experts models,
    DeepSeek-V3, Qwen3 and gpt-oss's flavours there, set score_before_experts False)."""
    if not shape.is_moe:
        return 0.0 * np.asarray(tokens, dtype=float)
    e = act_bytes(precision)
    t = np.asarray(tp, dtype=float)
    h, fe = shape.hidden, shape.moe_ffn_hidden
    f = 1.0 if (te and precision == "fp8") else e  # the bytes a linear keeps its input in
    act = 0.0 if "moe_act" in modules else 1.0
    g = 1.0 if (fp8_act_cache and precision == "fp8") else e  # the bytes the SwiGLU keeps its input in
    # Sequence parallelism (``sp``; Megatron-LM requires it for MoE with tp > 1) gives each
    # tensor-parallel rank s / t of the tokens, and the router and the dispatcher work on
    # those (Megatron-Core's MoE parallel folding: the experts' all-to-all spans the tp
    # ranks, planner/moe.py), so the routed rows and the router's scores are a 1 / t share;
    # without it every rank routes every token. The shared experts run tensor-parallel on
    # every token, their widths split.
    share = np.where(np.asarray(sp, dtype=bool), t, 1.0)
    clamp = 2.0 * e * act if clamp_saved else 0.0
    eager = (act * e * fe + 4.0 * h) if eager_saved else 0.0
    routed = load * shape.top_k * (f * h * np.asarray(etp, dtype=float) + (2.0 * g + act * f + clamp) * fe
                                   + eager) / share
    shared = (2.0 * g + act * f) * shape.shared_experts * fe / t
    router = (e + 4.0) * shape.experts / share
    if "moe" in modules:
        routed = shared = router = 0.0
    dense_mlp = dense_mlp_bytes(shape, e, f, te) / t
    return np.asarray(tokens, dtype=float) * (routed + shared + router - dense_mlp)


def cp_kv_bytes(shape: ModelShape, seq: Any, micro_batch: Any, tp: Any, cp: Any, precision: str) -> Any:
    """Context parallelism's transient peak: the all-gathered K and V of the block being
    computed, for the whole sequence (2 e s b k / t, k = kv heads x head dim), and in its
    backward their gradients before the reduce-scatter (as much again): 4 e s b k / t.
    Zero when cp = 1. (Ring attention holds two of the cp chunks instead; the
    all-gather form is what runs on CPU and what is counted.)"""
    k = shape.kv_heads * shape.dim_head
    full = np.asarray(seq, dtype=float) * np.asarray(micro_batch, dtype=float) * k
    return np.where(np.asarray(cp) > 1, 4.0 * act_bytes(precision) * full / np.asarray(tp, dtype=float), 0.0)


def pipeline_fsdp_holds_stage(pp: Any, zero: Any) -> Any:
    """Where a pipeline's FSDP stages (ZeRO-3 with pp > 1) hold their whole stage
    unsharded, weights and fp32 gradients, through the step: the one statement of it.

    torch.distributed.pipelining (the runner's, and torchtitan's) turns FSDP2's gradient
    sync and its reshard-after-backward off for every backward of the step
    (PipelineStage.backward_maybe_with_nosync) and reduce-scatters once, at the
    schedule's REDUCE_GRAD (perform_reduce_grad). So:

    - weights: every schedule keeps the stage's gathered weights (16-bit, fp8: 1 byte)
      from its first backward to the end of the step; the split-backward ones
      (:func:`pipeline_fsdp_unsharded_from_forward`; torchtitan every pipeline) from
      the first forward. The first stage's activations peak in 1F1B's and interleaving's
      steady state, after that first backward (traced: 4 of 4 blocks gathered there),
      so the whole stage counts beside them; under GPipe, which runs every forward
      first, it is an upper bound (the stage is whole at the end of backward, when most
      activations are freed);
    - gradients: accumulated unsharded over the micro-batches in FSDP2's fp32 reduce
      dtype, 4 bytes a weight of the stage, until the reduce-scatter."""
    return (np.asarray(pp) > 1) & (np.asarray(zero) >= 3)


def pipeline_fsdp_unsharded_from_forward(pp: Any, schedule: str) -> Any:
    """Where a pipeline's FSDP stages (:func:`pipeline_fsdp_holds_stage`) are whole from
    the first forward, not only from the first backward: the split-backward schedules,
    whose replicas the registry reduces with "fsdp_reduce_grad_unsharded"
    (strategies/schedules.grad_sync), so the runner shards them with
    reshard_after_forward = False (strategies/apply.py). The one statement of it:
    perf.zero3_gathers (one gather a step) and :func:`runner_phases` (FSDP2 without
    resharding) read it here."""
    return (np.asarray(pp) > 1) & (grad_sync(schedule, "fsdp") == "fsdp_reduce_grad_unsharded")


def _add_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: a[k] + b[k] for k in a}


def model_states(params: Any, dp: Any, zero: Any, precision: str,
                 state_bytes: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """Bytes of weights, gradients and optimizer states per GPU under ZeRO stage 0-3.

    Stage 1 shards optimizer states over the data-parallel group, stage 2 also the
    gradients, stage 3 also the weights (ZeRO paper, figure 1).
    """
    w, g, o = state_bytes or STATE_BYTES[precision]
    dp, zero = np.asarray(dp, dtype=float), np.asarray(zero)
    params = np.asarray(params, dtype=float)
    p_b = params * w / np.where(zero >= 3, dp, 1.0)
    g_b = params * g / np.where(zero >= 2, dp, 1.0)
    o_b = params * o / np.where(zero >= 1, dp, 1.0)
    return {"params_bytes": p_b, "grads_bytes": g_b, "optimizer_bytes": o_b, "model_states_bytes": p_b + g_b + o_b}


def layer_activations(shape: ModelShape, tokens: Any, tp: Any, sp: Any, precision: str,
                      flash: Any = True, seq: Any = None, selective: Any = False, op_sac: Any = False,
                      mla_up_proj: bool = False, te: bool = False, layernorm: bool = False) -> Any:
    """Bytes one transformer block of mgbench's workload saves for backward, for
    ``tokens`` tokens (micro-batch x sequence), per tensor-parallel rank.

    Per token, with e bytes an element (2 under bf16 autocast, 4 in fp32), h hidden,
    q = heads x head dim, k = kv_heads x head dim, F the MLP width, a heads, t the
    tensor-parallel degree:

    - each of the two RMSNorms: its input and its normalised output (2 e h, sequence-
      sharded under sequence parallelism: / t) and two fp32 per-token scalars (8 B); its
      output, the next matmuls' input, e h (whole on every rank: replicated, or
      all-gathered under sequence parallelism, as DTensor's plan keeps it);
    - attention: the rotated q and k, v and SDPA's output (e (2 q + 2 k) / t) and
      SDPA's fp32 log-sum-exp (4 a / t); its output is read by the output projection
      as a view;
    - MLP: SwiGLU keeps w1 x, silu(w1 x), w3 x and their product (4 e F / t), GELU keeps
      w1 x and its GELU (2 e F / t).

    ``flash=False`` (planner only: an attention kernel that stores its scores) adds
    Korthikanti et al.'s 5 a s bytes per token (softmax, dropout mask and output) / t.
    ``selective`` (core attention recomputed) saves neither those scores nor the
    log-sum-exp; q, k, v are kept as the recomputation's inputs and the output as the
    output projection's.

    ``op_sac`` (torchtitan's op-level selective checkpointing) keeps the block's input
    (e h, sequence-sharded under sequence parallelism), attention's output and
    log-sum-exp (e q / t + 4 a / t) and half of the matmul outputs: of q, k, v and the
    MLP's w1 (and w3) outputs (e (q + 2 k + n F) / 2 / t, n = 2 gated, 1 otherwise) and
    of the two h-wide outputs, wo's and w2's (e h, per rank as the block input is).

    Multi-head latent attention (:func:`mla_attention_bytes`) at its own widths: q and
    k at nope + rope a head, the values and the output at v_head_dim, the up-projection
    of keys and values whole (the values are a view of it), and the compressed latents
    with their norms. ``mla_up_proj`` (Megatron-Core's recompute module of that name:
    the up-projections and rotary parts run again in backward, their outputs discarded)
    keeps of the heads only the attention output (e a v), beside the latents.

    ``te`` (Megatron-Core on Transformer Engine, stacks.toml ``saved_inputs``): a norm and
    the linear after it are one module (LayerNormLinear) that saves the normalised output
    once, as the linear's input, sharded under sequence parallelism (the backward
    all-gathers it again): per norm its input and that output, (e + f) h (/ t under
    sequence parallelism), no whole copy; the fused SwiGLU saves its input (2 e F) and the
    second linear its own input (f F); a GELU MLP e F + f F. f is the byte a linear keeps
    its input in: 1 under fp8 (TE saves the FP8-quantized input for backward, linear.py
    _Linear.forward), e otherwise; under fp8 the output projection also keeps an FP8 copy of
    attention's output beside the bf16 one attention's backward reads (f a v / t).

    ``layernorm`` (Megatron-Core's recompute module of that name): the norms' outputs are
    discarded and computed again in backward from their inputs, which are kept (e h and the
    scalars, / t under sequence parallelism). On Transformer Engine the linear after the
    norm then saves its original input, the recomputed output (Megatron-Core sets
    save_original_input on those linears with this module: Megatron-MoE-ModelZoo
    design_docs/MR3465, TE PR 1865), so nothing more is kept; under torch the linear's whole
    input copy stays.
    """
    N = np.asarray(tokens, dtype=float)
    t = np.asarray(tp, dtype=float)
    sp, flash = np.asarray(sp, dtype=bool), np.asarray(flash, dtype=bool)
    e = act_bytes(precision)
    h, a, F = shape.hidden, shape.heads, shape.ffn_hidden
    q, k = shape.attn_dim, shape.kv_heads * shape.dim_head
    sel = np.asarray(selective, dtype=bool)
    f = 1.0 if (te and precision == "fp8") else e  # the bytes a linear keeps its input in
    if te:
        norm_own = (e + (0.0 if layernorm else f)) * h + NORM_SCALAR_BYTES
        norms = 2.0 * np.where(sp, norm_own / t, norm_own)
    elif layernorm:
        norm_own = e * h + NORM_SCALAR_BYTES
        norms = 2.0 * (np.where(sp, norm_own / t, norm_own) + e * h)
    else:
        norm_own = 2.0 * e * h + NORM_SCALAR_BYTES
        norms = 2.0 * (np.where(sp, norm_own / t, norm_own) + e * h)
    if shape.is_mla:
        heads_b, latent_b = mla_attention_bytes(shape, e)
        if mla_up_proj:
            heads_b = e * a * shape.v_dim
        attn = (heads_b + np.where(sel, 0.0, LSE_BYTES * a)) / t + latent_b
        # op-level: attention's output (a v wide) and half the projections' outputs.
        out_w = a * shape.v_dim
    else:
        attn = (e * (2.0 * q + 2.0 * k) + np.where(sel, 0.0, LSE_BYTES * a)) / t
        out_w = q
    proj_split, proj_whole = projection_widths(shape)
    mlp = dense_mlp_bytes(shape, e, f, te) / t
    if te and f < e:  # the output projection's FP8 copy of attention's output
        attn = attn + f * (a * shape.v_dim if shape.is_mla else q) / t
    scores = 0.0 if seq is None else np.where(flash | sel, 0.0, 5.0 * a * np.asarray(seq, dtype=float) * e / 2.0 / t)
    n_f = 2.0 if shape.gated_mlp else 1.0
    wide = np.where(sp, e * h / t, e * h)  # an h-wide tensor per rank
    # half the projections' outputs: MLA's down-projections run whole on every tp rank
    op = wide + (e * out_w + LSE_BYTES * a) / t + e * ((proj_split + n_f * F) / t + proj_whole) / 2.0 + wide
    return N * np.where(np.asarray(op_sac, dtype=bool), op, norms + attn + mlp + scores)


def dense_mlp_bytes(shape: ModelShape, e: float, f: float, te: bool) -> float:
    """Bytes a dense MLP saves per token (before tensor parallelism): torch's SwiGLU keeps
    w1 x, silu(w1 x), w3 x and their product (4 e F), GELU w1 x and its output (2 e F);
    on Transformer Engine (``te``) the fused SwiGLU keeps its input (2 e F) and the second
    linear its own input in f bytes (f F), GELU e F + f F."""
    F = shape.ffn_hidden
    if te:
        return (2.0 * e + f) * F if shape.gated_mlp else (e + f) * F
    return (4.0 if shape.gated_mlp else 2.0) * e * F


def mla_attention_bytes(shape: ModelShape, e: float) -> tuple[float, float]:
    """(per-head bytes, latent bytes) multi-head latent attention saves for backward per
    token, e bytes an element (the log-sum-exp apart), as DeepSeek-V2's formulas run
    (arXiv:2405.04434, eqs. 9-19) in mgbench's MLAttention on CUDA and in Megatron-Core's
    MLA alike:

    - per head, split over tensor-parallel ranks: the rotated queries and the keys the
      kernel reads (nope + rope each: the shared rotary key is broadcast to every head
      and concatenated), the up-projection's output kv = [k_nope, v] kept whole (the
      values are a view of it: nope + v), and the attention output (v):
      e a (2 (nope + rope) + nope + 2 v);
    - the compressed latents, not split over tensor-parallel ranks (the down-projections
      are replicated): the kv down-projection's output c_kv with the rotary key
      (r_kv + rope, what the norm's input view keeps), the normalised latent and its
      output for the up-projection (2 r_kv), the query latent's norm input, normalised
      value and output (3 r_q, with a query latent), each norm with its fp32 scalars.

    Grouped-query attention's count at q/k width (4 a (nope + rope)) differs from this by
    the v / qk widths and the latents: for DeepSeek-V3 they are equal per head (768 a
    either way), and the latents add 6,208 elements and 16 bytes a token."""
    a, qk, v, nope, rope = shape.heads, shape.qk_head_dim, shape.v_dim, shape.qk_nope_head_dim, shape.qk_rope_head_dim
    heads = e * a * (2.0 * qk + nope + 2.0 * v)
    latent = e * (shape.kv_lora_rank + rope) + 2.0 * e * shape.kv_lora_rank + NORM_SCALAR_BYTES
    if shape.q_lora_rank is not None:
        latent += 3.0 * e * shape.q_lora_rank + NORM_SCALAR_BYTES
    return heads, latent


def projection_widths(shape: ModelShape) -> tuple[float, float]:
    """Elements a token's attention input projections output (every one but the output
    projection), as (split over tensor-parallel ranks, whole on each): q, k and v for
    grouped-query attention, all split; MLA's query and kv up-projections (or the one query
    projection) split, its down-projections (the query latent, the kv latent with the
    rotary key) whole. Op-level checkpointing keeps half of them."""
    parts = shape.attention_parts()
    return (float(sum(p.n for p in parts if p.split == "column")),
            float(sum(p.n for p in parts if p.split == "replicated")))


def checkpointed_layer(shape: ModelShape, tokens: Any, tp: Any, sp: Any, precision: str) -> Any:
    """A checkpointed block keeps only its input (the residual stream: e h per token,
    sequence-sharded under sequence parallelism)."""
    t = np.asarray(tp, dtype=float)
    return np.asarray(tokens, dtype=float) * act_bytes(precision) * shape.hidden / np.where(sp, t, 1.0)


def korthikanti_bytes_per_layer(shape: ModelShape, seq: Any, micro_batch: Any, tp: Any, sp: Any, flash: Any,
                                precision: str, selective: Any = False) -> Any:
    """Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    Models", table 2) for 16-bit activations, no recompute: s b h (34 + 5 a s / h), the
    24 s b h of attention/MLP internals and the 5 a s^2 b of scores divided by t, the
    other 10 s b h only with sequence parallelism; flash attention drops the scores.
    Generalised to grouped-query attention and an MLP of width F. Kept for the
    step-time model, which uses it as the memory traffic of elementwise work.
    ``selective`` (core attention recomputed) drops the scores as flash attention does:
    table 2's "selective activation recomputation" rows."""
    s, b = np.asarray(seq, dtype=float), np.asarray(micro_batch, dtype=float)
    t = np.asarray(tp, dtype=float)
    sp, flash = np.asarray(sp, dtype=bool), np.asarray(flash, dtype=bool)
    h, a, F = shape.hidden, shape.heads, shape.ffn_hidden
    g = shape.kv_heads / shape.heads
    hd_ratio = shape.attn_dim / h
    replicated = 10.0 * h
    sharded = (2.0 + 4.0 * g + 2.0) * h * hd_ratio + (8.0 if shape.gated_mlp else 4.0) * F
    scores = 5.0 * a * s
    no_scores = np.asarray(flash, dtype=bool) | np.asarray(selective, dtype=bool)
    per_sb = np.where(sp, (replicated + sharded) / t, replicated + sharded / t) + np.where(no_scores, 0.0, scores / t)
    return s * b * per_sb * act_bytes(precision) / 2.0  # the counts above are at 2 bytes an element


def in_flight(pp: Any, num_micro: Any, schedule: str, virtual_stages: int = 1) -> Any:
    """How many micro-batches' activations the first pipeline stage holds at its peak.

    In units of one micro-batch through a whole stage (ceil(L / p) blocks). GPipe keeps
    all m; 1F1B keeps p (at most m); interleaved 1F1B with v virtual stages keeps
    p (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, section 4.2.3), and so does its
    zero-bubble form (interleaved_zb: the weight passes fill the bubble, the warm-up is
    interleaved 1F1B's); ZB-V keeps 1F1B's p (Qi et al. 2023, section 6: "the same peak
    memory as 1F1B"); DualPipe keeps p + 1 (DeepSeek-V3 report; table of
    github.com/deepseek-ai/DualPipe), and DualPipeV, the same schedule folded into a V,
    is taken to keep the same. pp = 1: one.
    """
    p = np.asarray(pp, dtype=float)
    m = np.asarray(num_micro, dtype=float)
    if schedule == "gpipe":
        n = m
    elif schedule in ("interleaved", "interleaved_zb"):
        n = np.minimum(p * (1.0 + (p - 1.0) / (p * virtual_stages)), m)
    elif schedule == "dualpipev":
        n = np.minimum(p + 1.0, m)
    else:  # 1f1b, zbv
        n = np.minimum(p, m)
    return np.where(p == 1, 1.0, n)


def logits_bytes(shape: ModelShape, tokens: Any, precision: str) -> Any:
    """The output projection's logits, whole on every tensor-parallel rank (the head's
    output is gathered for the loss): e bytes per token and vocabulary entry (padded)."""
    return np.asarray(tokens, dtype=float) * shape.padded_vocab * act_bytes(precision)


# How the loss holds the logits, by stack (data/stacks.toml [stacks.*.memory] loss): bytes
# per logit element (per token and vocabulary entry, / tp where the stack's loss is
# vocabulary-parallel) kept for backward, and held besides at the loss's backward.
#   fp32   torch's cross_entropy over logits.float() (torchtitan, Hugging Face, Composer):
#          log_softmax keeps its fp32 output (4); backward makes the fp32 gradient of it
#          and of its input while that output still lives (4 + 4). The bf16 logits the
#          head wrote are dropped before backward (torchtitan deletes them), or counted
#          here as their gradient once cast back.
#   fused  Megatron-Core's vocab-parallel cross-entropy: the fp32 softmax kept (4), its
#          gradient computed in place, cast back to the logits' dtype for the head's
#          backward (e).
#   flash_ce  flash-attn's fused cross-entropy kernel (flash_attn.losses.cross_entropy,
#          llm-foundry's MPT default loss_fn 'fused_crossentropy'): the logits kept (e;
#          the kernel keeps only fp32 per-token loss and log-sum-exp besides), the
#          gradient written to a new buffer of their dtype (e: inplace_backward off). Composer's
#          training metrics later run torch's cross-entropy over the same logits in fp32
#          (8 more a logit), after backward, when the activations are freed: not counted.
# "e" stands for the logits' own bytes at the run's precision (act_bytes: 2 under bf16 or
# fp8 autocast, 4 in fp32): those kernels keep or write the logits' dtype, where the fp32
# figures are fp32 whatever the logits are.
# "chunked" is mgbench's runner (:func:`logits_bytes`, :func:`loss_backward_bytes`).
LOSS_MODES: dict[str, tuple[float | str, float | str]] = {"fp32": (4.0, 8.0), "fused": (4.0, "e"),
                                                          "flash_ce": ("e", "e")}
LOSS_NAMES = ("chunked", *LOSS_MODES)


def loss_bytes(shape: ModelShape, tokens: Any, tp: Any, precision: str, loss: str = "chunked",
               vocab_parallel: bool = False) -> tuple[Any, Any]:
    """(bytes kept for backward, transient bytes at the loss's backward) of the logits and
    loss on the stage that computes it, as ``loss`` (LOSS_NAMES) holds them."""
    if loss == "chunked":
        return logits_bytes(shape, tokens, precision), loss_backward_bytes(shape, tokens, precision)
    e = act_bytes(precision)
    kept, transient = (e if b == "e" else float(b) for b in LOSS_MODES[loss])
    per = np.asarray(tokens, dtype=float) * shape.padded_vocab / (np.asarray(tp, dtype=float) if vocab_parallel else 1.0)
    return per * kept, per * transient


def loss_backward_bytes(shape: ModelShape, tokens: Any, precision: str) -> Any:
    """The loss's transient peak in backward, beyond the saved logits.

    Backward takes the chunks last to first; during chunk 0's (a full chunk of
    c = ceil(N / LOSS_CHUNKS) tokens) the other chunks' logits gradients are held
    (e (N - c) V) and the chunk's recomputed fp32 log-softmax, its gradient and the
    gradient of its input exist together (12 c V). The concatenation of the gradients
    that follows happens after the logits themselves are freed, and is smaller."""
    N = np.asarray(tokens, dtype=float)
    c = np.ceil(N / LOSS_CHUNKS)
    return shape.padded_vocab * (act_bytes(precision) * (N - c) + 12.0 * c)


def memory_per_gpu(shape: ModelShape | None, *, params: Any = None, seq: Any = 2048, micro_batch: Any = 1,
                   num_micro: Any = 1, tp: Any = 1, pp: Any = 1, dp: Any = 1, zero: Any = 0,
                   precision: str = "bf16", recompute: Any = 0, sp: Any = False, flash: Any = True,
                   schedule: str = "1f1b", virtual_stages: int = 1,
                   largest_layer_params: Any = None, ep: Any = 1, cp: Any = 1, replicas: Any = 1,
                   offload: bool = False, state_bytes: tuple[float, float, float] | None = None,
                   loss: str = "chunked", loss_vocab_parallel: bool = False, te_saved_inputs: bool = False,
                   margin: float = ALLOWANCE_FRACTION, fixed: bool = True, moe: Any = None,
                   pp_last_layers: Any = None, fp8_recipe: str | None = None,
                   pipeline_outputs_freed: bool = False, expert_epilogue: bool = False,
                   fp8_attention: bool = False, etp: Any = 1, moe_eager_saved: bool = False) -> dict[str, Any]:
    """Everything one GPU holds at its peak under the planner's production assumptions,
    in bytes; the components add up to ``total_bytes``.

    Model states per ZeRO stage (mixed precision: 2 + 2 + 12 bytes a parameter); the
    activations of the heaviest pipeline stage's in-flight micro-batches as this
    workload saves them; ``gathered_params_bytes``: under ZeRO-3 the full 16-bit weights
    of the layer being computed and the next one, prefetched (DeepSpeed's estimator
    adds the largest layer; with the prefetch, two), in a pipeline the whole stage's
    (:func:`pipeline_fsdp_holds_stage`, which also keeps its gradients unsharded in
    fp32 through the step); ``temporaries_bytes``: the
    transient peak of backward (the loss's logits gradients on the stage that computes
    the loss, a recomputed block under checkpointing); and the stated allowance.

    With ``shape=None`` and ``params`` given (``--params`` mode) the layers are unknown:
    model states, and under ZeRO-3 the gathered working set of ``largest_layer_params``
    (DeepSpeed's estimate_zero3_model_states_mem_needs takes the same input), computed
    and prefetched: twice its 16-bit weights. Without it that working set is unknown and
    not counted (``gathered_params_known`` False), never guessed.

    ``recompute``: 0 none, 1 every_2nd, 2 full, 3 selective, 4 op (index into RECOMPUTE,
    array or scalar).

    The axes of issue 17:

    - ``ep``: routed experts sharded over ep ranks (:func:`stage_param_split`); their
      ZeRO group is the expert data-parallel ranks, tp x dp x cp / ep (MoE parallel
      folding: with tp = 1 the data-parallel group / ep); MoE blocks' activations by
      :func:`moe_mlp_extra`, at the busiest rank's load (``moe``: planner/moe.py MoeOptions);
    - ``etp``: each routed expert split over etp ranks too (:func:`stage_param_split`),
      their ZeRO group tp x dp x cp / (ep x etp), their input rows gathered etp-fold
      (:func:`moe_mlp_extra`);
    - ``cp``: each rank holds s / cp tokens of each sequence, so every per-token
      activation is divided by cp; ZeRO shards over dp x cp (the cp ranks hold the same
      weights: torchtitan's FSDP mesh); plus :func:`cp_kv_bytes`;
    - ``replicas`` (HSDP): ZeRO shards over dp x cp / replicas ranks, replicated across;
    - ``offload`` (FSDP2 CPUOffloadPolicy, ZeRO-3): weights, gradients and optimizer
      states live in host memory (``host_bytes``, not in the device total); the device
      keeps the gathered working set;
    - ``fixed`` (a GPU process; False for CPU ranks): :func:`fixed_per_process`, the CUDA
      context and NCCL communicators outside the allocator and cuBLAS's workspace inside
      it. ``reserved_bytes`` is what the caching allocator reserves (counted tensors,
      workspace, allowance), ``total_bytes`` what must fit in device memory;
    - ``margin``: the allowance's fraction (ALLOWANCE_FRACTION unless the user runs closer
      to, or further from, the edge: --memory-margin);
    - ``pp_last_layers``: the last pipeline stage's blocks where the run sets them
      (:func:`stage_layers`): the first stage, whose weights and in-flight activations
      are counted, holds its share of the rest;
    - the stack (planner/stack.py memory_of): ``state_bytes`` (weights, gradients,
      optimizer states per parameter; default STATE_BYTES[precision]) and ``loss``, how
      the loss holds the logits (:data:`LOSS_MODES`; ``loss_vocab_parallel``: split over
      tp); ``pipeline_outputs_freed``: a stage's output, once sent, holds no data
      (Megatron-LM's deallocate_pipeline_outputs), so in-flight micro-batches do not keep it;
    - ``precision = "fp8"``: under torchao float8 (``te_saved_inputs`` False) the same
      states and saved activations as bf16 (torchao's float8 matmul saves its
      high-precision input and weight for backward and casts again there); under
      Transformer Engine (``te_saved_inputs``: the megatron-lm stack) the linears keep
      FP8-quantized inputs (:func:`layer_activations` ``te``); both add one block's float8
      weight casts (1 byte a weight) as a temporary; under ZeRO-3 the weights are
      all-gathered in float8 (tensorwise recipe), 1 byte a weight instead of 2;
      ``fp8_recipe`` (the layout's: what casting costs in time, layout_time.step_time) is
      taken and not counted: the recipes' scale tensors are a small fraction of a byte a
      value; ``fp8_attention`` (the layout's: attention in FP8 costs less time) is taken
      and not counted either: attention's saved inputs and output stay at the
      activations' bytes, which for Transformer Engine's FP8 attention (it saves them
      quantized) is the larger figure.
    """
    check_margin(margin)
    c = np.asarray(cp, dtype=float)
    zgroup = np.asarray(dp, dtype=float) * c / np.asarray(replicas, dtype=float)
    if shape is None:  # the stack's state bytes, as with a shape (fp32 training keeps fp32 everything)
        sb = None if precision == "fp32" else state_bytes
        states = model_states(params, zgroup, zero, precision, sb)
        w_bytes = 1.0 if precision == "fp8" else STATE_BYTES[precision][0]  # the gathered copy, as with a shape
        layer = 0.0 if largest_layer_params is None else np.asarray(largest_layer_params, dtype=float)
        gathered = np.where(np.asarray(zero) >= 3, 2.0 * layer * w_bytes, 0.0) + 0.0 * states["params_bytes"]
        zero_a = np.zeros_like(states["model_states_bytes"])
        states, host = _offloaded(states, offload)
        subtotal = states["model_states_bytes"] + gathered
        return {**states, "activations_bytes": zero_a, "gathered_params_bytes": gathered,
                "temporaries_bytes": zero_a, "fixed_bytes": zero_a, "allowance_bytes": zero_a,
                "reserved_bytes": subtotal, "total_bytes": subtotal,
                "host_bytes": host, "gathered_params_known": largest_layer_params is not None}
    p_arr = np.asarray(pp)
    chunks = rank_runs(p_arr, schedule, virtual_stages)
    dense_p, expert_p = stage_param_split(shape, tp, pp, ep, pp_last_layers, etp, chunks)
    sb = None if precision == "fp32" else state_bytes  # fp32 training keeps fp32 everything
    # Routed experts' ZeRO group: their expert data-parallel ranks, t x dp x cp / ep
    # (MoE parallel folding, planner/moe.py: ep consecutive ranks of the t x dp x cp).
    egroup = np.maximum(zgroup * np.asarray(tp, dtype=float) / expert_ranks(ep, etp), 1.0)
    states = _add_states(model_states(dense_p, zgroup, zero, precision, sb),
                         model_states(expert_p, egroup, zero, precision, sb))
    states, host = _offloaded(states, offload)
    held = pipeline_fsdp_holds_stage(pp, zero)
    stage_w = dense_p + expert_p
    # The unsharded fp32 gradients replace the sharded ones at the peak (the shards are
    # made by the reduce-scatter that frees them); on the device under offload too.
    grads = np.where(held, np.maximum(states["grads_bytes"], 4.0 * stage_w), states["grads_bytes"])
    states = {**states, "grads_bytes": grads,
              "model_states_bytes": states["params_bytes"] + grads + states["optimizer_bytes"]}
    tokens = np.asarray(seq, dtype=float) * np.asarray(micro_batch, dtype=float) / c
    rc = np.asarray(recompute)
    lps = stage_layers(shape.layers, pp, pp_last_layers)[0]
    ck = recomputed_blocks(lps, rc)
    from .moe import MoeOptions, rank_load

    # ``moe``: how an MoE model routes (planner/moe.py MoeOptions; None: the defaults): the
    # busiest rank's load and the Megatron-Core recompute modules that discard saved tensors.
    mopts = moe if moe is not None else MoeOptions()
    full_l = layer_activations(shape, tokens, tp, sp, precision, flash, seq, selective=rc == SELECTIVE,
                               op_sac=rc == OP_SAC, mla_up_proj="mla_up_proj" in mopts.recompute_modules,
                               te=te_saved_inputs, layernorm="layernorm" in mopts.recompute_modules)
    if shape.is_moe:  # the mean block of the stage: its MoE blocks save more (at the busiest rank's load)
        full_l = full_l + moe_mlp_extra(shape, tokens, tp, precision, rank_load(mopts, ep), mopts.recompute_modules,
                                        te=te_saved_inputs, fp8_act_cache=mopts.fp8_act_cache, sp=sp,
                                        clamp_saved=expert_epilogue and shape.glu_clamp is not None
                                        and not mopts.fused_grouped_mlp, etp=etp, eager_saved=moe_eager_saved) \
            * shape.stage_moe_layers(lps, chunks) / lps
    ck_l = checkpointed_layer(shape, tokens, tp, sp, precision)
    blocks = (lps - ck) * full_l + ck * ck_l
    e = act_bytes(precision)
    t = np.asarray(tp, dtype=float)
    # Rotary tables in the stream dtype (once per forward) and, off the last stage, the
    # stage's output kept for its backward (none where the stack frees a sent output:
    # pipeline_outputs_freed); on the last, the final norm and the logits.
    rope = np.asarray(seq, dtype=float) / c * shape.dim_head * e
    out_first = 0.0 if pipeline_outputs_freed else tokens * e * shape.hidden / np.where(sp, t, 1.0)
    final_norm = tokens * (np.where(sp, (2.0 * e * shape.hidden + NORM_SCALAR_BYTES) / t,
                                    2.0 * e * shape.hidden + NORM_SCALAR_BYTES) + e * shape.hidden)
    logits, loss_t = loss_bytes(shape, tokens, tp, precision, loss, loss_vocab_parallel)
    nflight = in_flight(pp, num_micro, schedule, virtual_stages)
    first = (blocks + rope + out_first) * nflight
    last = blocks + rope + final_norm + logits
    single = blocks + rope + final_norm + logits
    # In a V (zbv, dualpipev) rank 0 holds the first chunk, with the most micro-batches in
    # flight, and the last, with the output layer: its logits and the loss's backward come
    # on top of the in-flight activations (the runner's own count does the same:
    # memory_for_config). The blocks counted are the other ranks' (a lighter rank 0 holds
    # fewer, so this bounds it from above).
    v = v_shaped(schedule)
    acts = np.where(p_arr == 1, single, first + final_norm + logits if v else np.maximum(first, last))
    # Transient peaks beyond the saved activations: the loss's backward on the stage that
    # computes it; a checkpointed block rebuilt in backward.
    # A block rebuilt in backward holds its whole activations for a moment (under op-level
    # checkpointing too: every block is rebuilt, from its saved matmul outputs).
    whole_l = layer_activations(shape, tokens, tp, sp, precision, flash, seq, te=te_saved_inputs)
    rebuild = np.where((ck > 0) | (rc == OP_SAC), whole_l, 0.0)
    temps = np.where(p_arr == 1, np.maximum(loss_t, rebuild),
                     np.where((first >= last) & (not v), rebuild, np.maximum(loss_t, rebuild)))
    # One block's weights on this GPU: routed experts / (ep x etp), the rest / tp.
    layer_experts = shape.experts * shape.expert_params() if shape.is_moe else 0.0
    layer_p = (shape.params_per_layer() - shape.num_expert_params() / shape.layers) / t \
        + layer_experts / expert_ranks(ep, etp)
    z3 = np.asarray(zero) >= 3
    # Gathered 16-bit weights; float8 ones under fp8 (torchao's float8 all-gather).
    w_bytes = 1.0 if precision == "fp8" else STATE_BYTES[precision][0]
    gathered = np.where(held, stage_w * w_bytes, np.where(z3, 2.0 * layer_p * w_bytes, 0.0))
    temps = temps + cp_kv_bytes(shape, seq, micro_batch, tp, cp, precision)
    # A block's float8 weight casts under fp8 (under ZeRO-3 the gathered ones are the casts;
    # weights already kept in FP8, 1 byte a weight in state_bytes, need none).
    if precision == "fp8" and not (sb is not None and sb[0] <= 1.0):
        temps = temps + np.where(z3, 0.0, layer_p)
    subtotal = states["model_states_bytes"] + acts + gathered + temps
    allowance = margin * subtotal
    fx = fixed_per_process(tp, pp, dp, ep, cp, replicas)
    fixed_b = np.where(fixed, fx["fixed_bytes"], 0.0) + 0.0 * subtotal
    reserved = subtotal + allowance + np.where(fixed, fx["workspace_bytes"], 0.0)
    return {**states, "activations_bytes": acts, "gathered_params_bytes": gathered, "temporaries_bytes": temps,
            "fixed_bytes": fixed_b, "allowance_bytes": allowance, "reserved_bytes": reserved,
            "total_bytes": subtotal + allowance + fixed_b, "host_bytes": host}


def fixed_per_process(tp: Any = 1, pp: Any = 1, dp: Any = 1, ep: Any = 1, cp: Any = 1, replicas: Any = 1) -> dict[str, Any]:
    """What a GPU training process holds besides its tensors (hardware.toml
    [planner.fixed_memory]): the CUDA context and one NCCL communicator per process group
    of the layout (outside the caching allocator), and cuBLAS's workspace (inside it)."""
    from .. import catalog

    f = catalog.load("hardware.toml")["planner"]["fixed_memory"]
    one = np.asarray(1.0)
    d, c, r = (np.asarray(x, dtype=float) for x in (dp, cp, replicas))
    groups = sum(np.where(np.asarray(x, dtype=float) > 1, 1.0, 0.0) for x in (tp, pp, ep, cp, replicas)) \
        + np.where(d * c / r > 1, 1.0, 0.0)  # the sharding / data-parallel group
    outside = f["cuda_context_bytes"] * one + f["nccl_communicator_bytes"] * groups
    return {"outside_allocator_bytes": outside, "workspace_bytes": f["cublas_workspace_bytes"] * one,
            "fixed_bytes": outside + f["cublas_workspace_bytes"]}


def check_margin(margin: float) -> None:
    """One line for a --memory-margin that is not a fraction."""
    if not 0.0 <= margin < 1.0:
        from ..errors import MgbenchError

        raise MgbenchError(f"--memory-margin is a fraction of the counted memory kept free: 0 or more and below 1, "
                           f"got {margin}")


def _offloaded(states: dict[str, Any], offload: bool) -> tuple[dict[str, Any], Any]:
    """Model states moved to host memory by CPU offload: (device states, host bytes). The
    host keeps the sharded weights, gradients and optimizer states (FSDP2's
    CPUOffloadPolicy; the optimizer steps there)."""
    host = states["model_states_bytes"]
    if not offload:
        return states, 0.0 * host
    return {k: 0.0 * v for k, v in states.items()}, host


# --- the runner's own configs ---------------------------------------------------------------

CONFIG_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "temporaries_bytes",
               "total_bytes")


def memory_for_config(cfg: Any) -> dict[str, float]:
    """Analytic bytes per rank of a runner config (:class:`mgbench.config.RunConfig`) at
    its peak, by category; the categories add up to ``total_bytes`` exactly. No
    allowance: these are the workload's tensors, comparable with tracked (allocated)
    memory. The rank is rank 0 (a pipeline's first stage: see :func:`runner_phases`).

    Keys: params_bytes (weights and buffers), grads_bytes, optimizer_bytes (AdamW's m and
    v), activations_bytes (what forward saves for backward, autocast's 16-bit weight
    copies included), temporaries_bytes (what exists only around the peak: gathered FSDP
    weights, DDP's gradient buckets, the loss's gradients, the optimizer's per-parameter
    scratch), total_bytes.
    """
    phases = runner_phases(cfg)
    name = max(phases, key=lambda k: phases[k]["total_bytes"])
    return phases[name]


def runner_phases(cfg: Any) -> dict[str, dict[str, float]]:
    """The candidate peaks of training step 2 of ``cfg`` on rank 0, each by category
    (step 1 holds no optimizer states until its own optimizer step, so step 2 is the
    higher). Memory only grows in forward, so each candidate is a moment of backward or
    of the optimizer step:

    - ``loss_backward``: on the stage that computes the loss, every in-flight
      micro-batch saved and the loss's gradients being assembled;
    - ``last_block_backward`` / ``first_block_backward``: the backward of the stage's
      last block (first in backward: every block's activations still saved, few
      gradients yet) and of its first block (most gradients made, one block's
      activations left); between the two, memory changes linearly block by block, so
      one of them is the highest. Each carries the block's backward scratch and, if the
      block is checkpointed, its rebuilt activations;
    - ``optimizer``: weights, full gradients, optimizer states and AdamW's scratch.

    The rank is rank 0: for a pipeline the first stage, which holds the most
    micro-batches in flight under 1F1B and GPipe (the last holds the logits of one).
    """
    from ..config import is_hsdp
    from ..strategies import BY_NAME, ZERO_STAGE
    from ..strategies.schedules import chunks_per_rank, grad_sync_of, rank_chunks

    shape: ModelShape = cfg.shape
    st = cfg.strategy
    entry = BY_NAME[st]
    # How a pipeline's replicas reduce gradients (the schedule registry's grad_sync).
    sync = grad_sync_of(cfg)
    # The registry says which data parallelism a strategy runs (its ZeRO stage), not a
    # list of names here: hsdp and fsdp+ep are FSDP2 too.
    fsdp = entry.fsdp_sharded or (st == "pp+tp+dp" and cfg.dp_mode in ("fsdp", "hsdp") and cfg.dp > 1)
    # The split-backward schedules' FSDP stages are not resharded after forward: FSDP2 as
    # fsdp_grad_op runs it, sharded at rest, whole in use.
    if st == "pp+tp+dp" and fsdp:
        zero = 2 if pipeline_fsdp_unsharded_from_forward(cfg.pp, cfg.pp_schedule) else 3
    else:
        zero = ZERO_STAGE.get(st, 0)
    ddp = entry.ddp_replicated or sync == "ddp_reducer"
    dp, tp, pp = cfg.dp, cfg.tp, cfg.pp
    sp = st == "tp_sp"
    tsp = tp if sp else 1
    # This rank's model chunks, placed by the registry (loop or V; strategies/schedules.py).
    v = chunks_per_rank(cfg.pp_schedule, cfg.virtual_stages) if cfg.pipelined else 1
    chunk_ids = rank_chunks(cfg.pp_schedule, 0, pp, cfg.virtual_stages) if cfg.pipelined else [0]
    e = act_bytes(cfg.precision)
    mixed = cfg.precision != "fp32"
    h, V, F = shape.hidden, shape.padded_vocab, shape.ffn_hidden
    first, last = True, (pp * v - 1) in chunk_ids
    if last and pp * v > 1:
        # The V places the last chunk on rank 0 too, in its own module (a copy of the
        # model cut to the chunk): a tied embedding and head are two weights there.
        shape = dataclasses.replace(shape, tie_embeddings=False)
    chunk = _rank_chunk_sizes(shape.layers, pp * v, chunk_ids)
    L = sum(chunk)
    # The model's indices of this rank's blocks (which of them are MoE blocks).
    all_chunks = _rank_chunk_sizes(shape.layers, pp * v, list(range(pp * v)))
    block_ids = [sum(all_chunks[:c]) + j for c, n in zip(chunk_ids, chunk) for j in range(n)]
    ep = cfg.ep

    # -- model states: parameters on this rank (tensor-parallel shards) -----------------
    plist3 = _rank_param_list(shape, tp, first, last, L, block_ids, ep)
    plist = [(n, mm) for n, mm, _ in plist3]
    n_params = sum(n for n, _ in plist)
    # Routed experts' weights on this rank (experts / ep of each MoE layer): under fsdp+ep
    # FSDP shards them over the dp / ep ranks that hold the same experts, not over dp.
    n_expert = sum(n for n, _, x in plist3 if x)
    edp = float(dp // ep)
    # One block's weights on this rank, the mean over the rank's blocks (MoE and dense
    # blocks differ), and its matmul weights (what autocast copies).
    blocks3 = [_block_params(shape, tp, shape.is_moe_layer(i), ep) for i in block_ids]
    block_p = sum(n for b in blocks3 for n, _, _ in b) / max(L, 1)
    block_mm = sum(n for b in blocks3 for n, mm, _ in b if mm) / max(L, 1)
    block_x = sum(n for b in blocks3 for n, _, x in b if x) / max(L, 1)
    # HSDP shards within groups of dp / replicas ranks and replicates across the groups.
    shard_ranks = float(dp) / (cfg.replicas if is_hsdp({"strategy": st, "dp_mode": cfg.dp_mode}) else 1)
    zshard = shard_ranks if zero else 1.0
    p_div, g_div, o_div = (zshard if zero >= k else 1.0 for k in (3, 2, 1))
    if fsdp:  # FSDP2 keeps weights sharded at rest under either reshard policy
        p_div = shard_ranks

    def sharded(total: float, experts: float, div: float) -> float:
        # ``total`` elements of which ``experts`` are routed experts' weights, over ``div``
        # ranks (the experts over the dp / ep ranks sharing them where div is dp).
        return (total - experts) / div + experts / (edp if div == dp and div > 1 else div)

    rope_buf = 2.0 * cfg.seq_len * (_rotary_dim(shape) // 2) * 4.0  # fp32 cos and sin tables
    w_b, g_b, o_b = RUNNER_STATE_BYTES
    params_b = w_b * sharded(n_params, n_expert, p_div) + rope_buf
    grads_b = g_b * sharded(n_params, n_expert, g_div)
    # Under the runner's tensor parallelism the vocabulary-sharded embedding's gradient
    # comes out whole on every rank (DTensor's embedding backward; seen in the trace):
    # V h fp32 elements, not V h / t.
    emb_grad_extra = 4.0 * V * h * (1.0 - 1.0 / tp) if tp > 1 and first else 0.0
    if not fsdp:
        grads_b += emb_grad_extra
    if st == "zero1":
        owned = _zero1_partition([n for n, _ in plist], dp)
    elif tp > 1 and not fsdp:
        # strategies/pieces.make_optimizer steps DTensor parameters (every matrix under
        # tensor parallelism) before the plain ones (the replicated norms).
        norms = {i for i, (n, mm) in enumerate(plist) if n == h and not mm}
        owned = [n for i, (n, _) in enumerate(plist) if i not in norms] + [h] * len(norms)
    else:
        owned = [sharded(n, n if x else 0.0, o_div) for n, _, x in plist3]
    opt_b = o_b * sum(owned)
    # strategies/pieces.optimizer_kw: fused AdamW on CUDA, except behind torch's sharded
    # fp16 scaler (tensor parallelism, FSDP), which falls back to the foreach step.
    if cfg.device == "cpu":
        step_kind = "single"
    else:
        step_kind = "foreach" if cfg.precision == "fp16" and (tp > 1 or fsdp) else "fused"
    scratch = 4.0 * _adamw_scratch(owned, step_kind)

    # -- activations of one micro-batch ---------------------------------------------------
    N = float(cfg.micro_batch * cfg.seq_len)
    # Block i is checkpointed when the count of recomputed blocks grows at it (one rule).
    r = RECOMPUTE.index(cfg.activation_checkpointing)
    ck_flags = [bool(recomputed_blocks(i + 1, r) > recomputed_blocks(i, r)) for n in chunk for i in range(n)]
    # Each block's saved tensors: the planner's count, with what the runner's MLA and MoE
    # blocks save beyond it (:func:`_runner_block_extra`).
    base_l = float(layer_activations(shape, N, tp, sp, cfg.precision))
    full_ls = [base_l + N * _runner_block_extra(shape, i, e, tp, ep, cfg.device) for i in block_ids]
    ck_l = float(checkpointed_layer(shape, N, tp, sp, cfg.precision))
    saved = [ck_l if c else f for c, f in zip(ck_flags, full_ls)]
    rope = cfg.seq_len * _rotary_dim(shape) * e  # the tables in the stream dtype, once per forward
    logits = float(logits_bytes(shape, N, cfg.precision)) if last else 0.0
    if last:  # the final norm and the output projection's input
        rest = N * ((2.0 * e * h + NORM_SCALAR_BYTES) / tsp + e * h)
    else:  # the stage's output, kept for its backward
        rest = N * e * h / tsp
    per_micro = sum(saved) + rope + rest + logits
    nflight = float(in_flight(pp, cfg.grad_accum, cfg.pp_schedule, v)) if cfg.pipelined else 1.0
    others = (nflight - 1.0) * per_micro  # micro-batches in flight besides the one in backward
    # autocast's 16-bit copies of the matmul weights, made once per forward (the cache
    # lives as long as the autocast region) and kept by backward; FSDP2 gathers 16-bit
    # weights instead. A checkpointed block makes them again when it is rebuilt.
    cast_l = 2.0 * block_mm if mixed and not fsdp else 0.0
    cast_head = 2.0 * V * h / tp if mixed and not fsdp and last else 0.0
    # The MLP's backward scratch: the gradient of its product and of one factor (2 e N F,
    # GELU: one) and one weight's gradient before it is accumulated (16-bit under autocast).
    bwd_l = N * e * F / tp * (2.0 if shape.gated_mlp else 1.0) + (2.0 if mixed else 4.0) * F * h / tp
    dy = N * e * h / tsp  # the gradient flowing into a block

    # -- buffers the strategy holds --------------------------------------------------------
    # DDP's gradient buckets (fp32, a copy of the gradients); ep's DDP leaves the routed
    # experts out (strategies/expert_parallel.py reduces them itself).
    buckets = 4.0 * (n_params - (n_expert if entry.prepare == "expert_parallel" else 0.0)) if ddp else 0.0
    # FSDP2's gathered 16-bit weights (wb bytes each). reshard_after_forward (fsdp): the
    # root's (embedding, final norm, head) and one block's, whose all-gather buffer
    # outlives the copy-out by one block: at the end of forward the root's weights and
    # the last block's buffer; during a block's backward the root's, the block's and the
    # buffer of the next; during the loss's backward nothing (the root reshards after
    # forward and gathers again when backward reaches it). Without resharding
    # (fsdp_grad_op) the root and every block stay gathered from forward to backward.
    g_fwd = g_loss = g_bwd = 0.0
    if fsdp:
        wb = 2.0 if mixed else 4.0
        root = V * h / tp + ((h + (0 if _tied(shape, tp) else V * h / tp)) if last else 0.0)
        if zero >= 3:
            g_fwd, g_loss, g_bwd = wb * (root + block_p), 0.0, wb * (root + 2.0 * block_p)
        else:
            g_fwd = g_loss = g_bwd = wb * (root + L * block_p)
    # DDP also keeps each bucket's last averaged gradients (its hook's result) until the
    # next step's replace them: another gradient-sized buffer from step 2 on.
    comm = 2.0 * buckets

    g_head = 4.0 * (V * h / tp + h) / g_div if last else 0.0
    head_p_all = (h + (0 if _tied(shape, tp) else V * h / tp)) if last else 0.0
    g_block = 4.0 * sharded(block_p, block_x, g_div)
    # Gradients of earlier micro-batches: with gradient accumulation; in a pipeline once a
    # micro-batch's backward has run before the peak (1F1B's steady state; GPipe runs
    # every forward first).
    if cfg.pipelined:
        grads_acc = grads_b if cfg.pp_schedule != "gpipe" and cfg.grad_accum > nflight else 0.0
    else:
        grads_acc = grads_b if cfg.grad_accum > 1 else 0.0
    # FSDP2 without gradient sync (every micro-batch but the last) accumulates unsharded
    # fp32 gradients on every rank; the last micro-batch reduce-scatters them group by group.
    fsdp_acc = fsdp and grads_acc > 0
    acc_unsharded = 4.0 * n_params if fsdp_acc else 0.0
    if fsdp_acc:
        grads_acc = 0.0
    base = {"params_bytes": params_b, "optimizer_bytes": opt_b}
    phases: dict[str, dict[str, float]] = {}
    # In a pipeline autocast wraps the whole schedule, so its weight copies live through
    # every micro-batch's backward; otherwise each goes with its block's backward.
    all_casts = cast_l * (L if cfg.pipelined else ck_flags.count(False)) + cast_head
    all_saved = others + per_micro + all_casts
    # End of forward: the loss's fp32 work on one chunk (its upcast and log-softmax), or
    # under tensor parallelism the head's local logits next to the gathered ones.
    c = -(-N // LOSS_CHUNKS)
    loss_fwd = c * V * ((4.0 if mixed else 0.0) + 4.0)
    head_gather = N * V * e / tp if tp > 1 else 0.0
    phases["forward_end"] = {**base, "grads_bytes": grads_acc, "activations_bytes": all_saved,
                             "temporaries_bytes": max(loss_fwd if last else 0.0, head_gather if last else 0.0)
                             + comm + g_fwd + acc_unsharded}
    if last:
        phases["loss_backward"] = {
            **base, "grads_bytes": grads_acc, "activations_bytes": all_saved,
            "temporaries_bytes": float(loss_backward_bytes(shape, N, cfg.precision)) + comm + g_loss + acc_unsharded}
    wb = 2.0 if mixed else 4.0
    if fsdp and zero >= 3 and last:
        # Backward reaches the output projection: the loss's gradient of the logits (the
        # logits themselves freed), and the root gathered again, its all-gather buffer
        # beside it.
        root_w = V * h / tp + head_p_all
        phases["head_backward"] = {
            **base, "grads_bytes": grads_acc, "activations_bytes": all_saved - logits,
            "temporaries_bytes": N * V * e + 2.0 * wb * root_w + comm + acc_unsharded}
    # Under FSDP2 the output projection's 16-bit gradient waits unsharded until the
    # root's reduce-scatter at the end of backward, and a block's 16-bit gradients
    # gather unsharded during its backward.
    root_g = wb * (V * h / tp + h) if fsdp and last else 0.0
    root_w_all = V * h / tp + head_p_all if fsdp else 0.0
    cur_g = 0.0  # (the block's own weight gradient at the peak is in its backward scratch)
    # The first backward of the step, with every in-flight micro-batch saved; and in a
    # pipeline the last one, with one micro-batch left but every other one's gradients.
    variants = [("", others, grads_acc)]
    if cfg.pipelined and cfg.grad_accum > 1:
        variants.append(("last_micro_", 0.0, grads_b))
    blocks_at = [("last_block_backward", L - 1), ("first_block_backward", 0)]
    mid = [i for i in range(1, L - 1) if ck_flags[i]]
    if fsdp and zero >= 3 and mid:
        # The last checkpointed block with a block before it to prefetch.
        blocks_at.insert(1, ("inner_block_backward", mid[-1]))
    for prefix, held, g_before in variants:
        for name, i in blocks_at:
            if L == 0:
                break
            done = L - 1 - i  # blocks whose backward is over
            rebuilt = (full_ls[i] + cast_l) if ck_flags[i] else 0.0
            casts_now = all_casts if cfg.pipelined else cast_l * ck_flags[: i + 1].count(False)
            r_g, c_g, gath = root_g, cur_g, g_bwd
            if fsdp and zero >= 3 and i < L - 1 and ck_flags[i]:
                # Rebuilding a block after the stage's last one, FSDP2 keeps the output projection's
                # waiting gradient in fp32 and gathers a block's 16-bit gradients
                # unsharded beside it; the next block is prefetched only if there is one.
                r_g = 4.0 * (V * h / tp + h) if last else 0.0
                # The block's 16-bit gradients count at its peak when they outweigh its
                # activations (the peak is then at the end of its backward; seen in traces).
                c_g = wb * block_p if wb * block_p > full_ls[i] else 0.0
                gath = wb * (root_w_all + block_p) + (wb * block_p if i > 0 else 0.0)
            phases[prefix + name] = {
                **base, "grads_bytes": max(g_before, (0.0 if fsdp else g_head) + done * g_block),
                "activations_bytes": held + sum(saved[: i + 1]) + rope + casts_now,
                "temporaries_bytes": rebuilt + bwd_l + dy + r_g + c_g + comm + gath + acc_unsharded}
    if fsdp:
        # The end of a block's backward under FSDP2: its gradients copied to fp32 as the
        # reduce-scatter's input (the 16-bit ones are released as they are copied) and the
        # output, the block's new gradient shard; the output projection's 16-bit gradient;
        # the gradient flowing into the block.
        for name, i in (("last_block_reduce_scatter", L - 1), ("first_block_reduce_scatter", 0)):
            if L == 0:
                break
            done = L - 1 - i
            phases[name] = {
                **base, "grads_bytes": max(grads_acc, (done + 1) * g_block),
                "activations_bytes": others + sum(saved[:i]) + rope + cast_l * ck_flags[:i].count(False),
                "temporaries_bytes": 4.0 * block_p + root_g + dy + comm + g_bwd
                + (4.0 * (n_params - done * block_p) if fsdp_acc else 0.0)}
        # The root's reduce-scatter at the very end of backward: its 16-bit gradients
        # (embedding and output projection) and their fp32 copy, every block's shard
        # made; the root's weights stay gathered only without resharding.
        head_p = (h + (0 if _tied(shape, tp) else V * h / tp)) if last else 0.0
        if tp == 1:
            root_t = (wb + 4.0) * (V * h + head_p)
        else:  # the embedding's gradient whole (see emb_grad_extra), its weights still gathered
            root_t = wb * V * h + (wb + 4.0) * head_p + wb * (V * h / tp + head_p)
        phases["root_reduce_scatter"] = {
            **base, "grads_bytes": L * g_block, "activations_bytes": 0.0,
            "temporaries_bytes": root_t + comm + (4.0 * (V * h / tp + head_p) if fsdp_acc else 0.0)}
    if first and L > 0:
        # The embedding's backward, last of all: its dense gradient (whole under tensor
        # parallelism), and where a gradient is already there (the tied output
        # projection's, or an earlier micro-batch's) their sum, made out of place; tied,
        # the output projection's gradient waits beside them. Under FSDP2 these are
        # 16-bit and the root's weights are gathered, with the last block's
        # reduce-scatter buffer not yet released.
        tied = _tied(shape, tp) and last
        if fsdp:
            emb_t = wb * V * h * (1 + 2 * tied) + wb * (V * h / tp + head_p_all) + 4.0 * block_p
            if tp > 1:  # the output projection's pending gradient and the embedding gradient's shard
                emb_t += wb * (V * h / tp + head_p_all)
            g_now = L * g_block
        elif cfg.pipelined:
            # Earlier micro-batches' gradients take the dense one in place. Beside it the
            # trace shows 2 bytes per matmul weight of the stage alive through the
            # stage's backward under autocast (16-bit gradients of the weight copies the
            # micro-batches share, by their size; not traced to their holder).
            emb_t, g_now = 4.0 * V * h + (all_casts - cast_head), grads_b
        else:
            existing = tied or cfg.grad_accum > 1
            emb_t = 4.0 * V * h * (1 + tied + (cfg.grad_accum > 1))
            # Without a gradient already there, the dense one becomes the embedding's.
            g_now = grads_b if existing else grads_b - 4.0 * V * h / tp - emb_grad_extra
        acc_root = 4.0 * (V * h / tp + head_p_all) if fsdp_acc else 0.0  # the blocks' are reduced by now
        # A pipeline's first stage runs the embedding's backward with later micro-batches
        # still in flight.
        held_now = others + all_casts if cfg.pipelined else 0.0
        phases["embedding_backward"] = {**base, "grads_bytes": g_now, "activations_bytes": held_now,
                                        "temporaries_bytes": emb_t + comm + acc_root}
    if ddp:
        # The end of DDP's backward: the gradients, the buckets, the last step's averages
        # and for every bucket the new average its all-reduce hook returns (DDP's
        # built-in hook divides out of place), until the reducer copies them into the
        # gradients.
        phases["ddp_finalize"] = {**base, "grads_bytes": grads_b, "activations_bytes": 0.0,
                                  "temporaries_bytes": comm + buckets}
    if sync == "allreduce_after_schedule":
        # strategies/pipeline.mean_allreduce after the schedule: per chunk, its fp32
        # gradients concatenated into one flat buffer beside them, one chunk at a time.
        flat = max(sum(n for n, _ in _rank_params(shape, tp, c == 0, c == pp * v - 1, n_c))
                   for c, n_c in zip(chunk_ids, chunk))
        phases["allreduce_after_schedule"] = {**base, "grads_bytes": grads_b, "activations_bytes": 0.0,
                                              "temporaries_bytes": 4.0 * flat}
    phases["optimizer"] = {**base, "grads_bytes": grads_b, "activations_bytes": 0.0,
                           "temporaries_bytes": comm + scratch}
    for ph in phases.values():
        ph["total_bytes"] = sum(ph[k] for k in CONFIG_KEYS if k != "total_bytes")
        for k in list(ph):
            ph[k] = float(ph[k])
    return phases


def _rank_chunk_sizes(layers: int, chunks: int, ids: list[int]) -> list[int]:
    """Blocks of each chunk in ``ids`` when ``layers`` blocks are cut into ``chunks``
    balanced chunks, the first ones one block longer (strategies/pipeline.chunk_layers)."""
    base, extra = divmod(layers, chunks)
    return [base + (1 if c < extra else 0) for c in ids]


def _zero1_partition(sizes: list[float], dp: int) -> list[float]:
    """The parameters (numels, in the order rank 0's optimizer steps them) whose states
    rank 0 holds under torch's ZeroRedundancyOptimizer: whole tensors, largest first,
    each to the rank holding the fewest elements so far (ties to the lowest rank)."""
    loads = [0.0] * dp
    mine = []
    for n in sorted(sizes, reverse=True):
        r = min(range(dp), key=lambda i: loads[i])
        loads[r] += n
        if r == 0:
            mine.append(n)
    return mine


def _rank_params(shape: ModelShape, tp: int, first: bool, last: bool, layers: int,
                 block_ids: list[int] | None = None, ep: int = 1) -> list[tuple[float, bool]]:
    """(elements on this tensor-parallel rank, is a matmul weight) of every parameter of
    the stage, in the order the model registers them (the order a single-tensor optimizer
    steps them): embedding, per block its parameters (:func:`_block_params`), then the
    final norm and the untied output projection. Tensor parallelism splits the
    embedding and output projection over the vocabulary and every block matrix over its
    sharded dimension; norms are replicated. ``block_ids``: the model's indices of the
    stage's blocks (default 0 .. layers - 1), which say which are MoE blocks; ``ep``:
    the expert-parallel degree (a rank holds experts / ep of each MoE layer)."""
    return [(n, mm) for n, mm, _ in _rank_param_list(shape, tp, first, last, layers, block_ids, ep)]


def _rank_param_list(shape: ModelShape, tp: int, first: bool, last: bool, layers: int,
                     block_ids: list[int] | None = None, ep: int = 1) -> list[tuple[float, bool, bool]]:
    """:func:`_rank_params` with a third flag: the parameter is a routed expert's weight
    (sharded over ep, and under fsdp+ep FSDP-sharded over the dp / ep ranks sharing it)."""
    h, V = shape.hidden, shape.padded_vocab
    ids = list(range(layers)) if block_ids is None else block_ids
    out: list[tuple[float, bool, bool]] = [(V * h / tp, False, False)] if first else []
    for i in ids:
        out += _block_params(shape, tp, shape.is_moe_layer(i), ep)
    if last:
        out.append((h, False, False))
        if not _tied(shape, tp):
            out.append((V * h / tp, True, False))
    return out


def _block_params(shape: ModelShape, tp: int, moe: bool, ep: int) -> list[tuple[float, bool, bool]]:
    """(elements on this rank, is a matmul weight, is a routed expert's) of one block's
    parameters in registration order (workloads/gpt.py, moe.py): attn_norm; attention
    (wq, wk, wv, wo; MLA: wq or wq_a, q_norm, wq_b, then wkv_a, kv_norm, wkv_b, wo);
    mlp_norm; a dense MLP's w1, w2, (w3), or an MoE layer's router, its experts' stacked
    w1, w3, w2 (experts / ep of them) and the shared experts' w1, w2, w3."""
    h, F = shape.hidden, shape.ffn_hidden
    attn = [(p.k * p.n / (tp if p.split in ("column", "row") else 1), p.split != "norm")
            for p in shape.attention_parts()]
    out = [(h, False, False)] + [(n, mm, False) for n, mm in attn] + [(h, False, False)]
    if not moe:
        return out + [(h * F / tp, True, False), (F * h / tp, True, False)] + (
            [(h * F / tp, True, False)] if shape.gated_mlp else [])
    fe, fs = shape.moe_ffn_hidden, shape.shared_experts * shape.moe_ffn_hidden
    out += [(h * shape.experts, True, False)] + [(shape.experts / ep * h * fe, True, True)] * 3
    return out + ([(h * fs, True, False)] * 3 if shape.shared_experts else [])


def _rotary_dim(shape: ModelShape) -> int:
    """Width of the runner's rotary tables: each head's rope part under MLA, else the head."""
    return shape.qk_rope_head_dim if shape.is_mla else shape.dim_head


def _runner_block_extra(shape: ModelShape, index: int, e: float, tp: int, ep: int, device: str) -> float:
    """Bytes per token that block ``index`` of the runner's decoder saves for backward
    beyond :func:`layer_activations` (which counts grouped-query attention and a dense
    MLP of width ffn_hidden), e bytes an activation element. Zero for a dense GQA block.

    MLA (workloads/gpt.MLAttention's docstring lists what it saves): q_norm's input,
    normalised value and output (3 e q_lora_rank) and kv_norm's input, a view that keeps
    wkv_a's whole output (e (kv_lora_rank + rope)), normalised value and output
    (2 e kv_lora_rank), each norm with its fp32 statistics; SDPA's q and k (e a qk each,
    qk = nope + rope) and its log-sum-exp (as counted), and for values and output: on CPU
    the padded v and output (e a qk each) and wo's contiguous copy of the cut output
    (e a v); on CUDA wkv_b's output, which the saved v keeps (e a (nope + v)), and the
    output (e a v). layer_activations counts the CUDA form (:func:`mla_attention_bytes`)
    with the latents whole on every tensor-parallel rank: what is left here is the CPU
    form's difference and the runner's split of the latents over tp.

    An MoE block (workloads/moe.py), per token and its top_k routed rows: the router's
    fp32 probabilities (4 E), the top-k ids (int64) and fp32 probabilities and their sum;
    per row the expert's input row and output row (under ep the rows received and sent
    back by the all-to-all) and the weighted row index_add keeps (3 e h), the SwiGLU's
    four tensors (4 e F_e), the fp32 combine weight, the row's token index and kept slot
    (int64 each; under ep also the regrouping order and its inverse); the shared experts'
    SwiGLU (4 e shared x F_e); less the dense MLP layer_activations counted (4 e F). (The
    planner's :func:`moe_mlp_extra` counts 2 e h a row and no indices.)"""
    extra = 0.0
    if shape.is_mla:
        # layer_activations counts MLA as it runs on CUDA (mla_attention_bytes), the
        # latents whole on every rank; the runner splits them over tp too and, on CPU,
        # pads v to qk for SDPA.
        a, qk, v = shape.heads, shape.dim_head, shape.v_dim
        heads_b, latent_b = mla_attention_bytes(shape, e)
        sdpa = e * a * (4.0 * qk + v) if device == "cpu" and v < qk else heads_b
        extra += (sdpa - heads_b) / tp + latent_b / tp - latent_b
    if shape.is_moe_layer(index):
        h, k, fe = shape.hidden, shape.top_k, shape.moe_ffn_hidden
        per_row = 3.0 * e * h + 4.0 * e * fe + 4.0 + 16.0 + (16.0 if ep > 1 else 0.0)
        router = 4.0 * shape.experts + 12.0 * k + 4.0
        shared = 4.0 * e * shape.shared_experts * fe
        dense = (4.0 if shape.gated_mlp else 2.0) * e * shape.ffn_hidden / tp
        extra += k * per_row + router + shared - dense
    return extra


def _tied(shape: ModelShape, tp: int) -> bool:
    """Whether the output projection shares the embedding's weight on this rank. Under
    the runner's tensor parallelism it does not: parallelize_module replaces the
    embedding's weight with a vocabulary-sharded DTensor and then shards the head's
    reference to the old tensor into a second one (strategies/tensor_parallel.py), so a
    tied model is trained untied, with two shards. (Reported; the trace sees it.)"""
    return shape.tie_embeddings and tp == 1


def _adamw_scratch(sizes: list[float], kind: str) -> float:
    """Elements of scratch torch's AdamW allocates at its peak within a step.

    ``single`` (CPU's default) steps one tensor at a time: sqrt(v) and its quotient by
    the bias correction are new tensors, and the previous tensor's denominator lives
    until the next one replaces it, so the peak is the largest (previous + 2 x current).
    ``foreach`` (CUDA's default) makes sqrt(v) for every tensor at once: one copy of
    all of them. ``fused`` (the runner's choice on CUDA) updates in place: none."""
    if not sizes or kind == "fused":
        return 0.0
    if kind == "foreach":
        return float(sum(sizes))
    best, prev = 0.0, 0.0
    for n in sizes:
        best = max(best, prev + 2.0 * n)
        prev = n
    return best
