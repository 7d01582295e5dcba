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
from ..errors import MgbenchError
from ..record import config_from_record


def against_run(profile: dict[str, Any], run: str, results_dir: str = "results") -> dict[str, Any]:
    """Per ok config of ``run``: measured and predicted step time, error; and the mean
    absolute percentage error over them."""
    from ..probe.profile import hardware, overlap
    from .perf import DEFAULT_OVERLAP
    from .predict import layout_of, predict

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
            pred = predict(cfg.shape, hw, layout_of(cfg),
                           overlap=overlap(profile, cfg.nproc, DEFAULT_OVERLAP), host_ops=counted_ops(cfg, hw))
        except MgbenchError as e:  # a layout the planner cannot price: say why, keep the others
            row["reason"] = str(e)
        else:
            p = float(pred["step_time_s"])
            row.update(predicted_s=p, error_pct=100.0 * (p - row["measured_s"]) / row["measured_s"],
                       breakdown=pred["breakdown"])
        rows.append(row)
    if len(_COUNTS) > known:
        _save_counts(run_dir)
    errs = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    host = (store.read_manifest(store.resolve_run(run, results_dir)).get("machine") or {}).get("hostname")
    return {"run": run, "profile_device": profile["device_name"], "rows": rows, "num_predicted": len(errs),
            "mape": float(np.mean(errs)) if errs else None, "max_abs_error_pct": float(np.max(errs)) if errs else None,
            "same_machine": host == profile.get("hostname"),
            "method": "profile throughputs (no fit to the run) through the planner's step-time model"
                      + ("; each config's non-matmul ops counted by tracing one step (planner/opcount.py)"
                         if device == "cpu" and any(r.get("breakdown", {}).get("attention_s") for r in rows) else "")
                      + ("; CPU ranks share the host's cores (see mgbench/probe/profile.py)" if device == "cpu" else "")}


def counted_ops(cfg: Any, hw: Any) -> dict[str, float] | None:
    """The config's counted non-matmul ops (one traced step of rank 0, planner/opcount.py)
    when ``hw`` prices them (a probed CPU profile), else None. Configs that differ only
    in what the count cannot see share one trace (cached per run of the planner)."""
    if hw.ew_bw is None:
        return None
    return _count(cfg)


def _count(cfg: Any) -> dict[str, float]:
    from .opcount import count_step, host_ops

    key = repr(sorted((k, v) for k, v in cfg.params().items() if k not in _NOT_COUNTED))
    if key not in _COUNTS:
        try:
            _COUNTS[key] = host_ops(count_step(cfg))
        except Exception as e:  # a config the fake-tensor trace cannot run: no prediction, and why
            raise MgbenchError(f"its ops could not be counted by tracing one step under fake tensors "
                               f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return _COUNTS[key]


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


def _save_counts(run_dir: Any) -> None:
    try:
        store.write_json_atomic(run_dir.op_counts, {"opcount_version": OPCOUNT_VERSION, "counts": _COUNTS})
    except OSError:  # a read-only run folder: the counts stay in memory only
        pass


# Bump when what a count holds changes: stored counts of another version are traced again.
OPCOUNT_VERSION = 1
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
