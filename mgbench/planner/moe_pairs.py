"""Published MoE A/B pairs: does the model move the way a run moved when one knob changed?

A row's error says how far the model is off on a configuration; it does not say whether
the model gets a choice right (HybridEP or all-to-all, CUDA graphs or not, more GPUs, one
system or another), which is what a user comparing two `mgbench predict` lines relies on.
Two scored rows of data/published_moe_runs.toml whose configurations differ in exactly
one field (moe_validation.CONFIG_FIELDS, or one of the MoE options, moe.MoeOptions) form
a pair; the published ratio (tokens/s per GPU of the second over the first) is set beside
the predicted one. Rows that repeat a configuration an earlier row holds
(moe_validation.repeats: other submitters re-measuring it) are left out, so each pair of
configurations counts once. A pair whose rows carry different ``date`` fields (two
releases, or two submitters of one MLPerf round) is marked: there the software or the
machine room changed too.

No constant is fitted to a pair; the pairs are read from rows already scored, fit and
held out alike, so this is a diagnosis of the model's levers, not a third split.

    python -m mgbench.planner.moe_pairs
"""

from __future__ import annotations

import dataclasses
import itertools
from statistics import mean
from typing import Any

from . import moe, moe_validation

# Within this relative difference of the published ratio a predicted ratio "agrees"; also
# the size below which a published effect counts as none (run-to-run noise of the tables'
# repeated rows: the MLPerf submitters' re-measurements of one configuration differ by up
# to 1.9%, NVIDIA's point releases of one recipe by up to 4%).
BAND = 0.05
VERDICTS = ("agrees", "too large", "too small", "opposite")


def knobs(row: dict[str, Any]) -> dict[str, str]:
    """A row's configuration as named fields (moe_validation.CONFIG_FIELDS and each MoE
    option, ``moe.<name>``), each value comparable as text."""
    out = {f: repr(row.get(f)) for f in moe_validation.CONFIG_FIELDS}
    out.update({f"moe.{k}": repr(v) for k, v in dataclasses.asdict(moe.options_of(row)).items()})
    return out


def verdict(published_ratio: float, predicted_ratio: float, band: float = BAND) -> str:
    """How the predicted effect of a knob compares with the published one: "agrees" (the
    ratios within ``band`` of each other), "opposite" (the model moves the other way from
    a published effect, or predicts one beyond ``band`` against a published move the other
    way), else "too large" or "too small" (the predicted effect is bigger / smaller)."""
    if abs(predicted_ratio / published_ratio - 1.0) <= band:
        return "agrees"
    p, q = published_ratio - 1.0, predicted_ratio - 1.0
    if p * q < 0 and max(abs(p), abs(q)) > band:
        return "opposite"
    return "too large" if abs(q) > abs(p) else "too small"


def pairs(scored: list[dict[str, Any]] | None = None, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every pair of scored rows (fit or held out, not a repeat) that differ in exactly one
    knob: the knob, both values, both ids, whether they share a release, the published and
    predicted ratios (second over first), the effect error (predicted ratio / published
    ratio - 1) and the :func:`verdict`."""
    rows = moe_validation.runs() if rows is None else rows
    scored = moe_validation.scored_rows(rows) if scored is None else scored
    by_id = {s["id"]: s for s in scored}
    again = moe_validation.repeats(rows)
    use = [r for r in rows if r["split"] in moe_validation.SPLITS and r["id"] not in again
           and by_id.get(r["id"], {}).get("error_pct") is not None]
    cfg = {r["id"]: knobs(r) for r in use}
    out = []
    for a, b in itertools.combinations(use, 2):
        ka, kb = cfg[a["id"]], cfg[b["id"]]
        diff = [k for k in ka if ka[k] != kb[k]]
        if len(diff) != 1:
            continue
        pub = float(b["published"]) / float(a["published"])
        pred = by_id[b["id"]]["predicted"] / by_id[a["id"]]["predicted"]
        out.append({"knob": diff[0], "from": ka[diff[0]], "to": kb[diff[0]], "a": a["id"], "b": b["id"],
                    "same_release": a.get("date") == b.get("date"), "published_ratio": pub,
                    "predicted_ratio": pred, "effect_error": pred / pub - 1.0, "verdict": verdict(pub, pred)})
    return out


def by_knob(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per knob: pairs, mean |effect error| and how many pairs have each verdict."""
    out: dict[str, dict[str, Any]] = {}
    for knob in sorted({p["knob"] for p in found}):
        sel = [p for p in found if p["knob"] == knob]
        out[knob] = {"pairs": len(sel), "mean_abs_effect_error": mean(abs(p["effect_error"]) for p in sel),
                     **{v: sum(p["verdict"] == v for p in sel) for v in VERDICTS}}
    return out


# The MoE options a user sets whose published A/B evidence predict names, and what it calls
# them: the option's knob (:func:`knobs`) and its `--moe-*` flag.
LEVERS = {"moe.dispatcher": "--moe-dispatcher", "moe.cuda_graphs": "--moe-cuda-graphs", "num_gpus": "the GPU count"}


def lever_note(knob: str, found: list[dict[str, Any]] | None = None) -> str | None:
    """One line on how well the published A/B pairs of ``knob`` bear out the model's lever
    (for `mgbench predict`'s notes where a run sets it), or None without pairs."""
    found = pairs() if found is None else found
    s = by_knob(found).get(knob)
    if s is None:
        return None
    counts = ", ".join(f"{s[v]} {v}" for v in VERDICTS if s[v])
    return (f"{LEVERS.get(knob, knob)}: on the {s['pairs']} published A/B pairs that change only it, the predicted "
            f"ratio was off the published one by {100 * s['mean_abs_effect_error']:.0f}% on average ({counts}; "
            "python -m mgbench.planner.moe_pairs lists them)")


def lever_notes(opts: moe.MoeOptions, *, gpu_count: bool = False) -> list[str]:
    """The :func:`lever_note` lines for what a run of an MoE model sets: a dispatcher other
    than all-to-all, CUDA graphs, and (``gpu_count``: plan, which chooses it) the GPU count."""
    knobs = [k for k, on in (("moe.dispatcher", opts.dispatcher != "alltoall"), ("moe.cuda_graphs", opts.cuda_graphs),
                             ("num_gpus", gpu_count)) if on]
    if not knobs:
        return []
    found = pairs()
    return [n for n in (lever_note(k, found) for k in knobs) if n]


def report(found: list[dict[str, Any]] | None = None) -> str:
    """The pairs and the per-knob summary, as text."""
    found = pairs() if found is None else found
    lines = [f"Published MoE A/B pairs (published_moe_runs.toml rows that differ in one knob; repeats left out): "
             f"tokens/s per GPU, second over first; a predicted ratio within {100 * BAND:.0f}% of the published "
             "one agrees", f"{'knob':<18} {'from -> to':<32} {'published':>9} {'predicted':>9}  verdict     pair"]
    for p in sorted(found, key=lambda p: (p["knob"], p["a"])):
        move = f"{p['from']} -> {p['to']}"
        lines.append(f"{p['knob']:<18} {move[:32]:<32} {p['published_ratio']:>9.3f} {p['predicted_ratio']:>9.3f}  "
                     f"{p['verdict']:<10}  {p['a']} / {p['b']}" + ("" if p["same_release"] else " (different releases or submitters)"))
    for knob, s in by_knob(found).items():
        counts = ", ".join(f"{s[v]} {v}" for v in VERDICTS if s[v])
        lines.append(f"{knob}: {s['pairs']} pairs, mean |effect error| {100 * s['mean_abs_effect_error']:.1f}% ({counts})")
    return "\n".join(lines)


def markdown(found: list[dict[str, Any]] | None = None) -> str:
    """The per-knob summary and the pairs as a Markdown table (docs/planner.md)."""
    found = pairs() if found is None else found
    lines = ["| knob | from -> to | published | predicted | verdict | pair |", "|---|---|---|---|---|---|"]
    for p in sorted(found, key=lambda p: (p["knob"], p["a"])):
        note = "" if p["same_release"] else " (different releases or submitters)"
        lines.append(f"| {p['knob']} | {p['from']} -> {p['to']} | {p['published_ratio']:.3f} | "
                     f"{p['predicted_ratio']:.3f} | {p['verdict']} | `{p['a']}` / `{p['b']}`{note} |")
    lines.append("")
    for knob, s in by_knob(found).items():
        counts = ", ".join(f"{s[v]} {v}" for v in VERDICTS if s[v])
        lines.append(f"- {knob}: {s['pairs']} pairs, mean |effect error| "
                     f"{100 * s['mean_abs_effect_error']:.1f}% ({counts})")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m mgbench.planner.moe_pairs
    print(report())
