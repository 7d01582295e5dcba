"""How far to trust a prediction: an interval from the validation residuals of its regime.

A regime is where a prediction's numbers come from. Each regime's relative half-widths
(how far below and above the prediction the truth has been seen to fall) are taken from
measured residuals, never chosen:

- ``catalog-validated``: catalog constants on the GPU they were calibrated on (A100),
  for the software stack asked (``--stack``, planner/stack.py). Half-width: the largest
  |error| of that stack's validation rows of published_runs.toml in the same dense /
  pipelined class.
- ``catalog-other-gpu``: catalog constants carried to another GPU by its measured
  best-GEMM fraction (MAMF). Widened on both sides by the worst published cross-generation
  |residual| (the informational H100 rows: Llama 3 405B, whose pipeline schedule is
  assumed, and torchtitan's Llama 3 8B on 500 W H100s, predicted 32% too fast: part of
  it their 500 W HBM2e H100s, part the A100 -> H100 ratio the model still gets too high).
- ``catalog-assumed``: a GPU with no MAMF figure: its matmul efficiency is the A100's
  fraction by assumption. No measurement bounds that, so the interval is widened by a
  stated convention (ASSUMED_SLOWDOWN: the step may take up to twice as long), and the
  reasons name the assumption.
- ``probed``: a hardware profile of the machine; the half-width is the largest error of
  that profile's own `predict --against` validation when the profile records one,
  otherwise (``probed-unvalidated``) x0 to x2 by stated convention.

Intervals are [prediction x (1 - low), prediction x (1 + high)] on time; throughput's
interval is its reciprocal image.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from . import hardware

# A convention, not a measurement: where a GPU's matmul efficiency is borrowed from the
# A100, nothing measured bounds the error, so the step may take up to (1 + this) times
# the prediction. `mgbench probe` on that GPU replaces the assumption with a measurement.
ASSUMED_SLOWDOWN = 1.0


@lru_cache(maxsize=1)
def _residuals() -> dict[str, list[float]]:
    """Validation residuals keyed "<stack>:dense" / "<stack>:pipelined", and "cross_gpu"
    (informational rows on another GPU than the calibrated one, any stack)."""
    from .validation import published_runs, predict_run, stack_of

    out: dict[str, list[float]] = {"cross_gpu": []}
    for run in published_runs():
        err = predict_run(run)["error_pct"] / 100.0
        if run["role"] == "validation":
            out.setdefault(f"{stack_of(run)}:{'pipelined' if run['pp'] > 1 else 'dense'}", []).append(err)
        elif run["role"] == "informational" and hardware.resolve(system=run["system"]).gpu != \
                hardware.planner_defaults()["calibrated_gpu"]:
            out["cross_gpu"].append(err)
    return out


def _bounds(errs: list[float]) -> tuple[float, float]:
    """(low, high) half-widths on step time from throughput errors e = (pred - true) / true:
    the true step time is the predicted one times (1 + e), so a negative e (the model was
    pessimistic) says how far below the prediction the truth fell, a positive one above."""
    return max([0.0] + [-e for e in errs]), max([0.0] + list(errs))


def regime(gpu: str, pipelined: bool, profile: dict[str, Any] | None = None,
           stack: str = "megatron-lm") -> dict[str, Any]:
    """The regime of a prediction and its half-widths on step time, with the reasons.
    Catalog predictions use the residuals of their software stack's published rows in the
    same dense / pipelined class; a class the stack has no rows for borrows the
    calibration stack's rows of that class, widened by the stack's own, and says so."""
    if profile is not None:
        v = profile.get("validation")
        if v:
            w = v["max_abs_error_pct"] / 100.0
            return {"regime": "probed", "low": min(w, 1.0), "high": w,
                    "reasons": [f"probed profile, validated against run {v['run']}: max |error| "
                                f"{v['max_abs_error_pct']:.0f}% over {v['num_configs']} configs"]}
        return {"regime": "probed-unvalidated", "low": 1.0, "high": 1.0,
                "reasons": ["probed profile not validated against a run on its machine: an interval of x0 to x2 "
                            "(a convention) until `mgbench predict --hardware PROFILE --against RUN` records one"]}
    from .stack import DEFAULT_STACK

    res = _residuals()
    cls = "pipelined" if pipelined else "dense"
    calibrated = hardware.planner_defaults()["calibrated_gpu"]
    own = res.get(f"{stack}:{cls}")
    if own:
        low, high = _bounds(own)
        reasons = [f"{cls} layouts: published {stack} runs on {calibrated} predicted within "
                   f"{100 * max(low, high):.0f}% (published_runs.toml validation rows)"]
    else:
        mine = [e for k, v in res.items() if k.startswith(f"{stack}:") for e in v]
        low, high = _bounds(res[f"{DEFAULT_STACK}:{cls}"] + mine)
        reasons = [f"{cls} layouts: no published {stack} run of this class; {DEFAULT_STACK}'s {cls} rows and "
                   f"{stack}'s other rows on {calibrated} were predicted within {100 * max(low, high):.0f}%"]
    if gpu == calibrated:
        return {"regime": "catalog-validated", "low": low, "high": high, "reasons": reasons}
    # Few cross-GPU rows, each with an assumed schedule: widen both sides by the worst.
    cross = max([0.0] + [abs(e) for e in res["cross_gpu"]])
    low, high = max(low, cross), max(high, cross)
    reasons.append(f"{gpu}: efficiency carried from {calibrated} by GEMM fractions; published runs on another GPU "
                   f"(published_runs.toml informational rows: Llama 3 405B on H100 with its schedule assumed, "
                   f"torchtitan Llama 3 8B on 500 W H100s) were predicted within {100 * cross:.0f}%")
    if gpu not in hardware.planner_defaults()["mamf_fraction"]:
        high = max(high, ASSUMED_SLOWDOWN)
        reasons.append(f"{gpu}: no measured GEMM fraction: its matmul efficiency is {calibrated}'s by assumption; "
                       f"nothing measured bounds it, so the interval allows up to {1 + ASSUMED_SLOWDOWN:.0f}x the "
                       "step time (a convention; `mgbench probe` on that GPU measures it)")
        return {"regime": "catalog-assumed", "low": low, "high": high, "reasons": reasons}
    return {"regime": "catalog-other-gpu", "low": low, "high": high, "reasons": reasons}


def intervals(step_time_s: float, tokens_per_s_per_gpu: float, reg: dict[str, Any]) -> dict[str, Any]:
    """The prediction's intervals, in the JSON names `predict` and `plan` use."""
    lo_t, hi_t = step_time_s * (1.0 - reg["low"]), step_time_s * (1.0 + reg["high"])
    return {"step_time_s_interval": [lo_t, hi_t],
            "tokens_per_s_per_gpu_interval": [tokens_per_s_per_gpu * step_time_s / hi_t,
                                              tokens_per_s_per_gpu * step_time_s / max(lo_t, 1e-30)],
            "regime": reg["regime"], "interval_reasons": reg["reasons"]}


def calibrated(fit: dict[str, Any]) -> dict[str, Any]:
    """The regime of a prediction with `--calibrate RUN`: its leave-one-out errors."""
    errs = [abs(r["loo_error_pct"]) / 100.0 for r in fit["rows"] if r.get("loo_error_pct") is not None]
    if not errs:
        return {"regime": "calibrated-unvalidated", "low": 1.0, "high": 1.0,
                "reasons": ["calibrated on a run whose leave-one-out predictions all failed: x0 to x2 (a convention)"]}
    w = max(errs)
    return {"regime": "calibrated", "low": min(w, 1.0), "high": w,
            "reasons": [f"calibrated on {fit['num_configs']} measured configs: leave-one-out errors up to {100 * w:.0f}%"]}


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two [low, high] intervals overlap: the candidates cannot be told apart."""
    return a[0] <= b[1] and b[0] <= a[1]


def leave_one_out_coverage() -> dict[str, Any]:
    """How many validation rows fall inside an interval built from the OTHER rows of
    their class (stack x dense / pipelined): the intervals' out-of-sample coverage."""
    from .validation import predict_run, published_runs

    from .validation import stack_of

    rows = [(r, predict_run(r)["error_pct"] / 100.0) for r in published_runs() if r["role"] == "validation"]
    inside = []
    for i, (run, e) in enumerate(rows):
        cls = (stack_of(run), run["pp"] > 1)
        low, high = _bounds([e2 for j, (r2, e2) in enumerate(rows) if j != i and (stack_of(r2), r2["pp"] > 1) == cls])
        # true time = predicted x (1 + e): inside when -low <= e <= high
        inside.append({"id": run["id"], "error_pct": 100.0 * e, "interval_pct": [-100.0 * low, 100.0 * high],
                       "inside": -low <= e <= high})
    return {"rows": inside, "covered": sum(r["inside"] for r in inside), "total": len(inside)}
