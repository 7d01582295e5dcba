"""A measured hardware profile, and the planner's Hardware made from it.

`mgbench probe` writes one JSON profile per machine; `predict`, `plan` and `memory`
take it with ``--hardware PROFILE`` in place of catalog constants. Torch-free: reading a
profile and predicting from it must not load the rank side.

How measured figures become the planner's inputs (planner/hardware.py, Hardware). A GPU
machine is priced from the typed profile (:func:`hardware_profile`, the type a catalog
accelerator has; :func:`device_hardware`); CPU ranks from the rows, since what a rank gets
depends on how many share the host (below):

- matmul throughput = the probed GEMMs of a transformer layer's shapes (total FLOPs over
  total median time) at the precision asked. ``peak_tflops`` is the catalog peak when the
  device is a catalog accelerator (so MFU keeps its usual meaning), else the fastest probed
  GEMM; ``compute_eff`` is then throughput / peak.
- memory bandwidth = the probed elementwise add (median span); collective alpha and bus bandwidth = the
  probe's own `mgbench comm` all-reduce fit (same conversion as ``predict --comm``).
- fused attention (GPU) = the probed causal SDPA forward + backward as a fraction of the
  peak, its FLOPs counted in the catalog's convention (FlashAttention's: halved for the
  mask, backward 2.5 x forward; the probe's rows count 2 x), priced as the catalog prices
  a kernel figure (planner/perf.py flash_attention_s).
- CPU ranks share the host. A rank of an n-rank run gets t = cores // n threads
  (launching.threads_per_rank), and the probe times its kernels (GEMMs, SDPA, per-op
  overhead, the step's non-matmul ops) in n processes at once, each at t threads
  (probe/concurrent.py): the figures already hold what the ranks do to each other
  (shared cache and memory bus; with n t above the cores, time slices). A rank count the
  probe did not run is priced from the row at t threads with the most concurrent
  processes m below n, times min(1, c / (n t)) / min(1, c / (m t)) (the share of the
  cores each rank loses to the extra ranks; profiles written before the concurrent probe
  have m = 1). Collective latency and bandwidth come from the all-reduce fit at n ranks
  when probed there (comm_at). Host memory bandwidth (the roofline term of profiles
  without the op probes) is split 1/n. The planner's "GPUs per node" is the rank count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import catalog
from ..errors import MgbenchError
from ..hardware_profile import Collective, Figure, HardwareProfile
from ..planner.hardware import Hardware, evidence_detail, planner_defaults
from ..planner.perf import FLASH_FWD_BWD_PASSES, link_from_all_reduce_fit
from .workload import ATTENTION_FWD_BWD_PASSES

PROFILE_VERSION = 2
PRECISION_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# A probe times mgbench's own runner: a probed Hardware's stack is the runner's (its memory,
# its FP8 recipe).
STACK = "mgbench"


def read_profile(path: str | Path) -> dict[str, Any]:
    """A profile written by `mgbench probe`; one clear error for anything else."""
    p = Path(path)
    try:
        prof = json.loads(p.read_text())
    except FileNotFoundError:
        raise MgbenchError(f"--hardware {p}: no such file; write one with `mgbench probe -o {p}`") from None
    except IsADirectoryError:
        found = sorted(p.glob("*.json"))[:3]
        hint = f" (it holds {', '.join(str(f) for f in found)})" if found else ""
        raise MgbenchError(f"--hardware {p}: a folder; give the profile's .json file{hint}") from None
    except OSError as e:
        raise MgbenchError(f"--hardware {p}: cannot be read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MgbenchError(f"--hardware {p}: not a JSON profile ({e})") from None
    if not isinstance(prof, dict) or "profile_version" not in prof:
        raise MgbenchError(f"--hardware {p}: not an mgbench hardware profile (no profile_version)")
    if prof["profile_version"] > PROFILE_VERSION:
        raise MgbenchError(f"--hardware {p}: profile version {prof['profile_version']} is newer than this "
                           f"mgbench reads ({PROFILE_VERSION}); upgrade mgbench")
    if prof.get("hardware_profile") is not None:
        try:  # the typed profile the probe wrote beside its raw rows: each figure must say its evidence
            HardwareProfile.from_dict(prof["hardware_profile"])
        except (MgbenchError, TypeError, ValueError, AttributeError) as e:
            raise MgbenchError(f"--hardware {p}: its hardware_profile is not valid ({e})") from None
    return prof


# The dtype whose GEMMs stand for a device's best and layer figures: what its training runs in.
PROFILE_DTYPE = {"cuda": "bfloat16", "cpu": "float32"}
PRECISION_OF_DTYPE = {v: k for k, v in PRECISION_DTYPE.items()}


def hardware_profile(profile: dict[str, Any], precision: str | None = None) -> HardwareProfile:
    """The probe's measurements as the one hardware profile type (hardware_profile.py), the
    type the catalog's accelerators have (efficiency.toml): every figure "measured" on this
    machine, its source the probe run, or null with the reason. Fractions are of the
    catalog's datasheet peak where the device is a catalog accelerator, else of the
    fastest probed GEMM (which then stands as the peak, as :func:`hardware` prices it).

    ``precision`` picks the dtype whose GEMMs and attention the figures are of; by default
    the one the device trains in (PROFILE_DTYPE), the profile the probe writes beside its
    rows. :func:`hardware` prices a device from this type at the precision asked."""
    acc = profile.get("accelerator")
    entry = catalog.accelerator(acc) if acc else None
    src = f"mgbench probe on {profile.get('hostname')} ({profile.get('device_name')})"
    date = profile.get("created_at")

    def measured(value: float | None, unit: str, reason: str | None = None, **detail: Any) -> Figure:
        if value is None:
            return Figure(value=None, unit=unit, kind="measured", reason=reason or "not probed")
        return Figure(value=float(value), unit=unit, kind="measured", source=src, date=date, detail=detail)

    dtype = (PRECISION_DTYPE.get(precision, precision) if precision is not None
             else PROFILE_DTYPE.get(profile["device"], "float32"))
    precision = PRECISION_OF_DTYPE.get(dtype, dtype)
    rows = [g for g in profile.get("gemm") or [] if g["dtype"] == dtype]
    row = max(rows, key=lambda g: g["best_tflops"]) if rows else None
    peak = catalog.accelerator_peak(acc, precision) if entry else None
    if entry:
        peaks = {k: Figure(value=float(v), unit="TFLOP/s", kind="datasheet", source=f"hardware.toml accelerators.{acc}",
                           date=entry.get("retrieved")) for k, v in (entry.get("tflops") or {}).items()}
        mem_peak = Figure(value=float(entry["mem_bw_tbps"]), unit="TB/s", kind="datasheet",
                          source=f"hardware.toml accelerators.{acc}", date=entry.get("retrieved"))
    else:
        peaks = {}
        mem_peak = Figure(value=None, unit="TB/s", kind="datasheet",
                          reason="not a catalog accelerator: no datasheet bandwidth")
    if precision not in peaks and row is not None:
        # No datasheet peak at this precision (not a catalog accelerator, or its source
        # publishes none): the fastest probed GEMM stands as the peak.
        peaks[precision] = measured(row["best_tflops"], "TFLOP/s", note="fastest probed GEMM (no datasheet peak)")
    base = float(peak) if peak else (row["best_tflops"] if row else None)

    def frac(v: float | None) -> float | None:
        return None if v is None or not base else float(v) / base

    no_gemm = f"no {dtype} GEMMs probed"
    attn = [a for a in profile.get("attention") or [] if a["dtype"] == dtype]
    attn_row = max(attn, key=lambda a: a["typical_tflops"]) if attn else None
    copies = profile.get("copies") or {}
    h2d = copies.get("copy_h2d_pinned")
    colls = []
    for c in profile.get("comm_at") or ([profile["comm"]] if profile.get("comm") else []):
        fit = c.get("all_reduce") or {}
        n = c.get("nproc", 0)
        if fit.get("bw_gbps") and n >= 2:
            busbw = link_from_all_reduce_fit(fit["alpha_s"], fit["bw_gbps"], n)["bw"]
            colls.append(Collective(op="all_reduce", gpus=n, scope="intra", busbw=measured(
                busbw, "GB/s", algbw_gbps=fit["bw_gbps"], alpha_s=fit["alpha_s"])))
    return HardwareProfile(
        accelerator=acc or profile.get("device_name") or profile["device"], peaks=peaks, mem_bw_peak=mem_peak,
        gemm_best=measured(frac(row["best_tflops"]) if row else None, f"fraction of the {precision} peak", no_gemm,
                           tflops=row["best_tflops"] if row else None, dtype=dtype),
        gemm_layer=measured(frac(row["typical_tflops"]) if row else None, f"fraction of the {precision} peak", no_gemm,
                            tflops=row["typical_tflops"] if row else None, dtype=dtype),
        gemm_best_fp8=Figure(value=None, unit="fraction of the fp8 peak", kind="measured",
                             reason="the probe times bf16, fp16 and fp32 GEMMs only"),
        gemm_fixed=Figure(value=None, unit="s", kind="measured",
                          reason="the probe times the workload's own GEMM shapes (gemm_layer) instead"),
        # The probe credits forward + backward with its own passes (kernels.attention); a
        # kernel fraction is stated in FlashAttention's 3.5 (perf.FLASH_FWD_BWD_PASSES).
        attention=measured(frac(attn_row["typical_tflops"] * FLASH_FWD_BWD_PASSES / ATTENTION_FWD_BWD_PASSES)
                           if attn_row else None,
                           f"fraction of the {precision} peak",
                           f"no {dtype} attention probed", kernel="torch SDPA (causal, forward + backward)"),
        mem_bw=measured((profile.get("memory") or {}).get("median_bytes_per_s", 0) / 1e12 or None, "TB/s",
                        "no memory bandwidth probed", kernel="elementwise add, median"),
        host_link=(measured(h2d, "GB/s", copy="host to device, pinned") if h2d else
                   Figure(value=None, unit="GB/s", kind="measured",
                          reason=copies.get("null_reason", "no host-device copy probed"))),
        collectives=tuple(colls))


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Write atomically (a profile is either whole or absent)."""
    from ..store import write_json_atomic

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p, profile)
    return p


def measured_at(profile: dict[str, Any], rows: list[dict[str, Any]], ranks: int) -> tuple[dict[str, Any] | None, float]:
    """For a rank of a ``ranks``-rank CPU run: the row (of ``rows``) at its thread count
    probed with the most concurrent processes m not above ``ranks``, and the factor its
    rates take for the ranks beyond m (module doc); (None, 1) when none was probed."""
    threads, share_n = rank_share(profile, ranks)
    cands = [r for r in rows if r.get("threads") == threads and r.get("ranks", 1) <= ranks]
    if not cands:
        return None, 1.0
    row = max(cands, key=lambda r: r.get("ranks", 1))
    # m processes at the n-rank thread count t: m t fills at most the cores when m does
    # not exceed them (t <= cores // n <= cores // m), and t = 1 when it does, so m's
    # share is that of m ranks at their own thread count.
    _, share_m = rank_share(profile, row.get("ranks", 1))
    return row, share_n / share_m


def gemm_row(profile: dict[str, Any], precision: str, ranks: int | None = None) -> tuple[dict[str, Any], float]:
    """The probed layer GEMMs at a precision and the factor their rates take: for a rank
    of a ``ranks``-rank CPU run, measured_at's row at the rank's thread count; for a
    device (``ranks`` None), its fastest row, factor 1. One clear error where neither
    was probed."""
    dtype = PRECISION_DTYPE.get(precision, precision)
    runs = [g for g in profile["gemm"] if g["dtype"] == dtype]
    if not runs:
        have = sorted({g["dtype"] for g in profile["gemm"]})
        raise MgbenchError(f"the profile has no {dtype} GEMMs (it has {', '.join(have)}); "
                           f"re-probe with --dtype {dtype} or predict at another precision")
    if ranks is None:
        return max(runs, key=lambda g: g["typical_tflops"]), 1.0
    row, share = measured_at(profile, runs, ranks)
    if row is None:  # a thread count never measured is unknown, not its neighbour's speed
        threads, _ = rank_share(profile, ranks)
        have = ", ".join(f"{g['threads']} x {g.get('ranks', 1)}" for g in runs)
        raise MgbenchError(f"the profile has no {dtype} GEMMs at {threads} thread(s) probed with at most {ranks} "
                           f"process(es) (it has threads x processes {have}); re-probe this host with `mgbench probe` "
                           "(without --max-ranks, which skips the larger rank counts and their thread counts)")
    return row, share


def rank_share(profile: dict[str, Any], ranks: int) -> tuple[int, float]:
    """(threads per rank, fraction of a t-thread process's speed each rank gets) for
    ``ranks`` CPU ranks on the probed host: mgbench gives each rank cores // ranks threads
    (at least 1); ranks x threads above the cores time-share them."""
    from ..launching import threads_per_rank

    cores = profile["cores"]
    t = threads_per_rank(ranks, cores)
    return t, min(1.0, cores / (ranks * t))


def overlap(profile: dict[str, Any], ranks: int, default: float) -> float:
    """How much data-parallel communication a rank can hide behind its compute. On CPU,
    gloo reduces with the same cores the ranks compute on: when the ranks' threads
    already fill every core, communication time-shares them instead of hiding (0).
    A GPU overlaps on its own copy engines and SMs: the planner's default."""
    if profile["device"] != "cpu":
        return default
    threads, _ = rank_share(profile, ranks)
    return 0.0 if ranks > 1 and ranks * threads >= profile["cores"] else default


def hardware(profile: dict[str, Any], precision: str, ranks: int = 1) -> Hardware:
    """The planner's Hardware for ``ranks`` processes on the probed machine (one node).

    On a GPU machine one rank is one device (:func:`device_hardware`); on CPU the ranks
    share the host (module doc).
    """
    if profile["device"] != "cpu":
        return device_hardware(profile, precision, ranks)
    row, share = gemm_row(profile, precision, ranks)
    acc = profile.get("accelerator")
    catalog_peak = catalog.accelerator_peak(acc, precision) if acc else None
    # Median-based throughput (what training steps see) against the same row's best.
    achieved = row["typical_tflops"] * share
    peak = catalog_peak if catalog_peak else row["best_tflops"] * share
    return Hardware(
        **_machine(profile, ranks, memory_bytes=profile["host_memory_bytes"] / ranks),
        peak_tflops=peak,
        compute_eff=achieved / peak,
        mem_bw=float(profile["memory"]["median_bytes_per_s"] / ranks),
        evidence="measured", evidence_detail=f"probed on {profile.get('hostname')}",
        **host_rates(profile, precision, ranks),
    )


def device_hardware(profile: dict[str, Any], precision: str, ranks: int = 1) -> Hardware:
    """The planner's Hardware for ``ranks`` devices of a probed GPU machine, priced from
    the typed profile (:func:`hardware_profile` at ``precision``), the type a catalog
    accelerator has: matmuls at its layer-GEMM fraction of the peak, fused attention at
    its attention fraction (null: scores and values priced as GEMMs, as for a catalog GPU
    without a kernel figure), memory-bound work at its measured bandwidth. Links come from
    the all-reduce fit (:func:`comm_link`), which the profile's collective figures are
    made from."""
    gemm_row(profile, precision)  # one clear error where that dtype was never probed
    hp = hardware_profile(profile, precision)
    # A probed dtype has a layer-GEMM figure and a peak (its fastest GEMM where no datasheet
    # gives one): hardware_profile.
    peak, gemm, mem = hp.peaks[precision], hp.gemm_layer, hp.mem_bw
    if mem.value is None:
        raise MgbenchError(f"the profile has no memory bandwidth ({mem.reason}); re-probe with `mgbench probe`")
    return Hardware(
        **_machine(profile, ranks, memory_bytes=profile["device_memory_bytes"]),
        peak_tflops=peak.value,
        compute_eff=gemm.value,
        mem_bw=mem.value * 1e12,
        attn_eff=hp.attention.value,
        evidence=hp.evidence, evidence_detail=f"probed on {profile.get('hostname')}: {evidence_detail(hp)}",
    )


def _machine(profile: dict[str, Any], ranks: int, memory_bytes: float) -> dict[str, Any]:
    """The Hardware fields a probed machine has whatever its device: its name, node,
    memory, power and the links of its all-reduce fit."""
    acc = profile.get("accelerator")
    link = comm_link(profile, ranks)
    return dict(
        stack=STACK,
        system=f"probed:{profile['hostname']}",
        gpu=acc or profile["device_name"],
        gpus_per_node=max(ranks, profile.get("num_devices", 1)),
        memory_bytes=float(memory_bytes),
        # Unknown without a catalog entry or a sourced TDP; predict prices no energy, so NaN
        # (not 0 W) is never printed, and any use of it shows up as NaN, not as free power.
        tdp_w=catalog.accelerator_tdp(acc) if acc else float("nan"),
        intra_bw=link["bw"], intra_alpha_s=link["alpha_s"],
        inter_bw=link["bw"], inter_alpha_s=link["alpha_s"],
        max_power_kw=None,
        elementwise_passes=float(planner_defaults()["elementwise_passes"]),
        # Measured on this machine, GEMMs at the workload's own shapes: no shape model on top.
        gemm_shapes=False,
    )


def host_rates(profile: dict[str, Any], precision: str, ranks: int) -> dict[str, Any]:
    """The probed CPU terms of Hardware for a rank of a ``ranks``-rank run (measured_at:
    probed with that many processes at once, or scaled by the share of the cores):
    per-op overhead / share (a rank's ops run serially on its time-shared cores),
    elementwise bandwidth x share and SDPA rate x share (the workload's operands are
    cache-sized, so a rank's cores, not the host's memory bus, bound them; they are
    timed at the rank's thread count, as the GEMMs). Empty for a profile without those
    probes (written before them): the roofline terms stand."""
    dtype = PRECISION_DTYPE.get(precision, precision)
    rows = profile.get("host_ops")
    row, share = measured_at(profile, rows, ranks) if isinstance(rows, list) else (None, 1.0)
    attn, a_share = measured_at(profile, [a for a in profile.get("attention", []) if a["dtype"] == dtype], ranks)
    if row is None or attn is None:
        return {}
    return {"op_overhead_s": row["op_overhead_s"] / share, "ew_bw": row["elementwise"]["bytes_per_s"] * share,
            "attn_points": tuple((float(a["seq"]), a["tflops_median"] * 1e12 * a_share) for a in attn["shapes"])}


def holds_cuda_context(profile: dict[str, Any] | None) -> bool:
    """Whether a rank's fixed device memory (CUDA context, NCCL) is counted on the machine
    ``profile`` describes (None: a catalog GPU): everywhere but on a probed CPU, whose
    ranks hold none. The one rule memory, predict and plan apply."""
    return not (profile and profile.get("device") == "cpu")


def memory_budget(profile: dict[str, Any], ranks: int) -> dict[str, Any]:
    """What one rank may use on the probed machine, for `memory --hardware`: a GPU's
    device memory, or on CPU the host's RAM split over the ranks (they share it)."""
    if profile["device"] == "cpu":
        if not profile.get("host_memory_bytes"):
            return {"device_memory_bytes": None, "budget_source": "unknown: the profile has no host RAM figure"}
        return {"device_memory_bytes": float(profile["host_memory_bytes"]) / ranks,
                "budget_source": f"host RAM of {profile['hostname']} / {ranks} rank(s)"}
    return {"device_memory_bytes": float(profile["device_memory_bytes"]),
            "budget_source": f"device memory of {profile['device_name']} on {profile['hostname']}"}


def comm_at(profile: dict[str, Any], ranks: int) -> dict[str, Any]:
    """The probe's collective measurement for ``ranks`` ranks: on CPU the one taken at
    exactly that many ranks when the probe ran it and its fit succeeded (ranks
    time-share the cores, so a collective's latency depends on how many there are), else
    the profile's main one."""
    exact = [c for c in profile.get("comm_at") or [] if c.get("nproc") == ranks
             and (c.get("all_reduce") or {}).get("bw_gbps")]
    return exact[0] if exact else (profile.get("comm") or {})


def collective_latency_s(profile: dict[str, Any], ranks: int) -> float | None:
    """Seconds of fixed cost of one collective among ``ranks`` ranks: the alpha of the
    all-reduce fit at that rank count (comm_at); None where there is no fit."""
    fit = comm_at(profile, ranks).get("all_reduce")
    return float(fit["alpha_s"]) if fit and fit.get("bw_gbps") else None


def framework_row(profile: dict[str, Any], strategy: str, ranks: int) -> dict[str, Any] | None:
    """The probe's framework row of ``strategy`` (probe/framework.py) timed at exactly
    ``ranks`` ranks, else its one-rank row; None where neither was probed."""
    rows = [r for r in (profile.get("framework") or {}).get("rows") or [] if r["strategy"] == strategy]
    return (next((r for r in rows if r.get("ranks", 1) == ranks), None)
            or next((r for r in rows if r.get("ranks", 1) == 1), None))


def framework_residual_s(profile: dict[str, Any], strategy: str, layers: int, ranks: int) -> float | None:
    """Seconds per step a rank of ``strategy`` spends beyond its aten ops (probe/framework.py),
    scaled to ``layers`` blocks (framework_layer_scale). From the row probed at
    ``ranks`` ranks when there is one (it holds the collectives' latency, the waits for
    the slowest rank and the time-shared cores, as measured); else the one-rank row's
    framework Python divided by the rank's share of the cores (it runs on one core,
    time-shared when the ranks' threads outnumber the cores). None where not probed."""
    row = framework_row(profile, strategy, ranks)
    if row is None:
        return None
    scaled = row["residual_s"] * framework_layer_scale(layers, row["layers"])
    if row.get("ranks", 1) == ranks:
        return scaled
    _, share = rank_share(profile, ranks)
    return scaled / share


def framework_layer_scale(layers: int, probed_layers: int) -> float:
    """How a strategy's per-step cost beyond its ops, probed on a tiny model of
    ``probed_layers`` blocks, grows to ``layers`` blocks: (layers + 1) / (probed + 1), as
    hooks, module calls and collectives come per block, plus the embedding and head."""
    return (layers + 1) / (probed_layers + 1)


def comm_link(profile: dict[str, Any], ranks: int) -> dict[str, float]:
    """Per-ring-step latency and bus bandwidth from the probe's all-reduce fit (at
    ``ranks`` ranks when probed there, comm_at): the fit t = alpha + S / algbw of an
    n-rank ring gives alpha / (2 (n - 1)) per step and a bus bandwidth
    algbw x 2 (n - 1) / n (the same conversion as `predict --comm`)."""
    comm = comm_at(profile, ranks)
    fit = comm.get("all_reduce")
    n = comm.get("nproc", 0)
    if not fit or not fit.get("bw_gbps") or n < 2:
        if ranks > 1:
            raise MgbenchError(
                f"the profile has no collective fit ({comm.get('null_reason', 'none measured')}), so it cannot "
                f"price communication between {ranks} ranks; probe a machine with 2 or more devices")
        return {"bw": float("inf"), "alpha_s": 0.0}  # one rank: no collective is ever priced
    return link_from_all_reduce_fit(fit["alpha_s"], fit["bw_gbps"] * 1e9, n)


def describe(profile: dict[str, Any]) -> list[str]:
    """Human lines summarising a profile (for `mgbench probe`)."""
    lines = [f"{profile['device_name']} ({profile['device']}, {profile['cores']} cores, "
             f"{profile.get('num_devices', 1)} device(s)), probed in {profile['probe_s']:.0f} s"]
    for g in profile["gemm"]:
        at = f" x {g['ranks']} rank(s)" if "ranks" in g else ""
        lines.append(f"  GEMM {g['dtype']:<9} {g['threads']:>3} thread(s){at}: typical {g['typical_tflops']:.3f}, "
                     f"best {g['best_tflops']:.3f} TFLOP/s over {len(g['shapes'])} layer shapes")
    for a in profile["attention"]:
        at = (f" {a['threads']:>3} thread(s)" if "threads" in a else "") + (f" x {a['ranks']} rank(s)" if "ranks" in a else "")
        lines.append(f"  attention {a['dtype']}{at}: typical {a['typical_tflops']:.3f} TFLOP/s (causal SDPA, fwd+bwd)")
    for h in profile.get("host_ops") if isinstance(profile.get("host_ops"), list) else []:
        at = f" x {h['ranks']} rank(s)" if "ranks" in h else ""
        lines.append(f"  ops {h['threads']:>3} thread(s){at}: {h['op_overhead_s'] * 1e6:.1f} us per op; the step's "
                     f"{h['elementwise']['ops']} non-matmul ops get {h['elementwise']['bytes_per_s'] / 1e9:.1f} GB/s")
    for r in (profile.get("framework") or {}).get("rows") or []:
        n = int(r.get("ranks", 1))
        lines.append(f"  framework {r['strategy']:<13} {r['residual_s'] * 1e3:.1f} ms a step beyond its {r['ops']:.0f} "
                     f"ops (tiny {int(r['layers'])}-layer model, {n} rank{'s' if n > 1 else ''})")
    lines.append(f"  memory bandwidth {profile['memory']['bytes_per_s'] / 1e9:.1f} GB/s")
    cp = profile.get("copies") or {}
    lines.append("  copies: " + (cp["null_reason"] if "null_reason" in cp else
                                 ", ".join(f"{k.removeprefix('copy_')} {v:.1f} GB/s" for k, v in cp.items())))
    comm = profile.get("comm") or {}
    ar = comm.get("all_reduce")
    if ar and ar.get("bw_gbps"):
        for c in profile.get("comm_at") or [comm]:
            f = c.get("all_reduce") or {}
            if f.get("bw_gbps"):
                lines.append(f"  all_reduce on {c['nproc']} ranks: alpha {f['alpha_s'] * 1e6:.1f} us, "
                             f"algbw {f['bw_gbps']:.2f} GB/s (fit error {f['fit_mean_abs_error_pct']:.1f}%)")
    else:
        lines.append(f"  collectives: not measured ({comm.get('null_reason', 'no fit')})")
    return lines
