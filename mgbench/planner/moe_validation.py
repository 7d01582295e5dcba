"""Predictions against published mixture-of-experts training throughput
(data/published_moe_runs.toml; issue 26, item 5).

Every row is predicted through the path `mgbench predict` takes: resolve.resolve (the
catalog system at the row's precision, the row's stack, Megatron-LM unless it names another) and predict.predict (the
layout's rules, the step model, the memory), with the row's MoE options (moe.MoeOptions:
routing, dispatcher, node limit, FP8 dispatch, overlap, recomputed modules) given to
predict. A row whose layout predict
refuses is reported with the refusal, not left out.

Fit and held-out rows are scored apart (mean and worst |error|); the split follows the
rule in the data file's header, fixed before the rows were predicted, and nothing is
fitted to a held-out row (the MoE terms' constants are sourced in planner/moe.py).

    python -m mgbench.planner.moe_validation   # prints the table
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from statistics import mean, median
from typing import Any

from .. import catalog
from ..errors import MgbenchError
from ..layout import Layout, fp8_attention_problem
from ..model_shape import ModelShape
from . import ep_kernels, hardware, moe, perf
from .memory import rank_runs, stage_layers
from .splits import SPLITS, alternating
from .stack import row_state_bytes

# The acceptance (26): mean |error| under 15% and none over 30%, on the fit and the
# held-out rows alike.
TARGET_MEAN_PCT = 15.0
TARGET_WORST_PCT = 30.0
# A row whose source states its layout two ways (the table one, the recipe at the
# release's tag another) cannot score the model: it is printed priced both ways
# (``layout_conflict`` names the other layout's fields) and counted in neither split.
UNSCORED = "unscored"
LAYOUT_FIELDS = ("tp", "pp", "ep", "cp", "virtual_stages", "micro_batch", "global_batch", "num_gpus")
REQUIRED = ("id", "system", "model", "seq", "num_gpus", "tp", "pp", "ep", "micro_batch", "global_batch", "zero",
            "recompute", "precision", "routing", "dispatcher", "published", "split", "source", "date")
# A row's stack (data/stacks.toml) where it names one; Megatron-Bridge is Megatron-Core, and
# DeepSeek's HAI-LLM is priced as it.
STACK = "megatron-lm"


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    return catalog.load("published_moe_runs.toml")


def split_rule(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The split the data file's header states: a row whose source states two layouts
    (``layout_conflict``) is unscored; rows seen before it was written (``seen_before``)
    are fit; rows added after the host launch term was built (``added_after_host_term``)
    are all held out; the Blackwell Ultra rows of the tenth session (``added_as_fit``)
    are all fit; rows added from the seventeenth session on (``added_alternating``)
    alternate among themselves in file order, fit first; the others alternate in file
    order, held_out first (an unscored row among them keeps its turn, so the rows after it
    keep their split)."""
    out, i, j = {}, 0, 0
    for r in rows:
        if r.get("added_alternating"):
            out[r["id"]] = UNSCORED if r.get("layout_conflict") else alternating(j, "fit")
            j += 1
            continue
        if r.get("added_as_fit"):
            out[r["id"]] = UNSCORED if r.get("layout_conflict") else "fit"
            continue
        if r.get("layout_conflict"):
            out[r["id"]] = UNSCORED
            if not r.get("seen_before") and not r.get("added_after_host_term"):
                i += 1
            continue
        if r.get("seen_before"):
            out[r["id"]] = "fit"
            continue
        if r.get("added_after_host_term"):
            out[r["id"]] = "held_out"
            continue
        out[r["id"]] = alternating(i, "held_out")
        i += 1
    return out


def check_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, or MgbenchError naming every row that lacks a field, splits against the
    rule, or names MoE options that do not parse."""
    problems = []
    rule = split_rule(rows)
    for r in rows:
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            problems.append(f"{r.get('id', '?')}: missing {', '.join(missing)}")
            continue
        if (recipe := perf.row_recipe_problem(r)) is not None:
            problems.append(f"{r['id']}: {recipe}")
        if r.get("added_as_fit") and (r.get("added_after_host_term") or r.get("seen_before")):
            problems.append(f"{r['id']}: added_as_fit with added_after_host_term or seen_before: one split rule a row")
        if r["split"] != rule[r["id"]]:
            problems.append(f"{r['id']}: split {r['split']!r}, but the header's rule gives {rule[r['id']]!r}")
        try:
            moe.options_of(r)
            row_state_bytes(r)
        except MgbenchError as exc:
            problems.append(f"{r['id']}: {exc}")
        problems += [f"{r['id']}: {p}" for p in conflict_problems(r)]
        if (fused := fused_mlp_problem(r)) is not None:
            problems.append(f"{r['id']}: {fused}")
        if (attention := fp8_attention_row_problem(r)) is not None:
            problems.append(f"{r['id']}: {attention}")
        unpriced = r.get("unpriced_settings")
        if unpriced is not None and (not isinstance(unpriced, dict) or not unpriced
                                     or not all(isinstance(v, str) for v in unpriced.values())):
            problems.append(f"{r['id']}: unpriced_settings must be a table of the settings the source varies, "
                            f"each a string, got {unpriced!r}")
    if problems:
        raise MgbenchError("published_moe_runs.toml: " + "; ".join(problems))
    return rows


def fp8_attention_row_problem(row: dict[str, Any]) -> str | None:
    """Why a row's ``fp8_attention`` cannot stand: not a boolean, set on a row that does not
    train in FP8, or without ``fp8_attention_source`` (the recipe line that sets it); None
    where it can."""
    on = row.get("fp8_attention", False)
    if not isinstance(on, bool):
        return f"fp8_attention must be true or false, got {on!r}"
    if not on:
        return None
    if (why := fp8_attention_problem(row.get("precision", ""), True, row.get("fp8_recipe"))) is not None:
        return why.replace("--fp8-attention", "fp8_attention").replace("--precision fp8", "precision fp8")
    if not row.get("fp8_attention_source"):
        return "fp8_attention without fp8_attention_source: name the recipe or config line that sets it"
    return None


def fused_mlp_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a row's ``fused_grouped_mlp`` (the header's rule): the CuteDSL
    kernel takes MXFP8 on Blackwell only, so a row that states it runs FP8 on a GPU with
    MX formats; ``fused_grouped_mlp_source`` only beside it."""
    if row.get("fused_grouped_mlp_source") is not None and not row.get("fused_grouped_mlp"):
        return "fused_grouped_mlp_source without fused_grouped_mlp = true"
    if not row.get("fused_grouped_mlp"):
        return None
    from .hardware import systems

    shape = shape_of(row)
    if not (shape.expert_bias or shape.glu_clamp is not None):
        return f"fused_grouped_mlp on {row['model']}, whose experts have no epilogue for it to fuse (the header's rule)"
    gpu = systems()[row["system"]]["gpu"]
    problem = moe.fused_grouped_mlp_problem(gpu, row.get("precision", ""), row.get("fp8_recipe"))
    return None if problem is None else f"fused_grouped_mlp: {problem}"


# A layout_conflict's keys that are not layout fields: where the two statements disagree,
# and (where it was not the 2026-11-27 application to rows whose errors were known) when the
# rule was applied to the row.
CONFLICT_NOTES = ("why", "applied")
CONFLICT_APPLIED = "on 2026-11-27, its tabled error known"


def conflict_problems(row: dict[str, Any]) -> list[str]:
    """What is wrong with a row's ``layout_conflict`` (a table: ``why``, and the layout
    fields the other statement gives, each differing from the row's own)."""
    c = row.get("layout_conflict")
    if c is None:
        return []
    if not isinstance(c, dict) or not isinstance(c.get("why"), str):
        return ["layout_conflict is a table with a 'why' (where the two statements disagree)"]
    if not isinstance(c.get("applied", ""), str):
        return ["layout_conflict's 'applied' is text: when the rule was applied to the row, and what was known then"]
    fields = {k: v for k, v in c.items() if k not in CONFLICT_NOTES}
    bad = sorted(k for k in fields if k not in LAYOUT_FIELDS)
    if bad or not fields:
        return [f"layout_conflict names {', '.join(bad) or 'no layout field'}; "
                f"give one or more of {', '.join(LAYOUT_FIELDS)}"]
    return [f"layout_conflict's {k} = {v!r} is the row's own" for k, v in fields.items() if row.get(k) == v]


def conflicting(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row as its other statement lays it out (``layout_conflict`` applied), or None
    where its source states one layout."""
    c = row.get("layout_conflict")
    if c is None:
        return None
    other = {**row, **{k: v for k, v in c.items() if k not in CONFLICT_NOTES}}
    if "pp" in c and "pp_last_layers" not in c:  # the row's last-stage split is its own layout's
        other.pop("pp_last_layers", None)
    return other


@lru_cache(maxsize=1)
def _checked() -> tuple[dict[str, Any], ...]:
    return tuple(check_rows(list(_data()["runs"])))


def runs() -> list[dict[str, Any]]:
    """Every row of published_moe_runs.toml, checked (once a process)."""
    return list(_checked())


def stack_of(row: dict[str, Any]) -> str:
    """The stack the row is priced on (STACK where it names none), which also names its
    interval class (moe.moe_class)."""
    return str(row.get("stack", STACK))


def shape_of(row: dict[str, Any]) -> ModelShape:
    """The row's model: a models.toml preset, with ``model_overrides`` applied (the string
    "none" unsets an optional dimension, which TOML cannot write as null: torchtitan's
    q_lora_rank = 0, queries projected directly)."""
    shape = catalog.model_shape(row["model"])
    overrides = {k: (None if v == "none" else v) for k, v in row.get("model_overrides", {}).items()}
    return dataclasses.replace(shape, **overrides)


def predict_row(row: dict[str, Any], options: moe.MoeOptions | None = None) -> dict[str, Any]:
    """`mgbench predict`'s answer for the row, with its MoE options (``options`` replaces
    them: for tests and what-ifs)."""
    from .predict import predict
    from .resolve import resolve

    hw = resolve(precision=row["precision"], system=row["system"], stack=stack_of(row))
    return predict(shape_of(row), hw, Layout.from_published(row), moe=options or moe.options_of(row),
                   state_bytes=row_state_bytes(row))


def score(row: dict[str, Any], options: moe.MoeOptions | None = None) -> dict[str, Any]:
    """One row: published and predicted tokens/s per GPU and the error (predicted -
    published) / published in %, or the refusal (``error_pct`` None) where predict
    refuses the layout; for a row stated two ways, ``other`` scores its other layout."""
    pub = float(row["published"])
    out = {"id": row["id"], "split": row["split"], "system": row["system"], "model": row["model"],
           "published": pub, "predicted": None, "error_pct": None, "refused": None, "terms": {}}
    if (alt := conflicting(row)) is not None:
        other = score({**alt, "layout_conflict": None}, options)
        out["other"] = {"layout": {k: v for k, v in row["layout_conflict"].items() if k not in CONFLICT_NOTES},
                        "why": row["layout_conflict"]["why"],
                        "applied": row["layout_conflict"].get("applied", CONFLICT_APPLIED), "predicted": other["predicted"],
                        "error_pct": other["error_pct"], "refused": other["refused"]}
    try:
        res = predict_row(row, options)
    except MgbenchError as exc:
        out["refused"] = str(exc)
        return out
    pred = float(res["tokens_per_s_per_gpu"])
    b = res["breakdown"]
    mem = res["memory"]
    out.update(predicted=pred, error_pct=100.0 * (pred - pub) / pub, fits=res["fits"],
               memory_gb=mem["total_bytes"] / 1e9, allowance_gb=mem["allowance_bytes"] / 1e9,
               device_gb=res["device_memory_bytes"] / 1e9,
               terms={k: float(b[k]) for k in ("compute_s", "bubble_s", "ep_a2a_s", "ep_comm_s", "moe_imbalance_s",
                                               "moe_recompute_s", "moe_permute_s", "moe_host_s", "moe_efa_notify_s",
                                               "exposed_dp_comm_s",
                                               "tp_comm_s", "pp_comm_s")} | {"step_time_s": float(res["step_time_s"])})
    return out


def published_step_s(row: dict[str, Any]) -> float:
    """The row's published step in seconds: its global batch's tokens over its published
    tokens/s per GPU times its GPUs."""
    return row["global_batch"] * row["seq"] / (row["published"] * row["num_gpus"])


def host_fit_rows() -> list[dict[str, Any]]:
    """The rows the host launch constants are solved from: the "fit" rows of this file
    that accelerator_runs.toml does not hold out (a row both files carry is fitted only
    where neither holds it out), run on Megatron-Core (the constants are its MoE layer's:
    another stack's rows set that stack's own term, moe.host_seconds), on NVIDIA GPUs
    (:func:`on_nvidia`), and whose expert parallelism stays off EFA: a launch constant is a host and GPU property, and a row
    across EFA nodes would move it by what EFA's own network terms miss (rules of
    2026-11-28, docs/planner.md; no fit row of another stack or across EFA existed before)."""
    # accelerator_runs.toml's split labels (accelerator_validation checks them against its
    # rule; it imports this module, so the file is read here)
    held = {r["id"] for r in catalog.load("accelerator_runs.toml")["runs"] if r["split"] == "held_out"}
    return [r for r in runs() if r["split"] == "fit" and r["id"] not in held and stack_of(r) == STACK
            and on_nvidia(r) and not hardware.ep_crosses_efa(r["system"], r["ep"])]


def vendor_of(row: dict[str, Any]) -> str | None:
    """The vendor of the GPUs the row ran on (catalog.accelerator_vendor)."""
    return catalog.accelerator_vendor(catalog.systems()[row["system"]]["gpu"])


def on_nvidia(row: dict[str, Any]) -> bool:
    """Whether the row ran on NVIDIA GPUs: the host constants are CUDA launch and
    Megatron-Core host costs, so only such rows solve them (rule of 2026-11-29 for the AMD
    Instinct rows, published_moe_runs.toml's header: HIP's launch costs are not known to be
    CUDA's)."""
    return vendor_of(row) == "nvidia"


def row_stage_moe_layers(row: dict[str, Any]) -> float:
    """The MoE layers of the busiest pipeline stage of ``row``, as the step model counts them
    (ModelShape.stage_moe_layers over the first stage's blocks, in the runs a rank holds:
    memory.rank_runs)."""
    shape = shape_of(row)
    lps = float(stage_layers(shape.layers, row.get("pp", 1), row.get("pp_last_layers"))[0])
    runs_a_rank = rank_runs(row.get("pp", 1), row.get("schedule", "1f1b"), row.get("virtual_stages", 1))
    return float(shape.stage_moe_layers(lps, runs_a_rank))


def host_terms(row: dict[str, Any]) -> tuple[float, float, float]:
    """(step seconds without the host term, d step / d per_layer_ms (its dispatcher's), d step /
    d per_local_expert_ms) of a row run eagerly: its step is linear in both constants
    (moe.host_seconds, the bubble's share included), so one prediction gives every
    candidate's step. (A graphed row pays the stored share of its kind of that eager wait:
    moe.graphed_share_key.)"""
    res = predict_row(row)
    b = res["breakdown"]
    n, n_local = moe.host_launches(shape_of(row), ep=row["ep"], moe_layers=row_stage_moe_layers(row),
                                   num_micro=res["num_micro_batches"], rerun=b["moe_rerun_share"])
    def wait(launches: float) -> float:  # the step's wait for that many ms of host time (moe.host_wait)
        return float(moe.host_wait(launches * 1e-3, bubble_fraction=b["bubble_fraction"]))

    return float(res["step_time_s"]) - float(b["moe_host_s"]), wait(float(n)), wait(float(n_local))


def solve_host(rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The host constants with the least mean |error| of tokens/s over ``rows`` (the
    eager ones of :func:`host_fit_rows`; a graphed row's step depends on the share too): ``per_layer_ms``, one value for each dispatcher the rows run
    (moe.DISPATCHERS), on a 0.05 ms grid, and ``per_local_expert_ms``, shared, on a
    0.005 ms grid; all non-negative. A row's step depends on its own dispatcher's constant
    only, so for each per-expert value every dispatcher's is solved on its own rows.
    A dispatcher that no row runs gets no constant (the stored file must give one:
    moe.host_constants refuses a missing one)."""
    import numpy as np

    rows = [r for r in host_fit_rows() if not moe.options_of(r).cuda_graphs] if rows is None else rows
    terms = np.array([host_terms(r) for r in rows])
    dispatchers = [moe.options_of(r).dispatcher for r in rows]
    pub = np.array([published_step_s(r) for r in rows])
    c0 = np.arange(0.0, 20.0001, 0.05)[:, None, None]
    c1 = np.arange(0.0, 2.0001, 0.005)[None, :, None]
    step = terms[:, 0] + c0 * terms[:, 1] + c1 * terms[:, 2]
    err = np.abs(pub / step - 1.0)  # per-layer value x per-expert value x row
    best: dict[str, Any] = {}
    total = np.zeros(err.shape[1])
    for d in sorted(set(dispatchers)):
        own = err[:, :, [k for k, x in enumerate(dispatchers) if x == d]].sum(axis=2)
        best[d] = own.argmin(axis=0)  # the dispatcher's best per-layer value, per per-expert value
        total = total + own.min(axis=0)
    j = int(np.argmin(total))
    return {"per_layer_ms": {d: round(float(c0[best[d][j], 0, 0]), 3) for d in best},
            "per_local_expert_ms": round(float(c1[0, j, 0]), 3),
            "mean_abs_pct": 100.0 * float(total[j]) / len(rows), "rows": [r["id"] for r in rows]}


def implied_host_ms(row: dict[str, Any], terms: tuple[float, float, float] | None = None) -> float | None:
    """The host time one MoE layer pass of an eager row would have to cost, in ms a
    per-layer unit (:func:`host_terms`: the bubble's stretch and a recomputed forward's
    launches counted), for the model's step to equal the published one: (published step -
    host-free step) / d step per ms. Negative where the model is slower than the row
    without any host term. None for a graphed row (it pays the stored graphed share, not the eager term). What the eighth
    session's per-dispatcher constants were read from (docs/planner.md). ``terms``: the
    row's :func:`host_terms`, where the caller has them."""
    if moe.options_of(row).cuda_graphs:
        return None
    base, per_ms, _ = host_terms(row) if terms is None else terms
    return (published_step_s(row) - base) / per_ms


def implied_host_report(rows: list[dict[str, Any]] | None = None) -> str:
    """Each eager row's :func:`implied_host_ms` beside what the model charges it a pass
    (its dispatcher's per-layer constant and its local experts'), by dispatcher."""
    c = moe.host_constants()
    solved = {r["id"] for r in host_fit_rows()}
    rows = [r for r in (runs() if rows is None else rows) if r["split"] in SPLITS and not moe.options_of(r).cuda_graphs]
    lines = [f"{'run':<52}  {'split':<9}  {'dispatcher':<10}  {'mb':>2}  {'implied':>8}  {'charged':>8}   "
             "(ms a MoE layer pass, eager rows)"]
    for r in sorted(rows, key=lambda r: (moe.options_of(r).dispatcher, r["split"], r["id"])):
        d = moe.options_of(r).dispatcher
        terms = host_terms(r)
        charged = c["per_layer_ms"][d] + c["per_local_expert_ms"] * terms[2] / terms[1]
        split = r["split"] + ("*" if r["id"] in solved else "")
        lines.append(f"{r['id']:<52}  {split:<9}  {d:<10}  {r['micro_batch']:>2}  "
                     f"{implied_host_ms(r, terms):>8.2f}  {charged:>8.2f}")
    lines.append("* a row the host constants are solved from (solve_host); charged: the dispatcher's per-layer "
                 "constant and the local experts', in the same unit")
    return "\n".join(lines)


def torchtitan_rows(split: str) -> list[dict[str, Any]]:
    """The eager torchtitan rows of ``split`` (the ones ``torchtitan_extra_ms`` prices in
    full; a graphed one would pay the graphed share of it)."""
    return [r for r in runs() if r["split"] == split and stack_of(r) == "torchtitan"
            and not moe.options_of(r).cuda_graphs]


def torchtitan_extra_terms(row: dict[str, Any]) -> tuple[float, float]:
    """(step seconds without ``torchtitan_extra_ms``, d step / d torchtitan_extra_ms) of a
    torchtitan row run eagerly: the extra adds to its dispatcher's per-layer constant, so
    the derivative is the host term's per-layer unit (:func:`host_terms`)."""
    per_ms = host_terms(row)[1]
    return float(predict_row(row)["step_time_s"]) - float(moe.host_constants()["torchtitan_extra_ms"]) * per_ms, per_ms


def solve_torchtitan_extra(rows: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The stored ``torchtitan_extra_ms`` (stacks.toml [moe_host]) with the least mean
    |error| of tokens/s over ``rows`` (:func:`torchtitan_rows` of the fit split), on a
    0.05 ms grid from minus the smallest per-layer constant to 20 ms, every other constant
    at its stored value (rule of 2026-11-28, docs/planner.md); None where there is no row."""
    import numpy as np

    rows = torchtitan_rows("fit") if rows is None else rows
    if not rows:
        return None
    terms = np.array([torchtitan_extra_terms(r) for r in rows])
    low = -min(float(v) for v in moe.host_constants()["per_layer_ms"].values())
    value, pct = least_error(terms[:, 0], terms[:, 1], [published_step_s(r) for r in rows],
                             np.round(np.arange(low, 20.0 + 1e-9, 0.05), 2))
    return {"torchtitan_extra_ms": value, "mean_abs_pct": pct, "rows": [r["id"] for r in rows]}


def term_errors(parts: dict[str, list[dict[str, Any]]], terms: Any, value: float) -> dict[str, dict[str, Any]]:
    """For each named list of rows: its count and mean |error| of tokens/s without a term
    the step is linear in and with it at ``value`` (``terms(row)``: the step without it and
    its derivative)."""
    out = {}
    for name, rows in parts.items():
        without, with_term = [], []
        for r in rows:
            base, per = terms(r)
            pub = published_step_s(r)
            without.append(abs(pub / base - 1.0) * 100.0)
            with_term.append(abs(pub / (base + value * per) - 1.0) * 100.0)
        out[name] = {"rows": len(rows), "without": mean(without) if rows else None,
                     "with": mean(with_term) if rows else None}
    return out


def torchtitan_extra_summary(value: float | None = None) -> dict[str, dict[str, Any]]:
    """Per split, over the eager torchtitan rows (:func:`term_errors`), at ``value`` (None:
    the stored one); "held_out_plain" leaves out the held-out rows that re-measure a fit
    row's configuration or offload to the host (whose miss is the host optimizer step, not
    priced)."""
    value = float(moe.host_constants()["torchtitan_extra_ms"]) if value is None else float(value)
    fit_configs = {configuration(r) for r in torchtitan_rows("fit")}
    parts = {split: torchtitan_rows(split) for split in SPLITS}
    parts["held_out_plain"] = [r for r in parts["held_out"]
                               if configuration(r) not in fit_configs and not r.get("offload")]
    return term_errors(parts, torchtitan_extra_terms, value)


def torchtitan_extra_report() -> str:
    """The stored constant, what the solve gives, and each split's error without it and with
    the solved value."""
    now = float(moe.host_constants()["torchtitan_extra_ms"])
    solved = solve_torchtitan_extra()
    if solved is None:
        return f"torchtitan_extra_ms stored {now:g}; no fit row to solve it from"
    lines = [f"torchtitan_extra_ms stored {now:g}; solved {solved['torchtitan_extra_ms']:g} over "
             f"{len(solved['rows'])} fit rows ({', '.join(solved['rows'])})"]
    for name, s in torchtitan_extra_summary(solved["torchtitan_extra_ms"]).items():
        if s["rows"]:
            lines.append(f"{name}: {s['rows']} rows, mean |error| {s['without']:.1f}% without the term, "
                         f"{s['with']:.1f}% at the solved value")
    return "\n".join(lines)


# The ROCm host factor's grid (rule of 2026-11-29, docs/planner.md: 1.0 to 4.0 by 0.05).
ROCM_FACTOR_GRID = (1.0, 4.0, 0.05)


def rocm_rows(split: str) -> list[dict[str, Any]]:
    """The eager Megatron-Core rows of ``split`` run on AMD Instinct GPUs (:func:`vendor_of`):
    the rows a ROCm host factor would apply to."""
    return [r for r in runs() if r["split"] == split and stack_of(r) == STACK and vendor_of(r) == "amd"
            and not moe.options_of(r).cuda_graphs]


def rocm_host_terms(row: dict[str, Any]) -> tuple[float, float]:
    """(step seconds without the host term, the host term's seconds at the stored constants,
    as predict reports it: moe.host_seconds and the bubble's share) of ``row``: a factor on
    the host term (the ROCm form the rule tests) makes the step base + factor x that."""
    res = predict_row(row)
    host = float(res["breakdown"]["moe_host_s"])
    return float(res["step_time_s"]) - host, host


def solve_rocm_host_factor(rows: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The factor on the eager host term (:func:`rocm_host_terms`) with the least mean |error|
    of tokens/s over ``rows`` (:func:`rocm_rows` of the fit split) on :data:`ROCM_FACTOR_GRID`,
    the NVIDIA constants held; None where there is no row."""
    import numpy as np

    rows = rocm_rows("fit") if rows is None else rows
    if not rows:
        return None
    terms = np.array([rocm_host_terms(r) for r in rows])
    low, high, by = ROCM_FACTOR_GRID
    value, pct = least_error(terms[:, 0], terms[:, 1], [published_step_s(r) for r in rows],
                             np.round(np.arange(low, high + 1e-9, by), 2))
    return {"factor": value, "mean_abs_pct": pct, "rows": [r["id"] for r in rows]}


def factor_adopted(before: list[float], after: list[float]) -> bool:
    """The rule's gate for a term tested on held-out rows (|error| in %, row by row, without
    and with it): their mean falls, and no row that was within :data:`TARGET_WORST_PCT` goes
    over it."""
    if not before or len(before) != len(after):
        return False
    crossed = any(b <= TARGET_WORST_PCT < a for b, a in zip(before, after))
    return mean(after) < mean(before) and not crossed


def rocm_host_report() -> str:
    """The ROCm host factor solved on the AMD fit rows, each AMD row's error without it and
    with it, and the rule's verdict on the held-out rows (:func:`factor_adopted`)."""
    solved = solve_rocm_host_factor()
    if solved is None:
        return "no AMD fit row to solve a ROCm host factor from"
    f = solved["factor"]
    lines = [f"ROCm host factor solved {f:g} over {len(solved['rows'])} AMD fit rows (grid {ROCM_FACTOR_GRID[0]:g} to "
             f"{ROCM_FACTOR_GRID[1]:g} by {ROCM_FACTOR_GRID[2]:g}); not in the planner unless the rule's gate passes"]
    verdict = None
    for split in SPLITS:
        before, after = [], []
        for r in rocm_rows(split):
            base, host = rocm_host_terms(r)
            pub = published_step_s(r)
            # signed as everywhere: (predicted - published) / published tokens/s, + too fast
            was, now = (pub / (base + host) - 1.0) * 100.0, (pub / (base + f * host) - 1.0) * 100.0
            before.append(abs(was))
            after.append(abs(now))
            lines.append(f"  {split:<8} {r['id']:<52} {was:+6.1f}% -> {now:+6.1f}%")
        if before:
            lines.append(f"{split.replace('_', ' ')}: {len(before)} rows, mean |error| {mean(before):.1f}% -> "
                         f"{mean(after):.1f}%, over {TARGET_WORST_PCT:g}%: {sum(e > TARGET_WORST_PCT for e in before)} -> "
                         f"{sum(e > TARGET_WORST_PCT for e in after)}")
        if split == "held_out":
            verdict = factor_adopted(before, after)
    lines.append(f"rule's gate on the held-out rows: {'adopted' if verdict else 'not adopted'}")
    return "\n".join(lines)


def efa_notify_terms(row: dict[str, Any]) -> tuple[float, float]:
    """(step seconds without the EFA proxy notify term, d step / d efa_proxy_notify_ms) of
    ``row``: its step is linear in the constant (moe.efa_notify_seconds, the bubble's
    stretch included), so one prediction gives every candidate's step. The derivative is 0
    where the term does not apply (moe.efa_notify_launches)."""
    res = predict_row(row)
    b = res["breakdown"]
    hw = hardware.resolve(row["system"])
    n = moe.efa_notify_launches(ep=row["ep"], gpus_per_node=hw.gpus_per_node, across_efa=ep_kernels.talks_over_efa(hw),
                                moe_layers=row_stage_moe_layers(row), num_micro=res["num_micro_batches"],
                                opts=moe.options_of(row), rerun=b["moe_rerun_share"])
    per_ms = float(moe.host_wait(float(n) * 1e-3, bubble_fraction=b["bubble_fraction"]))
    return float(res["step_time_s"]) - float(b["moe_efa_notify_s"]), per_ms


def efa_notify_rows(split: str) -> list[dict[str, Any]]:
    """The rows of ``split`` the EFA proxy notify term applies to (DeepEP-style dispatch
    through a CPU proxy across EFA nodes: moe.efa_notify_launches)."""
    return [r for r in runs() if r["split"] == split and efa_notify_terms(r)[1] > 0.0]


def solve_efa_notify(rows: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The stored ``efa_proxy_notify_ms`` (stacks.toml [moe_host]) with the least mean
    |error| of tokens/s over ``rows`` (the fit rows it applies to: :func:`efa_notify_rows`),
    on a 0.1 ms grid from 0 to 20 ms, every other constant at its stored value (rule of
    2026-11-28, docs/planner.md); None where there is no row."""
    import numpy as np

    rows = efa_notify_rows("fit") if rows is None else rows
    if not rows:
        return None
    terms = np.array([efa_notify_terms(r) for r in rows])
    value, pct = least_error(terms[:, 0], terms[:, 1], [published_step_s(r) for r in rows],
                             np.round(np.arange(0.0, 20.0 + 1e-9, 0.1), 1))
    return {"efa_proxy_notify_ms": value, "mean_abs_pct": pct, "rows": [r["id"] for r in rows]}


def efa_notify_summary() -> dict[str, dict[str, Any]]:
    """Per split, over the rows the EFA proxy notify term applies to: rows, and mean |error|
    of tokens/s without the term and with it at the stored value; "held_out_new": the
    held-out rows found after its rule was written (the others' errors, every one too fast,
    were in view: on them any small value lowers every error, so their fall is no test)."""
    parts = {split: efa_notify_rows(split) for split in SPLITS}
    parts["held_out_new"] = [r for r in parts["held_out"] if r.get("added_alternating")]
    return term_errors(parts, efa_notify_terms, float(moe.host_constants()["efa_proxy_notify_ms"]))


def efa_notify_report() -> str:
    """The stored constant, what the solve gives, and each split's error without and with it."""
    c = float(moe.host_constants()["efa_proxy_notify_ms"])
    solved = solve_efa_notify()
    lines = [f"efa_proxy_notify_ms stored {c:g}; solved "
             + ("- (no fit row)" if solved is None else
                f"{solved['efa_proxy_notify_ms']:g} over {len(solved['rows'])} fit rows ({', '.join(solved['rows'])})")]
    for split, s in efa_notify_summary().items():
        if s["rows"]:
            lines.append(f"{split}: {s['rows']} rows, mean |error| {s['without']:.1f}% without the term, "
                         f"{s['with']:.1f}% with it")
    return "\n".join(lines)


def graphed_host_share(row: dict[str, Any]) -> float:
    """Of a graphed row (its MoE layers in CUDA graphs), the share of the eager host term
    (the same row priced eagerly) its published step pays: 0 where it ran as fast as the
    host-free pricing, 1 where it ran as slowly as the eager one (the stored share of its
    kind, moe.graphed_share_key, prices it in between). (published step - host-free step) / (eager step - host-free
    step)."""
    if not moe.options_of(row).cuda_graphs:
        raise MgbenchError(f"{row['id']}: not a graphed row (cuda_graphs false)")
    return (published_step_s(row) - host_terms(row)[0]) / eager_host_wait(row)


def eager_host_wait(row: dict[str, Any]) -> float:
    """The seconds a row's step would wait on the host run eagerly (moe_host_s of the row
    priced with cuda_graphs off), at the stored constants."""
    opts = dataclasses.replace(moe.options_of(row), cuda_graphs=False)
    return float(predict_row(row, opts)["breakdown"]["moe_host_s"])


def graphed_fit_rows(key: str = "graphed_share") -> list[dict[str, Any]]:
    """The rows a graphed share (``key``, moe.graphed_share_key) is solved from: the "fit"
    rows run in CUDA graphs whose share is that one (of :func:`host_fit_rows`, so none that
    another file holds out)."""
    return [r for r in host_fit_rows() if moe.options_of(r).cuda_graphs and graphed_key(r) == key]


def graphed_key(row: dict[str, Any]) -> str:
    """The stored share a graphed row's MoE layers keep: moe.graphed_share_key of its options."""
    return moe.graphed_share_key(moe.options_of(row))


def least_error(base: Any, per_unit: Any, published: Any, grid: Any) -> tuple[float, float]:
    """(value, mean |error| in %) of the ``grid`` value whose steps, ``base`` + value x
    ``per_unit`` a row (a constant the step is linear in), come closest to ``published``
    steps in mean |error| of tokens/s: the solve of every such stored constant."""
    import numpy as np

    g = np.asarray(grid, dtype=float)[:, None]
    err = np.abs(np.asarray(published) / (np.asarray(base) + g * np.asarray(per_unit)) - 1.0).mean(axis=1)
    j = int(np.argmin(err))
    return float(g[j, 0]), 100.0 * float(err[j])


def solve_graphed_share(rows: list[dict[str, Any]] | None = None, key: str = "graphed_share") -> dict[str, Any] | None:
    """The stored share ``key`` (stacks.toml [moe_host] graphed_share, dropless, or
    graphed_padded_share, drop-and-pad: moe.graphed_share_key) with the least mean |error|
    of tokens/s over ``rows`` (:func:`graphed_fit_rows` of that kind), on a 0.01 grid from
    0 to moe.MAX_GRAPHED_SHARE (the grid ran to 2 until the tenth session's solve gave
    1.15), the eager constants held at their stored values; None where there is no row."""
    import numpy as np

    rows = graphed_fit_rows(key) if rows is None else rows
    if not rows:
        return None
    share, pct = least_error([host_terms(r)[0] for r in rows], [eager_host_wait(r) for r in rows],
                             [published_step_s(r) for r in rows],
                             np.round(np.arange(0.0, moe.MAX_GRAPHED_SHARE + 1e-4, 0.01), 2))
    return {key: share, "mean_abs_pct": pct, "rows": [r["id"] for r in rows]}


def graphed_share_report() -> str:
    """Each scored graphed row's :func:`graphed_host_share`, and how many fall between the
    two pricings."""
    rows = [r for r in runs() if r["split"] in SPLITS and moe.options_of(r).cuda_graphs]
    kind = {r["id"]: f"{r['split']:<9} {'dropless' if graphed_key(r) == moe.GRAPHED_SHARE_KEYS[0] else 'drop-and-pad'}"
            for r in rows}
    shares = sorted((graphed_host_share(r), r["id"]) for r in rows)
    lines = [f"{i:<52}  {kind[i]:<22} {s:>5.2f}" for s, i in shares]
    inside = sum(0.0 <= s <= 1.0 for s, _ in shares)
    lines.append(f"{inside} of {len(shares)} graphed rows between their host-free and eager pricing; share of the eager "
                 f"host term paid: median {median(s for s, _ in shares):.2f}, "
                 f"{shares[0][0]:.2f} to {shares[-1][0]:.2f}")
    stored = moe.host_constants()
    for key in moe.GRAPHED_SHARE_KEYS:
        solved = solve_graphed_share(key=key)
        held = [r for r in rows if r["split"] == "held_out" and graphed_key(r) == key]
        held_said = (f"mean |error| {mean(abs(score(r)['error_pct']) for r in held):.1f}%" if held
                     else "none to test it")
        lines.append(f"{key}: stored {stored[key]:g}; solved on {len(solved['rows']) if solved else 0} fit rows "
                     + (f"{solved[key]:g} (mean |error| {solved['mean_abs_pct']:.1f}%)" if solved else "(none)")
                     + f"; {len(held)} held-out rows of the kind at the stored value: {held_said}")
    return "\n".join(lines)


def scored_rows(rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """:func:`score` of each of ``rows`` (None: every row of the file), afresh."""
    return [score(r) for r in (runs() if rows is None else rows)]


@lru_cache(maxsize=1)
def file_scores() -> tuple[dict[str, Any], ...]:
    """Every row of the file scored once a process: what predict and plan read (the MoE
    intervals, uncertainty.moe_residuals; the A/B pairs' notes, moe_pairs.pairs), which
    would otherwise score the file once each. Treat as read-only."""
    return tuple(scored_rows())


def model_of(shape: ModelShape) -> str | None:
    """The model of the published runs whose dimensions ``shape`` has (its name aside: a
    Hugging Face config read from any folder, a preset by any name): the preset a row
    names, matched against the preset and against each row's variant (model_overrides);
    None where no row's model has them, however the shape is named."""
    mine = dataclasses.replace(shape, name=None)
    models = {row["model"] for row in runs()}
    candidates = [(m, catalog.model_shape(m)) for m in sorted(models)] + [(r["model"], shape_of(r)) for r in runs()
                                                                         if r.get("model_overrides")]
    return next((m for m, c in candidates if dataclasses.replace(c, name=None) == mine), None)


# Dimensions whose override makes a row's model another model built from a preset's fields
# (torchtitan's 9.5B debug model, UCCL's 12-layer benchmark model), not a variant of it.
OTHER_MODEL_FIELDS = ("hidden", "experts")


def another_model(row: dict[str, Any]) -> bool:
    """Whether the row's ``model_overrides`` change the preset's width or expert count: a
    different model, left out of the preset's record (:func:`model_record`)."""
    return any(k in row.get("model_overrides", {}) for k in OTHER_MODEL_FIELDS)


def model_record(model: str, cuda_graphs: bool | None = None, efa: bool | None = None) -> dict[str, Any] | None:
    """How the planner did on ``model``'s scored published runs (fit and held out; a
    refused or unscored row has no error), its variants (rows with model_overrides that
    keep its width and experts) pooled, other models built from its fields left out: their count by split, the signed mean of the throughput errors (positive:
    predicted too fast), the mean |error| and the range; with ``cuda_graphs`` also the
    same over the runs whose MoE layers ran that way; with ``efa`` only the runs whose
    expert parallelism crossed nodes over AWS EFA (True) or the others (False:
    hardware.ep_crosses_efa), whose errors differ in kind (moe.moe_class). None
    where no run of the model is scored."""
    from .hardware import ep_crosses_efa

    by_id = {r["id"]: r for r in runs()}
    done = [s for s in file_scores() if s["model"] == model and s["split"] in SPLITS and s["error_pct"] is not None
            and not another_model(by_id[s["id"]])
            and (efa is None or ep_crosses_efa(by_id[s["id"]]["system"], by_id[s["id"]]["ep"]) == efa)]
    if not done:
        return None
    errs = [s["error_pct"] for s in done]
    out = {"model": model, "rows": len(done), "fit": sum(s["split"] == "fit" for s in done),
           "held_out": sum(s["split"] == "held_out" for s in done), "mean_pct": mean(errs),
           "mean_abs_pct": mean(abs(e) for e in errs), "low_pct": min(errs), "high_pct": max(errs),
           "variants": sum(1 for s in done if by_id[s["id"]].get("model_overrides"))}
    if cuda_graphs is not None:
        same = [s["error_pct"] for s in done if moe.options_of(by_id[s["id"]]).cuda_graphs == cuda_graphs]
        out["class_rows"] = len(same)
        out["class_mean_pct"] = mean(same) if same else None
    return out


def model_record_note(shape: ModelShape, cuda_graphs: bool | None = None, efa: bool | None = None) -> str:
    """predict's and plan's line on the published MoE runs of the model ``shape`` is
    (:func:`model_of`, :func:`model_record`): how far the planner was off on them, in
    which direction, so a reader can discount a prediction for a model it runs fast or
    slow on; ``efa``: only the runs of the prediction's kind (EP across AWS EFA nodes, or
    not)."""
    model = model_of(shape)
    rec = model_record(model, cuda_graphs, efa) if model is not None else None
    where = "" if efa is None else " with EP across AWS EFA nodes" if efa else " not across AWS EFA"
    if rec is None:
        return (f"{shape.name or 'this model'}: no scored published MoE run{where} has its dimensions "
                "(data/published_moe_runs.toml): the MoE terms are unchecked on this model")
    line = (f"{model} in the published MoE runs{where}: {rec['rows']} scored ({rec['fit']} fit, {rec['held_out']} held "
            f"out), predicted throughput {rec['mean_pct']:+.1f}% on average (mean |error| "
            f"{rec['mean_abs_pct']:.1f}%, {rec['low_pct']:+.1f}% to {rec['high_pct']:+.1f}%; positive: too fast)")
    if rec.get("class_rows"):
        what = "in CUDA graphs" if cuda_graphs else "eager"
        line += f"; the {rec['class_rows']} with MoE layers {what}: {rec['class_mean_pct']:+.1f}%"
    elif cuda_graphs is not None:
        line += f"; none with MoE layers {'in CUDA graphs' if cuda_graphs else 'eager'}"
    if rec["variants"]:
        line += f"; {rec['variants']} of the runs trained a variant of it (model_overrides), pooled"
    return line + " (python -m mgbench.planner.moe_validation)"


def vendor_record_note(system: str | None, cuda_graphs: bool = False) -> str | None:
    """predict's and plan's line where eager MoE layers run on a GPU that is not NVIDIA's:
    the host constants (moe.host_constants) were solved on NVIDIA rows only
    (:func:`host_fit_rows`) and are carried unchanged, and what the scored eager runs on that
    vendor's GPUs say of them, or that none tests them. None on NVIDIA GPUs, on a system
    the catalog lacks (a probed profile) and for layers in CUDA graphs (no host launches)."""
    systems = catalog.systems()
    gpu = systems[system]["gpu"] if system in systems else None
    vendor = catalog.accelerator_vendor(gpu)
    if cuda_graphs or vendor in (None, "nvidia"):
        return None
    by_id = {r["id"]: r for r in runs()}
    errs = [s["error_pct"] for s in file_scores() if s["split"] in SPLITS and s["error_pct"] is not None
            and vendor_of(by_id[s["id"]]) == vendor and not moe.options_of(by_id[s["id"]]).cuda_graphs]
    line = (f"MoE host time on {gpu} ({vendor}): the eager layers' launch constants were solved on NVIDIA GPUs "
            "(CUDA) only and are carried here unchanged")
    if not errs:
        return line + f"; no scored published run on {vendor} GPUs tests them (data/published_moe_runs.toml)"
    return (line + f"; the {len(errs)} scored eager published runs on {vendor} GPUs: predicted throughput "
            f"{mean(errs):+.1f}% on average (mean |error| {mean(abs(e) for e in errs):.1f}%, {min(errs):+.1f}% to "
            f"{max(errs):+.1f}%; positive: too fast; python -m mgbench.planner.moe_validation --rocm-host)")


# The fields that make two rows one configuration for the planner (with the MoE options,
# moe.options_of, which carry a row's dispatcher_backend as moe.backend): what it
# prices. Rows that differ only in who measured them, or when,
# are one configuration measured again.
CONFIG_FIELDS = ("system", "model", "model_overrides", "seq", "num_gpus", "tp", "pp", "cp", "ep", "etp", "schedule",
                 "virtual_stages", "pp_last_layers", "micro_batch", "global_batch", "zero", "recompute",
                 "precision", "fp8_recipe", "fp8_attention", "flash_attention", "stack", "sequence_parallel", "offload",
                 "optimizer")


def knobs(row: dict[str, Any]) -> dict[str, str]:
    """A row's configuration as named fields (:data:`CONFIG_FIELDS` and each MoE option,
    ``moe.<name>``), each value comparable as text (moe_pairs reads which one differs)."""
    out = {f: repr(row.get(f)) for f in CONFIG_FIELDS}
    out.update({f"moe.{k}": repr(v) for k, v in dataclasses.asdict(moe.options_of(row)).items()})
    return out


def configuration(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's configuration (:func:`knobs`), comparable and hashable."""
    return tuple(knobs(row).items())


def measurement(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's :func:`configuration` and the settings its source varied that the planner
    does not price (``unpriced_settings``): rows equal in it re-measure one run's setup
    (moe_pairs.repeat_spread), where rows equal only in their configuration are priced alike."""
    return configuration(row) + (("unpriced_settings", repr(row.get("unpriced_settings"))),)


def repeats(rows: list[dict[str, Any]]) -> set[str]:
    """Ids of the rows whose configuration an earlier row of the file already holds (MLPerf
    submitters running NVIDIA's recipe on the same system): the same prediction again."""
    seen, out = set(), set()
    for r in rows:
        c = configuration(r)
        if c in seen:
            out.add(r["id"])
        seen.add(c)
    return out


def meets_targets(abs_errors: list[float]) -> bool:
    """Whether errors (|%|) meet issue 26's targets: a mean under :data:`TARGET_MEAN_PCT`
    and none over :data:`TARGET_WORST_PCT`; not for no error at all."""
    return bool(abs_errors) and mean(abs_errors) < TARGET_MEAN_PCT and max(abs_errors) <= TARGET_WORST_PCT


def summary(scored: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Per split: rows, rows predicted, mean and worst |error|, the worst row, and whether
    the targets are met (a refused row fails them)."""
    scored = scored_rows() if scored is None else scored
    out = {}
    for split in SPLITS:
        sel = [r for r in scored if r["split"] == split]
        done = [r for r in sel if r["error_pct"] is not None]
        errs = [abs(r["error_pct"]) for r in done]
        worst = max(done, key=lambda r: abs(r["error_pct"])) if done else None
        m = mean(errs) if errs else None
        w = max(errs) if errs else None
        out[split] = {"rows": len(sel), "predicted": len(done), "refused": [r["id"] for r in sel if r["refused"]],
                      "mean_abs_pct": m, "worst_abs_pct": w, "worst_row": worst["id"] if worst else None,
                      "targets_met": len(done) == len(sel) and meets_targets(errs)}
    return out


def conflict_line(scored: dict[str, Any]) -> str:
    """What is said of an unscored row (a :func:`score` with ``other``): its error as
    its table lays it out and with its other layout, where the source states that one,
    and that the rule came after the error was known."""
    other = scored["other"]
    lay = ", ".join(f"{k} {v}" for k, v in other["layout"].items())

    def got(r: dict[str, Any]) -> str:
        return f"refused: {r['refused']}" if r["error_pct"] is None else f"{r['predicted']:.0f} ({r['error_pct']:+.1f}%)"

    return (f"unscored; as tabled {got(scored)}, with {lay} {got(other)}; {other['why']} (the rule that leaves such a "
            f"row unscored was applied to it {other['applied']})")


def report(scored: list[dict[str, Any]] | None = None) -> str:
    """The table, one row per published run and the per-split summary, as text (what
    validation_report prints)."""
    scored = scored_rows() if scored is None else scored
    head = (f"{'run':<42}  {'split':<8}  {'published':>9}  {'predicted':>9}  {'error':>7}  "
            f"{'compute':>8}  {'a2a':>7}  {'exposed':>7}  {'bubble':>7}")
    lines = ["Published MoE runs (published_moe_runs.toml): tokens/s per GPU; seconds a step: compute (MoE terms "
             "in it), all-to-all and what of it is exposed, bubble", head, "-" * len(head)]
    for r in scored:
        if r["error_pct"] is None:
            lines.append(f"{r['id']:<42}  {r['split']:<8}  {r['published']:>9.0f}  refused: {r['refused']}")
        else:
            t = r["terms"]
            lines.append(f"{r['id']:<42}  {r['split']:<8}  {r['published']:>9.0f}  {r['predicted']:>9.0f}  "
                         f"{r['error_pct']:>+6.1f}%  {t['compute_s']:>8.2f}  {t['ep_a2a_s']:>7.2f}  "
                         f"{t['ep_comm_s']:>7.2f}  {t['bubble_s']:>7.2f}")
        if "other" in r:
            lines.append("    " + conflict_line(r))
    for split, s in summary(scored).items():
        if s["predicted"]:
            lines.append(f"{split}: {s['predicted']} of {s['rows']} rows predicted, mean |error| "
                         f"{s['mean_abs_pct']:.1f}%, worst {s['worst_abs_pct']:.1f}% ({s['worst_row']}); targets "
                         f"(mean < {TARGET_MEAN_PCT:g}%, none over {TARGET_WORST_PCT:g}%) "
                         f"{'met' if s['targets_met'] else 'NOT met'}"
                         + (f"; refused: {', '.join(s['refused'])}" if s["refused"] else ""))
        else:
            lines.append(f"{split}: no row predicted")
    lines.append(distinct_line(scored))
    lines.append(fabric_line(scored))
    lines.append(stack_line(scored))
    return "\n".join(lines)


def distinct_line(scored: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> str:
    """The held-out figure with one row per configuration (:func:`repeats` left out), since
    repeats of a configuration get its prediction again and weigh it more than once."""
    again = repeats(runs() if rows is None else rows)
    s = summary([r for r in scored if r["id"] not in again])["held_out"]
    n = sum(r["split"] == "held_out" and r["id"] in again for r in scored)
    if not s["predicted"]:
        return "held out, one row per configuration: no row predicted"
    return (f"held out, one row per configuration ({n} rows of a configuration an earlier row holds left out: "
            f"re-measurements, or steps differing only in settings the planner does not price): {s['predicted']} rows, mean |error| {s['mean_abs_pct']:.1f}%, worst {s['worst_abs_pct']:.1f}%")


def fabric_line(scored: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> str:
    """The held-out figure by the interval classes' fabric split (moe.moe_class):
    runs whose expert parallelism crossed AWS EFA nodes, with the all-to-all dispatcher
    and DeepEP-style, apart from the rest."""
    by_id = {r["id"]: r for r in (runs() if rows is None else rows)}
    held = [s for s in scored if s["split"] == "held_out" and s["error_pct"] is not None]

    def kind(s: dict[str, Any]) -> str:
        r = by_id[s["id"]]
        return str(moe.moe_class(shape_of(r), moe.options_of(r), r["system"], r["ep"], offload=bool(r.get("offload")),
                                 stack=stack_of(r)))

    efa = ("efa", "efa-deepep")
    parts = []
    for what, keep in (("EP across AWS EFA nodes with the all-to-all dispatcher", lambda k: k == "efa"),
                       ("EP across AWS EFA nodes with DeepEP-style dispatch (UCCL-EP, NVSHMEM on libfabric, DeepEP v2 on NCCL GIN)",
                        lambda k: k == "efa-deepep"),
                       ("elsewhere", lambda k: k not in efa)):
        sel = [abs(s["error_pct"]) for s in held if keep(kind(s))]
        if sel:
            parts.append(f"{what} {len(sel)} rows, mean |error| {mean(sel):.1f}%")
    return "held out by fabric: " + "; ".join(parts)


def micro_batch_sweeps(rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The scored rows that measure one setup at two or more micro-batch sizes (equal in
    :func:`measurement` but for ``micro_batch``; the global batch fixed, so the same tokens),
    each split in two by its smallest and largest micro-batch: a step is m x A + B, A the
    cost of one micro-batch's pass and B the rest, solved from the two points for the
    published steps and for the predicted ones. Where the two Bs part, the model misses what
    grows with the data (its all-to-all bytes, its GEMMs); where the As part, what every pass
    pays (host launches, latency, the bubble). A two-point reading, not a fit: a bigger
    micro-batch also runs faster GEMMs, which lands in A."""
    rows = [r for r in (runs() if rows is None else rows) if r["split"] in SPLITS]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        key = tuple(kv for kv in measurement(r) if kv[0] != "micro_batch")
        groups.setdefault(key, []).append(r)
    out = []
    for group in groups.values():
        if len({r["micro_batch"] for r in group}) < 2:
            continue
        small = min(group, key=lambda r: r["micro_batch"])
        big = max(group, key=lambda r: r["micro_batch"])
        try:
            ps, pb = predict_row(small), predict_row(big)
        except MgbenchError:  # a refused layout has no step to split (score reports why)
            continue
        # the same global batch at two micro-batch sizes: two micro-batch counts
        ms, mb = float(ps["num_micro_batches"]), float(pb["num_micro_batches"])

        def split(step_small: float, step_big: float) -> tuple[float, float]:
            a = (step_small - step_big) / (ms - mb)
            return a, step_small - ms * a

        a_pub, b_pub = split(published_step_s(small), published_step_s(big))
        a_model, b_model = split(float(ps["step_time_s"]), float(pb["step_time_s"]))
        out.append({"rows": (small["id"], big["id"]), "splits": (small["split"], big["split"]),
                    "micro_batches": (small["micro_batch"], big["micro_batch"]), "num_micro": (ms, mb),
                    "per_micro_s": {"published": a_pub, "model": a_model}, "rest_s": {"published": b_pub, "model": b_model}})
    return out


def sweep_report(sweeps: list[dict[str, Any]] | None = None) -> str:
    """:func:`micro_batch_sweeps` as a table: per sweep, the published and predicted cost of a
    micro-batch's pass (A) and of the rest (B), and their ratios."""
    sweeps = micro_batch_sweeps() if sweeps is None else sweeps
    head = (f"{'sweep (smallest micro-batch row)':<52}  {'mb':>5}  {'m':>7}  {'A pub ms':>9}  {'A model':>8}  "
            f"{'B pub s':>8}  {'B model':>8}  {'A ratio':>7}  {'B ratio':>7}")
    lines = ["Micro-batch sweeps (one setup at two micro-batch sizes, the same tokens): step = m x A + B, solved from "
             "the two points, published and predicted; ratio = published / model", head, "-" * len(head)]
    for s in sweeps:
        a, b = s["per_micro_s"], s["rest_s"]
        lines.append(f"{s['rows'][0]:<52}  {s['micro_batches'][0]:>2}/{s['micro_batches'][1]:<2}  "
                     f"{s['num_micro'][0]:>3.0f}/{s['num_micro'][1]:<3.0f}  {1e3 * a['published']:>9.1f}  "
                     f"{1e3 * a['model']:>8.1f}  {b['published']:>8.2f}  {b['model']:>8.2f}  "
                     f"{a['published'] / a['model']:>7.2f}  {b['published'] / b['model']:>7.2f}")
    return "\n".join(lines)


# The parts :func:`stack_line` reports apart, each with a test of whether a row is in it.
STACK_PARTS = (
    ("Megatron-Core on NVIDIA with EP off AWS EFA",
     lambda r: stack_of(r) == STACK and on_nvidia(r) and not hardware.ep_crosses_efa(r["system"], r["ep"])),
    ("Megatron-Core on AMD Instinct (Primus)", lambda r: stack_of(r) == STACK and vendor_of(r) == "amd"),
    ("EP across AWS EFA nodes", lambda r: hardware.ep_crosses_efa(r["system"], r["ep"])),
    ("other stacks off EFA (torchtitan, NeMo AutoModel)",
     lambda r: stack_of(r) != STACK and not hardware.ep_crosses_efa(r["system"], r["ep"])),
)


def stack_line(scored: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> str:
    """Both splits' figures by the part of the file a row belongs to (:data:`STACK_PARTS`:
    Megatron-Core's runs on NVIDIA GPUs with expert parallelism off AWS EFA, its runs on AMD
    Instinct, the runs across EFA, the other stacks' runs), each with its rows, mean |error|, the count over the worst-row target and
    whether that part meets both targets: where the planner is within them and where not."""
    by_id = {r["id"]: r for r in (runs() if rows is None else rows)}
    parts = []
    for split in SPLITS:
        done = [s for s in scored if s["split"] == split and s["error_pct"] is not None]
        for what, keep in STACK_PARTS:
            errs = [abs(s["error_pct"]) for s in done if keep(by_id[s["id"]])]
            if not errs:
                continue
            over = sum(e > TARGET_WORST_PCT for e in errs)
            met = meets_targets(errs)
            parts.append(f"{split.replace('_', ' ')}, {what}: {len(errs)} rows, mean |error| {mean(errs):.1f}%, "
                         f"{over} over {TARGET_WORST_PCT:g}% (targets {'met' if met else 'not met'})")
    return "by part: " + "; ".join(parts)


if __name__ == "__main__":  # python -m mgbench.planner.moe_validation [--implied-host | --mb-sweep | --graphed-share | --efa-notify | --torchtitan-extra | --rocm-host]
    import sys

    if "--implied-host" in sys.argv[1:]:
        print(implied_host_report())
    elif "--mb-sweep" in sys.argv[1:]:
        print(sweep_report())
    elif "--graphed-share" in sys.argv[1:]:
        print(graphed_share_report())
    elif "--efa-notify" in sys.argv[1:]:
        print(efa_notify_report())
    elif "--torchtitan-extra" in sys.argv[1:]:
        print(torchtitan_extra_report())
    elif "--rocm-host" in sys.argv[1:]:
        print(rocm_host_report())
    else:
        print(report())
