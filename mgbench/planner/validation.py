"""Predictions versus published training throughput (mgbench/data/published_runs.toml,
and the same-software A100 / H100 pairs of mgbench/data/generation_pairs.toml).

    python -m mgbench.planner.validation_report   # prints the error tables and the solved defaults
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from statistics import median
from typing import Any

from .. import catalog
from ..errors import MgbenchError
from ..model_shape import ModelShape
from . import hardware, layout_time, stack
from ..layout import RECOMPUTE


def published_runs() -> list[dict[str, Any]]:
    return catalog.load("published_runs.toml")["runs"]


# The stack the generation pairs ran (data/stacks.toml solves it from their calibration pair).
PAIRS_STACK = "llm-foundry"


@lru_cache(maxsize=1)
def _pairs_data() -> tuple[dict[str, Any], ...]:
    data = catalog.load("generation_pairs.toml")
    src, lay, models = data["source"], data["layout"], data["models"]
    out = []
    for p in data["pairs"]:
        if p.get("model") not in models:
            raise MgbenchError(f"generation_pairs.toml: pair {p.get('id')!r} names model {p.get('model')!r}, "
                               f"which its [models] table lacks ({', '.join(models)}): add its shape with its source")
        if not p.get("source"):
            raise MgbenchError(f"generation_pairs.toml: pair {p.get('id')!r} has no source: name the table rows it is read from")
        runs = {}
        for side in ("a100", "h100"):
            row = p[side]
            runs[side] = {
                "id": f"{p['id']}-{side}", "stack": PAIRS_STACK, "system": lay[f"{side}_system"],
                "source": f"{src['repo']} {src['file']}@{src['commit'][:9]}: {p['source']}",
                "shape": models[p["model"]], "seq": p["seq"], "micro_batch": row["micro_batch"],
                "global_batch": row["micro_batch"] * row["grad_accum"] * lay["num_gpus"],
                "tp": lay["tp"], "pp": lay["pp"], "num_gpus": lay["num_gpus"], "zero": lay["zero"],
                "recompute": p["recompute"], "metric": "tokens",
                "published_tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"],
                # The A100 row scores the stack on the GPU its constants come from; the H100 row
                # is the cross-generation evidence, kept out of the stack's own class.
                "role": p["role"] if side == "a100" else "cross-generation"}
        out.append({"id": p["id"], "model": p["model"], "seq": p["seq"], "role": p["role"], "source": p["source"],
                    "a100": runs["a100"], "h100": runs["h100"],
                    "published_ratio": row_ratio(runs["h100"], runs["a100"])})
    return tuple(out)


def row_ratio(h100: dict[str, Any], a100: dict[str, Any]) -> float:
    """The published H100 / A100 tokens/s per GPU of one pair."""
    return h100["published_tokens_per_s_per_gpu"] / a100["published_tokens_per_s_per_gpu"]


def generation_pairs() -> list[dict[str, Any]]:
    """Every A100 / H100 pair of generation_pairs.toml, each with its two rows as published
    runs (``a100``, ``h100``) that :func:`predict_run` takes."""
    return list(_pairs_data())


def stack_runs() -> list[dict[str, Any]]:
    """The rows that calibrate and score the stacks on the calibrated GPU: published_runs.toml
    and the generation pairs' A100 rows."""
    return published_runs() + [p["a100"] for p in generation_pairs()]


def stack_of(run: dict[str, Any]) -> str:
    """The software stack a published run used (Megatron-LM where the row names none)."""
    return run.get("stack", stack.DEFAULT_STACK)


# What a published_runs.toml / generation_pairs.toml row that names neither trained with.
RUN_DEFAULTS = {"zero": 0, "precision": "bf16"}


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
        tp=run["tp"], pp=run["pp"], dp=dp, zero=run.get("zero", RUN_DEFAULTS["zero"]),
        recompute=RECOMPUTE.index(run["recompute"]), schedule=run.get("schedule", "1f1b"),
        virtual_stages=run.get("virtual_stages", 1), flash=run.get("flash", True), ep=run.get("ep", 1), cp=cp,
        precision=run.get("precision", RUN_DEFAULTS["precision"]), pp_last_layers=run.get("pp_last_layers"),
        fp8_recipe=run.get("fp8_recipe"),
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
    (row,) = [r for r in stack_runs() if r["role"] == "calibration" and stack_of(r) == name]
    return _bisect(lambda e: predict_run(row, stack_eff=e)["error_pct"], 0.2, 2.0)


def error_table() -> tuple[list[dict[str, Any]], float]:
    """Every published run's prediction (the generation pairs' A100 rows included), and
    the mean absolute % error of the default stack's validation rows (:func:`stack_errors`
    has every stack's)."""
    rows = [predict_run(r) for r in stack_runs()]
    return rows, stack_errors(rows)[stack.DEFAULT_STACK]


@lru_cache(maxsize=1)
def _pair_rows() -> tuple[dict[str, Any], ...]:
    out = []
    for p in generation_pairs():
        a, h = predict_run(p["a100"]), predict_run(p["h100"])
        ratio = h["predicted"] / a["predicted"]
        out.append({"id": p["id"], "seq": p["seq"], "role": p["role"], "a100": a, "h100": h,
                    "published_ratio": p["published_ratio"], "predicted_ratio": ratio,
                    "ratio_error_pct": 100.0 * (ratio / p["published_ratio"] - 1.0)})
    return tuple(out)


def pair_table() -> list[dict[str, Any]]:
    """Each generation pair's prediction: A100 and H100 tokens/s per GPU (the
    ``llm-foundry`` stack) and the H100 / A100 ratio, published vs predicted. A positive
    ratio error: the model carries the A100's speed to the H100 too optimistically."""
    return list(_pair_rows())


# Sequence bands of the pairs' summary: short sequences are GEMM-bound, long ones
# attention-bound (where the flash-attention fraction sets the ratio).
SEQ_BANDS = (("seq <= 2K", 0, 2048), ("seq 4K-8K", 4096, 8192), ("seq >= 16K", 16384, 1 << 40))


def pair_summary(rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per sequence band and overall: how many pairs, the published and predicted ratio
    medians, the mean |ratio error| and the range of each error (ratio, A100, H100)."""
    rows = pair_table() if rows is None else rows

    def stats(sel: list[dict[str, Any]], band: str) -> dict[str, Any]:
        scored = [r for r in sel if r["role"] == "validation"]

        def rng(vals: list[float]) -> list[float]:
            return [min(vals), max(vals)]
        return {"band": band, "pairs": len(sel),
                "published_ratio_median": median([r["published_ratio"] for r in sel]),
                "predicted_ratio_median": median([r["predicted_ratio"] for r in sel]),
                "ratio_mean_abs_error_pct": sum(abs(r["ratio_error_pct"]) for r in sel) / len(sel),
                "ratio_error_pct": rng([r["ratio_error_pct"] for r in sel]),
                # The calibration pair's A100 row is exact by construction: not scored.
                "a100_mean_abs_error_pct": sum(abs(r["a100"]["error_pct"]) for r in scored) / len(scored),
                "a100_error_pct": rng([r["a100"]["error_pct"] for r in scored]),
                "h100_mean_abs_error_pct": sum(abs(r["h100"]["error_pct"]) for r in sel) / len(sel),
                "h100_error_pct": rng([r["h100"]["error_pct"] for r in sel])}

    out = [stats([r for r in rows if lo <= r["seq"] <= hi], name) for name, lo, hi in SEQ_BANDS]
    return out + [stats(rows, "all")]


def stack_errors(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean absolute % error of each stack's validation rows."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["role"] == "validation":
            out.setdefault(r["stack"], []).append(abs(r["error_pct"]))
    return {k: sum(v) / len(v) for k, v in out.items()}


if __name__ == "__main__":  # the printed tables moved, so that this module imports no reporting
    raise SystemExit("the validation tables are printed by `python -m mgbench.planner.validation_report`")
