"""Published all-reduce bandwidth across nodes against the planner's price of it
(data/published_collectives.toml, perf.group_collective_time).

Each row's all-reduce is priced on its catalog system at its node count, ranks a node and
message size; the predicted bus bandwidth is the published one's definition,
algbw x 2 (n - 1) / n. "fit" rows set a link's bw_eff (hardware.toml names them);
"held_out" rows set nothing.

    python -m mgbench.planner.collective_validation   # prints the table
"""

from __future__ import annotations

from functools import lru_cache
from statistics import mean
from typing import Any

from .. import catalog
from ..collectives import busbw_factor
from ..errors import MgbenchError
from .hardware import resolve

SPLITS = ("fit", "held_out")
REQUIRED = ("id", "system", "nodes", "ranks_per_node", "bytes", "busbw_gbps", "split", "source", "date")


@lru_cache(maxsize=1)
def rows() -> tuple[dict[str, Any], ...]:
    """The file's rows, checked (:func:`check`)."""
    return tuple(check(list(catalog.load("published_collectives.toml")["rows"])))


def check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, or MgbenchError naming each that lacks a field, has an unknown split, more
    ranks a node than its system's GPUs, or is a fit row not naming its system's network
    link in ``sets`` (the link whose bw_eff it set)."""
    bad = [f"{r.get('id', '?')}: missing {', '.join(k for k in REQUIRED if k not in r)}" for r in rows
           if any(k not in r for k in REQUIRED)]
    for r in rows:
        if any(k not in r for k in REQUIRED):
            continue
        system = catalog.systems().get(r["system"])
        if r["split"] not in SPLITS:
            bad.append(f"{r['id']}: split {r['split']!r}")
        if system is None:
            bad.append(f"{r['id']}: no catalog system {r['system']!r}")
            continue
        if not 1 <= r["ranks_per_node"] <= system["gpus_per_node"]:
            bad.append(f"{r['id']}: ranks_per_node {r['ranks_per_node']} on {system['gpus_per_node']}-GPU nodes")
        if r["split"] == "fit" and r.get("sets") != system["inter_link"]:
            bad.append(f"{r['id']}: a fit row sets its system's network link ({system['inter_link']}), "
                       f"not sets {r.get('sets')}")
    if bad:
        raise MgbenchError("published_collectives.toml: " + "; ".join(bad))
    return rows


def predicted_busbw_gbps(row: dict[str, Any]) -> float:
    """The bus bandwidth (GB/s) the planner's price of the row's all-reduce implies."""
    from . import perf

    hw = resolve(system=row["system"])
    n = row["nodes"] * row["ranks_per_node"]
    span = (row["nodes"] - 1) * hw.gpus_per_node + row["ranks_per_node"]  # whole nodes, g of each
    seconds = float(perf.group_collective_time(float(row["bytes"]), n, span, hw, 2.0))
    return busbw_factor("all_reduce", n) * row["bytes"] / seconds / 1e9


def score() -> list[dict[str, Any]]:
    """Every row: published and predicted busbw and the error in %."""
    out = []
    for r in rows():
        pred = predicted_busbw_gbps(r)
        out.append({"id": r["id"], "split": r["split"], "system": r["system"], "nodes": r["nodes"],
                    "published": r["busbw_gbps"], "predicted": pred,
                    "error_pct": 100.0 * (pred - r["busbw_gbps"]) / r["busbw_gbps"]})
    return out


def summary(scored: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mean and worst |error| per split."""
    out = {}
    for split in SPLITS:
        errs = [(abs(s["error_pct"]), s["id"]) for s in scored if s["split"] == split]
        out[split] = {"rows": len(errs), "mean_abs_pct": mean(e for e, _ in errs) if errs else None,
                      "worst": max(errs) if errs else None}
    return out


def report() -> str:
    """The table and the per-split summary, as printed."""
    scored = score()
    lines = ["Published all-reduce across nodes (published_collectives.toml): nccl-tests bus bandwidth, GB/s",
             f"{'row':38s}  {'split':8s}  {'system':13s}  {'nodes':>5s}  {'published':>9s}  {'predicted':>9s}  "
             f"{'error':>7s}"]
    for s in scored:
        lines.append(f"{s['id']:38s}  {s['split']:8s}  {s['system']:13s}  {s['nodes']:5d}  {s['published']:9.1f}  "
                     f"{s['predicted']:9.1f}  {s['error_pct']:+6.1f}%")
    for split, sm in summary(scored).items():
        if sm["rows"]:
            lines.append(f"{split}: {sm['rows']} rows, mean |error| {sm['mean_abs_pct']:.1f}%, worst "
                         f"{sm['worst'][0]:.1f}% ({sm['worst'][1]})")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
