"""Predictions against public end-to-end training throughput on every accelerator family
(data/accelerator_runs.toml), beside a one-constant baseline.

Every row is predicted through the path `mgbench predict` takes: resolve.resolve (the
catalog system, the precision, the stack) and predict.predict (the layout's validation,
the step model, the memory). A "ratio" row is predicted twice, on its accelerator and on
``relative_to``'s, with the same layout, and scored on the ratio.

The baseline prices every GPU at one MFU: the median MFU of the project's validation rows
of published_runs.toml (A100, published figures; :func:`baseline_mfu`), against each GPU's
dense bf16 peak (llm-analysis documents 50% for every GPU; this is the same kind of
estimate, with the project's own number). A ratio row's baseline is the ratio of peaks.

Per family (accelerator_runs.toml [families]), fit and held-out rows apart: how many, the
mean and worst |error| of the model and of the baseline. Nothing is fitted to these rows
(the efficiencies come from data/efficiency.toml's measurements); the split, fixed by a
rule in the data file's header, keeps a part no later calibration may touch.

    python -m mgbench.planner.validation_report   # prints the table
"""

from __future__ import annotations


from functools import lru_cache
from statistics import mean, median
from typing import Any

from .. import catalog
from ..errors import MgbenchError
from ..layout import Layout
from ..model_shape import ModelShape
from . import perf
from .splits import SPLITS, alternating
from .stack import row_state_bytes

# The targets (29): held-out mean |error| under 15%, no row off by more than 35%.
TARGET_HELD_OUT_MEAN_PCT = 15.0
TARGET_WORST_PCT = 35.0
UNSCORED = "unscored"  # the value published_moe_runs.toml gives a run stated with two layouts (moe_validation)
METRICS = ("tokens", "model", "ratio")
# How a "model" row's source counts a token's FLOPs, where not as the planner does
# (ModelShape.flops_per_token: 6 x the matmul parameters + attention): "all_params", 6 x
# every parameter (the input embedding's too, as sum(p.numel()) gives) + the attention.
FLOPS_COUNTED = ("all_params",)
REQUIRED = ("id", "accelerator", "system", "seq", "num_gpus", "micro_batch", "global_batch", "zero", "recompute",
            "precision", "stack", "metric", "published", "split", "source", "date")


def _data() -> dict[str, Any]:
    return catalog.load("accelerator_runs.toml")


def families() -> dict[str, list[str]]:
    """Family name -> the catalog accelerators it holds."""
    return _data()["families"]


def family_of(accelerator: str) -> str:
    """The family an accelerator belongs to; MgbenchError for one no family lists."""
    for fam, accs in families().items():
        if accelerator in accs:
            return fam
    raise MgbenchError(f"accelerator_runs.toml: {accelerator!r} is in no [families] list")


def check_row(row: dict[str, Any]) -> list[str]:
    """What is wrong with one row, one line each (empty: nothing)."""
    out = [f"missing {k}" for k in REQUIRED if k not in row]
    if row.get("metric") not in METRICS:
        out.append(f"metric {row.get('metric')!r} is not one of {', '.join(METRICS)}")
    if row.get("split") not in SPLITS + (UNSCORED,):
        out.append(f"split {row.get('split')!r} is not one of {', '.join(SPLITS + (UNSCORED,))}")
    if "flops_counted" in row and (row.get("metric") != "model" or row["flops_counted"] not in FLOPS_COUNTED):
        out.append(f"flops_counted {row['flops_counted']!r}: a \"model\" row's, one of {', '.join(FLOPS_COUNTED)}")
    if row.get("metric") == "ratio" and "relative_to" not in row:
        out.append("a ratio row names the accelerator and system it is relative to (relative_to)")
    if (recipe := perf.row_recipe_problem(row)) is not None:
        out.append(recipe)
    try:
        row_state_bytes(row)
    except MgbenchError as exc:
        out.append(str(exc))
    if "published" in row and not (isinstance(row["published"], (int, float)) and row["published"] > 0):
        out.append(f"published {row['published']!r} is not a positive number")
    sysname = row.get("system")
    if sysname is not None:
        s = catalog.systems().get(sysname)
        if s is None:
            out.append(f"system {sysname!r} is not in hardware.toml")
        elif s["gpu"] != row.get("accelerator"):
            out.append(f"system {sysname!r} holds {s['gpu']}, not {row.get('accelerator')}")
    return out


@lru_cache(maxsize=1)
def _runs() -> tuple[dict[str, Any], ...]:
    rows = _data()["runs"]
    problems = [f"{r.get('id', '?')}: {p}" for r in rows for p in check_row(r)]
    ids = [r["id"] for r in rows]
    problems += [f"{i}: id repeated" for i in sorted({i for i in ids if ids.count(i) > 1})]
    if not problems:  # the split is the header's rule, checked as published_moe_runs.toml's is
        rule = split_by_rule(list(rows))
        problems += [f"{r['id']}: split {r['split']!r}, but the header's rule gives {rule[r['id']]!r}"
                     for r in rows if r["split"] != rule[r["id"]]]
    problems += shared_row_problems(rows)
    if problems:
        raise MgbenchError("accelerator_runs.toml: " + "; ".join(problems))
    return tuple(rows)


def shared_row_problems(rows: Any) -> list[str]:
    """One line for each thing a row states otherwise than published_moe_runs.toml's row
    of the same id (the run is one fact, written in two files): its system, model,
    published figure and layout (Layout.from_published, defaults applied alike)."""
    from .moe_validation import runs as moe_runs

    moe = {r["id"]: r for r in moe_runs()}
    out = []
    for r in rows:
        other = moe.get(r["id"])
        if other is None:
            continue
        for k in ("system", "model", "published"):
            if r.get(k) != other.get(k):
                out.append(f"{r['id']}: {k} {r.get(k)!r}, but published_moe_runs.toml says {other.get(k)!r}")
        if Layout.from_published(r) != Layout.from_published(other):
            out.append(f"{r['id']}: its layout differs from published_moe_runs.toml's row")
    return out


def runs() -> list[dict[str, Any]]:
    """Every row of accelerator_runs.toml, checked (:func:`check_row`)."""
    return list(_runs())


def split_by_rule(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The split the data file's rule gives each row: within each family in file order,
    the 1st, 3rd, 5th ... held out, the 2nd, 4th ... fit; a row whose run
    published_moe_runs.toml states with two layouts (its ``layout_conflict``) keeps its
    place in that order but is unscored."""
    seen: dict[str, int] = {}
    out = {}
    for r in rows:
        fam = family_of(r["accelerator"])
        i = seen.get(fam, 0)
        seen[fam] = i + 1
        twin = moe_row_for(r)
        out[r["id"]] = (UNSCORED if twin and twin.get("layout_conflict") else
                        alternating(i, "held_out"))
    return out


def moe_row_for(row: dict[str, Any]) -> dict[str, Any] | None:
    """The same run in published_moe_runs.toml (checked there), where that file holds it:
    its MoE options and model overrides are stated there, once."""
    from .moe_validation import runs as moe_runs

    same = [r for r in moe_runs() if r["id"] == row["id"]]
    return same[0] if same else None


def shape_of(row: dict[str, Any]) -> ModelShape:
    """The row's model: a models.toml preset or accelerator_runs.toml [shapes] entry, or,
    for a run published_moe_runs.toml holds, its shape there (model overrides applied)."""
    extra = _data().get("shapes", {})
    if row["model"] in extra:
        dims = {k: v for k, v in extra[row["model"]].items() if k != "source"}
        return ModelShape(name=row["model"], **dims)
    moe_row = moe_row_for(row)
    if moe_row:
        from .moe_validation import shape_of as moe_shape_of

        return moe_shape_of(moe_row)
    return catalog.model_shape(row["model"])


def moe_options_for(row: dict[str, Any]) -> Any:
    """The MoE options a row is priced with: those published_moe_runs.toml states for the
    same run (one place for them: routing, dispatcher, node limit, FP8 dispatch, overlap),
    or the planner's defaults (None) for a run that file does not hold."""
    from . import moe

    moe_row = moe_row_for(row)
    return moe.options_of(moe_row) if moe_row else None


def predict_on(row: dict[str, Any], system: str) -> dict[str, Any]:
    """`mgbench predict`'s answer for the row's model and layout on ``system``."""
    from .predict import predict
    from .resolve import resolve

    hw = resolve(precision=row["precision"], system=system, stack=row["stack"])
    return predict(shape_of(row), hw, Layout.from_published(row), moe=moe_options_for(row),
                   state_bytes=row_state_bytes(row))


@lru_cache(maxsize=1)
def baseline_mfu() -> dict[str, Any]:
    """The one constant of the baseline: the median MFU of published_runs.toml's validation
    rows, each from its published figure (tokens/s x model FLOPs a token, or model TFLOP/s,
    or hardware TFLOP/s x model / hardware FLOPs), over its GPU's dense bf16 peak."""
    from .hardware import resolve as hw_resolve
    from .validation import published_runs
    from ..layout import RECOMPUTE

    vals = []
    for r in published_runs():
        if r["role"] != "validation":
            continue
        shape = catalog.model_shape(r["model"]) if "model" in r else ModelShape(**r["shape"])
        peak = hw_resolve(system=r["system"], precision="bf16").peak_tflops * 1e12
        model = float(shape.flops_per_token(r["seq"]))
        if r["metric"] == "tokens":
            mfu = r["published_tokens_per_s_per_gpu"] * model / peak
        elif r["metric"] == "model":
            mfu = r["published_tflops_per_gpu"] * 1e12 / peak
        else:  # hardware TFLOP/s: recomputation counted; MFU counts the model's FLOPs only
            hw_flops = float(perf.hardware_flops_per_token(shape, r["seq"], RECOMPUTE.index(r["recompute"])))
            mfu = r["published_tflops_per_gpu"] * 1e12 * model / hw_flops / peak
        vals.append(mfu)
    return {"mfu": median(vals), "rows": len(vals)}


def _bf16_peak(accelerator: str) -> float:
    peak = catalog.accelerator_peak(accelerator, "bf16")
    if peak is None:
        raise MgbenchError(f"{accelerator}: no bf16 peak in the catalog, so no baseline")
    return peak * 1e12


def baseline(row: dict[str, Any], mfu: float | None = None) -> float:
    """The one-constant baseline's figure for the row, in its metric."""
    mfu = baseline_mfu()["mfu"] if mfu is None else mfu
    if row["metric"] == "ratio":
        return _bf16_peak(row["accelerator"]) / _bf16_peak(row["relative_to"]["accelerator"])
    rate = mfu * _bf16_peak(row["accelerator"])
    if row["metric"] == "model":  # in the FLOPs the source counts, as the model's figure is (counted_flops_per_token)
        return rate / 1e12 * counted_flops_per_token(row) / float(shape_of(row).flops_per_token(row["seq"]))
    return rate / float(shape_of(row).flops_per_token(row["seq"]))


def counted_flops_per_token(row: dict[str, Any]) -> float:
    """A token's FLOPs as the row's source counts them (``flops_counted``; the planner's
    count, ModelShape.flops_per_token, where the row says nothing)."""
    shape = shape_of(row)
    if row.get("flops_counted") == "all_params":
        return 6.0 * shape.num_params() + float(shape.attention_flops_per_token(row["seq"]))
    return float(shape.flops_per_token(row["seq"]))


def predicted(row: dict[str, Any]) -> float:
    """The model's figure for the row, in its metric: a "model" row's TFLOP/s are the
    predicted tokens/s times a token's FLOPs as its source counts them."""
    own = predict_on(row, row["system"])
    if row["metric"] == "ratio":
        other = predict_on(row, row["relative_to"]["system"])
        return own["tokens_per_s_per_gpu"] / other["tokens_per_s_per_gpu"]
    if row["metric"] == "tokens":
        return own["tokens_per_s_per_gpu"]
    return own["tokens_per_s_per_gpu"] * counted_flops_per_token(row) / 1e12


def score(row: dict[str, Any]) -> dict[str, Any]:
    """One row: the published figure, the model's and the baseline's, and their errors
    (prediction - published) / published, in %."""
    pub = float(row["published"])
    pred = predicted(row)
    base = baseline(row)
    out = {"id": row["id"], "family": family_of(row["accelerator"]), "accelerator": row["accelerator"],
           "split": row["split"], "metric": row["metric"], "published": pub, "predicted": pred,
           "error_pct": 100.0 * (pred - pub) / pub, "baseline": base, "baseline_error_pct": 100.0 * (base - pub) / pub}
    twin = moe_row_for(row)
    if twin and twin.get("layout_conflict"):  # the same run, priced with its other layout (moe_validation)
        from .moe_validation import score as moe_score

        out["other"] = moe_score(twin)["other"]
    return out


def scored_rows(rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """:func:`score` of every row (``rows``: accelerator_runs.toml's by default)."""
    return [score(r) for r in (runs() if rows is None else rows)]


def _stats(sel: list[dict[str, Any]], key: str) -> dict[str, Any]:
    errs = [abs(r[key]) for r in sel]
    return {"mean_abs_pct": mean(errs) if errs else None, "worst_abs_pct": max(errs) if errs else None}


def family_table(scored: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per family (every family of [families], with or without rows) and split: rows, the
    model's and the baseline's mean and worst |error|, and whether the model's held-out
    mean beats the baseline's; the accelerators of the family no row measured."""
    scored = scored_rows() if scored is None else scored
    out = []
    for fam, accs in families().items():
        mine = [r for r in scored if r["family"] == fam and r["split"] in SPLITS]
        have = {r["accelerator"] for r in mine}
        entry: dict[str, Any] = {"family": fam, "rows": len(mine),
                                 "unscored": [r["id"] for r in scored if r["family"] == fam and r["split"] == UNSCORED],
                                 "accelerators_without_rows": [a for a in accs if a not in have]}
        for split in SPLITS:
            sel = [r for r in mine if r["split"] == split]
            entry[split] = {"rows": len(sel), "model": _stats(sel, "error_pct"),
                            "baseline": _stats(sel, "baseline_error_pct")}
        ho = entry["held_out"]
        entry["beats_baseline_held_out"] = (None if not ho["rows"] else
                                            ho["model"]["mean_abs_pct"] < ho["baseline"]["mean_abs_pct"])
        out.append(entry)
    return out


def targets(scored: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The issue's targets, each met or not, with the figure that decides it."""
    scored = scored_rows() if scored is None else scored
    table = family_table(scored)
    held = [abs(r["error_pct"]) for r in scored if r["split"] == "held_out"]
    worst = max((r for r in scored if r["split"] in SPLITS), key=lambda r: abs(r["error_pct"]))
    return {
        "held_out_mean_abs_pct": mean(held), "held_out_mean_met": mean(held) < TARGET_HELD_OUT_MEAN_PCT,
        "worst_row": worst["id"], "worst_abs_pct": abs(worst["error_pct"]),
        "worst_met": abs(worst["error_pct"]) <= TARGET_WORST_PCT,
        "families_without_rows": [t["family"] for t in table if not t["rows"]],
        "families_losing_to_baseline": [t["family"] for t in table if t["beats_baseline_held_out"] is False],
    }


if __name__ == "__main__":
    raise SystemExit("the tables are printed by `python -m mgbench.planner.validation_report`")
