"""Published collective bandwidth across nodes against the planner's price of it
(data/published_collectives.toml): all-reduce (perf.group_collective_time, which prices
data-parallel traffic) and all-to-all (moe.alltoall_seconds, the price of MoE's dispatch
and combine).

Each row's collective is priced on its catalog system at its node count, ranks a node and
message size; the predicted bus bandwidth is the published one's definition (nccl-tests:
algbw x 2 (n - 1) / n for all-reduce, algbw x (n - 1) / n for all-to-all). "fit"
all-reduce rows set a link's bw_eff (hardware.toml names them); "fit" all-to-all rows set
NCCL's all-to-all share (:func:`solve_all_to_all_share`) and a link's all-to-all cost per
peer node (:func:`solve_a2a_peer`); "held_out" rows set nothing.

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
from .splits import SPLITS

COLLECTIVES = ("all_reduce", "all_to_all")
REQUIRED = ("id", "system", "nodes", "ranks_per_node", "bytes", "busbw_gbps", "split", "source", "date")


@lru_cache(maxsize=1)
def rows() -> tuple[dict[str, Any], ...]:
    """The file's rows, checked (:func:`check`)."""
    return tuple(check(list(catalog.load("published_collectives.toml")["rows"])))


def check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, or MgbenchError naming each that lacks a field, has an unknown split, more
    ranks a node than its system's GPUs, an unknown ``collective``, an all-to-all across nodes on
    part of their GPUs (moe.ep_geometry prices whole nodes), or is a fit row not naming what
    it sets in ``sets``: its system's network link for an all-reduce (the link whose
    bw_eff it set), "all_to_all" for an all-to-all."""
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
        if collective_of(r) not in COLLECTIVES:
            bad.append(f"{r['id']}: collective {collective_of(r)!r} (one of {', '.join(COLLECTIVES)})")
        elif (collective_of(r) == "all_to_all" and r["nodes"] > 1
              and r["ranks_per_node"] != system["gpus_per_node"]):
            # moe.ep_geometry prices whole nodes of consecutive ranks (one node: any part of it)
            bad.append(f"{r['id']}: an all_to_all row across nodes runs every GPU of its nodes, not "
                       f"{r['ranks_per_node']} of {system['gpus_per_node']}")
        if r["split"] == "fit" and collective_of(r) == "all_to_all":
            if r.get("sets") != "all_to_all":  # NCCL's share and a link's a2a_peer_us (solve_*)
                bad.append(f"{r['id']}: a fit all_to_all row sets the all-to-all share (sets = \"all_to_all\"), "
                           f"not {r.get('sets')!r}")
        elif r["split"] == "fit" and r.get("sets") != system["inter_link"]:
            bad.append(f"{r['id']}: a fit row sets its system's network link ({system['inter_link']}), "
                       f"not sets {r.get('sets')}")
    if bad:
        raise MgbenchError("published_collectives.toml: " + "; ".join(bad))
    return rows


def collective_of(row: dict[str, Any]) -> str:
    """The row's collective: ``collective``, all-reduce where it does not say."""
    return row.get("collective", "all_reduce")


def predicted_busbw_gbps(row: dict[str, Any], share: float | None = None) -> float:
    """The bus bandwidth (GB/s) the planner's price of the row's collective implies (an
    all-to-all's bytes at ``share`` of the links' rates, None: the stored share;
    :func:`solve_all_to_all_share`)."""
    from . import moe, perf

    hw = resolve(system=row["system"])
    n = row["nodes"] * row["ranks_per_node"]
    if collective_of(row) == "all_to_all":
        seconds = float(moe.alltoall_seconds(hw, n, float(row["bytes"]), share))
    else:
        span = (row["nodes"] - 1) * hw.gpus_per_node + row["ranks_per_node"]  # whole nodes, g of each
        seconds = float(perf.group_collective_time(float(row["bytes"]), n, span, hw, 2.0))
    return busbw_factor(collective_of(row), n) * row["bytes"] / seconds / 1e9


def error_pct(row: dict[str, Any], share: float | None = None, predicted: float | None = None) -> float:
    """(predicted - published) / published busbw in % (``share``: as
    :func:`predicted_busbw_gbps`; ``predicted``: the prediction where the caller has it)."""
    pred = predicted_busbw_gbps(row, share) if predicted is None else predicted
    return 100.0 * (pred - row["busbw_gbps"]) / row["busbw_gbps"]


def score() -> list[dict[str, Any]]:
    """Every row: published and predicted busbw and the error in %."""
    out = []
    for r in rows():
        pred = predicted_busbw_gbps(r)
        out.append({"id": r["id"], "split": r["split"], "system": r["system"], "nodes": r["nodes"],
                    "collective": collective_of(r),
                    "published": r["busbw_gbps"], "predicted": pred,
                    "error_pct": error_pct(r, predicted=pred)})
    return out


def summary(scored: list[dict[str, Any]], collective: str | None = None) -> dict[str, dict[str, Any]]:
    """Mean and worst |error| per split (of one ``collective``'s rows where given)."""
    out = {}
    scored = [s for s in scored if collective is None or s["collective"] == collective]
    for split in SPLITS:
        errs = [(abs(s["error_pct"]), s["id"]) for s in scored if s["split"] == split]
        out[split] = {"rows": len(errs), "mean_abs_pct": mean(e for e, _ in errs) if errs else None,
                      "worst": max(errs) if errs else None}
    return out


def solve_all_to_all_share() -> dict[str, Any]:
    """The share of the links' rates NCCL's all-to-all moves its bytes at
    (moe.nccl_all_to_all_share), solved on the fit all-to-all rows (least mean |error| of
    bus bandwidth, a 0.01 grid from 0.50 to 1), with both splits' mean |error| at it and
    at 1. The rule fixed before the first solve (docs/planner.md, "An all-to-all share from
    fit rows"): adopt it only if the held-out rows' error falls below their error at 1.
    The first solve (0.72) failed that; after efa-v2's all-to-all cost per peer node was solved (0.97) it passed."""
    rows_ = [r for r in rows() if collective_of(r) == "all_to_all"]

    def err(split: str, share: float) -> float:
        return mean(abs(error_pct(r, share)) for r in rows_ if r["split"] == split)

    grid = [round(0.5 + 0.01 * i, 2) for i in range(51)]
    best = min(grid, key=lambda s: err("fit", s))
    return {"share": best, "fit_pct": err("fit", best), "held_out_pct": err("held_out", best),
            "fit_pct_at_1": err("fit", 1.0), "held_out_pct_at_1": err("held_out", 1.0)}


def solve_a2a_peer(link: str) -> dict[str, Any]:
    """What an all-to-all pays per peer node on a network link (hardware.toml ``a2a_peer_us``,
    moe.exchange_seconds; a ring's steps keep the link's ``alpha_us``), solved on the fit
    all-to-all rows across nodes of systems whose inter_link it is: least mean |error| of
    bus bandwidth on a 1 us grid from 0 to 300 us, every other figure held. Returns the value,
    the fit rows' and the held-out all-to-all rows' (across nodes, on the link) mean |error|
    at it and at the stored value (None where the link has none: its latency then). What set
    efa-v2's (docs/planner.md). Edits the loaded catalog while it runs and puts it back."""
    links = catalog.load("hardware.toml")["links"]
    if link not in links:
        raise MgbenchError(f"hardware.toml has no link {link!r}")
    table = links[link]
    stored = table.get("a2a_peer_us")

    def across(split: str) -> list[dict[str, Any]]:  # rows inside one node never reach the link
        return [r for r in rows() if catalog.systems()[r["system"]]["inter_link"] == link
                and r["split"] == split and collective_of(r) == "all_to_all" and r["nodes"] > 1]

    fit, held = across("fit"), across("held_out")
    if not fit:
        raise MgbenchError(f"published_collectives.toml: no fit all_to_all row runs across nodes on {link}")

    def err(group: list[dict[str, Any]]) -> float:
        return mean(abs(error_pct(r)) for r in group)

    def put(value: float | None) -> None:
        if value is None:
            table.pop("a2a_peer_us", None)
        else:
            table["a2a_peer_us"] = value

    try:
        at = {}
        for peer in range(301):
            put(float(peer))
            at[peer] = err(fit)
        best = min(at, key=lambda a: (at[a], a))
        put(float(best))
        held_best = err(held)
        put(None)
        fit_none, held_none = err(fit), err(held)
    finally:
        put(stored)
    return {"a2a_peer_us": float(best), "fit_pct": at[best], "held_out_pct": held_best,
            "stored_a2a_peer_us": stored, "fit_pct_at_stored": err(fit), "held_out_pct_at_stored": err(held),
            "fit_pct_at_latency": fit_none, "held_out_pct_at_latency": held_none,
            "fit_rows": [r["id"] for r in fit], "held_out_rows": [r["id"] for r in held]}


# Cached for predict's and plan's note: a test that patches the share, a link's cost or the
# pricing in-process must clear it (cache_clear) before and after.
@lru_cache(maxsize=1)
def _all_to_all_scores() -> tuple[dict[str, Any], ...]:
    return tuple(s for s in score() if s["collective"] == "all_to_all")


def a2a_record_note(dispatcher: str, ep: int | None) -> str | None:
    """predict's and plan's line where a run's expert parallelism exchanges tokens with
    NCCL's all-to-all (the "alltoall" dispatcher, EP above 1): how the model's price of an
    all-to-all did against the published alltoall_perf figures, inside one node and across
    nodes. None otherwise: DeepEP's and HybridEP's kernels are priced at the link rate,
    which DeepEP's published figures reach (moe.DEEPEP_H800)."""
    if dispatcher != "alltoall" or not ep or ep <= 1:
        return None
    scored = _all_to_all_scores()
    if not scored:
        return None
    fast = sum(s["error_pct"] > 0 for s in scored)

    def span(rows: list[dict[str, Any]]) -> str:
        errs = [s["error_pct"] for s in rows]
        return f"{min(errs):+.1f}% to {max(errs):+.1f}%" if errs else "no figure"

    inside = [s for s in scored if s["nodes"] == 1]
    across = [s for s in scored if s["nodes"] > 1]
    return (f"all-to-all: the model prices NCCL's all-to-all faster than {fast} of the {len(scored)} published "
            f"nccl-tests alltoall_perf figures ({span(inside)} inside one node, {span(across)} across nodes; "
            f"mean |error| {mean(abs(s['error_pct']) for s in scored):.1f}%; "
            "python -m mgbench.planner.collective_validation): the EP exchange may take longer than predicted")


def report() -> str:
    """The table and the per-split summary, as printed."""
    scored = score()
    lines = ["Published collectives across nodes (published_collectives.toml): nccl-tests bus bandwidth, GB/s",
             f"{'row':44s}  {'collective':10s}  {'split':8s}  {'system':13s}  {'nodes':>5s}  {'published':>9s}  "
             f"{'predicted':>9s}  {'error':>7s}"]
    for s in scored:
        lines.append(f"{s['id']:44s}  {s['collective']:10s}  {s['split']:8s}  {s['system']:13s}  {s['nodes']:5d}  "
                     f"{s['published']:9.1f}  {s['predicted']:9.1f}  {s['error_pct']:+6.1f}%")
    for collective in COLLECTIVES:
        for split, sm in summary(scored, collective).items():
            if sm["rows"]:
                lines.append(f"{collective} {split}: {sm['rows']} rows, mean |error| {sm['mean_abs_pct']:.1f}%, "
                             f"worst {sm['worst'][0]:.1f}% ({sm['worst'][1]})")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
