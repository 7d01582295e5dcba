"""Resolve systems, GPUs and links from the catalog into the numbers the models use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalog
# Read in catalog.py, which `mgbench comm` shares; the planner's modules take them from here.
from ..catalog import links, systems
from ..errors import MgbenchError
from ..hardware_profile import (Figure, HardwareProfile, catalog_profile, efficiency_entries,
                                median_measured_mem_fraction, shape_model)

GB = 1e9
# hardware.toml memory_gb is the vendor's label, which nvidia-smi's total (MiB) fits: an
# H100's 80 for 81,559 MiB, a B200's 180 for 183,359 MiB, a GB200's 186 for 189,471 MiB.
# Read as GiB it is 0.4-0.6% above what an HBM part reports (its CUDA context is counted
# apart, memory.fixed_per_process), but a GDDR part with ECC on reports less (an L40S
# 46,068 MiB for its 48: 6.7%); read as 1e9 bytes, as it was before 2026-11-28, 6.5% below
# the HBM parts, so every fit check turned away layouts that fit on them.
GIB = float(2**30)


@dataclass(frozen=True)
class Hardware:
    """What the performance model needs to know about one node type."""

    system: str
    gpu: str
    gpus_per_node: int
    peak_tflops: float  # at the plan's precision
    memory_bytes: float
    tdp_w: float
    intra_bw: float  # bytes/s one direction per GPU, after bw_eff
    intra_alpha_s: float
    inter_bw: float  # bytes/s per GPU across nodes, after bw_eff
    inter_alpha_s: float
    max_power_kw: float | None
    compute_eff: float  # achievable fraction of peak for training matmuls (see planner_defaults)
    mem_bw: float  # bytes/s of device memory
    elementwise_passes: float  # memory passes over activation bytes per step (see planner_defaults)
    # The software stack's achieved fraction of what the calibration stack (Megatron-LM)
    # gets from the same kernels (planner/stack.py, data/stacks.toml): compute time / this.
    stack_eff: float = 1.0
    stack: str = "megatron-lm"
    # Fraction of peak the fused attention kernel reaches on this GPU, forward + backward
    # (efficiency.toml, attention); None: not recorded, attention's scores and values are
    # priced as layer GEMMs (planner/perf.py flash_attention_s).
    attn_eff: float | None = None
    # The fraction by sequence of each kernel measured on this GPU, ((kernel, ((seq,
    # fraction), ...)), ...) (efficiency.toml [attention_curves]): the curve of the stack's
    # kernel (stacks.toml attention_kernel) replaces attn_eff (planner/perf.py
    # attention_fraction). Empty: attn_eff stands.
    attn_curves: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    # Where the efficiency came from (hardware_profile.HardwareProfile.evidence): "measured"
    # on this accelerator (a public GEMM measurement of it, or a probe of this machine),
    # "carried" from a named sibling, or "assumed" (uncertainty.py widens the interval by it).
    evidence: str = "assumed"  # every constructor states it; a Hardware built without says nothing was measured
    evidence_detail: str | None = None  # the figures' kinds and siblings, in words
    # What an all-to-all pays per peer node across the network (hardware.toml link
    # ``a2a_peer_us``, solved on published alltoall_perf rows; moe.exchange_seconds): a
    # rank's messages to each peer are small, and the network's per-message cost shows
    # there, not in a ring's steps. None: the link's latency (inter_alpha_s).
    a2a_peer_s: float | None = None
    # GEMMs priced at the layer's own shapes (planner/perf.py gemm_seconds): every GEMM pays
    # gemm_fixed_s, and its operands stream at mem_bw x mem_bw_fraction, the two combined
    # with the compute time by the p-norm gemm_norm (hardware_profile.shape_model). False:
    # every GEMM at the asymptotic rate, as for a probe, whose GEMMs were timed at the
    # workload's shapes.
    gemm_shapes: bool = False
    gemm_fixed_s: float = 0.0
    gemm_norm: float = 1.5
    # Achieved / datasheet device-memory bandwidth (efficiency.toml mem_bw): memory-bound
    # work streams at mem_bw x this. 1: mem_bw is already achieved (a probe measured it).
    mem_bw_fraction: float = 1.0
    # The best FP8 GEMM's fraction of the FP8 peak over the best bf16 GEMM's of the bf16
    # peak (efficiency.toml); None where FP8 was not measured (layout_time.fp8_linear_ratio
    # then carries the bf16 fraction, and says so).
    fp8_gemm_ratio: float | None = None
    # Probed CPU profiles only (probe/profile.py): a step's unfused non-matmul work priced
    # op by op (planner/perf.py, host terms). None/0 elsewhere: the catalog's two-term
    # roofline (elementwise_passes) stands.
    op_overhead_s: float = 0.0  # fixed cost per aten op (dispatch, autograd, allocation)
    ew_bw: float | None = None  # bytes/s unfused elementwise ops get at the workload's sizes
    attn_points: tuple[tuple[float, float], ...] | None = None  # (seq, causal SDPA fwd+bwd FLOP/s), by seq


def planner_defaults() -> dict[str, Any]:
    """The planner's calibrated defaults of hardware.toml (efficiencies, memory passes)."""
    return catalog.load("hardware.toml")["planner"]


def profile(gpu: str) -> HardwareProfile | None:
    """The catalog hardware profile of ``gpu`` (hardware.toml peaks, efficiency.toml
    figures); None for an accelerator efficiency.toml has no entry for (a user's own, from a
    --system-file): its efficiency is then assumed (:func:`efficiency_fields`)."""
    if gpu not in efficiency_entries():
        return None
    return catalog_profile(gpu)


def gemm_fraction(gpu: str) -> float | None:
    """The best dense bf16 GEMM's fraction of ``gpu``'s peak (efficiency.toml gemm_best:
    measured on it or carried from a sibling); None where none is known."""
    p = profile(gpu)
    return None if p is None else p.gemm_best.value


def compute_efficiency(gpu: str) -> float:
    """Default achievable fraction of dense peak for training matmuls: the calibrated
    A100 value (hardware.toml [planner] matmul_eff) scaled by the GPU's best-GEMM fraction
    relative to the A100's (efficiency.toml gemm_best), or the A100 value where no
    fraction is known (an assumption, which the GPU's evidence then says)."""
    d = planner_defaults()
    ref = gemm_fraction(d["calibrated_gpu"])
    own = gemm_fraction(gpu)
    return float(d["matmul_eff"]) * (ref if own is None else own) / ref


def attention_efficiency(gpu: str) -> float | None:
    """The fused attention kernel's fraction of dense peak on ``gpu``, forward + backward
    (efficiency.toml attention); None where no figure is recorded."""
    p = profile(gpu)
    return None if p is None else p.attention.value


def stack_attention_kernel(name: str) -> str:
    """The fused attention kernel a stack runs (stacks.toml attention_kernel): "cudnn"
    (Transformer Engine's FusedAttention) or "flash2" (FlashAttention-2, as torch's SDPA
    picks it). Read here, beside the curves it selects, so that planner/perf.py needs no
    import of planner/stack.py; a stack that does not state one is refused, not guessed."""
    kernel = catalog.load("stacks.toml")["stacks"].get(name, {}).get("attention_kernel")
    if kernel is None:
        raise MgbenchError(f"stacks.toml [stacks.{name}] states no attention_kernel (cudnn or flash2): "
                           "the fused attention it runs cannot be priced")
    return str(kernel)


def attention_curves(gpu: str) -> tuple[tuple[str, tuple[tuple[float, float], ...]], ...]:
    """Each kernel's fused-attention fraction by sequence on ``gpu`` (efficiency.toml
    [attention_curves]), as (kernel, ((seq, fraction), ...)); empty where ``gpu`` is not
    among the accelerators the curves are for."""
    c = catalog.load("efficiency.toml").get("attention_curves", {})
    if gpu not in c.get("accelerators", ()):
        return ()
    return tuple((k, tuple((float(q), float(f)) for q, f in v["points"])) for k, v in c["kernels"].items())


# The attention kinds FP8 attention is measured for (efficiency.toml [fp8_attention]):
# "mla" multi-head latent attention (DeepSeek-V3's 192-wide keys, 128-wide values), "gqa"
# every other layer, sliding windows included (the one FP8 window figure published measures
# a benchmark that gives its FP8 backward no window: docs/research/fp8_attention.md); and
# the FP8 scalings Transformer Engine runs attention in: MXFP8 under the mxfp8 recipe,
# per-tensor FP8 under the per-tensor ones (blockwise passes no fp8_dpa).
FP8_ATTENTION_KINDS = ("mla", "gqa")
FP8_ATTENTION_SCALINGS = ("mxfp8", "fp8")
# Beside each kind's ratios: the BF16 kernel's fraction of the GPU's bf16 peak in the same
# run, forward + backward in FlashAttention's FLOP convention (perf.flash_attention_s), the
# seconds a ratio is a ratio of (layout_time.step_time).
FP8_ATTENTION_BF16 = "bf16_fraction"


def fp8_attention_gpus() -> list[str]:
    """The GPUs efficiency.toml [fp8_attention] has an entry for (measured or carried)."""
    return sorted(catalog.load("efficiency.toml").get("fp8_attention", {}))


def fp8_attention_points(gpu: str | None, seen: tuple[str, ...] = ()) -> dict[str, dict[str, Any]] | None:
    """The FP8 / BF16 fused-attention time ratios measured for ``gpu``, forward + backward:
    {kind: {scaling: ((seq, ratio), ...)}} (efficiency.toml [fp8_attention]; a ``carried``
    entry takes its sibling's), each kind with the BF16 kernel's fraction of peak in the
    same run under :data:`FP8_ATTENTION_BF16`; None where ``gpu`` has no entry."""
    table = catalog.load("efficiency.toml").get("fp8_attention", {})
    spec = table.get(gpu) if gpu is not None else None
    if spec is None:
        return None
    if spec.get("kind") == "carried":
        if gpu in seen or spec.get("from") not in table:
            raise MgbenchError(f"efficiency.toml [fp8_attention.{gpu}]: carried from {spec.get('from')!r}, which is "
                               "not an entry of the table or is carried in a circle")
        return fp8_attention_points(spec["from"], seen + (gpu,))
    out: dict[str, dict[str, Any]] = {}
    for kind in FP8_ATTENTION_KINDS:
        for scaling in FP8_ATTENTION_SCALINGS + (FP8_ATTENTION_BF16,):
            points = spec.get(kind, {}).get(scaling)
            what = "fraction" if scaling == FP8_ATTENTION_BF16 else "ratio"
            ok = isinstance(points, list) and points and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                         and v > 0 for v in p) for p in points)
            if ok and what == "fraction":
                ok = all(p[1] <= 1.0 for p in points)
            if not ok:
                bound = ", the fraction at most 1" if what == "fraction" else ""
                raise MgbenchError(f"efficiency.toml [fp8_attention.{gpu}] {kind}.{scaling} must be a list of "
                                   f"[sequence, {what}] pairs, both positive{bound}, got {points!r}")
            out.setdefault(kind, {})[scaling] = tuple((float(q), float(r)) for q, r in sorted(points))
    return out


def efficiency_fields(gpu: str) -> dict[str, Any]:
    """The Hardware fields that come from ``gpu``'s profile besides compute_eff and
    attn_eff: its evidence, the GEMM shape model and the achieved memory bandwidth."""
    p = profile(gpu)
    sm = shape_model()
    if p is None:
        return {"evidence": "assumed", "gemm_shapes": True, "gemm_norm": sm["p"],
                "gemm_fixed_s": catalog_profile(planner_defaults()["calibrated_gpu"]).gemm_fixed.value,
                "mem_bw_fraction": median_measured_mem_fraction(),
                "evidence_detail": f"{gpu}: no efficiency.toml entry: the {planner_defaults()['calibrated_gpu']}'s "
                                   "GEMM fraction and small-GEMM cost, the median measured memory fraction (assumed)"}
    ratio = None
    if p.gemm_best_fp8.value is not None and p.gemm_best.value:
        ratio = p.gemm_best_fp8.value / p.gemm_best.value
    return {"evidence": p.evidence, "evidence_detail": evidence_detail(p), "gemm_shapes": True,
            "gemm_norm": sm["p"], "gemm_fixed_s": p.gemm_fixed.value,
            "mem_bw_fraction": p.mem_bw.value / p.mem_bw_peak.value, "fp8_gemm_ratio": ratio}


def evidence_detail(p: HardwareProfile) -> str:
    """The kinds of a profile's efficiency figures, in words, for reasons and reports."""
    def one(name: str, f: Figure) -> str:
        frm = f" from {f.carried_from}" if f.carried_from else ""
        return f"{name} {f.kind}{frm}" + (" (none: priced as GEMMs)" if f.value is None and name == "attention" else "")
    return f"{p.accelerator}: " + ", ".join(one(n, getattr(p, n)) for n in ("gemm_best", "attention", "mem_bw"))


def on_efa(system: str | None) -> bool:
    """Whether a catalog system's nodes talk over AWS EFA (its inter_link an efa-* link):
    MoE dispatch across such nodes runs through other transports than InfiniBand's, and the
    published MoE runs over EFA are kept apart (moe.moe_class, moe_pairs)."""
    return str(systems().get(system or "", {}).get("inter_link", "")).startswith("efa")


def ep_crosses_efa(system: str | None, ep: Any = None) -> bool | None:
    """Whether expert parallelism of degree ``ep`` (None: taken to) crosses nodes of a
    system that talk over AWS EFA (:func:`on_efa`): groups of consecutive ranks larger than
    a node (moe.ep_geometry). None where ``system`` is not a catalog system (a probed
    machine, or none): its fabric is unknown. A catalog system given another GPU
    (``SYSTEM[GPU]``, :func:`resolve`'s label) keeps its system's fabric."""
    system = system_of(system) if system else system
    if system not in systems():
        return None
    return on_efa(system) and (ep is None or int(ep) > int(systems()[system]["gpus_per_node"]))


def _link(name: str) -> dict[str, Any]:
    if name not in links():
        raise MgbenchError(f"unknown link {name!r}; known: {', '.join(links())}")
    return links()[name]


def catalog_system(hw: Hardware) -> str:
    """The catalog system ``hw`` was resolved from (its label is ``SYSTEM[GPU]`` when a
    system was given another GPU: :func:`resolve`)."""
    return system_of(hw.system)


def system_of(label: str) -> str:
    """The catalog system of a Hardware label (``SYSTEM[GPU]`` when :func:`resolve` gave a
    system another GPU, else the system's name)."""
    return label.split("[")[0]


def resolve(system: str | None = None, gpu: str | None = None, precision: str = "bf16",
            compute_eff: float | None = None, comm_eff_scale: float = 1.0) -> Hardware:
    """Hardware for a catalog system (``dgx-h100``) or a bare GPU (``h100-sxm``, placed
    in the first system that uses it). Both given and the system holds another GPU:
    that system's node size and links with this GPU, named ``SYSTEM[GPU]`` so every
    output says so (its wall power, measured for its own GPUs, is then unknown)."""
    if system is None and gpu is None:
        raise MgbenchError("name a --system (e.g. dgx-h100) or a --gpu (e.g. h100-sxm)")
    if system is None:
        catalog.accelerator(gpu)  # validates the name
        system = next((k for k, s in systems().items() if s["gpu"] == gpu), None)
        if system is None:
            raise MgbenchError(f"no system in the catalog uses {gpu}; pass --system")
    if system not in systems():
        raise MgbenchError(catalog.unknown_name("system", system, systems()))
    s = systems()[system]
    label = system
    if gpu is not None and gpu != s["gpu"]:
        catalog.accelerator(gpu)  # validates the name
        s = {**s, "gpu": gpu, "max_power_kw": None}
        label = f"{system}[{gpu}]"
    acc = catalog.accelerator(s["gpu"])
    peak = catalog.accelerator_peak(s["gpu"], precision)
    if peak is None:
        have = ", ".join(acc.get("tflops", {})) or "none"
        raise MgbenchError(f"catalog has no {precision} peak for {s['gpu']} (its source publishes none; peaks it "
                           f"has: {have}); choose another --precision, or define your own accelerator with it "
                           "in a --system-file")
    missing = [k for k in ("memory_gb", "mem_bw_tbps") if acc.get(k) is None]
    if missing:
        raise MgbenchError(f"catalog has no {' or '.join(missing)} for {s['gpu']}: its memory cannot be modelled")
    intra, inter = _link(s["intra_link"]), _link(s["inter_link"])
    nic_share = s["nics_per_node"] / s["gpus_per_node"]
    return Hardware(
        system=label,
        gpu=s["gpu"],
        gpus_per_node=s["gpus_per_node"],
        peak_tflops=peak,
        memory_bytes=float(acc["memory_gb"]) * GIB,
        # No sourced TDP (hardware.toml leaves the key out): unknown, NaN as for a probed
        # profile's unknown GPU, so energy is null (search._row) rather than borrowed.
        tdp_w=catalog.accelerator_tdp(s["gpu"]),
        intra_bw=intra["peak_gbps"] * GB * intra["bw_eff"] * comm_eff_scale,
        intra_alpha_s=intra["alpha_us"] * 1e-6,
        inter_bw=inter["peak_gbps"] * GB * inter["bw_eff"] * nic_share * comm_eff_scale,
        inter_alpha_s=inter["alpha_us"] * 1e-6,
        a2a_peer_s=inter["a2a_peer_us"] * 1e-6 if "a2a_peer_us" in inter else None,
        max_power_kw=s.get("max_power_kw"),
        compute_eff=compute_eff if compute_eff is not None else compute_efficiency(s["gpu"]),
        mem_bw=float(acc["mem_bw_tbps"]) * 1e12,
        elementwise_passes=float(planner_defaults()["elementwise_passes"]),
        attn_eff=attention_efficiency(s["gpu"]),
        attn_curves=attention_curves(s["gpu"]),
        **efficiency_fields(s["gpu"]),
    )
