"""Fit the performance model's efficiencies to a measured run (`--calibrate RUN`).

For each `ok` record of a data-parallel run (single, ddp, zero1, fsdp, fsdp_grad_op),
the model's terms are computed from the record's own layout:

    step = shared x hardware FLOPs per rank / F[g]         (compute)
         + max(0, comm bytes / BW + steps x alpha + calls x c - overlap x backward window)

F[g] (achieved FLOP/s of the config's group g = its precision and compile setting: a
bf16 matmul runs several times faster than an fp32 one, and a compiled step is not the
eager one, so one F across them fits neither), BW (collective bandwidth), alpha (latency
per ring step), c (cost of one collective call: launch, hooks and, for FSDP, DTensor
bookkeeping, which is paid even on one rank) and overlap are fitted by non-negative least
squares, with overlap on a grid; the communication terms are shared by every group. On
CPU the ranks share the host's cores, so ``shared`` = ranks and F is the whole host's rate;
on GPUs each rank has its own device (shared = 1). Leave-one-out: each config is
predicted from a fit to the others, which is what says whether the model generalises
(null for a config alone in its group: no other config measured its F).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import catalog, store
from ..store import load_comm_fits, load_comm_rows
from ..errors import MgbenchError
from ..config import CHECKPOINTING
from ..strategies import DATA_PARALLEL, ZERO_STAGE
from ..model_shape import ModelShape
from ..layout import RECOMPUTE
from .memory import act_bytes
from . import perf
from .perf import dp_window_fraction, link_from_all_reduce_fit

# Calibration fits data-parallel runs only (one model replica or shard per rank).
ZERO_OF = {name: ZERO_STAGE[name] for name in ("single", *DATA_PARALLEL)}
OVERLAP_GRID = np.linspace(0.0, 1.0, 11)
assert set(CHECKPOINTING) <= set(RECOMPUTE), "a checkpointing mode the fit does not know"


def group_of(rec: dict[str, Any]) -> tuple[str, bool]:
    """The compute group of a record: (precision, compile). Each has its own F."""
    return rec["precision"], bool(rec["compile"])


def features(rec: dict[str, Any]) -> dict[str, float]:
    """Per-rank work of one measured config: FLOPs, collective bytes and ring steps."""
    shape = ModelShape.from_record(rec)
    n, s = rec["nproc"], rec["seq_len"]
    # Model FLOPs plus what checkpointing recomputes (perf's one rule: the blocks'
    # forward, never the output head).
    rc = RECOMPUTE.index(rec["activation_checkpointing"])
    tokens_per_rank = rec["micro_batch"] * rec["grad_accum"] * s
    flops = float(perf.hardware_flops_per_token(shape, s, rc)) * tokens_per_rank
    zero = ZERO_OF[rec["strategy"]]
    bytes_per_param = act_bytes(rec["precision"])
    p_bytes = shape.num_params() * bytes_per_param
    ga, units = rec["grad_accum"], shape.layers + 1  # FSDP shards each block and the root
    if rec["strategy"] == "single":
        k, calls = 0.0, 0.0
    elif zero == 3:
        # perf's count (the one statement): all-gathers in forward and backward of every
        # micro-step, one reduce-scatter per step (the runner syncs gradients on the last)
        k = float(perf.collective_counts(shape.layers, 1, 1, n, 3, ga, rc)["dp"])
        calls = k * units
    # ZeRO 0-2 as mgbench's runner implements them, which is what a calibration run
    # measured (perf.collective_counts prices production stacks: ZeRO 0-2 move an
    # all-reduce's bytes): FSDP2 without resharding gathers once per micro-step, and
    # ZeroRedundancyOptimizer broadcasts each rank's updated shard after DDP's all-reduce.
    elif zero == 2:
        # no resharding: one all-gather per step, a reduce-scatter per micro-step
        k, calls = 1.0 + ga, (1.0 + ga) * units
    else:
        # DDP: one all-reduce per gradient bucket (torch's default bucket_cap_mb = 25 MiB) per step
        k, calls = 2.0, max(1.0, np.ceil(p_bytes / (25 * 2**20)))
        if zero == 1:  # ZeroRedundancyOptimizer then broadcasts each rank's updated shard
            k, calls = 3.0, calls + n
    comm_bytes = k * (n - 1) / n * p_bytes  # k ring passes of (n-1)/n of the parameters
    steps = k * (n - 1)
    shared = float(n) if rec["device"] == "cpu" else 1.0
    return {"compute": shared * flops, "comm_bytes": comm_bytes, "comm_steps": steps, "comm_calls": calls,
            "window_frac": float(dp_window_fraction(rec["grad_accum"], zero))}


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (active set by dropping negatives)."""
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        active = [a for a, c in zip(active, sol) if c >= 0] if (sol < 0).any() else active
    return coef


def _compute_columns(F: dict[str, np.ndarray]) -> np.ndarray:
    """One compute column per group: a config's FLOPs in its group's column, 0 elsewhere."""
    return F["compute"][:, None] * F["groups"]


def _predict(coef: np.ndarray, overlap: float, F: dict[str, np.ndarray]) -> np.ndarray:
    g = F["groups"].shape[1]
    compute = _compute_columns(F) @ coef[:g]
    comm = coef[g] * F["comm_bytes"] + coef[g + 1] * F["comm_steps"] + coef[g + 2] * F["comm_calls"]
    return compute + np.maximum(comm - overlap * F["window_frac"] * compute, 0.0)


def _fit(F: dict[str, np.ndarray], y: np.ndarray) -> tuple[np.ndarray, float]:
    """Coefficients [1/F per group..., 1/BW, alpha, c] and the overlap, by least squares
    on relative errors over the overlap grid."""
    g = F["groups"].shape[1]
    C = _compute_columns(F)
    comm_cols = [F["comm_bytes"], F["comm_steps"], F["comm_calls"]]
    best: tuple[float, np.ndarray, float] | None = None
    for ov in OVERLAP_GRID:
        coef = _nnls(np.column_stack([C, *comm_cols]), y)
        for _ in range(5):  # exposed comm depends on the compute estimate: alternate
            compute = C @ coef[:g]
            comm = sum(c * col for c, col in zip(coef[g:], comm_cols))
            exposed = np.where(comm > ov * F["window_frac"] * compute, 1.0, 0.0)
            X = np.column_stack([C * (1.0 - exposed * ov * F["window_frac"])[:, None],
                                 *(col * exposed for col in comm_cols)])
            coef = _nnls(X, y)
        sse = float(((_predict(coef, ov, F) - y) ** 2 / y**2).sum())
        if best is None or sse < best[0]:
            best = (sse, coef, float(ov))
    assert best is not None
    return best[1], best[2]


def fit_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit on the ok records; report values (F per precision and compile group),
    residuals and leave-one-out errors."""
    recs = [r for r in records if r["status"] == "ok" and r["strategy"] in ZERO_OF]
    if len(recs) < 3:
        raise MgbenchError(f"calibration needs at least 3 ok data-parallel configs, the run has {len(recs)}")
    groups = sorted({group_of(r) for r in recs})
    feats = [features(r) for r in recs]
    F = {k: np.array([f[k] for f in feats]) for k in feats[0]}
    F["groups"] = np.array([[1.0 if group_of(r) == grp else 0.0 for grp in groups] for r in recs])
    y = np.array([r["step_time_s"] for r in recs])
    coef, overlap = _fit(F, y)
    pred = _predict(coef, overlap, F)
    n_groups = len(groups)
    rows = []
    for i, (r, m, p) in enumerate(zip(recs, y, pred)):
        row = {"config_id": r["config_id"], "label": r["label"], "measured_s": float(m), "fitted_s": float(p),
               "residual_pct": 100.0 * (p - m) / m}
        keep = np.arange(len(recs)) != i
        if not (F["groups"][keep] @ F["groups"][i]).any():
            # Alone in its group: the others say nothing about its F (no prediction, not 0 s).
            row.update(loo_predicted_s=None, loo_error_pct=None,
                       loo_null_reason=f"no other config is {_group_label(group_of(r))}: nothing to predict its "
                                       "compute rate from")
        else:
            c_i, o_i = _fit({k: v[keep] for k, v in F.items()}, y[keep])
            row.update(_loo_figures(float(_predict(c_i, o_i, {k: v[i : i + 1] for k, v in F.items()})[0]), float(m)))
        rows.append(row)
    loo_errors = [abs(r["loo_error_pct"]) for r in rows if r["loo_error_pct"] is not None]
    device = recs[0]["device_name"]
    scope = "whole host (ranks share its cores)" if recs[0]["device"] == "cpu" else "per device"
    compute_groups = []
    for j, grp in enumerate(groups):
        members = [r for r in recs if group_of(r) == grp]
        flops = 1.0 / coef[j] if coef[j] > 0 else None
        peak = members[0].get("peak_tflops")  # the catalog peak at this group's precision
        compute_groups.append({"precision": grp[0], "compile": grp[1], "num_configs": len(members),
                               "achieved_flops_per_s": flops, "peak_tflops": peak,
                               "compute_eff": flops / (peak * 1e12) if flops and peak else None})
    one = compute_groups[0] if n_groups == 1 else None
    return {
        "device_name": device,
        "accelerator": catalog.match_accelerator(device, recs[0].get("device_memory_gib")),
        "num_configs": len(recs),
        # One compute rate when the run has one (precision, compile) group; otherwise see
        # compute_groups (a rate across groups would describe none of them).
        "achieved_flops_per_s": one["achieved_flops_per_s"] if one else None,
        "compute_eff": one["compute_eff"] if one else None,
        "compute_groups": compute_groups,
        "flops_scope": scope,
        "comm_bytes_per_s": 1.0 / coef[n_groups] if coef[n_groups] > 0 else None,
        "alpha_s_per_step": float(coef[n_groups + 1]),
        "seconds_per_collective_call": float(coef[n_groups + 2]),
        "overlap": overlap,
        "rows": rows,
        "fit_mean_abs_error_pct": float(np.mean([abs(r["residual_pct"]) for r in rows])),
        "loo_mean_abs_error_pct": float(np.mean(loo_errors)) if loo_errors else None,
        "loo_predicted_configs": len(loo_errors),
    }


def _group_label(group: tuple[str, bool]) -> str:
    return f"{group[0]} {'compiled' if group[1] else 'eager'}"


def _loo_figures(predicted: float, measured: float) -> dict[str, Any]:
    """A held-out prediction, or null with the reason when the fit on the rest says nothing.

    With few configs the non-negative fit on the others can drop every term (all
    coefficients zero, or zero up to rounding): its "prediction" of ~0 s is no prediction,
    not a 100% error.
    """
    if predicted <= 1e-6 * measured:
        return {"loo_predicted_s": None, "loo_error_pct": None,
                "loo_null_reason": "the fit on the other configs attributes no time to any term"}
    return {"loo_predicted_s": predicted, "loo_error_pct": 100.0 * (predicted - measured) / measured,
            "loo_null_reason": None}


def fit_run(run: str, results_dir: str = "results") -> dict[str, Any]:
    return fit_records(store.read_records(store.resolve_run(run, results_dir)))


def hardware_overrides(fit: dict[str, Any], precision: str | None = None) -> dict[str, Any]:
    """What a fit changes in `predict` for the same accelerator: the compute efficiency of
    the fit's group at ``precision`` (the compiled one where both were measured: the
    planner models a tuned run), or its only group when ``precision`` is None."""
    no_peak = MgbenchError(
        f"the calibration run was measured on {fit['device_name']!r}, which has no catalog peak; its fit "
        "describes that machine only: run `mgbench predict --calibrate RUN` without --system/--gpu to see it")
    if fit["accelerator"] is None:
        raise no_peak
    groups = fit.get("compute_groups") or [{"precision": None, "compile": None, "compute_eff": fit["compute_eff"]}]
    if precision is not None:
        groups = [g for g in groups if g["precision"] == precision] or groups
        if groups[0]["precision"] not in (None, precision):
            raise MgbenchError(f"the calibration run measured {', '.join(sorted({g['precision'] for g in groups}))}, "
                               f"not {precision}: predict at a measured precision (--precision)")
        groups = sorted(groups, key=lambda g: not g["compile"])[:1]
    if len(groups) > 1:
        raise MgbenchError("the calibration run mixes " + ", ".join(_group_label((g["precision"], g["compile"]))
                                                                   for g in groups)
                           + ": each has its own compute efficiency; predict at one precision (--precision)")
    eff = groups[0]["compute_eff"]
    if eff is None and groups[0].get("peak_tflops") and not groups[0].get("achieved_flops_per_s"):
        raise MgbenchError("the calibration fit attributes no time to compute"
                           + (f" for {_group_label((groups[0]['precision'], groups[0]['compile']))}"
                              if groups[0]["precision"] else "")
                           + ": its compute efficiency is unknown (too few or too noisy configs)")
    if eff is None:
        raise no_peak
    return {"hardware": {"compute_eff": eff}, "overlap": fit["overlap"], "gpu": fit["accelerator"]}


def plan_overrides(fit: dict[str, Any], systems: list[str] | None,
                   precision: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-system hardware overrides for `plan`: systems with the calibrated GPU only, at
    the plan's ``precision`` (see hardware_overrides)."""
    from .hardware import systems as all_systems

    over = hardware_overrides(fit, precision)
    return {name: over["hardware"] for name, s in all_systems().items()
            if s["gpu"] == over["gpu"] and (systems is None or name in systems)}


def comm_links(run: str, results_dir: str = "results") -> dict[str, Any]:
    """Link figures measured by `mgbench comm` (its all_reduce fits), in the planner's
    terms: the alpha-beta fit t = alpha + S / algbw of an n-rank ring becomes a per-step
    latency alpha / (2 (n - 1)) and a bus bandwidth algbw x 2 (n - 1) / n. A single-node
    sweep ("all") or its intra-node groups set the intra-node link; inter-node groups
    set the inter-node one. Returns the accelerator measured and the Hardware fields."""
    run_dir = store.resolve_run(run, results_dir)
    manifest = store.read_manifest(run_dir)
    if manifest.get("kind") != "comm":
        raise MgbenchError(f"--comm {run}: not a `mgbench comm` run")
    gpus = (manifest.get("interconnect") or {}).get("gpus") or []
    acc = catalog.match_accelerator(gpus[0]["name"]) if gpus else None
    if acc is None:
        raise MgbenchError(f"--comm {run}: measured on {'CPU ranks' if not gpus else gpus[0]['name']}, not on a "
                           "catalog GPU: its links say nothing about the catalog's systems")
    fits = load_comm_fits(run_dir)
    rows = load_comm_rows(run_dir)
    out: dict[str, float] = {}
    for scope, prefix in (("all", "intra"), ("intra", "intra"), ("inter", "inter")):
        f = fits.get(f"all_reduce:{_dtype(rows)}:{scope}")
        n = next((r["nproc"] for r in rows if r["collective"] == "all_reduce" and r.get("scope", "all") == scope), 0)
        if not f or not f.get("bw_gbps") or n < 2:
            continue
        link = link_from_all_reduce_fit(f["alpha_s"], f["bw_gbps"] * 1e9, n)
        out[f"{prefix}_bw"], out[f"{prefix}_alpha_s"] = link["bw"], link["alpha_s"]
    if not out:
        raise MgbenchError(f"--comm {run}: no all_reduce fit with a bandwidth on 2 or more ranks to use")
    return {"gpu": acc, "fields": out}


def _dtype(rows: list[dict[str, Any]]) -> str:
    kinds = {r["dtype"] for r in rows if r["collective"] == "all_reduce"}
    return "bfloat16" if "bfloat16" in kinds else sorted(kinds)[0] if kinds else "float32"
