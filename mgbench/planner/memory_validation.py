"""Predicted peak memory against published measurements of production stacks
(data/published_memory.toml): what `mgbench memory`, `predict` and `plan` say a layout
needs, scored on the peaks that torchtitan (and other stacks) published for theirs, and on
the layouts they published as running out of memory.

    python -m mgbench.planner.memory_validation     # prints the table and both parts' errors

The prediction is the planner's ``reserved_bytes`` (the tensors counted, cuBLAS's
workspace and the stated allowance, memory.ALLOWANCE_FRACTION) with the row's stack's
memory (stack.memory_of): torchtitan publishes the CUDA caching allocator's peak reserved
bytes. An out-of-memory row is judged on ``total_bytes``, which adds the CUDA context and
NCCL's buffers, what must fit in device memory. No constant is fitted to these rows today: "fit" rows are the ones a future constant
may be set from, "held_out" rows never set one, and both parts' errors are reported.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import mean
from typing import Any

from .. import catalog
from ..model_shape import ModelShape
from ..layout import Layout
from .hardware import GIB
from .predict import memory



def published_memory() -> list[dict[str, Any]]:
    """Every row of published_memory.toml."""
    return catalog.load("published_memory.toml")["runs"]


def layout_of_row(run: dict[str, Any]) -> Layout:
    """The planner's layout of a published row (a pipeline's micro-batches from num_micro)."""
    dp = run["dp"]
    return Layout(num_gpus=run["num_gpus"], tp=run["tp"], pp=run["pp"], cp=run.get("cp", 1), ep=run.get("ep", 1),
                  zero=run["zero"], micro_batch=run["micro_batch"], seq_len=run["seq_len"],
                  global_batch=run["micro_batch"] * dp * run.get("num_micro", 1), precision=run["precision"],
                  recompute=run["recompute"], sequence_parallel=run["sequence_parallel"],
                  schedule=run.get("schedule", "1f1b"), virtual_stages=run.get("virtual_stages", 1),
                  pp_last_layers=run.get("pp_last_layers"))


def moe_options_of(run: dict[str, Any]) -> Any:
    """The MoE options a row states (routing, recompute modules), for an MoE model; None
    (the planner's defaults) otherwise."""
    if "routing" not in run and "moe_recompute" not in run:
        return None
    from .moe import options_of

    return options_of(run)


def _shape(run: dict[str, Any]) -> ModelShape:
    """A row's model: a preset, its dims overridden where the run trained a variant (as the
    MoE file's rows: moe_validation.shape_of), or the dims the row gives."""
    if "model" in run:
        from .moe_validation import shape_of

        return shape_of(run)
    return ModelShape(name=run["id"], **run["shape"])


def predict_row(run: dict[str, Any]) -> dict[str, Any]:
    """The planner's memory for one row, beside what was published."""
    shape = _shape(run)
    got = memory(shape, layout_of_row(run), stack=run["stack"], moe=moe_options_of(run),
                 state_bytes=run.get("state_bytes"))
    # torchtitan publishes the caching allocator's reserved peak: the CUDA context and NCCL's
    # buffers are outside it; what must fit (total_bytes) decides the out-of-memory rows.
    # Megatron publishes the peak allocated: the tensors without the allowance.
    if run.get("oom"):
        predicted = got["total_bytes"] / GIB
    elif run.get("metric") == "allocated":
        predicted = (got["reserved_bytes"] - got["allowance_bytes"]) / GIB
    else:
        predicted = got["reserved_bytes"] / GIB
    out = {"id": run["id"], "stack": run["stack"], "role": run["role"], "predicted_gib": predicted,
           "measured_gib": run.get("measured_gib"), "oom": bool(run.get("oom")), "why": run.get("why")}
    if out["oom"]:
        out["predicted_fits"] = predicted <= run["device_memory_gib"]
        out["error_pct"] = None
    else:
        out["error_pct"] = 100.0 * (predicted - run["measured_gib"]) / run["measured_gib"]
    return out


@lru_cache(maxsize=None)
def moe_miss(stack: str) -> tuple[tuple[float, float] | None, tuple[str, ...]]:
    """How far the planner's memory is from ``stack``'s published MoE peaks: the (smallest,
    largest) |error| in % over its measured MoE rows, None where it has none; and the ids
    of its published out-of-memory MoE layouts the planner says fit. Read by
    stack_memory_notes, so the warning says what the rows say."""
    rows = [r for r in published_memory() if r["stack"] == stack and _shape(r).is_moe]
    scored = [predict_row(r) for r in rows]
    errs = [abs(r["error_pct"]) for r in scored if r["error_pct"] is not None]
    return ((min(errs), max(errs)) if errs else None,
            tuple(r["id"] for r in scored if r["oom"] and r["predicted_fits"]))


# Above this |error| on a stack's published MoE peaks, memory warns (the validation file's
# target, tests/unit/test_stack_memory.py's 15%).
MOE_MEMORY_WARN_PCT = 15.0


def stack_memory_notes(shape: ModelShape | None, stack: str | None) -> list[str]:
    """Where the memory model misses a stack's published MoE peaks (data/published_memory.toml,
    :func:`moe_miss`) by more than MOE_MEMORY_WARN_PCT, or says one of its
    out-of-memory MoE layouts fits, one line for an MoE model on that stack."""
    if shape is None or not shape.is_moe:
        return []
    from .stack import DEFAULT_STACK

    stack = stack or DEFAULT_STACK
    span, oom_fits = moe_miss(stack)
    if (span is None or span[1] <= MOE_MEMORY_WARN_PCT) and not oom_fits:
        return []
    said = [] if span is None else [f"{stack}'s published MoE peaks (data/published_memory.toml) are "
                                    f"{span[0]:.0f}-{span[1]:.0f}% off this count"]
    if oom_fits:
        said.append(f"{len(oom_fits)} layout(s) it counts as fitting ran out of memory ({', '.join(oom_fits)})")
    return ["; ".join(said) + ": keep that much headroom (docs/planner.md)"]


def error_table() -> list[dict[str, Any]]:
    """Every row predicted."""
    return [predict_row(r) for r in published_memory()]


def summary(rows: list[dict[str, Any]], stack: str | None = None) -> dict[str, Any]:
    """Mean and worst |error| of the measured rows per role (informational rows apart),
    and the published out-of-memory layouts the planner says fit (should be none); of
    ``stack``'s rows only, where given."""
    rows = [r for r in rows if stack is None or r["stack"] == stack]
    out: dict[str, Any] = {}
    for role in ("fit", "held_out"):
        errs = [abs(r["error_pct"]) for r in rows if r["role"] == role and r["error_pct"] is not None]
        out[role] = {"rows": len(errs), "mean_abs_error_pct": mean(errs) if errs else None,
                     "max_abs_error_pct": max(errs) if errs else None}
    out["oom_rows"] = sum(r["oom"] for r in rows)
    out["oom_predicted_to_fit"] = [r["id"] for r in rows if r["oom"] and r["predicted_fits"]]
    return out


def main() -> None:
    from tabulate import tabulate

    rows = error_table()
    print(tabulate([[r["id"], r["stack"], r["role"], "OOM" if r["oom"] else f"{r['measured_gib']:.1f}",
                     f"{r['predicted_gib']:.1f}",
                     ("fits: WRONG" if r["predicted_fits"] else "does not fit: right") if r["oom"]
                     else f"{r['error_pct']:+.1f}%"] for r in rows],
                   headers=["run", "stack", "role", "published GiB", "predicted GiB", "error"]))
    for stack in sorted({r["stack"] for r in rows}):
        s = summary(rows, stack)
        for role in ("fit", "held_out"):
            p = s[role]
            if p["rows"]:
                print(f"{stack} {role}: {p['rows']} rows, mean |error| {p['mean_abs_error_pct']:.1f}%, "
                      f"max {p['max_abs_error_pct']:.1f}%")
    s = summary(rows)
    print(f"published out-of-memory layouts: {s['oom_rows']}, predicted to fit: {s['oom_predicted_to_fit'] or 'none'}")
    for r in rows:
        if r["why"]:
            print(f"{r['id']}: {r['role']}: {r['why']}")


if __name__ == "__main__":
    main()
