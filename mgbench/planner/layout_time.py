"""The one step model: :func:`step_time` adds up the terms perf.py states (compute,
tp and pp communication, the bubble, data-parallel traffic and what overlap hides of
it) and those of the axes of issue 17 (expert parallelism, context parallelism, FP8,
HSDP, CPU offload). `predict`, `plan`'s vectorised search, the validation tables and
the run's closing projection all call it; calibration fits coefficients of the same
FLOP and collective counts (perf.hardware_flops_per_token, perf.collective_counts).

    step = compute (+ moe) + bubble + tp_comm + pp_comm + exposed_dp_comm
           + ep_comm + cp_comm + offload + moe_host + optimizer

compute   perf's; with context parallelism each of the cp ranks computes s / cp tokens
          of every sequence (queries) against the whole sequence (keys): perf is called
          with micro-batch b / cp and data-parallel degree dp x cp, which gives exactly
          that split of tokens, the same micro-batch count and the gradient reduction
          over dp x cp ranks that torchtitan's FSDP mesh does. Under fp8 the blocks'
          linear layers (every block matmul but attention's scores and values) run at
          the FP8 peak times the GPU's measured FP8 best-GEMM fraction over its bf16
          one (efficiency.toml gemm_best_fp8 / gemm_best: Hopper reaches 0.88 of the
          bf16 fraction, MI300X 0.87, B200 0.98), or, where no FP8 GEMM was measured,
          the bf16 fraction (:func:`fp8_linear_ratio`); the output projection stays bf16
          (torchao / torchtitan leave it out, strategies/fp8.py); quantizing each
          linear's input and output gradient costs memory traffic besides
          (perf.fp8_cast_seconds, ``fp8_cast_s``). MFU stays against the bf16 peak.
bubble    perf's: the schedule's theoretical idle fraction f (strategies/schedules.py's
          :func:`theoretical_bubble`, the one place for it), bubble = blocks x f / (1 - f),
          on the blocks' compute after the fp8 speed-up.
ep_comm   the expert-parallel all-to-alls by scope (planner/moe.py): dispatch and
          combine, forward and backward, per MoE layer and micro-batch, their rows split
          between the node's NVLink and the network by the group's placement (ep
          consecutive ranks) and the dispatcher (one row per expert, or DeepEP's one per
          node and GPU, where node-limited routing pays), FP8 dispatch where the run does
          it, at the busiest receiver's load; exposed all of it, or under DualPipe /
          Megatron-Core's EP overlap only what the paired micro-batch's compute cannot
          cover (moe.exposed_a2a). Its options: ``moe`` (moe.MoeOptions; None: the defaults).
moe_host  what the GPU waits on the host in eager MoE layers (moe.host_seconds: per MoE
          layer pass, a per-layer time by dispatcher and a per-local-expert time solved
          from published Megatron-Bridge rows, a recomputed layer's forward launches
          counted again: ``moe_rerun_share``, moe.host_launches; moe.host_wait: all of it,
          dropless or drop-and-pad, stretched by the bubble like the stage's other work);
          under MoeOptions(cuda_graphs=True) the stored graphed_share of it, or
          graphed_padded_share with a capacity factor (the GPU time of the small kernels
          that stays in graphs; moe.graphed_share_key).
moe_efa_notify  the extra host wait (beyond moe_host's) for the token counts a forward
          DeepEP-style dispatch exchanges across AWS EFA nodes through a CPU proxy
          (UCCL-EP, NVSHMEM on libfabric), which the kernels' published rates leave out: per forward dispatch
          (moe.efa_notify_seconds), stretched by the bubble as moe_host.
moe       compute the MoE layers add to perf's (in the blocks, so the bubble scales too):
          the busiest rank's extra expert rows (load - 1 of perf's expert_gemm_s, or of
          the routed experts' FLOP share of the linears where perf reports none), the
          Megatron-Core recompute modules the run names, the token permutation
          around the all-to-alls and the routed rows' activation traffic beyond the
          dense MLP perf's elementwise term counts (both memory-bound), and where
          gpt-oss-style experts run unfused, the passes of their clamp and bias
          (moe.epilogue_seconds, counted from Megatron-Core's ops: ``moe_epilogue_s``).
cp_comm   the all-gather form of context parallelism: per block and micro-batch an
          all-gather of K and V (s b 2 k e / t bytes in all, k = kv heads x head dim)
          and a reduce-scatter of their gradients (ring collectives over cp ranks, plus
          one all-gather per recomputed block); not overlapped.
dp_comm   perf's rule per parameter group (its all-gather count and overlap window
          follow the pipeline schedule's gradient sync: perf.zero3_gathers,
          perf.dp_window_fraction): dense weights over dp x cp ranks (HSDP: the
          reduce-scatter / all-gathers inside dp x cp / replicas ranks, then an
          all-reduce of the shard across the replicas), routed experts (/ ep) over the
          expert data-parallel group of dp x cp / ep ranks; under fp8 with ZeRO-3 the
          weight all-gathers carry 1 byte a weight (torchao's float8 all-gather).
offload   FSDP2 CPU offload: every all-gather first copies the sharded weights host to
          device (perf.zero3_gathers: 2 per micro-batch) at the bytes a weight the run
          keeps (``offload_weight_bytes``: the stack's, fp32 under FSDP2's mixed precision,
          2 where it trains in bf16 throughout), every reduce-scatter copies the gradient
          shard back; the two directions run concurrently on
          the host link (PCIe / C2C of the system, hardware.toml ``host_link``), not
          overlapped with compute. The optimizer's step on the host's CPU and the
          gradient clipping there (``host_optimizer_s``: planner/host_step.py, one
          thread a rank at measured rates), serial with the step.
optimizer the optimizer's own matrix work a step and, under offload, its states' copies to
          run it on the GPU (planner/optimizer.py: Muon's Newton-Schulz iterations at the
          GEMM rate, its gradient and weight over the host link, its pageable momentum at
          host_step's pageable rate; nothing for AdamW), serial with the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import catalog
from ..errors import MgbenchError
from ..layout import fp8_attention_problem
from ..model_shape import ModelShape
from ..strategies.schedules import bubble_unknown_reason
from . import ep_kernels
from . import host_step
from . import moe as moe_terms
from . import optimizer as optimizer_terms
from . import perf
from .hardware import GB, Hardware
from .hardware import FP8_ATTENTION_BF16, fp8_attention_gpus
from .hardware import fp8_attention_points as hardware_fp8_attention_points
from .memory import (STATE_BYTES, VIRTUAL_SCHEDULES, act_bytes, attention_recomputed_share, expert_ranks, rank_runs,
                     recomputed_share, stage_layers, stage_param_split)
from .stack import counts_expert_epilogue
from .stack import fp8_recipe as recipe_of

FP8_EFF_NOTE = ("FP8 linears at the bf16 matmul efficiency's fraction of the FP8 peak (an assumption: no FP8 "
                "best-GEMM (MAMF) figure is recorded)")
FP8_MEASURED_NOTE = ("FP8 linears at the FP8 peak x the measured FP8 best-GEMM fraction ({ratio:.2f} of the bf16 one, "
                     "efficiency.toml)")
FP8_CAST_NOTE = ("FP8 casts: every linear's input and output gradient cast under the {recipe} recipe, {bytes:.3g} bytes "
                 "an element at the achieved memory bandwidth, unfused (fp8_cast_s; --fp8-recipe)")
FP8_LAYOUT_UNKNOWN_NOTE = ("FP8 casts on {gpu}: whether its FP8 GEMMs take any operand layout is not stated "
                           "(fp8_any_layout): priced with the column-wise copy a TN-only GPU makes, the larger cost")


def hardware_precision(precision: str) -> str:
    """The precision whose peak a Hardware is resolved at: fp8 training keeps bf16 for
    everything but the blocks' linears, and MFU is quoted against the bf16 peak."""
    return catalog.mfu_precision(precision)


def fp8_peak_tflops(hw: Hardware) -> float:
    """The catalog's dense FP8 peak of ``hw``'s GPU; MgbenchError where it has none."""
    try:
        peak = catalog.accelerator_peak(hw.gpu, "fp8")
    except MgbenchError:
        peak = None
    if peak is None:
        with_fp8 = [k for k in catalog.accelerators() if catalog.accelerator_peak(k, "fp8") is not None]
        raise MgbenchError(f"--precision fp8: the catalog has no FP8 peak for {hw.gpu} (GPUs with one in "
                           f"hardware.toml: {', '.join(with_fp8)}); choose bf16")
    return peak


def fp8_linear_ratio(hw: Hardware) -> float:
    """Seconds of an FP8 linear over the same linear's bf16 seconds on ``hw``: the peaks'
    ratio, divided by the measured FP8 best-GEMM fraction over the bf16 one where the
    GPU's profile has both (an H100 SXM's FP8 GEMMs reach 0.71 of the FP8 peak against
    0.80 of the bf16 one: 0.5 / 0.88 = 0.57, not 0.5)."""
    return hw.peak_tflops / fp8_peak_tflops(hw) / (hw.fp8_gemm_ratio or 1.0)


FP8_ATTENTION_NOTE = ("attention's scores and values in FP8 (--fp8-attention, {scaling} scaling): {ratio:.2f} x the "
                      "BF16 fused kernel's seconds, the FP8 / BF16 fused-attention time measured on this GPU for this "
                      "attention, taken off at the BF16 kernel's measured rate (efficiency.toml [fp8_attention]); "
                      "their saved activations still counted at BF16 bytes")


def fp8_attention_terms(shape: ModelShape, hw: Hardware, precision: str, recipe: str, seq: Any,
                        flash: Any = True) -> tuple[Any, Any, str]:
    """(seconds of attention's scores and values in FP8 over their BF16 seconds on ``hw``,
    the BF16 kernel's fraction of the bf16 peak in the same run, the scaling it runs in):
    what cuDNN's benchmarks measured for the model's kind of attention
    (hardware.fp8_attention_points: MLA, else GQA, sliding windows included), by sequence
    (perf.log2_interp), in MXFP8 under the mxfp8 recipe and per-tensor FP8 under the
    others. MgbenchError where the layout is not FP8, the recipe gives attention no FP8
    (blockwise), attention is materialised (``flash`` False) or the GPU has no
    measurement."""
    if (why := fp8_attention_problem(precision, True, recipe, flash)) is not None:
        raise MgbenchError(why)
    points = hardware_fp8_attention_points(hw.gpu)
    if points is None:
        raise MgbenchError(f"--fp8-attention: no FP8 / BF16 fused-attention time measured for {hw.gpu} "
                           f"(efficiency.toml [fp8_attention] has {', '.join(fp8_attention_gpus()) or 'none'}): "
                           "drop it")
    scaling = "mxfp8" if recipe == "mxfp8" else "fp8"
    kind = points["mla" if shape.is_mla else "gqa"]
    return perf.log2_interp(kind[scaling], seq), perf.log2_interp(kind[FP8_ATTENTION_BF16], seq), scaling


def host_link_bw(hw: Hardware) -> float:
    """Bytes/s one GPU moves to or from host memory (one direction): the system's
    ``host_link`` in hardware.toml at its measured fraction. MgbenchError where unknown."""
    from .hardware import catalog_system

    system = catalog.systems().get(catalog_system(hw), {})
    name = system.get("host_link")
    if name is None:
        raise MgbenchError(f"--offload: the host link of {hw.system!r} is not in the catalog (hardware.toml "
                           "systems.*.host_link); offload cannot be priced there")
    link = catalog.links()[name]
    return float(link["peak_gbps"]) * GB * float(link["bw_eff"])


def cp_kv_exchange_s(shape: ModelShape, hw: Hardware, *, seq: Any, micro_batch: Any, tp: Any, cp: Any, span: Any,
                     precision: str, layers: Any, num_micro: Any, recompute: Any) -> Any:
    """Seconds of context-parallel K/V exchange per step (see the module docstring):
    ``micro_batch`` whole sequences of ``seq`` tokens, ``layers`` blocks on the stage."""
    e = act_bytes(precision)
    k = shape.kv_heads * shape.dim_head
    nbytes = np.asarray(seq, dtype=float) * np.asarray(micro_batch, dtype=float) * 2.0 * k * e / np.asarray(tp, dtype=float)
    one = perf.group_collective_time(nbytes, cp, span, hw, 1.0)
    lay = np.asarray(layers, dtype=float)
    recomputed = attention_recomputed_share(lay, recompute)  # recomputed attention gathers K/V again
    return (2.0 + recomputed) * lay * np.asarray(num_micro, dtype=float) * one


def dp_comm_s(hw: Hardware, *, dense: Any, expert: Any, tp: Any, dpc: Any, ep: Any, replicas: Any, zero: Any,
              num_micro: Any, precision: str, pp: Any = 1, schedule: str = "1f1b") -> Any:
    """Seconds of data-parallel traffic per step before overlap (see the module
    docstring); ``dense``/``expert``: parameters on this GPU before sharding; ``dpc``:
    the data-parallel ranks (dp x cp)."""
    g = act_bytes(precision)  # gradient bytes (perf's)
    w = 1.0 if precision == "fp8" else g  # gathered weight bytes
    z = np.asarray(zero)
    m = np.asarray(num_micro, dtype=float)
    t, d = np.asarray(tp, dtype=float), np.asarray(dpc, dtype=float)

    def group(params: Any, n: Any, r: Any) -> Any:
        shard = n / r  # ranks a copy is sharded over; its r replicas span all t x n GPUs
        gb = np.asarray(params, dtype=float) * g
        allreduce = perf.group_collective_time(gb, n, t * n, hw, 2.0)
        z3 = perf.zero3_gathers(m, pp, schedule) * perf.group_collective_time(
            np.asarray(params, dtype=float) * w, shard, t * shard, hw, 1.0) \
            + perf.group_collective_time(gb, shard, t * shard, hw, 1.0) \
            + perf.group_collective_time(gb / shard, r, t * n, hw, 2.0)
        return np.where(z >= 3, z3, allreduce)

    # Routed experts: replicated over the t x dp x cp / ep ranks of their expert
    # data-parallel group (MoE parallel folding, planner/moe.py: an ep group is ep
    # consecutive ranks, so a replica is ep ranks from the next and the group spans all
    # t x dp x cp of them). (A dense model has no expert group: not even its latency terms.)
    n_e = t * d / np.asarray(ep, dtype=float)
    gb_e = np.asarray(expert, dtype=float) * g
    expert_z3 = perf.zero3_gathers(m, pp, schedule) * perf.group_collective_time(
        np.asarray(expert, dtype=float) * w, n_e, t * d, hw, 1.0) + perf.group_collective_time(gb_e, n_e, t * d, hw, 1.0)
    experts = np.where(np.asarray(expert) > 0,
                       np.where(z >= 3, expert_z3, perf.group_collective_time(gb_e, n_e, t * d, hw, 2.0)), 0.0)
    return group(dense, d, np.asarray(replicas, dtype=float)) + experts


def etp_comm_s(shape: ModelShape, hw: Hardware, *, tokens: Any, etp: Any, load: Any, act_bytes: float,
               moe_layers: Any, num_micro: Any, moe_rerun_share: Any) -> Any:
    """Seconds a step of expert tensor parallelism's own traffic on one rank (0 at etp 1):
    Megatron-Core's dispatcher all-gathers the routed rows of the etp ranks before the
    experts and reduce-scatters the experts' partial outputs after them (its
    gather_from_sequence_parallel_region / reduce_scatter_to_sequence_parallel_region
    over the expert tensor-parallel group), and backward runs the two the other way: four
    ring collectives a MoE layer and micro-batch (two more for a recomputed layer's
    forward) over etp consecutive ranks, each moving the rank's routed rows (``tokens``
    x top_k at the busiest rank's ``load``, hidden wide) from or to each of the others.
    Not overlapped with compute (none of the published recipes overlaps it)."""
    x = np.asarray(etp, dtype=float)
    rows = np.asarray(tokens, dtype=float) * shape.top_k * np.asarray(load, dtype=float)
    gathered = rows * x * shape.hidden * act_bytes  # the etp ranks' rows, each rank's whole after the gather
    one = perf.group_collective_time(gathered, x, x, hw, 1.0)
    passes = 4.0 + 2.0 * np.asarray(moe_rerun_share, dtype=float)
    return np.where(x > 1, passes * one * np.asarray(moe_layers, dtype=float) * np.asarray(num_micro, dtype=float),
                    0.0)


def check_fused_grouped_mlp(gpu: str | None, stack: str | None, precision: str, fp8_recipe: str | None) -> None:
    """One line (MgbenchError) where a run states the fused grouped MLP it cannot have
    (moe.fused_grouped_mlp_problem), its FP8 recipe resolved as the step prices it
    (``fp8_recipe`` given, else ``stack``'s)."""
    recipe = recipe_of(stack, fp8_recipe) if precision == "fp8" else None
    if (problem := moe_terms.fused_grouped_mlp_problem(gpu, precision, recipe)) is not None:
        raise MgbenchError(f"--moe-fused-grouped-mlp: {problem}: drop it")


def step_time(shape: ModelShape, hw: Hardware, *, seq: Any, global_batch: Any, micro_batch: Any, tp: Any, pp: Any,
              dp: Any, zero: Any, recompute: Any, precision: str = "bf16", schedule: str = "1f1b",
              virtual_stages: int = 1, overlap: float = perf.DEFAULT_OVERLAP, sp: Any = False, flash: Any = True,
              ep: Any = 1, cp: Any = 1, replicas: Any = 1, offload: bool = False,
              host_ops: dict[str, float] | None = None, moe: moe_terms.MoeOptions | None = None,
              pp_last_layers: Any = None, fp8_recipe: str | None = None,
              fp8_attention: bool = False, offload_state_bytes: tuple[float, float, float] = STATE_BYTES["fp32"],
              etp: Any = 1, optimizer: str = "adamw") -> dict[str, Any]:
    """Predicted step time and its parts for a layout with every axis (arrays
    broadcast); the step, its named terms in ``breakdown`` and ``notes``.
    ``hw`` is resolved at :func:`hardware_precision` (bf16 for fp8); ``moe``: how an MoE
    model routes and moves its tokens (None: moe.MoeOptions's defaults);
    ``pp_last_layers``: the last pipeline stage's blocks where the run sets them
    (memory.stage_layers; None: Megatron-LM's even split); ``fp8_recipe``: the FP8 scaling
    recipe under ``precision`` fp8 (perf.FP8_RECIPES; None: the stack's, stack.fp8_recipe);
    ``fp8_attention``: attention's scores and values in FP8 too (:func:`fp8_attention_terms`);
    ``offload_state_bytes``: the bytes a parameter the host copy holds its weight, gradient
    and optimizer state in under ``offload`` (the run's held state bytes; FSDP2's fp32
    shard and Adam's two fp32 moments where none are given); ``etp``: each routed
    expert split over etp ranks (Megatron-Core's expert tensor parallelism: its weights and
    gradient traffic / etp, and an all-gather and a reduce-scatter of the routed rows over
    the etp ranks around the experts, :func:`etp_comm_s`); ``optimizer``: the optimizer's
    own matrix work and, under ``offload``, its states' copies (planner/optimizer.py:
    Muon's Newton-Schulz iterations; nothing for AdamW)."""
    c = np.asarray(cp, dtype=float)
    d = np.asarray(dp, dtype=float)
    virtual = schedule in VIRTUAL_SCHEDULES
    v = virtual_stages if virtual else 1
    chunks = rank_runs(pp, schedule, virtual_stages)
    dense_p, expert_p = stage_param_split(shape, tp, pp, ep, pp_last_layers, etp, chunks)
    b = perf.compute_terms(shape, hw, seq=seq, global_batch=global_batch, micro_batch=np.asarray(micro_batch) / c,
                           tp=tp, pp=pp, dp=d * c, recompute=recompute, precision=hardware_precision(precision),
                           sp=sp, flash=flash, host_ops=host_ops, ep=ep, pp_last_layers=pp_last_layers)
    m = b["num_micro_batches"]
    s = np.asarray(seq, dtype=float)
    rc = np.asarray(recompute)
    t, p = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    notes: list[str] = []
    blocks = b["blocks_s"]
    if precision == "fp8":
        if host_ops is not None and hw.ew_bw is not None:
            raise MgbenchError("--precision fp8 is priced on catalog GPUs only (a probed CPU has no FP8 units)")
        ratio = fp8_linear_ratio(hw)
        blocks = blocks - b["linear_s"] * (1.0 - ratio) / hw.stack_eff
        notes.append(FP8_MEASURED_NOTE.format(ratio=hw.fp8_gemm_ratio) if hw.fp8_gemm_ratio else FP8_EFF_NOTE)
    scores_saved = 0.0 * blocks  # what FP8 attention takes off the blocks' seconds
    if fp8_attention:
        a_ratio, bf16_fraction, scaling = fp8_attention_terms(shape, hw, precision, recipe_of(hw.stack, fp8_recipe),
                                                              seq, flash)
        # The ratio is of cuDNN's kernel seconds, so it takes (1 - r) of the BF16 kernel's
        # seconds as measured in the same run, not of attention's seconds as priced: on
        # Blackwell those are FLOPs at the GEMM rate, not halved for causality, which put
        # DeepSeek-V3's MLA at 1.28x the kernel's time (a review, 2026-11-28). Never more
        # than attention's priced seconds.
        kernel = b["flash_unit_s"] / bf16_fraction
        scores_saved = np.minimum(kernel * (1.0 - a_ratio), b["scores_s"]) / hw.stack_eff
        blocks = blocks - scores_saved
        notes.append(FP8_ATTENTION_NOTE.format(ratio=float(np.mean(a_ratio)), scaling=scaling))
    lps, last_layers = stage_layers(shape.layers, p, pp_last_layers)
    # Megatron-Core builds the MTP modules on the last pipeline stage, beside the output
    # layer (a pipeline layout's "tmL"). perf prices the blocks' FLOPs per token with the
    # MTP modules' among them, spread over the stages (flop_spread_s): a pipelined stage
    # gives that share back, the MTP modules' exact FLOPs (the model's FLOPs less those of
    # the same model without them), keeping its own blocks' whole; the last stage runs the
    # MTP modules' FLOPs besides (mtp_flops_s), with a mean block's other terms each.
    # The FLOP-priced part as run: under fp8 the linears' FLOPs at the FP8 rate.
    flop_part = b["flop_spread_s"]
    if precision == "fp8":
        flop_part = flop_part - (b["linear_s"] - b["block_shape_loss_s"]) * (1.0 - ratio) / hw.stack_eff
    flop_part = flop_part - scores_saved
    moved = 0.0 * blocks  # the stage's share of the MTP modules' FLOPs
    if shape.mtp_layers:
        own, mtp_flops = perf.block_flops_per_token(shape, s, rc)
        moved = np.where(p > 1, flop_part * mtp_flops / (own + mtp_flops), 0.0)
        blocks = blocks - moved
    flop_own = flop_part - moved
    opts = moe if moe is not None else moe_terms.MoeOptions()
    e = act_bytes(precision)
    tokens_rank = s * np.asarray(micro_batch, dtype=float) / (c * t)  # a rank's tokens (sequence parallel over tp)
    moe_layers = shape.stage_moe_layers(lps, chunks)
    zero_s = 0.0 * blocks
    imbalance_s, moe_recompute_s, permute_s, a2a, ep_comm, host_s = zero_s, zero_s, zero_s, zero_s, zero_s, zero_s
    notify_s = zero_s
    etp_s = zero_s
    epilogue_s = zero_s
    rerun = zero_s  # the share of MoE layers whose forward runs again
    traffic_s = zero_s
    load = moe_terms.rank_load(opts, ep) if shape.is_moe else 1.0  # 1 without expert parallelism
    if shape.is_moe and np.any(np.asarray(etp) > 1) and opts.dedup:
        # DeepEP / HybridEP send a token to every etp rank of its experts over ep x etp ranks
        # and run no gather or scatter: another form, not priced.
        raise MgbenchError(f"--etp with --moe-dispatcher {opts.dispatcher} is not priced (its kernels send to every "
                           "expert tensor-parallel rank instead of gathering over them); give --moe-dispatcher "
                           "alltoall, or --etp 1")
    if shape.is_moe:
        linear_scale = (ratio if precision == "fp8" else 1.0) / hw.stack_eff  # the linears' seconds as run
        expert = np.asarray(b.get("expert_gemm_s", zero_s), dtype=float)
        expert = np.where(expert > 0, expert, b["linear_s"] * moe_terms.expert_share_of_linear(shape, lps))
        imbalance_s = expert * (load - 1.0) * linear_scale
        rank_tokens = np.asarray(global_batch, dtype=float) * s * lps / shape.layers / (t * d * c)
        rc_flops = moe_terms.recompute_flops_per_token(shape, opts.recompute_modules, load)
        moe_recompute_s = rc_flops * rank_tokens / perf.gemm_rate(hw) * linear_scale
        permute_s = moe_terms.permute_seconds(shape, hw, tokens=tokens_rank, act_bytes=e, moe_layers=moe_layers,
                                              num_micro=m, load=load) / hw.stack_eff
        traffic_s = perf.moe_traffic_seconds(shape, hw, tokens=tokens_rank * t, tp=t, precision=precision,
                                             load=load, moe_layers=moe_layers, num_micro=m,
                                             recompute=rc, sp=sp) / hw.stack_eff
        if opts.fused_grouped_mlp:
            check_fused_grouped_mlp(hw.gpu, hw.stack, precision, fp8_recipe)
        # The MoE layer's forward runs again under moe or a whole-block recompute (its
        # all-to-alls and host launches below too), the activation's alone under moe_act.
        rerun = moe_terms.moe_rerun_share(shape, opts.recompute_modules, recomputed_share(lps, rc))
        act_rerun = np.maximum(rerun, 1.0 if "moe_act" in opts.recompute_modules else 0.0)
        counted = counts_expert_epilogue(hw.stack)
        if counted:
            epilogue_s = moe_terms.epilogue_seconds(shape, hw, tokens=tokens_rank, moe_layers=moe_layers, num_micro=m,
                                                    load=load, opts=opts, act_rerun=act_rerun,
                                                    layer_rerun=rerun, act_bytes=e) / hw.stack_eff
        blocks = blocks + imbalance_s + moe_recompute_s + permute_s + traffic_s + epilogue_s
        # The routed experts' compute (Megatron-Core's "mlp" node: moe.LayerSplit).
        experts_s = expert * linear_scale + imbalance_s + traffic_s + epilogue_s
        notes.append(moe_terms.note(opts, schedule))
        if (epilogue := moe_terms.epilogue_note(shape, opts, counted, hw.stack)) is not None:
            notes.append(epilogue)
    cast_s = zero_s
    if precision == "fp8":
        recipe = recipe_of(hw.stack, fp8_recipe)
        known = hw.gpu in catalog.accelerators()  # a catalog or --system-file part (not a probed device)
        if recipe == "mxfp8" and known and not catalog.accelerator_mx_formats(hw.gpu):
            what = ("has none" if catalog.accelerator_mx_formats(hw.gpu) is False
                    else "has no mx_formats entry saying it does")
            others = ", ".join(r for r in perf.FP8_RECIPES if r != "mxfp8")
            raise MgbenchError(f"--fp8-recipe mxfp8 needs tensor cores that take MX block-scaled operands "
                               f"(hardware.toml mx_formats: Blackwell, CDNA 4), and {hw.gpu} {what}; give one of "
                               f"{others}")
        any_layout = catalog.accelerator_fp8_any_layout(hw.gpu) if known else None
        if any_layout is None and recipe in perf.TE_PER_TENSOR_RECIPES:
            notes.append(FP8_LAYOUT_UNKNOWN_NOTE.format(gpu=hw.gpu))
        any_layout = bool(any_layout)
        cast_s = perf.fp8_cast_seconds(shape, hw, tokens=tokens_rank * t, tp=t, blocks=lps, num_micro=m, recompute=rc,
                                       load=load, sp=sp, recipe=recipe,
                                       modules=opts.recompute_modules, any_layout=any_layout) / hw.stack_eff
        blocks = blocks + cast_s
        notes.append(FP8_CAST_NOTE.format(recipe=recipe, bytes=perf.fp8_cast_bytes(recipe, any_layout)))
    # The output layer (and the MTP modules) run on the last stage. Evenly split, that
    # stage has a first stage's blocks besides and sets the pace; where the run gives it
    # fewer blocks (pp_last_layers), they make room for the output layer, which paces the
    # pipeline only by what the room does not cover.
    # An MTP module: its own FLOPs, and a mean block of the stage's other terms (elementwise,
    # GEMM shape losses, MoE terms).
    mtp_s = np.where(p > 1, moved * shape.layers / lps + (blocks - flop_own) * shape.mtp_layers / lps, 0.0)
    room = np.where(p > 1, (lps - last_layers) / lps, 0.0) * blocks
    compute = blocks + np.maximum(b["head_s"] + mtp_s - room, 0.0)
    f = perf.bubble_fraction(p, m, schedule, v)
    if np.any(np.isnan(f)):
        bad = np.argwhere(np.isnan(np.broadcast_to(f, np.broadcast(p, m).shape)))[0]
        pi = int(np.broadcast_to(p, f.shape)[tuple(bad)])
        mi = int(np.broadcast_to(m, f.shape)[tuple(bad)])
        notes.append(bubble_unknown_reason(pi, mi, schedule) or "bubble unknown")
    bubble = blocks * f / (1.0 - f)

    if shape.is_moe:
        dispatch, combine = moe_terms.a2a_directions(shape, hw, tokens=tokens_rank, ep=ep, act_bytes=e, opts=opts,
                                                     moe_layers=moe_layers, num_micro=m, moe_rerun_share=rerun,
                                                     across_share=ep_kernels.priced_share(hw, opts), etp=etp)
        a2a = dispatch + combine
        # The MoE layers' compute by the node of Megatron-Core's EP overlap that runs it
        # (moe.LayerSplit). Permute (before dispatch) runs in the "attn" node under the
        # all-to-all dispatcher, in the "mlp" node under DeepEP / HybridEP; unpermute (after
        # combine) in the combine node, on the communication stream: half the passes each.
        # The rest of the blocks (attention's side, the FP8 casts among it) is taken at the
        # stage's MoE layers' share: its dense layers' dispatch and combine are no-ops.
        permute_half = permute_s / 2.0
        moe_share = np.clip(np.asarray(moe_layers, dtype=float) / lps, 0.0, 1.0)
        rest = (blocks - experts_s - permute_s) * moe_share
        split = moe_terms.LayerSplit(attention=rest + (0.0 if opts.dedup else permute_half),
                                     experts=experts_s + (permute_half if opts.dedup else 0.0),
                                     on_comm=permute_half, wgrad_delayed=not opts.wgrad_in_backward)
        ep_comm = moe_terms.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule=schedule, virtual_stages=v,
                                        opts=opts, split=split, dispatch=dispatch)
        host = moe_terms.host_seconds(shape, ep=ep, moe_layers=moe_layers, num_micro=m, opts=opts, rerun=rerun,
                                      stack=hw.stack)
        host_s = moe_terms.host_wait(host, bubble_fraction=f)
        notify = moe_terms.efa_notify_seconds(ep=ep, gpus_per_node=hw.gpus_per_node,
                                              across_efa=ep_kernels.talks_over_efa(hw), moe_layers=moe_layers,
                                              num_micro=m, opts=opts, rerun=rerun)
        notify_s = moe_terms.host_wait(notify, bubble_fraction=f)
        etp_s = etp_comm_s(shape, hw, tokens=tokens_rank, etp=etp, load=load, act_bytes=e, moe_layers=moe_layers,
                           num_micro=m, moe_rerun_share=rerun)
        ep_comm = ep_comm + etp_s
    cp_comm = cp_kv_exchange_s(shape, hw, seq=s, micro_batch=micro_batch, tp=t, cp=c, span=t * c,
                               precision=precision, layers=lps, num_micro=m, recompute=rc)

    dpc = d * c
    # Expert tensor parallelism: an expert's ranks are ep x etp of the t x dp x cp, so its
    # data-parallel group is etp times smaller (dp_comm_s prices it from the product).
    dp_comm = dp_comm_s(hw, dense=dense_p, expert=expert_p, tp=t, dpc=dpc, ep=expert_ranks(ep, etp),
                        replicas=replicas, zero=zero, num_micro=m, precision=precision, pp=p, schedule=schedule)
    z = np.asarray(zero)
    exposed_dp = np.maximum(dp_comm - overlap * compute * perf.dp_window_fraction(m, z, p, schedule), 0.0)

    offload_s = 0.0 * compute
    host_optimizer_s = 0.0 * compute
    if offload:
        shard = dense_p / (dpc / np.asarray(replicas, dtype=float)) + expert_p / (dpc / np.asarray(ep, dtype=float))
        bw = host_link_bw(hw)
        # Host to device (one shard copy per all-gather: 2 m, or one for a pipeline whose
        # stages stay unsharded) is the larger direction; the gradient copies back run
        # concurrently the other way.
        offload_s = perf.zero3_gathers(m, p, schedule) * offload_state_bytes[0] * shard / bw
        # The optimizer step runs on the host's CPU after the gradients' copies, serially.
        host_optimizer_s = host_step.host_optimizer_seconds(shape, optimizer, shard, offload_state_bytes, hw.stack)
        notes.append(host_step.note(optimizer, hw.stack))
    # The optimizer's own matrix work (Muon), and under offload the copies of its states it
    # makes to run on the GPU, serial with the step (planner/optimizer.py).
    n_gpus = t * p * dpc
    optimizer_s = optimizer_terms.step_seconds(shape, hw, optimizer, num_gpus=n_gpus, replicas=replicas)
    if offload and optimizer != "adamw":
        pinned, pageable = optimizer_terms.offload_bytes(optimizer, shard, offload_state_bytes)
        optimizer_s = optimizer_s + pinned / host_link_bw(hw) + pageable / host_step.pageable_bytes_per_s()
        notes.append(optimizer_terms.MUON_OFFLOAD_NOTE)

    # Pipeline sends are priced at 1F1B's count for every schedule. An interleaved schedule
    # sends v x as often (a micro-batch crosses a rank boundary once per chunk), but
    # Megatron-LM overlaps those sends with the chunks' compute by default
    # (overlap_p2p_comm: the --no-overlap-p2p-communication flag, on for the interleaved
    # schedule only; megatron/training/arguments.py @d98e8a64), and its warm-up and flush,
    # which it does not overlap, are about 1F1B's exposed count. (Tried at v x on
    # 2026-11-27, with the validation rows in view: Hopper's interleaved rows came out 2 to
    # 10 points slower, its held-out mean 7.5% -> 8.4%; the mechanism, not that, decided.)
    total = (compute + bubble + b["tp_comm_s"] + b["pp_comm_s"] + exposed_dp + ep_comm + cp_comm + offload_s + host_s
             + notify_s + optimizer_s + host_optimizer_s)
    tokens = np.asarray(global_batch, dtype=float) * s
    tps = tokens / total
    model_flops = shape.flops_per_token(s)
    res = {
        "num_micro_batches": m,
        "step_time_s": total, "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / n_gpus,
        "model_tflops_per_gpu": model_flops * tps / n_gpus / 1e12,
        "hardware_tflops_per_gpu": perf.hardware_flops_per_token(shape, s, rc) * tps / n_gpus / 1e12,
        "mfu": model_flops * tps / n_gpus / (hw.peak_tflops * 1e12),
    }
    terms = {k: v for k, v in b.items() if k not in ("num_micro_batches", "blocks_s", "flop_spread_s",
                                                      "block_shape_loss_s")}
    res["breakdown"] = {**terms, "compute_s": compute, "bubble_s": bubble, "bubble_fraction": f, "dp_comm_s": dp_comm,
                        "exposed_dp_comm_s": exposed_dp, "ep_comm_s": ep_comm, "ep_a2a_s": a2a,
                        "moe_imbalance_s": imbalance_s, "moe_recompute_s": moe_recompute_s,
                        "moe_permute_s": permute_s, "moe_epilogue_s": epilogue_s, "moe_traffic_s": traffic_s, "fp8_cast_s": cast_s, "moe_host_s": host_s, "moe_efa_notify_s": notify_s, "moe_rerun_share": rerun, "cp_comm_s": cp_comm,
                        "etp_comm_s": etp_s,
                        "mtp_last_stage_s": mtp_s,
                        "offload_s": offload_s, "optimizer_s": optimizer_s, "host_optimizer_s": host_optimizer_s,
                        "exposed_comm_s": b["tp_comm_s"] + b["pp_comm_s"] + exposed_dp + ep_comm + cp_comm + offload_s}
    res["fp8_recipe"] = recipe if precision == "fp8" else None
    res["notes"] = notes
    return res
