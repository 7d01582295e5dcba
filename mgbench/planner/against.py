"""Predict each config of a measured run from a hardware profile, and compare.

`mgbench predict --hardware PROFILE --against RUN`: no fitting to the run. The profile
supplies throughputs measured by microbenchmarks; the model's structure (compute +
exposed communication + bubble, planner/perf.py) turns them into step times. The error
is therefore a test of the model, unlike `--calibrate`, which fits the run itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import store
from ..errors import MgbenchError, first_line
from ..record import config_from_record


def against_run(profile: dict[str, Any], run: str, results_dir: str = "results") -> dict[str, Any]:
    """Per ok config of ``run``: measured and predicted step time, error; and the mean
    absolute percentage error over them."""
    from ..probe.profile import hardware, holds_cuda_context, overlap
    from .perf import DEFAULT_OVERLAP
    from ..layout import Layout
    from .predict import predict

    recs = [r for r in store.latest_records(store.read_records(store.resolve_run(run, results_dir)))
            if r["status"] == "ok" and r.get("step_time_s")]
    if not recs:
        raise MgbenchError(f"--against {run}: the run has no ok configs with a step time")
    device = recs[0]["device"]
    if device != profile["device"]:
        raise MgbenchError(f"--against {run}: the run measured {device} ranks, the profile a {profile['device']} "
                           "machine; probe the machine the run was measured on")
    # Counts traced for this run before (the run's closing projection, an earlier
    # --against) are reused: each costs a traced step, about a CPU-second a config.
    run_dir = store.RunDir(store.resolve_run(run, results_dir))
    known = len(_load_counts(run_dir))
    rows = []
    for rec in recs:
        cfg = config_from_record(rec)
        row = {"config_id": rec["config_id"], "label": rec["label"], "nproc": cfg.nproc,
               "measured_s": float(rec["step_time_s"]), "predicted_s": None, "error_pct": None, "reason": None}
        try:
            hw = hardware(profile, cfg.precision, ranks=cfg.nproc)
            host_ops, notes = counted_ops(cfg, hw, profile) or (None, [])
            pred = predict(cfg.shape, hw, Layout.from_config(cfg),
                           overlap=overlap(profile, cfg.nproc, DEFAULT_OVERLAP), host_ops=host_ops,
                           fixed=holds_cuda_context(profile))
        except MgbenchError as e:  # a layout the planner cannot price: say why, keep the others
            row["reason"] = str(e)
        else:
            p = float(pred["step_time_s"])
            row.update(predicted_s=p, error_pct=100.0 * (p - row["measured_s"]) / row["measured_s"],
                       breakdown=pred["breakdown"])
            if notes:
                row["note"] = "; ".join(notes)
        rows.append(row)
    if len(_COUNTS) > known:
        _save_counts(run_dir, [_count_key(config_from_record(r)) for r in recs])
    errs = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    host = (store.read_manifest(store.resolve_run(run, results_dir)).get("machine") or {}).get("hostname")
    return {"run": run, "profile_device": profile["device_name"], "rows": rows, "num_predicted": len(errs),
            "mape": float(np.mean(errs)) if errs else None, "max_abs_error_pct": float(np.max(errs)) if errs else None,
            "same_machine": host == profile.get("hostname"),
            "method": "profile throughputs (no fit to the run) through the planner's step-time model"
                      + ("; each config's non-matmul ops counted by tracing one step (planner/opcount.py)"
                         if device == "cpu" and any(r.get("breakdown", {}).get("attention_s") for r in rows) else "")
                      + ("; CPU ranks share the host's cores, priced from kernels probed with that many ranks at "
                         "once (mgbench/probe/profile.py); each strategy's cost per step beyond its ops and bytes "
                         "(framework Python; at n ranks also its collectives' latency and the waits for the slowest "
                         "rank) is probed on a tiny model, at the run's rank count where the probe ran it "
                         "(mgbench/probe/framework.py, planner/against.py fixed_cost)" if device == "cpu" else "")}


def counted_ops(cfg: Any, hw: Any, profile: dict[str, Any] | None = None) -> tuple[dict[str, float], list[str]] | None:
    """The config's counted non-matmul ops (one traced step of rank 0, planner/opcount.py)
    when ``hw`` prices them (a probed CPU profile), else None; with the notes on what
    the count leaves out. Configs that differ only in what the count cannot see share one
    trace (cached per run of the planner).

    With the ``profile``, also ``fixed_s`` (fixed_cost): what the step costs beyond
    its ops, bytes and the layout terms' communication, and its note where the probe
    did not measure part of it."""
    if hw.ew_bw is None:
        return None
    ops = dict(_count(cfg))
    notes: list[str] = []
    if profile is not None:
        ops["fixed_s"], note = fixed_cost(cfg, ops.get("collectives", 0.0), profile)
        notes += [note] if note else []
    return ops, notes


def fixed_cost(cfg: Any, counted: float, profile: dict[str, Any]) -> tuple[float, str | None]:
    """Seconds per step of ``cfg`` beyond its ops, bytes and the layout terms'
    communication, from the probe (``counted``: the collectives one traced step issues),
    and a note where the profile has no framework cost for the strategy (its per-step
    Python is then left out, not guessed), else None.

    Where the probe timed the strategy's tiny step at the config's rank count (a real
    gloo group of that many processes, probe/framework.py): that step's residual, which
    holds the framework's Python, every collective's latency and the waits for the
    slowest rank as the ranks meet them on shared cores, less the latency of the
    collectives the layout terms already price for the tiny step (modelled_latency_s),
    plus the probed latency of each collective ``cfg`` issues that neither the layout
    terms nor the tiny step price.
    Else (a one-rank row, or an older profile): the one-rank residual / the share of the
    cores, plus collective_latency."""
    from ..probe.profile import collective_latency_s, framework_layer_scale, framework_residual_s, framework_row

    framework = framework_residual_s(profile, cfg.strategy, cfg.shape.layers, cfg.nproc)
    note = None if framework is not None else (
        f"the probe measured no framework cost for {cfg.strategy} (it times probe/framework.py's strategies): "
        "its per-step Python is not in the prediction")
    row = framework_row(profile, cfg.strategy, cfg.nproc)
    if cfg.nproc < 2 or row is None or row.get("ranks", 1) != cfg.nproc or "collectives" not in row:
        return collective_latency(cfg, counted, profile) + (framework or 0.0), note
    alpha = collective_latency_s(profile, cfg.nproc) or 0.0
    from ..probe.framework import tiny_config

    tiny = tiny_config(cfg.strategy, int(row["layers"]), cfg.nproc)
    scale = framework_layer_scale(cfg.shape.layers, row["layers"])
    # Collectives neither the layout terms nor the tiny step's residual price (e.g. more
    # micro-batches than the tiny step's one: FSDP gathers again per micro-batch).
    beyond = max(0.0, (counted - modelled_collectives(cfg)) - (row["collectives"] - modelled_collectives(tiny)) * scale)
    return max(0.0, framework - modelled_latency_s(tiny, alpha) * scale) + beyond * alpha, note


def modelled_latency_s(cfg: Any, alpha: float) -> float:
    """The latency part of what the layout terms (planner/perf.py ring_time) charge for a
    step's data-parallel collectives (perf.collective_counts) at a probed all-reduce
    latency ``alpha``: alpha for an all-reduce (ZeRO 0-2), alpha / 2 for each of
    ZeRO-3's gathers and its reduction (a gather is half an all-reduce's ring steps);
    0 on one data-parallel rank."""
    n = float(_collective_counts(cfg)["dp"])
    return n * alpha / 2 if cfg.zero_stage >= 3 else n * alpha


def modelled_collectives(cfg: Any) -> float:
    """How many collectives a step of ``cfg`` issues in the planner's layout terms
    (planner/perf.py collective_counts: tensor-parallel all-reduces, pipeline sends and
    the data-parallel gradient collectives)."""
    return float(sum(_collective_counts(cfg).values()))


def _collective_counts(cfg: Any) -> dict[str, Any]:
    from ..layout import RECOMPUTE
    from .perf import collective_counts

    return collective_counts(cfg.shape.layers, cfg.tp, cfg.pp, cfg.dp, cfg.zero_stage, cfg.grad_accum,
                             RECOMPUTE.index(cfg.activation_checkpointing), cfg.pp_schedule, shape=cfg.shape)


def collective_latency(cfg: Any, counted: float, profile: dict[str, Any]) -> float:
    """Seconds a step spends in the fixed cost of collectives the layout terms do not
    price: the collectives one traced step issues (planner/opcount.py: ZeRO-1's
    parameter broadcasts, FSDP's gather and reduce-scatter per wrapped module) minus
    those the terms price (modelled_collectives), each at the all-reduce latency the
    probe measured at the config's rank count (probe/profile.py collective_latency_s:
    on CPU the ranks share the cores, so that latency includes waiting for a core).
    0 for one rank or a profile without a collective fit."""
    from ..probe.profile import collective_latency_s

    if cfg.nproc < 2:
        return 0.0
    alpha = collective_latency_s(profile, cfg.nproc)
    # ZeRO-1's per-parameter broadcasts are issued with async_op=True, yet measured here
    # (2 gloo ranks) they cost about one latency each, as gloo runs them one after another.
    extra = max(0.0, counted - modelled_collectives(cfg))
    return extra * alpha if alpha else 0.0


def _count(cfg: Any) -> dict[str, float]:
    from .opcount import count_step, host_ops

    key = _count_key(cfg)
    if key not in _COUNTS:
        try:
            _COUNTS[key] = host_ops(count_step(cfg))
        except Exception as e:  # a config the op count cannot run: no prediction, and why
            raise MgbenchError(f"its ops could not be counted by running one step of it (opcount.count_step) "
                               f"({type(e).__name__}: {first_line(str(e))})") from None
    return _COUNTS[key]


def _count_key(cfg: Any) -> str:
    return repr(sorted((k, v) for k, v in cfg.params().items() if k not in _NOT_COUNTED))


_COUNTS: dict[str, dict[str, float]] = {}


def _load_counts(run_dir: Any) -> dict[str, dict[str, float]]:
    """Merge the run folder's stored op counts into the cache (a missing or unreadable
    file is no cache: the counts are traced again)."""
    import json

    try:
        stored = json.loads(run_dir.op_counts.read_text())
    except (OSError, ValueError):
        return _COUNTS
    if isinstance(stored, dict) and stored.get("opcount_version") == OPCOUNT_VERSION:
        _COUNTS.update(stored.get("counts") or {})
    return _COUNTS


def _save_counts(run_dir: Any, keys: list[str]) -> None:
    """The run's own configs' counts (the cache may also hold other runs')."""
    mine = {k: _COUNTS[k] for k in keys if k in _COUNTS}
    try:
        store.write_json_atomic(run_dir.op_counts, {"opcount_version": OPCOUNT_VERSION, "counts": mine})
    except OSError:  # a read-only run folder: the counts stay in memory only
        pass


# Bump when what a count holds changes: stored counts of another version are traced again.
# 3: a cheap step is counted on real tensors (opcount.counts_on_real_tensors), whose DDP and
# ZeRO-1 counts differ from the fake group's.
OPCOUNT_VERSION = 3
# Keys that change how long or how often a config runs, not what one step dispatches.
_NOT_COUNTED = {"seed", "warmup_steps", "measured_steps", "check_steps"}


def record_validation(profile: dict[str, Any], res: dict[str, Any]) -> dict[str, Any] | None:
    """The profile's validation entry from a comparison (what sets its predictions'
    intervals, planner/uncertainty.py), or None when the run was measured elsewhere or
    nothing could be predicted."""
    if not res["same_machine"] or res["mape"] is None:
        return None
    return {"run": res["run"], "mape": res["mape"], "max_abs_error_pct": res["max_abs_error_pct"],
            "num_configs": res["num_predicted"]}
