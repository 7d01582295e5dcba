"""Fit the performance model's efficiencies to a measured run (`--calibrate RUN`).

For each `ok` record of a data-parallel run (single, ddp, zero1, fsdp, fsdp_grad_op),
the model's terms are computed from the record's own layout:

    step = shared x hardware FLOPs per rank / F            (compute)
         + max(0, comm bytes / BW + steps x alpha + calls x c - overlap x backward window)

F (achieved FLOP/s), BW (collective bandwidth), alpha (latency per ring step), c (cost
of one collective call: launch, hooks and, for FSDP, DTensor bookkeeping, which is paid
even on one rank) and overlap are fitted by non-negative least squares, with overlap on a grid. On CPU the
ranks share the host's cores, so ``shared`` = ranks and F is the whole host's rate; on
GPUs each rank has its own device (shared = 1). Leave-one-out: each config is predicted
from a fit to the others, which is what says whether the model generalises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import catalog, store
from ..collectives import busbw_factor
from ..store import load_comm_fits, load_comm_rows
from ..errors import MgbenchError
from ..strategies import DATA_PARALLEL, ZERO_STAGE
from ..model_shape import ModelShape

# Calibration fits data-parallel runs only (one model replica or shard per rank).
ZERO_OF = {name: ZERO_STAGE[name] for name in ("single", *DATA_PARALLEL)}
OVERLAP_GRID = np.linspace(0.0, 1.0, 11)


def features(rec: dict[str, Any]) -> dict[str, float]:
    """Per-rank work of one measured config: FLOPs, collective bytes and ring steps."""
    shape = ModelShape.from_record(rec)
    n, s = rec["nproc"], rec["seq_len"]
    fwd_bwd = shape.flops_per_token(s)
    # mgbench's checkpointing recomputes the forward of every block (full) or every
    # second block (selective): add that share of the forward (1/3 of fwd + bwd).
    share = {"none": 0.0, "selective": 0.5, "full": 1.0}[rec["activation_checkpointing"]]
    tokens_per_rank = rec["micro_batch"] * rec["grad_accum"] * s
    flops = fwd_bwd * (1.0 + share / 3.0) * tokens_per_rank
    zero = ZERO_OF[rec["strategy"]]
    bytes_per_param = 4.0 if rec["precision"] == "fp32" else 2.0
    p_bytes = shape.num_params() * bytes_per_param
    ga, units = rec["grad_accum"], shape.layers + 1  # FSDP shards each block and the root
    if rec["strategy"] == "single":
        k, calls = 0.0, 0.0
    elif zero == 3:
        # all-gather in forward and backward, reduce-scatter: per unit, per micro-step
        k, calls = 3.0 * ga, 3.0 * ga * units
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
            "window_frac": (2.0 / 3.0) / rec["grad_accum"] if zero < 3 else 1.0}


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


def _predict(coef: np.ndarray, overlap: float, F: dict[str, np.ndarray]) -> np.ndarray:
    compute = coef[0] * F["compute"]
    comm = coef[1] * F["comm_bytes"] + coef[2] * F["comm_steps"] + coef[3] * F["comm_calls"]
    return compute + np.maximum(comm - overlap * F["window_frac"] * compute, 0.0)


def _fit(F: dict[str, np.ndarray], y: np.ndarray) -> tuple[np.ndarray, float]:
    best: tuple[float, np.ndarray, float] | None = None
    for ov in OVERLAP_GRID:
        comm_cols = [F["comm_bytes"], F["comm_steps"], F["comm_calls"]]
        coef = _nnls(np.column_stack([F["compute"], *comm_cols]), y)
        for _ in range(5):  # exposed comm depends on the compute estimate: alternate
            comm = sum(c * col for c, col in zip(coef[1:], comm_cols))
            exposed = np.where(comm > ov * F["window_frac"] * coef[0] * F["compute"], 1.0, 0.0)
            X = np.column_stack([F["compute"] * (1.0 - exposed * ov * F["window_frac"]),
                                 *(col * exposed for col in comm_cols)])
            coef = _nnls(X, y)
        sse = float(((_predict(coef, ov, F) - y) ** 2 / y**2).sum())
        if best is None or sse < best[0]:
            best = (sse, coef, float(ov))
    assert best is not None
    return best[1], best[2]


def fit_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit on the ok records; report values, residuals and leave-one-out errors."""
    recs = [r for r in records if r["status"] == "ok" and r["strategy"] in ZERO_OF]
    if len(recs) < 3:
        raise MgbenchError(f"calibration needs at least 3 ok data-parallel configs, the run has {len(recs)}")
    feats = [features(r) for r in recs]
    F = {k: np.array([f[k] for f in feats]) for k in feats[0]}
    y = np.array([r["step_time_s"] for r in recs])
    coef, overlap = _fit(F, y)
    pred = _predict(coef, overlap, F)
    loo = []
    for i in range(len(recs)):
        keep = np.arange(len(recs)) != i
        c_i, o_i = _fit({k: v[keep] for k, v in F.items()}, y[keep])
        loo.append(float(_predict(c_i, o_i, {k: v[i : i + 1] for k, v in F.items()})[0]))
    device = recs[0]["device_name"]
    flops_per_s = 1.0 / coef[0] if coef[0] > 0 else None
    peak = recs[0].get("peak_tflops")
    rows = [{"config_id": r["config_id"], "label": r["label"], "measured_s": float(m), "fitted_s": float(p),
             "residual_pct": 100.0 * (p - m) / m, **_loo_figures(lo, float(m))}
            for r, m, p, lo in zip(recs, y, pred, loo)]
    loo_errors = [abs(r["loo_error_pct"]) for r in rows if r["loo_error_pct"] is not None]
    return {
        "device_name": device,
        "accelerator": catalog.match_accelerator(device),
        "num_configs": len(recs),
        "achieved_flops_per_s": flops_per_s,
        "flops_scope": "whole host (ranks share its cores)" if recs[0]["device"] == "cpu" else "per device",
        "compute_eff": flops_per_s / (peak * 1e12) if flops_per_s and peak else None,
        "comm_bytes_per_s": 1.0 / coef[1] if coef[1] > 0 else None,
        "alpha_s_per_step": float(coef[2]),
        "seconds_per_collective_call": float(coef[3]),
        "overlap": overlap,
        "rows": rows,
        "fit_mean_abs_error_pct": float(np.mean([abs(r["residual_pct"]) for r in rows])),
        "loo_mean_abs_error_pct": float(np.mean(loo_errors)) if loo_errors else None,
        "loo_predicted_configs": len(loo_errors),
    }


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


def hardware_overrides(fit: dict[str, Any]) -> dict[str, Any]:
    """What a fit changes in `predict` for the same accelerator."""
    if fit["accelerator"] is None or fit["compute_eff"] is None:
        raise MgbenchError(
            f"the calibration run was measured on {fit['device_name']!r}, which has no catalog peak; its fit "
            "describes that machine only: run `mgbench predict --calibrate RUN` without --system/--gpu to see it")
    return {"hardware": {"compute_eff": fit["compute_eff"]}, "overlap": fit["overlap"], "gpu": fit["accelerator"]}


def plan_overrides(fit: dict[str, Any], systems: list[str] | None) -> dict[str, dict[str, Any]]:
    """Per-system hardware overrides for `plan`: systems with the calibrated GPU only."""
    from .hardware import systems as all_systems

    over = hardware_overrides(fit)
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
        out[f"{prefix}_bw"] = f["bw_gbps"] * 1e9 * busbw_factor("all_reduce", n)
        out[f"{prefix}_alpha_s"] = f["alpha_s"] / (2 * (n - 1))
    if not out:
        raise MgbenchError(f"--comm {run}: no all_reduce fit with a bandwidth on 2 or more ranks to use")
    return {"gpu": acc, "fields": out}


def _dtype(rows: list[dict[str, Any]]) -> str:
    kinds = {r["dtype"] for r in rows if r["collective"] == "all_reduce"}
    return "bfloat16" if "bfloat16" in kinds else sorted(kinds)[0] if kinds else "float32"
