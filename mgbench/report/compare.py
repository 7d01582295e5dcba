"""`mgbench compare BASE NEW`: per matching config, the change of a metric, flagged only
when it is statistically significant AND past a threshold (asv's rule), with CI gates.

Configs match on their workload identity, as the config schema declares it
(:data:`mgbench.config.IDENTITY_KEYS`: model dims, resolved parallel degrees, precision,
compression, ...; not run id, seed, step counts or fault injection), so two runs of one
suite compare config by config and two configs that differ in any workload field are
never merged. Procedure keys that a run sweeps over (seeds, faults) separate its configs too. Significance is a
Mann-Whitney U test (two-sided, p < 0.05) on the medians of the measured windows when each
run has at least MIN_WINDOWS of them (`rounds` x `repeats`), else on the raw step times.

Why windows: consecutive steps are not independent samples. A machine's speed drifts over
seconds (on a shared 2-core VM we saw the same config's window median move between 23 and
37 ms a second apart while steps inside a window stayed within a few percent), so a test on
steps counts one slow spell as dozens of agreeing observations and calls noise
significant. Window medians, taken in interleaved rounds, are close to independent.

Correctness is compared too, whatever the metric: a config that matched its reference and
now differs, or a negative control whose bug was caught and now is not (the check stopped
biting), is a regression that no speed-up excuses (``correct_change``; the CLI exits 1).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .. import stats, store
from ..config import PROCEDURE_KEYS
from ..record import identity_of_record
from ..errors import MgbenchError

# Direction of "better" for metrics a gate may name.
HIGHER_IS_BETTER = {"tokens_per_s": True, "tokens_per_s_per_device": True, "samples_per_s": True,
                    "mfu_pct": True, "model_tflops_per_device": True, "step_time_s": False,
                    "mem_peak_gib": False, "energy_per_token_j": False}
# Per-step samples exist for step time, and these metrics are its reciprocal times a
# constant (same test, same p-value). Peak memory and energy per token are one value per
# run: no test applies, and the threshold alone decides.
FROM_STEP_TIME = {"tokens_per_s", "tokens_per_s_per_device", "samples_per_s", "mfu_pct", "model_tflops_per_device",
                  "step_time_s"}
P_SIGNIFICANT = 0.05
# NEW's status for a config BASE recorded and NEW did not.
MISSING = "missing"
# Fewer windows than this per run and the test falls back to steps: U on 4 vs 4 values
# cannot reach p < 0.05 in the normal approximation we use.
MIN_WINDOWS = stats.MIN_TEST_SAMPLES  # window medians a run needs before they are tested, not its steps


@dataclass(frozen=True)
class Gate:
    metric: str
    limit_pct: float  # e.g. -5.0: fail when the metric gets more than 5% worse


def parse_gate(text: str) -> Gate:
    """``tokens_per_s:-5%`` -> Gate; MgbenchError naming the accepted form otherwise."""
    m = re.fullmatch(r"([a-z_]+):([+-]?\d+(?:\.\d+)?)%", text.strip())
    if not m or m.group(1) not in HIGHER_IS_BETTER:
        raise MgbenchError(f"--fail-on {text!r}: expected METRIC:-N% with METRIC one of {', '.join(HIGHER_IS_BETTER)}, "
                           "e.g. tokens_per_s:-5%")
    return Gate(m.group(1), float(m.group(2)))


def match_key(rec: dict[str, Any], separating: tuple[str, ...] = ()) -> str:
    """A record's config identity (plus the ``separating`` procedure keys), hashable."""
    extra = [(k, rec.get(k)) for k in separating]
    return json.dumps([identity_of_record(rec), extra], sort_keys=True, default=str)


def separating_keys(*runs: list[dict[str, Any]]) -> tuple[str, ...]:
    """Procedure keys that tell apart configs of one workload inside a run (a sweep over
    seeds, or over injected faults): records are then matched on them too, so that no
    record of a run hides another. Keys that only differ between runs (a longer
    measured window in the new run) are not among them: those configs still match."""
    keys = []
    for k in PROCEDURE_KEYS:
        for recs in runs:
            groups: dict[str, set[str]] = {}
            for r in recs:
                groups.setdefault(match_key(r), set()).add(json.dumps(r.get(k), default=str))
            if any(len(v) > 1 for v in groups.values()):
                keys.append(k)
                break
    return tuple(keys)


def check_metric(metric: str) -> str:
    """A metric two runs can be compared on (MgbenchError listing them otherwise)."""
    if metric not in HIGHER_IS_BETTER:
        raise MgbenchError(f"--metric {metric!r}: one of {', '.join(HIGHER_IS_BETTER)}")
    return metric


def compare_runs(base: str, new: str, results_dir: str = "results", metric: str = "tokens_per_s",
                 threshold_pct: float = 10.0) -> list[dict[str, Any]]:
    """One row per config present in both runs: values, change %, p-value, verdict."""
    check_metric(metric)
    dirs = [store.resolve_run(r, results_dir) for r in (base, new)]
    for name, d in zip((base, new), dirs):
        if store.read_manifest(d).get("kind") == "comm":  # no training configs: nothing to match
            raise MgbenchError(f"{name} is a `mgbench comm` sweep: compare takes runs of `mgbench run`; "
                               f"`mgbench report {base} {new}` shows sweeps side by side")
    base_recs, new_recs = (store.latest_records(store.read_records(d)) for d in dirs)
    sep = separating_keys(base_recs, new_recs)
    b_recs = {match_key(r, sep): r for r in base_recs}
    n_recs = {match_key(r, sep): r for r in new_recs}
    rows = []
    for key, b in b_recs.items():
        n = n_recs.get(key)
        if n is None:
            # A config NEW did not record (an interrupted or shorter run): listed, so that a
            # gate sees it stop producing the metric (gate_failures).
            rows.append({"label": b.get("label"), "config_id": b.get("config_id"), "base_status": b["status"],
                         "new_status": MISSING, "metric": metric, "correct_change": None, "base": b.get(metric),
                         "new": None, "change_pct": None, "p_value": None, "verdict": f"{b['status']} -> {MISSING}"})
            continue
        row: dict[str, Any] = {"label": n.get("label") or b.get("label"), "config_id": n.get("config_id"),
                               "base_status": b["status"], "new_status": n["status"], "metric": metric,
                               "correct_change": correctness_regression(b, n)}
        if b["status"] != "ok" or n["status"] != "ok" or b.get(metric) is None or n.get(metric) is None:
            row.update(base=b.get(metric), new=n.get(metric), change_pct=None, p_value=None,
                       verdict="n/a" if b["status"] == n["status"] else f"{b['status']} -> {n['status']}")
            rows.append(row)
            continue
        bv, nv = float(b[metric]), float(n[metric])
        if not bv:  # no relative change from 0 (JSON has no infinity)
            row.update(base=bv, new=nv, change_pct=None, p_value=None, verdict="n/a: base is 0")
            rows.append(row)
            continue
        change = 100.0 * (nv - bv) / bv
        if metric in FROM_STEP_TIME:
            p, basis = significance(b, n)
        else:
            p, basis = None, "no test: one value per run, so the threshold alone decides"
        better = change > 0 if HIGHER_IS_BETTER[metric] else change < 0
        significant = (p is None or p < P_SIGNIFICANT) and abs(change) >= threshold_pct
        verdict = ("better" if better else "worse") if significant else "~"
        row.update(base=bv, new=nv, change_pct=change, p_value=p, p_basis=basis, significant=significant,
                   verdict=verdict)
        rows.append(row)
    if all(r["new_status"] == MISSING for r in rows):
        raise MgbenchError(f"runs {base} and {new} have no config in common; compare runs of the same suite")
    return rows


def correctness_regression(base: dict[str, Any], new: dict[str, Any]) -> str | None:
    """How a config's correctness verdict got worse from ``base`` to ``new`` (None when it
    did not): a timed config that matched its reference and now differs from it, or a
    negative control (status "checked") whose injected bug was caught and now is not."""
    b, n = base.get("correct"), new.get("correct")
    if base["status"] == new["status"] == "checked" and b is False and n is True:
        return f"{new.get('inject')} was caught and now is NOT CAUGHT: the correctness check no longer bites"
    if base["status"] == new["status"] == "ok" and b is True and n is False:
        return f"matched the single-process reference and now differs: {new.get('correct_reason')}"
    return None


def significance(base: dict[str, Any], new: dict[str, Any]) -> tuple[float | None, str]:
    """p-value of "same distribution" for two records' step times, and what it was
    computed on; None (no test: the threshold alone decides, as for one value a run) where
    a run has fewer steps than the test needs."""
    bw, nw = base.get("repeat_medians_s") or [], new.get("repeat_medians_s") or []
    if len(bw) >= MIN_WINDOWS and len(nw) >= MIN_WINDOWS:
        return stats.mann_whitney_u(bw, nw)[1], f"window medians ({len(bw)} vs {len(nw)})"
    bs, ns = base.get("step_times_s") or [], new.get("step_times_s") or []
    if min(len(bs), len(ns)) < stats.MIN_TEST_SAMPLES:
        return None, (f"no test: {len(bs)} vs {len(ns)} measured steps, fewer than {stats.MIN_TEST_SAMPLES} a run, so "
                      f"the threshold alone decides (raise measured_steps)")
    return (stats.mann_whitney_u(bs, ns)[1],
            f"steps (fewer than {MIN_WINDOWS} windows; correlated in time, so p is optimistic: set rounds = {MIN_WINDOWS})")


def gate_failures(rows: list[dict[str, Any]], gates: list[Gate]) -> list[str]:
    """Each significant change past a gate's limit, as a sentence; and each config that
    measured the gate's metric in BASE and no longer does in NEW (it ran out of memory,
    failed, timed out, was interrupted or was not run: :data:`MISSING`), which no
    threshold may excuse."""
    out = []
    for g in gates:
        for r in rows:
            if r["metric"] == g.metric and r["base_status"] == "ok" and r["base"] is not None and (
                    r["new_status"] != "ok" or r["new"] is None):
                out.append(f"{r['label']}: {g.metric} measured in BASE and not in NEW ({r['base_status']} -> "
                           f"{r['new_status']}) breaks the gate {g.metric}:{g.limit_pct:+g}%")
                continue
            if r["metric"] != g.metric or r.get("change_pct") is None or not r.get("significant"):
                continue
            # Express the change so that negative means worse, whatever the metric's direction.
            signed = r["change_pct"] if HIGHER_IS_BETTER[g.metric] else -r["change_pct"]
            if signed < g.limit_pct:
                p = "no test" if r["p_value"] is None else f"p = {r['p_value']:.3g}"
                out.append(f"{r['label']}: {g.metric} {r['change_pct']:+.1f}% ({p}) "
                           f"breaks the gate {g.metric}:{g.limit_pct:+g}%")
    return out
