"""Tracked memory against the analytic model, per config.

A record's tracked figures (one training step under torch's memory tracker, the busiest
rank, split by category at its peak) beside what :func:`mgbench.planner.memory.
memory_for_config` predicts for the same config, category by category, and the error of
the predicted total against the tracked peak. Computed here, when a report or a table
is made, not stored in the record: the record keeps what was measured, and the model it
is held against is always the current one.
"""

from __future__ import annotations

import math
from typing import Any

from ..record import config_from_record

# The model's categories and the tracked ones each stands for. The model has no
# separate entry for gathered parameters, communication buffers or module buffers:
# they are transient or small, and it counts them under temporaries.
MODEL_OF_TRACKED: dict[str, tuple[str, ...]] = {
    "params_bytes": ("params",),
    "grads_bytes": ("grads",),
    "optimizer_bytes": ("optimizer",),
    "activations_bytes": ("activations",),
    "temporaries_bytes": ("temporaries", "gathered_params", "comm", "other"),
}
# Issue 14's bar for real CPU runs: the predicted total within 10% of the tracked peak.
AGREEMENT_PCT = 10.0


def _clean(rec: dict[str, Any]) -> dict[str, Any]:
    """A record row from a DataFrame has NaN where the record had None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}


def compare_record(rec: dict[str, Any]) -> dict[str, Any]:
    """One record's row: ``tracked_<model key>`` and ``predicted_<model key>`` bytes for
    every model category and the total, ``error_pct`` = 100 (predicted - tracked) /
    tracked of the totals, ``agrees`` (|error_pct| <= AGREEMENT_PCT); or, when either
    side is missing, ``reason`` and no figures."""
    rec = _clean(rec)
    row: dict[str, Any] = {"label": rec.get("label"), "config_id": rec.get("config_id"),
                           "strategy": rec.get("strategy"), "nproc": rec.get("nproc"), "reason": None}
    if rec.get("status") != "ok":
        return {**row, "reason": f"status {rec.get('status')}"}
    if rec.get("mem_tracked_peak_bytes") is None:
        return {**row, "reason": "not tracked: " + (rec.get("mem_tracked_reason") or "a run from before tracking")}
    try:
        from ..planner.memory import memory_for_config

        predicted = memory_for_config(config_from_record(rec))
    except Exception as e:  # the model refusing a config is a reason to show, not a crash of the report
        return {**row, "reason": f"no prediction: {type(e).__name__}: {e}"}
    for key, cats in MODEL_OF_TRACKED.items():
        row[f"tracked_{key}"] = sum(rec.get(f"mem_tracked_{c}_bytes") or 0 for c in cats)
        row[f"predicted_{key}"] = float(predicted[key])
    tracked = rec["mem_tracked_peak_bytes"]
    row["tracked_total_bytes"] = tracked
    row["predicted_total_bytes"] = float(predicted["total_bytes"])
    row["error_pct"] = 100.0 * (row["predicted_total_bytes"] - tracked) / tracked if tracked else None
    row["agrees"] = row["error_pct"] is not None and abs(row["error_pct"]) <= AGREEMENT_PCT
    return row


def compare_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`compare_record` of every ok record."""
    return [compare_record(r) for r in records if r.get("status") == "ok"]


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a plain-text table in MiB (what tests print and notes quote)."""
    keys = ["total_bytes", *MODEL_OF_TRACKED]
    head = f"{'config':44} " + " ".join(f"{k.replace('_bytes', ''):>17}" for k in keys) + f" {'error %':>8}"
    lines = [head, f"{'':44} " + " ".join(f"{'tracked/predicted':>17}" for _ in keys)]
    for r in rows:
        name = str(r["label"])[:44]
        if r["reason"]:
            lines.append(f"{name:44} {r['reason']}")
            continue
        cells = " ".join(f"{r['tracked_' + k] / 2**20:>8.2f}/{r['predicted_' + k] / 2**20:<8.2f}" for k in keys)
        lines.append(f"{name:44} {cells} {r['error_pct']:>+8.1f}")
    return "\n".join(lines)
