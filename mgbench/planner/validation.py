"""Predictions versus published training throughput (mgbench/data/published_runs.toml).

    python -m mgbench.planner.validation      # prints the error table and the solved defaults
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import catalog
from ..model_shape import ModelShape
from . import hardware, layout_time, stack
from .memory import RECOMPUTE


def published_runs() -> list[dict[str, Any]]:
    return catalog.load("published_runs.toml")["runs"]


def stack_of(run: dict[str, Any]) -> str:
    """The software stack a published run used (Megatron-LM where the row names none)."""
    return run.get("stack", stack.DEFAULT_STACK)


# What each row's metric is called in the model's output, and its published field.
METRICS = {"hardware": ("hardware_tflops_per_gpu", "published_tflops_per_gpu", "TFLOP/s/GPU (hardware)"),
           "model": ("model_tflops_per_gpu", "published_tflops_per_gpu", "TFLOP/s/GPU (model)"),
           "tokens": ("tokens_per_s_per_gpu", "published_tokens_per_s_per_gpu", "tokens/s/GPU")}


def predict_run(run: dict[str, Any], matmul_eff: float | None = None,
                elementwise_passes: float | None = None, stack_eff: float | None = None) -> dict[str, Any]:
    """The planner's prediction for one published run, on the metric it reports, with
    the run's stack (``stack_eff`` overrides the stored factor, for solving it)."""
    shape = catalog.model_shape(run["model"]) if "model" in run else ModelShape(**run["shape"])
    hw = hardware.resolve(system=run["system"], precision="bf16")
    if matmul_eff is not None:
        scale = hardware.compute_efficiency(hw.gpu) / hardware.compute_efficiency(
            hardware.planner_defaults()["calibrated_gpu"])
        hw = dataclasses.replace(hw, compute_eff=matmul_eff * scale)
    if elementwise_passes is not None:
        hw = dataclasses.replace(hw, elementwise_passes=elementwise_passes)
    name = stack_of(run)
    hw = dataclasses.replace(hw, stack=name, stack_eff=stack_eff if stack_eff is not None else stack.efficiency(name))
    cp = run.get("cp", 1)
    dp = run["num_gpus"] // (run["tp"] * run["pp"] * cp)
    out = layout_time.step_time(
        shape, hw, seq=run["seq"], global_batch=run["global_batch"], micro_batch=run["micro_batch"],
        tp=run["tp"], pp=run["pp"], dp=dp, zero=run.get("zero", 0),
        recompute=RECOMPUTE.index(run["recompute"]), schedule=run.get("schedule", "1f1b"),
        virtual_stages=run.get("virtual_stages", 1), flash=run.get("flash", True), ep=run.get("ep", 1), cp=cp,
        precision=run.get("precision", "bf16"),
    )
    key, field, unit = METRICS[run["metric"]]
    predicted = float(out[key])
    published = float(run[field])
    return {"id": run["id"], "source": run["source"], "stack": name, "unit": unit, "published": published,
            "predicted": predicted, "error_pct": 100.0 * (predicted - published) / published, "role": run["role"],
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
    small, large = [r for r in published_runs() if r["role"] == "calibration" and stack_of(r) == stack.DEFAULT_STACK]

    def passes_for(mm: float) -> float:
        return _bisect(lambda c: predict_run(small, mm, c)["error_pct"], 0.0, 100.0)

    mm = _bisect(lambda e: predict_run(large, e, passes_for(e))["error_pct"], 0.3, 0.95, iters=40)
    return mm, passes_for(mm)


def solve_stack(name: str) -> float:
    """The stack efficiency that reproduces the stack's calibration row exactly."""
    (row,) = [r for r in published_runs() if r["role"] == "calibration" and stack_of(r) == name]
    return _bisect(lambda e: predict_run(row, stack_eff=e)["error_pct"], 0.2, 2.0)


def error_table() -> tuple[list[dict[str, Any]], float]:
    """Every published run's prediction, and the mean absolute % error of the default
    stack's validation rows (:func:`stack_errors` has every stack's)."""
    rows = [predict_run(r) for r in published_runs()]
    return rows, stack_errors(rows)[stack.DEFAULT_STACK]


def stack_errors(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean absolute % error of each stack's validation rows."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["role"] == "validation":
            out.setdefault(r["stack"], []).append(abs(r["error_pct"]))
    return {k: sum(v) / len(v) for k, v in out.items()}


def main() -> None:
    from tabulate import tabulate

    rows, _ = error_table()
    print(tabulate([[r["id"], r["stack"], r["unit"], r["published"], f"{r['predicted']:.1f}", f"{r['error_pct']:+.1f}%",
                     r["role"], r["source"]] for r in rows],
                   headers=["run", "stack", "metric", "published", "predicted", "error", "role", "source"]))
    for name, mae in stack_errors(rows).items():
        n = sum(r["role"] == "validation" and r["stack"] == name for r in rows)
        print(f"{name}: mean absolute error over {n} validation rows: {mae:.1f}% "
              f"(stack efficiency {stack.efficiency(name):.3f}, solved {solve_stack(name) if name != stack.DEFAULT_STACK else 1.0:.3f})")
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
