"""Published MoE A/B pairs: does the model move the way a run moved when one knob changed?

A row's error says how far the model is off on a configuration; it does not say whether
the model gets a choice right (HybridEP or all-to-all, CUDA graphs or not, more GPUs, one
system or another), which is what a user comparing two `mgbench predict` lines relies on.
Two scored rows of data/published_moe_runs.toml whose configurations differ in exactly
one knob (moe_validation.knobs: a layout field or an MoE option;
precision and its FP8 recipe count as one, :data:`GROUPS`) form a pair; the published
ratio of tokens/s per GPU is set beside the predicted one, each pair oriented so that the
published ratio is at least 1 (ties by id), so that a pair's figures do not depend on the
file's row order (which of a configuration's repeated rows is kept does). Rows
that repeat a configuration an earlier row holds (moe_validation.repeats: other
submitters re-measuring it) are left out, so each pair of configurations counts once. A
pair whose rows come from different sources (releases, or submitters of one MLPerf
round: :func:`source_of`) is marked: there the software or the machine room changed too.

No constant is fitted to a pair; the pairs are read from rows already scored, fit and
held out alike, so this is a diagnosis of the model's levers, not a third split.

    python -m mgbench.planner.moe_pairs
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from statistics import mean
from typing import Any

from . import moe, moe_validation
from .hardware import ep_crosses_efa

# Within this relative difference of the published ratio a predicted ratio "agrees"; also
# the size below which an effect counts as none. A convention, set above the noise the
# file itself shows (:func:`repeat_spread`, which a test keeps under this band): 5% while
# the widest re-measurement spread was the MLPerf submitters' 3.4% (eight-GPU B300, five
# submitters); 10% since the nineteenth session's rows, whose widest is 8.4% (torchtitan
# PR 2627's two tables of one 9.5B configuration on 8 B200, 23,780 and 21,940 tokens/s).
BAND = 0.10


def repeat_spread(rows: list[dict[str, Any]] | None = None) -> float:
    """The largest relative spread (max / min - 1) of the published figures of one
    configuration measured more than once with nothing else varied (moe_validation.measurement:
    rows that differ only in a setting the planner does not price are not re-measurements)."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in moe_validation.runs() if rows is None else rows:
        groups.setdefault(moe_validation.measurement(r), []).append(float(r["published"]))
    return max((max(v) / min(v) - 1.0 for v in groups.values() if len(v) > 1), default=0.0)
VERDICTS = ("agrees", "too large", "too small", "opposite")
# Fields that change together and make one knob: an FP8 recipe exists only under fp8; a
# dispatcher's backend (moe.backend, a row's dispatcher_backend: UCCL-EP, NVSHMEM on
# libfabric) only under a DeepEP-style dispatcher.
GROUPS = {"precision": ("precision", "fp8_recipe"), "moe.dispatcher": ("moe.dispatcher", "moe.backend")}


def knob_of(diff: list[str]) -> str | None:
    """The one knob a list of differing fields makes (a field, or a :data:`GROUPS` name
    whose fields include them all), or None where they make more than one."""
    if not diff:
        return None
    if len(diff) == 1:
        return next((g for g, fields in GROUPS.items() if diff[0] in fields), diff[0])
    return next((g for g, fields in GROUPS.items() if set(diff) <= set(fields)), None)


def source_of(row: dict[str, Any]) -> tuple[str, str]:
    """Where a row's figure comes from, to tell a pair from one table or round apart from
    one across two: its ``date`` and the first two clauses of its ``source`` (the table
    and release, or the round and submitter). Both are required fields of the file
    (moe_validation.REQUIRED)."""
    return row["date"], ",".join(row["source"].split(",")[:2])


def verdict(published_ratio: float, predicted_ratio: float, band: float = BAND) -> str:
    """How the predicted effect of a knob compares with the published one: "agrees" (the
    ratios within ``band`` of each other); "opposite" (both effects beyond ``band``, in
    opposite directions); else "too large" or "too small" (the predicted effect bigger /
    smaller than the published one: an effect within ``band`` counts as none)."""
    if abs(predicted_ratio / published_ratio - 1.0) <= band:
        return "agrees"
    p, q = published_ratio - 1.0, predicted_ratio - 1.0
    if p * q < 0 and min(abs(p), abs(q)) > band:
        return "opposite"
    return "too large" if abs(q) > abs(p) else "too small"


def pairs(scored: list[dict[str, Any]] | None = None, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every pair of scored rows (fit or held out, not a repeat) that differ in exactly one
    knob: the knob, its value in each, both ids, whether they share a source, the published
    and predicted ratios (second over first, the published one >= 1), the effect error
    (predicted ratio / published ratio - 1) and the :func:`verdict`. The file's own pairs
    are computed once a process (:func:`_file_pairs`)."""
    if scored is None and rows is None:
        return [dict(p) for p in _file_pairs()]
    rows = moe_validation.runs() if rows is None else rows
    scored = moe_validation.scored_rows(rows) if scored is None else scored
    by_id = {s["id"]: s for s in scored}
    measured = [r for r in rows if r["split"] in moe_validation.SPLITS
                and by_id.get(r["id"], {}).get("error_pct") is not None]
    # One pair a pair of configurations; where one was measured more than once, the
    # measurement with the other's unpriced_settings (a pair that also changed a setting the
    # planner does not price would credit the knob with that setting's effect) from the
    # other's source (its own table), then one from the other's source, else the first in
    # file order.
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in measured:
        groups.setdefault(moe_validation.configuration(r), []).append(r)
    cfg = {r["id"]: moe_validation.knobs(r) for r in measured}
    out = []
    for ga, gb in itertools.combinations(groups.values(), 2):
        same = [(x, y) for x in ga for y in gb if source_of(x) == source_of(y)]
        a, b = next(((x, y) for x, y in same if x.get("unpriced_settings") == y.get("unpriced_settings")),
                    same[0] if same else (ga[0], gb[0]))
        ka, kb = cfg[a["id"]], cfg[b["id"]]
        knob = knob_of([k for k in ka if ka[k] != kb[k]])
        if knob is None:
            continue
        if (float(b["published"]), b["id"]) < (float(a["published"]), a["id"]):  # ties: by id
            a, b, ka, kb = b, a, kb, ka
        fields = GROUPS.get(knob, (knob,))
        pub = float(b["published"]) / float(a["published"])
        pred = by_id[b["id"]]["predicted"] / by_id[a["id"]]["predicted"]
        def said(k: dict[str, str]) -> str:  # a group's value: its first field, and the others where set
            return " ".join([k[fields[0]], *(k[f] for f in fields[1:] if k[f] != "None")])

        out.append({"knob": knob, "from": said(ka), "to": said(kb),
                    "a": a["id"], "b": b["id"], "model": a["model"], "same_source": source_of(a) == source_of(b),
                    "changed": sorted(f for f in fields if ka[f] != kb[f]),
                    "efa": bool(ep_crosses_efa(a["system"], a["ep"]) and ep_crosses_efa(b["system"], b["ep"])),
                    "published_ratio": pub, "predicted_ratio": pred, "effect_error": pred / pub - 1.0,
                    "verdict": verdict(pub, pred)})
    return out


@lru_cache(maxsize=1)
def _file_pairs() -> tuple[dict[str, Any], ...]:
    """The pairs of the data file's rows, once a process (predict and plan name them)."""
    return tuple(pairs(list(moe_validation.file_scores())))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def by_knob(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per knob: pairs, mean |effect error|, how many pairs have each verdict, the models
    they ran, and the summary in words (``text``)."""
    out: dict[str, dict[str, Any]] = {}
    for knob in sorted({p["knob"] for p in found}):
        sel = [p for p in found if p["knob"] == knob]
        s = {"pairs": len(sel), "mean_abs_effect_error": mean(abs(p["effect_error"]) for p in sel),
             "models": sorted({p["model"] for p in sel}), **{v: sum(p["verdict"] == v for p in sel) for v in VERDICTS}}
        counts = ", ".join(f"{s[v]} {v}" for v in VERDICTS if s[v])
        s["text"] = (f"{_plural(s['pairs'], 'pair')}, mean |effect error| {100 * s['mean_abs_effect_error']:.1f}% "
                     f"({counts})")
        out[knob] = s
    return out


# The MoE options a user sets whose published A/B evidence predict names, and what it calls
# them: the option's knob (:func:`knobs`) and its `--moe-*` flag.
LEVERS = {"moe.dispatcher": "--moe-dispatcher", "moe.cuda_graphs": "--moe-cuda-graphs", "num_gpus": "the GPU count"}


def lever_note(knob: str, found: list[dict[str, Any]] | None = None, value: Any = None,
               efa: bool | None = None) -> str | None:
    """One line on how well the published A/B pairs of ``knob`` bear out the model's lever
    (for `mgbench predict`'s and `plan`'s notes where a run sets it), or None without
    pairs; ``value``: only the pairs with that value on one side (the dispatcher a run
    chose); ``efa``: only the pairs whose expert parallelism crossed AWS EFA nodes (True)
    or the others (False), where a dispatcher's transport differs (hardware.ep_crosses_efa)."""
    found = pairs() if found is None else found
    if value is not None:
        found = [p for p in found if repr(value) in (p["from"] + " " + p["to"]).split()]
    if efa is not None:
        found = [p for p in found if p["efa"] == efa]
    if knob == "moe.dispatcher":
        # a pair that changes only the backend (UCCL-EP against NVSHMEM) tests the backends'
        # kernel shares (ep_kernels), not the dispatcher a run chose: the report lists it,
        # the lever note does not
        found = [p for p in found if p["changed"] != ["moe.backend"]]
    s = by_knob(found).get(knob)
    if s is None:
        return None
    which = ("" if value is None else f" to or from {value}") + \
        ("" if efa is None else " with EP across AWS EFA nodes" if efa else " not across AWS EFA nodes")
    return (f"{LEVERS.get(knob, knob)}: on the published A/B pairs that change only it{which} "
            f"({', '.join(s['models'])}), the predicted ratio against the published one: {s['text']}; "
            "python -m mgbench.planner.moe_pairs lists them")


def lever_notes(opts: moe.MoeOptions, *, gpu_count: bool = False, system: str | None = None,
                ep: int | None = None) -> list[str]:
    """The :func:`lever_note` lines for what a run of an MoE model sets: a dispatcher other
    than all-to-all (its own pairs, those of the run's kind where ``system`` is a catalog
    one: expert parallelism of degree ``ep`` across AWS EFA nodes or not,
    hardware.ep_crosses_efa; all of them on a probed machine), CUDA graphs, and (``gpu_count``: plan, which chooses it) the
    GPU count."""
    asked = [(k, v) for k, v, on in (("moe.dispatcher", opts.dispatcher, opts.dispatcher != "alltoall"),
                                     ("moe.cuda_graphs", None, opts.cuda_graphs), ("num_gpus", None, gpu_count)) if on]
    if not asked:
        return []
    found = pairs()
    efa = ep_crosses_efa(system, ep)  # None on a probed machine: its fabric unknown
    return [n for n in (lever_note(k, found, v, efa if k == "moe.dispatcher" else None) for k, v in asked) if n]


def report(found: list[dict[str, Any]] | None = None) -> str:
    """The pairs and the per-knob summary, as text."""
    found = pairs() if found is None else found
    lines = [f"Published MoE A/B pairs (published_moe_runs.toml rows that differ in one knob; repeats left out): "
             f"tokens/s per GPU, second over first; a predicted ratio within {100 * BAND:.0f}% of the published "
             "one agrees", f"{'knob':<18} {'from -> to':<32} {'published':>9} {'predicted':>9}  verdict     pair"]
    for p in sorted(found, key=lambda p: (p["knob"], p["a"])):
        move = f"{p['from']} -> {p['to']}"
        lines.append(f"{p['knob']:<18} {move[:60]:<32} {p['published_ratio']:>9.3f} {p['predicted_ratio']:>9.3f}  "
                     f"{p['verdict']:<10}  {p['a']} / {p['b']}" + ("" if p["same_source"] else " (different sources)"))
    lines += [f"{knob}: {s['text']}" for knob, s in by_knob(found).items()]
    return "\n".join(lines)


def markdown(found: list[dict[str, Any]] | None = None) -> str:
    """The per-knob summary and the pairs as a Markdown table (docs/planner.md)."""
    found = pairs() if found is None else found
    lines = ["| knob | from -> to | published | predicted | verdict | pair |", "|---|---|---|---|---|---|"]
    for p in sorted(found, key=lambda p: (p["knob"], p["a"])):
        note = "" if p["same_source"] else " (different sources)"
        lines.append(f"| {p['knob']} | {p['from']} -> {p['to']} | {p['published_ratio']:.3f} | "
                     f"{p['predicted_ratio']:.3f} | {p['verdict']} | `{p['a']}` / `{p['b']}`{note} |")
    lines.append("")
    lines += [f"- {knob}: {s['text']}" for knob, s in by_knob(found).items()]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m mgbench.planner.moe_pairs
    print(report())


def evidence_notes(shape: Any, opts: moe.MoeOptions, *, system: str | None = None, ep: int | None = None,
                   gpu_count: bool = False) -> list[str]:
    """predict's and plan's evidence lines for a run of an MoE model, in one place: how the
    planner did on the model's published runs of the run's kind
    (moe_validation.model_record_note), on a GPU that is not NVIDIA's what the published runs
    of its vendor say of the host constants solved on NVIDIA's (moe_validation.
    vendor_record_note), how its all-to-all price did against nccl-tests where the run's
    expert parallelism uses NCCL's all-to-all (collective_validation.a2a_record_note), the
    rate a named DeepEP-style backend was priced at (ep_kernels.backend_note), and the
    published A/B pairs of the levers it sets (:func:`lever_notes`; ``gpu_count``: plan,
    which chooses it)."""
    from .collective_validation import a2a_record_note
    from .ep_kernels import backend_note

    crosses = ep_crosses_efa(system, ep)
    a2a = a2a_record_note(opts.dispatcher, ep)
    kernels = backend_note(opts.backend, crosses, opts.dispatcher)
    vendor = moe_validation.vendor_record_note(system, opts.cuda_graphs)
    return ([moe_validation.model_record_note(shape, opts.cuda_graphs, crosses)]
            + [n for n in (vendor, a2a, kernels) if n] + lever_notes(opts, gpu_count=gpu_count, system=system, ep=ep))
