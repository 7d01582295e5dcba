"""Predictions versus published training throughput (mgbench/data/published_runs.toml).

    python -m mgbench.planner.validation      # prints the error table and the solved defaults
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import catalog
from ..model_shape import ModelShape
from . import hardware, perf
from .memory import RECOMPUTE


def published_runs() -> list[dict[str, Any]]:
    return catalog.load("published_runs.toml")["runs"]


def predict_run(run: dict[str, Any], matmul_eff: float | None = None,
                elementwise_passes: float | None = None) -> dict[str, Any]:
    """The planner's TFLOP/s per GPU for one published run, on the metric it reports."""
    shape = catalog.model_shape(run["model"]) if "model" in run else ModelShape(**run["shape"])
    hw = hardware.resolve(system=run["system"], precision="bf16")
    if matmul_eff is not None:
        scale = hardware.compute_efficiency(hw.gpu) / hardware.compute_efficiency(
            hardware.planner_defaults()["calibrated_gpu"])
        hw = dataclasses.replace(hw, compute_eff=matmul_eff * scale)
    if elementwise_passes is not None:
        hw = dataclasses.replace(hw, elementwise_passes=elementwise_passes)
    dp = run["num_gpus"] // (run["tp"] * run["pp"])
    out = perf.step_time(
        shape, hw, seq=run["seq"], global_batch=run["global_batch"], micro_batch=run["micro_batch"],
        tp=run["tp"], pp=run["pp"], dp=dp, zero=run.get("zero", 0),
        recompute=RECOMPUTE.index(run["recompute"]), schedule=run.get("schedule", "1f1b"),
        flash=run.get("flash", True),
    )
    key = "hardware_tflops_per_gpu" if run["metric"] == "hardware" else "model_tflops_per_gpu"
    predicted = float(out[key])
    published = float(run["published_tflops_per_gpu"])
    return {"id": run["id"], "source": run["source"], "published": published, "predicted": predicted,
            "error_pct": 100.0 * (predicted - published) / published, "role": run["role"],
            "why": run.get("why")}


def _bisect(f, lo: float, hi: float, iters: int = 60) -> float:
    """Root of a monotone f on [lo, hi]."""
    flo = f(lo)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == (flo > 0):
            lo, flo = mid, f(mid)
        else:
            hi = mid
    return (lo + hi) / 2


def solve_defaults() -> tuple[float, float]:
    """(matmul_eff, elementwise_passes) that reproduce both calibration rows exactly.

    The small-model row pins the elementwise term for a given matmul efficiency; the
    large-model row, dominated by matmuls, then pins the matmul efficiency.
    """
    small, large = [r for r in published_runs() if r["role"] == "calibration"]

    def passes_for(mm: float) -> float:
        return _bisect(lambda c: predict_run(small, mm, c)["error_pct"], 0.0, 100.0)

    mm = _bisect(lambda e: predict_run(large, e, passes_for(e))["error_pct"], 0.3, 0.95, iters=40)
    return mm, passes_for(mm)


def error_table() -> tuple[list[dict[str, Any]], float]:
    """Every published run's prediction, and the mean absolute % error of the validation rows."""
    rows = [predict_run(r) for r in published_runs()]
    scored = [abs(r["error_pct"]) for r in rows if r["role"] == "validation"]
    return rows, sum(scored) / len(scored)


def main() -> None:
    from tabulate import tabulate

    rows, mae = error_table()
    print(tabulate([[r["id"], r["published"], f"{r['predicted']:.1f}", f"{r['error_pct']:+.1f}%", r["role"],
                     r["source"]] for r in rows],
                   headers=["run", "published TFLOP/s/GPU", "predicted", "error", "role", "source"]))
    print(f"\nmean absolute error over validation rows: {mae:.1f}%")
    for r in rows:
        if r["why"]:
            print(f"{r['id']}: {r['role']}: {r['why']}")
    from .uncertainty import leave_one_out_coverage

    cov = leave_one_out_coverage()
    print(f"intervals (uncertainty.py), leave-one-out: {cov['covered']} of {cov['total']} validation rows fall inside "
          "the interval built from the other rows of their class: "
          + ", ".join(f"{r['id']} {r['error_pct']:+.1f}% in [{r['interval_pct'][0]:+.1f}, {r['interval_pct'][1]:+.1f}]"
                      + ("" if r["inside"] else " OUTSIDE") for r in cov["rows"]))
    mm, c = solve_defaults()
    print(f"solved defaults: matmul_eff = {mm:.3f}, elementwise_passes = {c:.2f}")


if __name__ == "__main__":
    main()
