"""How far to trust a prediction: an interval from the validation residuals of its regime.

A regime is where a prediction's numbers come from. Each regime's relative half-widths
(how far below and above the prediction the truth has been seen to fall) are taken from
measured residuals, never chosen:

- ``catalog-validated``: catalog constants on the GPU they were calibrated on (A100),
  for the software stack asked (``--stack``, planner/stack.py). Half-width: the largest
  |error| of that stack's validation rows of published_runs.toml in the same dense /
  pipelined class.
- ``catalog-other-gpu``: catalog constants carried to another GPU by its best-GEMM and
  fused-attention fractions measured on it (data/efficiency.toml, evidence "measured";
  planner/hardware.py). The half-widths are the A100 class's
  compounded with the residuals of that carrying: on llm-foundry's 37 same-software A100 /
  H100 pairs (data/generation_pairs.toml) the predicted H100 / A100 ratio against the
  published one; true time = predicted x (1 + e_A100) x (1 + e_ratio). The evidence is
  A100 -> H100; other GPUs (H200, other A100 variants) take the same residuals, and the
  reasons say so. The informational H100 rows of published_runs.toml (Llama 3 405B with
  its pipeline schedule assumed, torchtitan on 500 W HBM2e H100s) are not used: their
  inputs are known not to match what is priced; cross_generation_coverage() reports
  whether they fall inside.
- ``catalog-carried``: a GPU whose best-GEMM fraction was carried from a sibling
  (efficiency.toml kind "carried": the same silicon in another form, power or memory).
  The other-GPU half-widths, compounded with how far measured siblings' fractions have
  been seen to differ (:func:`carried_spread`: efficiency.toml ``[carrying]`` pairs, both
  measured), on both sides.
- ``catalog-assumed``: a GPU with no GEMM measurement of it or of a sibling: its matmul
  efficiency is the A100's fraction by assumption. No measurement bounds that, so the
  interval is widened by a stated convention (ASSUMED_SLOWDOWN: the step may take up to
  twice as long), and the reasons name the assumption.

Every regime says its ``evidence`` ("measured", "carried", "assumed"; for an MoE model
on a GPU no MoE row ran on, :data:`NO_MOE_RUN`): the kind of the efficiency figure the
prediction scales with (HardwareProfile.evidence), which plan's ranking reads
(search.ranking_factor: anything but "measured" ranks on its pessimistic end). The
reasons also name the kinds of the attention and memory-bandwidth figures.
- ``probed``: a hardware profile of the machine; the half-width is the largest error of
  that profile's own `predict --against` validation when the profile records one,
  otherwise (``probed-unvalidated``) x0 to x2 by stated convention.

A mixture-of-experts model (``moe``: its class, :func:`moe_class`) takes its half-widths
from the published MoE runs instead (data/published_moe_runs.toml, every scored row, fit
and held out: planner/moe_validation.py), in classes kept apart because their errors
are: MoE layers run eagerly, MoE layers captured in CUDA graphs (every published graphed
row came out faster than it ran until the tenth session's graphed share; now they spread
both ways), and eager runs whose expert parallelism crosses nodes over AWS EFA, with the
all-to-all dispatcher or DeepEP-style (a third party's runs, all far slower than priced).
On a GPU those rows ran on the regime is ``moe-validated`` (ranked as measured: its own
runs validate it); on another, the MoE half-widths are carried to it as
the dense class's are (compounded with the generation-pair ratio residuals, widened where
the GPU's efficiency is carried or assumed); where no MoE row of either class ran on the
GPU the regime is ``moe-carried`` and plan ranks it as carried (its measured GEMM fraction
does not measure grouped GEMMs, its dispatch or its stack's host time). A probed
profile's or a --calibrate fit's half-widths are compounded with them (:func:`with_moe`).
The classes' leave-one-out coverage is n - 2 of n by construction (max-residual bounds: only a class's two extremes
can fall outside); the forward checks are in docs/planner.md.

Intervals are [prediction x (1 - low), prediction x (1 + high)] on time; throughput's
interval is its reciprocal image.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from . import hardware
from .moe import MOE_CLASSES, moe_class

# The evidence of the "moe-carried" regime: an MoE model on a GPU no published MoE run ran
# on (its GEMM fraction may be measured; the MoE step is not). plan ranks it like a carried
# GPU and words it apart (search.evidence_lines).
NO_MOE_RUN = "no-moe-run"

# A convention, not a measurement: where a GPU's matmul efficiency is borrowed from the
# A100, nothing measured bounds the error, so the step may take up to (1 + this) times
# the prediction. `mgbench probe` on that GPU replaces the assumption with a measurement.
ASSUMED_SLOWDOWN = 1.0

# The GPU the cross-generation pairs (data/generation_pairs.toml) measured.
EVIDENCE_GPU = "h100-sxm"


@lru_cache(maxsize=1)
def _residuals() -> dict[str, list[float]]:
    """Validation residuals keyed "<stack>:dense" / "<stack>:pipelined" (published rows and
    the generation pairs' A100 rows), "ratio" (the pairs' H100 / A100 ratio errors) and
    "cross_gpu" (informational rows on another GPU than the calibrated one, any stack:
    shown, not used for the intervals)."""
    from .validation import pair_table, predict_run, published_runs, stack_runs

    out: dict[str, list[float]] = {"cross_gpu": [], "ratio": [r["ratio_error_pct"] / 100.0 for r in pair_table()]}
    for run in stack_runs():
        if run["role"] == "validation":
            out.setdefault(_cls_key(run), []).append(predict_run(run)["error_pct"] / 100.0)
    for run in published_runs():
        if run["role"] == "informational" and hardware.resolve(system=run["system"]).gpu != \
                hardware.planner_defaults()["calibrated_gpu"]:
            out["cross_gpu"].append(predict_run(run)["error_pct"] / 100.0)
    return out


# What each MoE interval class (moe.MOE_CLASSES, moe.moe_class) says of its runs: the
# reason line.
MOE_CLASS_WORDS = {"eager": "MoE layers eager", "graphed": "MoE layers in CUDA graphs",
                   "efa": "MoE layers eager with Megatron-Core's all-to-all over AWS EFA",
                   "efa-deepep": "MoE layers eager with DeepEP-style dispatch over AWS EFA (UCCL-EP, NVSHMEM on "
                                 "libfabric or DeepEP v2 on NCCL GIN; where the run names it, priced at its kernel "
                                 "benchmarks' share of the network rate, and through a CPU proxy with its notify wait)",
                   "offload": "MoE runs with FSDP2's CPU offload (their optimizer step runs on the host: priced on one "
                              "thread; the host's garbage collection and synchronisations are not)",
                   "eager-torchtitan": "MoE layers eager on torchtitan's stack (priced with Megatron-Core's MoE host "
                                       "constants: an assumption)",
                   "eager-automodel": "MoE layers eager on NeMo AutoModel's stack (priced with Megatron-Core's MoE "
                                      "host constants: an assumption)"}


@lru_cache(maxsize=1)
def moe_residuals() -> dict[str, list[dict[str, Any]]]:
    """Per MoE class, every scored row of published_moe_runs.toml (fit and held out; an
    unscored or refused row has no error): its id, split, GPU and throughput error
    e = (predicted - published) / published."""
    from . import moe, moe_validation

    out: dict[str, list[dict[str, Any]]] = {c: [] for c in MOE_CLASSES}
    for row, s in zip(moe_validation.runs(), moe_validation.file_scores()):
        if row["split"] not in moe_validation.SPLITS:
            continue
        if s["error_pct"] is None:
            continue
        cls = moe_class(moe_validation.shape_of(row), moe.options_of(row), row["system"], row["ep"],
                        offload=bool(row.get("offload")), stack=moe_validation.stack_of(row))
        out[cls].append({"id": row["id"], "split": row["split"], "gpu": hardware.resolve(system=row["system"]).gpu,
                         "error": s["error_pct"] / 100.0})
    return out


def _moe_bounds(cls: str) -> tuple[float, float, list[str], str]:
    """(low, high, the GPUs the class's rows ran on, the reason line) of an MoE class."""
    if cls not in MOE_CLASSES:
        raise ValueError(f"MoE interval class {cls!r}: one of {', '.join(MOE_CLASSES)}")
    rows = moe_residuals()[cls]
    low, high = _bounds([r["error"] for r in rows])
    gpus = sorted({r["gpu"] for r in rows})
    held = sum(r["split"] == "held_out" for r in rows)
    reason = (f"{MOE_CLASS_WORDS[cls]}: the {len(rows)} published MoE runs of that kind ({held} of them held out; "
              f"published_moe_runs.toml, on {', '.join(gpus)}) took {1 - low:.2f}x to {1 + high:.2f}x "
              f"the predicted step time (python -m mgbench.planner.moe_validation)")
    return low, high, gpus, reason


def _cls_key(run: dict[str, Any]) -> str:
    from .validation import stack_of

    return f"{stack_of(run)}:{'pipelined' if run['pp'] > 1 else 'dense'}"


def _compound(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Half-widths of two independent relative errors on time, multiplied:
    (1 - low_a)(1 - low_b) below, (1 + high_a)(1 + high_b) above."""
    return 1.0 - (1.0 - a[0]) * (1.0 - b[0]), (1.0 + a[1]) * (1.0 + b[1]) - 1.0


def _bounds(errs: list[float]) -> tuple[float, float]:
    """(low, high) half-widths on step time from throughput errors e = (pred - true) / true:
    the true step time is the predicted one times (1 + e), so a negative e (the model was
    pessimistic) says how far below the prediction the truth fell, a positive one above."""
    return max([0.0] + [-e for e in errs]), max([0.0] + list(errs))


def regime(gpu: str, pipelined: bool, profile: dict[str, Any] | None = None,
           stack: str = "megatron-lm", moe: str | None = None) -> dict[str, Any]:
    """The regime of a prediction and its half-widths on step time, with the reasons.
    Catalog predictions use the residuals of their software stack's published rows in the
    same dense / pipelined class; a class the stack has no rows for borrows the
    calibration stack's rows of that class, widened by the stack's own, and says so.
    ``moe``: an MoE model's class (:func:`moe_class`): the published MoE runs' residuals
    of that class replace the dense rows' (see the module docstring)."""
    if profile is not None:
        return with_moe(_probed(profile), moe)
    from .stack import DEFAULT_STACK, efficiency_stack

    res = _residuals()
    cls = "pipelined" if pipelined else "dense"
    calibrated = hardware.planner_defaults()["calibrated_gpu"]
    # A stack that carries another's efficiency (stacks.toml efficiency_from) takes that
    # stack's residuals: its own factor is that one, checked on those rows only.
    carried = efficiency_stack(stack) if moe is None else stack
    carry_note = f" (whose efficiency {stack} carries)" if carried != stack else ""
    stack = carried
    own = res.get(f"{stack}:{cls}")
    rows_on = calibrated  # the GPU(s) the class's residuals were seen on
    if moe is not None:
        low, high, seen, why = _moe_bounds(moe)
        reasons = [why]
        if gpu in seen:
            # The class's rows include runs on this GPU: they validate the whole prediction
            # on it, its GEMM efficiency (measured or carried) included, so plan ranks it as
            # measured (search.evidence_of).
            n = sum(r["gpu"] == gpu for r in moe_residuals()[moe])
            return {"regime": "moe-validated", "evidence": "measured", "low": low, "high": high,
                    "reasons": reasons + [f"{gpu}: {n} of those runs ran on it"]}
        rows_on = "MoE"  # seen on Hopper and Blackwell parts, carried to this one like the dense class
    elif own:
        low, high = _bounds(own)
        reasons = [f"{cls} layouts: published {stack} runs{carry_note} on {calibrated} predicted within "
                   f"{100 * max(low, high):.0f}% (validation rows of published_runs.toml and generation_pairs.toml)"]
    else:
        mine = [e for k, v in res.items() if k.startswith(f"{stack}:") for e in v]
        low, high = _bounds(res[f"{DEFAULT_STACK}:{cls}"] + mine)
        reasons = [f"{cls} layouts: no published {stack} run{carry_note} of this class; {DEFAULT_STACK}'s {cls} rows and "
                   f"{stack}'s other rows on {calibrated} were predicted within {100 * max(low, high):.0f}%"]
    if gpu == calibrated and moe is None:
        return {"regime": "catalog-validated", "evidence": "measured", "low": low, "high": high, "reasons": reasons}
    prof = hardware.profile(gpu)
    evidence = prof.evidence if prof is not None else "assumed"
    detail = hardware.evidence_detail(prof) if prof is not None else f"{gpu}: no efficiency.toml entry"
    # The A100 class's residuals, compounded with how far the A100 -> H100 ratio was off.
    ratio = _bounds(res["ratio"])
    low, high = _compound((low, high), ratio)
    where = (f"{gpu}: efficiency carried from {calibrated} by GEMM and flash-attention fractions" if moe is None
             else f"{gpu}: no published MoE run of this kind ran on it; the MoE rows' errors carried to it")
    reasons.append(f"{where}; on "
                   f"{len(res['ratio'])} same-software A100 / H100 pairs (llm-foundry, generation_pairs.toml) the "
                   f"predicted H100 / A100 speed-up was {-100 * ratio[0]:+.0f}% to {100 * ratio[1]:+.0f}% off the "
                   f"published one; the interval compounds that with the {rows_on} rows': "
                   f"-{100 * low:.0f}% / +{100 * high:.0f}% on step time")
    if gpu != EVIDENCE_GPU and moe is None:
        reasons.append(f"{gpu}: the carrying was measured {calibrated} -> {EVIDENCE_GPU} only; "
                       f"{gpu} is assumed to carry the same way")
    reasons.append(f"evidence: {detail} (data/efficiency.toml)")
    if evidence == "assumed":
        high = max(high, ASSUMED_SLOWDOWN)
        reasons.append(f"{gpu}: no measured GEMM fraction: its matmul efficiency is {calibrated}'s by assumption; "
                       f"nothing measured bounds it, so the interval allows up to {1 + ASSUMED_SLOWDOWN:.0f}x the "
                       "step time (a convention; `mgbench probe` on that GPU measures it)")
        return {"regime": "catalog-assumed", "evidence": "assumed", "low": low, "high": high, "reasons": reasons}
    if evidence == "carried":
        spread = carried_spread()
        low, high = _compound((low, high), (spread["spread"], spread["spread"]))
        reasons.append(f"{gpu}: GEMM fraction carried from {prof.gemm_best.carried_from} ({prof.gemm_best.reason}); "
                       f"measured siblings' fractions differ by up to {100 * spread['spread']:.0f}% "
                       f"({spread['worst']}), so the interval widens by that on both sides")
        return {"regime": "catalog-carried", "evidence": "carried", "low": low, "high": high, "reasons": reasons}
    if moe is not None and not any(r["gpu"] == gpu for rows in moe_residuals().values() for r in rows):
        # A measured GEMM fraction does not measure an MoE step: its grouped GEMMs, its
        # dispatch over this GPU's links and its stack's per-layer host time (solved on
        # NVIDIA stacks) were never seen here, so plan ranks it as carried (its
        # pessimistic end) rather than letting a cheap GPU win on its point estimate.
        reasons.append(f"{gpu}: no published MoE run of either kind ran on it, so plan ranks it on the "
                       f"interval's slow end (+{100 * high:.0f}%), the way it ranks an efficiency not measured")
        return {"regime": "moe-carried", "evidence": NO_MOE_RUN, "low": low, "high": high, "reasons": reasons}
    return {"regime": "catalog-other-gpu", "evidence": "measured", "low": low, "high": high, "reasons": reasons}


def with_moe(reg: dict[str, Any], moe: str | None) -> dict[str, Any]:
    """A regime measured on this machine (a probed profile, a --calibrate fit: dense runs
    of mgbench's own runner) with an MoE class's half-widths compounded in: nothing it
    measured priced the MoE terms (host time, all-to-all, imbalance). ``reg`` unchanged
    for a dense model."""
    if moe is None:
        return reg
    m_low, m_high, _, why = _moe_bounds(moe)
    low, high = _compound((reg["low"], reg["high"]), (m_low, m_high))
    return {**reg, "low": min(low, 1.0), "high": high,
            "reasons": list(reg["reasons"]) + [f"{why}; compounded with the {reg['regime']} one"]}


def _probed(profile: dict[str, Any]) -> dict[str, Any]:
    """The regime of a prediction from a probed hardware profile: its recorded validation's
    largest error, or the x0 to x2 convention where it records none."""
    v = profile.get("validation")
    if v:
        w = v["max_abs_error_pct"] / 100.0
        return {"regime": "probed", "evidence": "measured", "low": min(w, 1.0), "high": w,
                "reasons": [f"probed profile, validated against run {v['run']}: max |error| "
                            f"{v['max_abs_error_pct']:.0f}% over {v['num_configs']} configs"]}
    # Measured on the machine, but nothing checked the prediction: the interval is the
    # convention's, and plan ranks it as assumed (search.evidence_of).
    return {"regime": "probed-unvalidated", "evidence": "assumed", "low": 1.0, "high": 1.0,
            "reasons": ["probed profile not validated against a run on its machine: an interval of x0 to x2 "
                        "(a convention) until `mgbench predict --hardware PROFILE --against RUN` records one"]}


def moe_leave_one_out_coverage() -> dict[str, Any]:
    """How many scored MoE rows fall inside the interval built from the OTHER rows of
    their class (:data:`MOE_CLASSES`): the MoE intervals' out-of-sample coverage."""
    out: dict[str, Any] = {"rows": []}
    for cls, rows in moe_residuals().items():
        for i, r in enumerate(rows):
            low, high = _bounds([q["error"] for j, q in enumerate(rows) if j != i])
            out["rows"].append({"id": r["id"], "class": cls, "error_pct": 100.0 * r["error"],
                                "interval_pct": [-100.0 * low, 100.0 * high], "inside": -low <= r["error"] <= high})
    out["covered"] = sum(r["inside"] for r in out["rows"])
    out["total"] = len(out["rows"])
    out["classes"] = {c: {"covered": sum(r["inside"] for r in out["rows"] if r["class"] == c),
                          "total": sum(r["class"] == c for r in out["rows"])} for c in MOE_CLASSES}
    return out


def carried_spread() -> dict[str, Any]:
    """How far a sibling's GEMM fraction may be from the one carried to it: the largest
    relative difference between the measured best-GEMM fractions of the sibling pairs of
    efficiency.toml ``[carrying] pairs`` (the same silicon in another form, power or
    memory, both measured), with the pair that set it."""
    from .. import catalog

    pairs = catalog.load("efficiency.toml")["carrying"]["pairs"]
    diffs = []
    for a, b in pairs:
        fa, fb = hardware.gemm_fraction(a), hardware.gemm_fraction(b)
        if fa is None or fb is None:
            continue
        diffs.append((abs(max(fa, fb) / min(fa, fb) - 1.0), f"{a} {fa:.3f} vs {b} {fb:.3f}"))
    spread, worst = max(diffs)
    return {"spread": spread, "worst": worst, "pairs": len(diffs)}


def intervals(step_time_s: float, tokens_per_s_per_gpu: float, reg: dict[str, Any]) -> dict[str, Any]:
    """The prediction's intervals, in the JSON names `predict` and `plan` use, with the
    evidence of the efficiency they rest on ("measured", "carried", "assumed")."""
    lo_t, hi_t = step_time_s * (1.0 - reg["low"]), step_time_s * (1.0 + reg["high"])
    return {"step_time_s_interval": [lo_t, hi_t],
            "tokens_per_s_per_gpu_interval": [tokens_per_s_per_gpu * step_time_s / hi_t,
                                              tokens_per_s_per_gpu * step_time_s / max(lo_t, 1e-30)],
            "regime": reg["regime"], "evidence": reg.get("evidence", "measured"),
            "interval_reasons": reg["reasons"]}


def calibrated(fit: dict[str, Any]) -> dict[str, Any]:
    """The regime of a prediction with `--calibrate RUN`: its leave-one-out errors."""
    errs = [abs(r["loo_error_pct"]) / 100.0 for r in fit["rows"] if r.get("loo_error_pct") is not None]
    if not errs:
        return {"regime": "calibrated-unvalidated", "evidence": "assumed", "low": 1.0, "high": 1.0,
                "reasons": ["calibrated on a run whose leave-one-out predictions all failed: x0 to x2 (a convention)"]}
    w = max(errs)
    return {"regime": "calibrated", "evidence": "measured", "low": min(w, 1.0), "high": w,
            "reasons": [f"calibrated on {fit['num_configs']} measured configs: leave-one-out errors up to {100 * w:.0f}%"]}


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two [low, high] intervals overlap: the candidates cannot be told apart."""
    return a[0] <= b[1] and b[0] <= a[1]


def leave_one_out_coverage() -> dict[str, Any]:
    """How many validation rows fall inside an interval built from the OTHER rows of
    their class (stack x dense / pipelined): the intervals' out-of-sample coverage,
    overall and per class."""
    from .validation import predict_run, stack_runs

    rows = [(r, predict_run(r)["error_pct"] / 100.0) for r in stack_runs() if r["role"] == "validation"]
    inside = []
    for i, (run, e) in enumerate(rows):
        low, high = _bounds([e2 for j, (r2, e2) in enumerate(rows) if j != i and _cls_key(r2) == _cls_key(run)])
        # true time = predicted x (1 + e): inside when -low <= e <= high
        inside.append({"id": run["id"], "class": _cls_key(run), "error_pct": 100.0 * e,
                       "interval_pct": [-100.0 * low, 100.0 * high], "inside": -low <= e <= high})
    classes: dict[str, list[int]] = {}
    for r in inside:
        c = classes.setdefault(r["class"], [0, 0])
        c[0] += r["inside"]
        c[1] += 1
    return {"rows": inside, "covered": sum(r["inside"] for r in inside), "total": len(inside),
            "classes": {k: {"covered": v[0], "total": v[1]} for k, v in classes.items()}}


def cross_generation_coverage() -> dict[str, Any]:
    """The other-GPU interval's coverage on the H100 rows, leave-one-out: each pair's H100
    error against the interval built without that pair (its A100 row left out of the
    stack's class, its ratio out of the ratio residuals). ``before``: the rule this
    replaced (the class's residuals widened on both sides by the worst informational
    cross-GPU row); ``after``: the class's residuals compounded with the ratio residuals.
    Also: the ratio rows against the other pairs' ratio residuals, and the informational
    H100 rows of published_runs.toml against the interval the planner gives them now."""
    from .validation import pair_table, predict_run, published_runs, stack_of, stack_runs

    pairs = pair_table()
    res = _residuals()
    worst_informational = max([0.0] + [abs(e) for e in res["cross_gpu"]])
    key = f"{stack_of(pairs[0]['h100'])}:dense"
    own_ids = {r["id"] for r in stack_runs() if r["role"] == "validation" and _cls_key(r) == key}
    out: dict[str, Any] = {"ratio": [], "before": [], "after": [], "informational": []}
    for p in pairs:
        others = [q for q in pairs if q["id"] != p["id"]]
        cls = _bounds([q["a100"]["error_pct"] / 100.0 for q in others if q["a100"]["id"] in own_ids])
        ratio = _bounds([q["ratio_error_pct"] / 100.0 for q in others])
        e_ratio, e_h100 = p["ratio_error_pct"] / 100.0, p["h100"]["error_pct"] / 100.0
        before = (max(cls[0], worst_informational), max(cls[1], worst_informational))
        after = _compound(cls, ratio)
        for name, (low, high), e in (("ratio", ratio, e_ratio), ("before", before, e_h100), ("after", after, e_h100)):
            out[name].append({"id": p["id"], "error_pct": 100.0 * e, "interval_pct": [-100.0 * low, 100.0 * high],
                              "inside": -low <= e <= high})
    calibrated = hardware.planner_defaults()["calibrated_gpu"]
    out["informational_before"] = []
    for run in published_runs():
        gpu = hardware.resolve(system=run["system"]).gpu
        if run["role"] == "informational" and gpu != calibrated:
            e = predict_run(run)["error_pct"] / 100.0
            reg = regime(gpu, run["pp"] > 1, stack=stack_of(run))
            out["informational"].append({"id": run["id"], "error_pct": 100.0 * e,
                                         "interval_pct": [-100.0 * reg["low"], 100.0 * reg["high"]],
                                         "inside": -reg["low"] <= e <= reg["high"], "why": run.get("why")})
    # The replaced rule on the same rows: each against the worst |error| of the others.
    for r in out["informational"]:
        w = max([0.0] + [abs(q["error_pct"]) for q in out["informational"] if q["id"] != r["id"]])
        out["informational_before"].append({"id": r["id"], "error_pct": r["error_pct"], "interval_pct": [-w, w],
                                            "inside": abs(r["error_pct"]) <= w})
    out["counts"] = {k: {"covered": sum(r["inside"] for r in v), "total": len(v)}
                     for k, v in out.items() if isinstance(v, list)}
    return out


def coverage_statement() -> str:
    """The intervals' coverage, computed: docs/planner.md states this sentence and a test checks
    it is the computed one."""
    loo, cross = leave_one_out_coverage(), cross_generation_coverage()["counts"]

    def n(c: dict[str, int]) -> str:
        return f"{c['covered']} of {c['total']}"

    return (f"leave-one-out coverage: validation rows {n(loo)} inside the interval from the other rows of their "
            f"class; H100 rows of the generation pairs {n(cross['before'])} inside the other-GPU interval before "
            f"(A100 class widened by the worst informational H100 row), {n(cross['after'])} after (A100 class "
            f"compounded with the ratio residuals); ratio rows {n(cross['ratio'])}; informational H100 rows "
            f"{n(cross['informational_before'])} before, {n(cross['informational'])} after")


def moe_coverage_statement() -> str:
    """The MoE intervals' coverage and half-widths, computed: docs/planner.md states this
    sentence and a test checks it is the computed one."""
    cov = moe_leave_one_out_coverage()
    parts = []
    for cls in MOE_CLASSES:
        low, high, gpus, _ = _moe_bounds(cls)
        c = cov["classes"][cls]
        parts.append(f"{cls} {1 - low:.2f}x to {1 + high:.2f}x the predicted step ({c['total']} rows on "
                     f"{', '.join(gpus)}; {c['covered']} inside the interval from the other rows of their class)")
    return "MoE intervals: " + "; ".join(parts)
