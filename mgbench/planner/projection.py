"""The closing section of a run: what the measured workload would do on catalog hardware,
and how far the model's prediction for this machine was from what was just measured.

`mgbench run` prints it and the report shows it under "Projection". Nothing here is
measured on the catalog systems: those rows are the planner's predictions with their
intervals (planner/uncertainty.py). The check against this machine uses a hardware
profile of it (`mgbench probe`), never a fit to the run being checked.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from .. import catalog, store
from ..errors import MgbenchError, first_line
from ..record import config_from_record

# One node of each: the previous, current and a non-NVIDIA generation.
SYSTEMS = ("dgx-a100", "dgx-h100", "mi300x-8")
PROJECTION_TOKENS = 1e9  # for $/M tokens only (a ratio, the same at any token count)


def _workload(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's most measured model, its sequence length and precision (ok configs)."""
    # A user's command (workload = "command") has no model mgbench knows, and the planner
    # models decoder LMs only (not the vision workload): nothing to project for either.
    ok = [r for r in records if r["status"] == "ok" and r.get("workload", "gpt") == "gpt"]
    if not ok:
        return None
    name = Counter(r["model_name"] for r in ok).most_common(1)[0][0]
    rec = next(r for r in ok if r["model_name"] == name)
    cfg = config_from_record(rec)
    return {"shape": cfg.shape, "seq_len": cfg.seq_len, "device": rec["device"],
            "precision": "bf16" if cfg.precision == "fp32" else cfg.precision}


def catalog_rows(shape: Any, seq_len: int, precision: str, systems: tuple[str, ...] = SYSTEMS) -> list[dict[str, Any]]:
    """Per system, the best layout on one node (highest tokens/s that fits), with intervals."""
    from . import cost
    from .search import PlanOptions, _add_interval, _row, evaluate_system

    # One node of each system: its own GPU count (hardware.toml gpus_per_node).
    node = {s: catalog.systems()[s]["gpus_per_node"] for s in systems}
    opts = PlanOptions(tokens=PROJECTION_TOKENS, seq_len=seq_len, global_batch_tokens=max(seq_len * 64, 2**19),
                       systems=list(systems), max_gpus=max(node.values()), precision=precision)
    rows = []
    for system in systems:
        # A system the planner cannot price at this precision gets a row that says why,
        # and the others are still projected: this section closes a finished run, which
        # must not end in an error over what it projects (issue 30: an fp8 run on
        # suites/modern.toml exited 2 here, as an A100 has no FP8 units).
        left_out = _left_out(system, precision)
        if left_out is None:
            try:
                cols, _ = evaluate_system(shape, system, opts, cost.Prices())
            except MgbenchError as e:
                left_out = f"not projected: {first_line(str(e))}"
        if left_out is not None:
            rows.append({"system": system, "fits": False, "reason": left_out})
            continue
        at_node = cols["num_gpus"] == node[system]
        if not at_node.any():
            rows.append({"system": system, "fits": False, "reason": f"does not fit on {node[system]} GPUs of {system}"})
            continue
        i = max(at_node.nonzero()[0], key=lambda j: cols["tokens_per_s"][j])
        r = _row(cols, int(i))
        _add_interval(r, opts, shape)
        rows.append({**r, "fits": True, "tokens_per_s_per_gpu": r["tokens_per_s"] / r["num_gpus"]})
    return rows


def _left_out(system: str, precision: str) -> str | None:
    """Why ``system`` has no row at ``precision``, known before pricing it: an fp8 run is
    projected onto GPUs with FP8 units only (the catalog's fp8 peak); None otherwise."""
    gpu = catalog.systems()[system]["gpu"]
    if precision == "fp8" and catalog.accelerator_peak(gpu, "fp8") is None:
        return f"left out: its {gpu} has no FP8 peak in the catalog (an fp8 run is projected onto FP8 GPUs only)"
    return None


def this_machine(run_dir: Path, results_dir: str | Path, hostname: str | None, device: str) -> dict[str, Any]:
    """The model's prediction for the configs just measured, from this machine's newest
    profile; or the reason there is none."""
    from ..probe.profile import read_profile
    from .against import against_run

    profiles = sorted(store.profiles_dir(results_dir).glob(f"{hostname}-{device}-*.json")) if hostname else []
    if not profiles:
        return {"null_reason": "no hardware profile of this machine: run `mgbench probe`, then "
                               f"`mgbench predict --hardware PROFILE --against {run_dir.name}`"}
    try:
        prof = read_profile(profiles[-1])
        res = against_run(prof, str(run_dir), results_dir)
    except MgbenchError as e:  # the check cannot be made: it says why, the run still closes
        return {"null_reason": f"the model was not checked against this run: {first_line(str(e))}"}
    res["profile"] = str(profiles[-1])
    return res


def projection(run_dir: Path, results_dir: str | Path = "results") -> dict[str, Any]:
    """The whole closing section, as data (printed by `run`, drawn by the report)."""
    manifest = store.read_manifest(run_dir)
    records = store.latest_records(store.read_records(run_dir))
    work = _workload(records)
    if work is None:
        return {"null_reason": "no ok config to project"}
    out: dict[str, Any] = {
        "model": work["shape"].name, "seq_len": work["seq_len"], "precision": work["precision"],
        "catalog": catalog_rows(work["shape"], work["seq_len"], work["precision"]),
        "this_machine": this_machine(run_dir, results_dir, (manifest.get("machine") or {}).get("hostname"),
                                     work["device"]),
    }
    if any(r["device"] == "cpu" for r in records if r["status"] == "ok"):
        out["cpu_note"] = ("measured on CPU ranks that share this host's cores: the run's own scaling says how the "
                           "strategies compare here, not how GPUs scale; the catalog rows are predictions in "
                           f"{work['precision']} (the CPU run was fp32)")
    return out


def lines(p: dict[str, Any]) -> list[str]:
    """The section as text lines for the terminal."""
    from .search import schedule_label

    if "null_reason" in p:
        return [f"Projection: none ({p['null_reason']})"]
    out = [f"Projection: {p['model']} at sequence {p['seq_len']}, {p['precision']}, one node of each system "
           "(predicted, with intervals)"]
    for r in p["catalog"]:
        if not r["fits"]:
            out.append(f"  {r['system']:<10} {r['reason']}")
            continue
        lo, hi = r["tokens_per_s_per_gpu_interval"]
        usd = "-" if r["usd_per_million_tokens"] is None else f"${r['usd_per_million_tokens']:.3g}/M tokens"
        out.append(f"  {r['system']:<10} {r['tokens_per_s_per_gpu']:>12,.0f} tokens/s/GPU ({lo:,.0f} to {hi:,.0f}), "
                   f"tp={r['tp']} pp={r['pp']} dp={r['dp']} ZeRO-{r['zero']} mb={r['micro_batch']}"
                   + (f" {lab}" if (lab := schedule_label(r)) else "") + ", "
                   f"{r['memory_per_gpu_bytes'] / 1e9:.1f} GB/GPU, {usd}")
    m = p["this_machine"]
    if "null_reason" in m:
        out.append(f"  this machine: {m['null_reason']}")
    elif m["mape"] is not None:
        out.append(f"  this machine: the model, from {Path(m['profile']).name}, predicted the {m['num_predicted']} "
                   f"measured configs with mean |error| {m['mape']:.0f}% (max {m['max_abs_error_pct']:.0f}%)")
    if p.get("cpu_note"):
        out.append(f"  note: {p['cpu_note']}")
    return out
