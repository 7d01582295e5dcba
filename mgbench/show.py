"""`mgbench show`: a run's records as a table, JSON or CSV."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from . import store
from .procs import run_status
from .record import control_verdict

TABLE_COLUMNS = [
    ("strategy", "strategy"), ("nproc", "n"), ("_layout", "dp/tp/pp"), ("model_name", "model"), ("micro_batch", "mb"),
    ("grad_accum", "ga"),
    ("seq_len", "seq"), ("precision", "prec"), ("status", "status"), ("step_time_s", "step s"),
    ("tokens_per_s", "tok/s"), ("tokens_per_s_per_device", "tok/s/dev"), ("mfu_pct", "MFU %"),
    ("mem_peak_gib", "peak GiB"), ("energy_per_token_j", "J/tok"), ("loss_max_rel_diff", "loss diff"),
    ("_bubble", "bubble meas/theory"), ("_data", "data wait"), ("correct", "correct"),
]


def _derived(r: dict[str, Any]) -> dict[str, Any]:
    """Cells computed from several record fields."""
    if r.get("workload") == "command":  # the user's own command: mgbench knows none of its model's keys
        return {"strategy": "command", "_layout": None, "model_name": None, "micro_batch": None, "grad_accum": None,
                "seq_len": None, "precision": None, "_bubble": None}
    lay = f"{r.get('dp', r.get('nproc'))}/{r.get('tp', 1)}/{r.get('pp', 1)}"
    # Degrees beyond dp/tp/pp, named where they are not 1 (expert and context parallelism).
    lay += "".join(f" {k}={r[k]}" for k in ("ep", "cp") if (r.get(k) or 1) != 1)
    if r.get("strategy") in ("pp", "pp+tp+dp"):
        lay += f" {r.get('pp_schedule')}"
    units = {}
    if r.get("workload") == "vision":
        # Images, not tokens: the throughput cells say img/s, and the seq cell the image size.
        units = {"tokens_per_s": _rate(r.get("images_per_s"), "img/s"),
                 "tokens_per_s_per_device": _rate(r.get("images_per_s_per_device"), "img/s"),
                 "seq_len": f"{r['image_size']}px" if r.get("image_size") else None}
    bubble = None
    if r.get("pp_bubble_theoretical") is not None:
        meas = r.get("pp_bubble_measured")
        bubble = f"{'-' if meas is None else f'{meas:.2f}'}/{r['pp_bubble_theoretical']:.2f}"
    return {"_layout": lay, "_bubble": bubble, "_data": data_wait_cell(r), **units}


def number(v: float) -> str:
    """A figure as the table prints it: whole with thousands separators from 1,000 up
    (15,156 tok/s, as the progress line says it: never 1.516e+04, nor 15160 rounded to
    four figures as if exact), four significant figures below (0.01277 s)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def clock(seconds: float) -> str:
    """Elapsed time as progress lines print it: m:ss, or h:mm:ss from an hour up."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _rate(v: float | None, unit: str) -> str | None:
    return None if v is None else f"{number(v)} {unit}"


def data_wait_cell(r: dict[str, Any]) -> str | None:
    """data = "disk": the median wait per step, its share of the step, and the flag."""
    wait, frac = r.get("data_wait_s"), r.get("data_wait_fraction")
    if wait is None or frac is None:
        return None
    return f"{_ms(wait)} ms {100 * frac:.0f}%" + (" INPUT-BOUND" if r.get("input_bound") else "")


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"  # 0.251, 19, 805, 1,474: never 1.47e+03


# A median step time whose 95% interval is wider than this share of it is called noisy.
NOISY_CI_PCT = 10.0


def noise_pct(r: Any) -> float | None:
    """The width of a record's 95% interval of the median step time, in % of the median
    (None where it has none: too few steps, or no timing); a dict or a pandas row."""
    med, lo, hi = (r.get(k) for k in ("step_time_s", "step_time_ci95_low_s", "step_time_ci95_high_s"))
    if not med or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (lo, hi)):
        return None
    return 100.0 * (hi - lo) / med


def input_bound_note(r: dict[str, Any]) -> str:
    """What an input-bound config means and what to try."""
    return (f"input-bound: waits {_ms(r['data_wait_s'])} ms per step for data, {100 * r['data_wait_fraction']:.0f}% "
            f"of the {_ms(r['step_time_s'])} ms step: the loader sets the pace, not the model; try more "
            "num_workers, prefetch_factor, persistent_workers (short passes), pin_memory on GPUs, or faster storage")


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return number(v)
    return v


# The cells of a timed window. A negative control (status "checked") shows none of them:
# it was not timed (records of schema 3 timed the clean model and keep those figures).
TIMED_COLUMNS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "mfu_pct", "mem_peak_gib",
                 "energy_per_token_j", "_bubble", "_data")
CONTROL_CELL = {False: "caught", True: "NOT CAUGHT", None: "-"}  # a negative control's correct cell


def table_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in records:
        r = {**r, **_derived(r)}
        control = r.get("status") == "checked"
        if control:
            r.update(dict.fromkeys(TIMED_COLUMNS))
        row = [_cell(r.get(k)) for k, _ in TABLE_COLUMNS]
        if control:
            row[-1] = CONTROL_CELL[r.get("correct")]
        elif r.get("correct") is False:
            row[-1] = "NO (fast but wrong)"
        rows.append(row)
    return rows


def render(run_dir: Path, fmt: str = "table") -> str:
    """The records of a run as a table (tabulate), JSON (full records) or CSV."""
    records = store.latest_records(store.read_records(run_dir))
    if fmt == "json":
        return json.dumps({"manifest": store.read_manifest(run_dir), "records": records}, indent=2, default=str)
    if fmt == "csv":
        df = store.load([run_dir])
        for col in df.columns:  # lists and tables as JSON, which a CSV reader can parse, not Python's repr
            if df[col].map(lambda v: isinstance(v, (list, dict))).any():
                df[col] = df[col].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
        return df.to_csv(index=False).rstrip("\n")
    from tabulate import tabulate

    manifest = store.read_manifest(run_dir)
    head = (f"run {manifest['run_id']}  suite {(manifest.get('suite') or {}).get('name', '-')}  "
            f"on {manifest['machine'].get('gpu_name') or manifest['machine'].get('cpu_model')}  "
            f"status {run_status(manifest)[0]}")
    body = tabulate(table_rows(records), headers=[h for _, h in TABLE_COLUMNS], tablefmt="simple")
    notes = [f"  {r['config_id']}: {r['status']}: {r.get('error') or r.get('skip_reason')}"
             for r in records if r["status"] not in ("ok", "checked")]
    notes += [f"  {r['config_id']}: {r['correct_reason']}" for r in records
              if r.get("correct") is False and r["status"] != "checked"]
    notes += [f"  {r['config_id']}: negative control: {control_verdict(r)}" for r in records if r["status"] == "checked"]
    notes += [f"  {r['config_id']}: {input_bound_note(r)}" for r in records if r.get("input_bound")]
    notes += [f"  {r['config_id']}: {r['ranks_warning']}" for r in records if r.get("ranks_warning")]
    noisy = [f"{r['config_id']} ({w:.0f}%)" for r in records
             if r["status"] == "ok" and (w := noise_pct(r)) is not None and w > NOISY_CI_PCT]
    if noisy:  # one line for all of them: on a shared CPU most configs are
        notes.append(f"  noisy, the median step time's 95% interval above {NOISY_CI_PCT:.0f}% of it (raise measured_steps, "
                     f"or set rounds = 5, before comparing these): {', '.join(noisy)}")
    crowded = sorted({r["rank_spread_reason"].split(":")[0] for r in records
                      if r["status"] == "ok" and "cores" in str(r.get("rank_spread_reason") or "")})
    notes += [f"  ranks share this host's cores ({c}): timings of such configs are the machine's contention as "
              "much as the strategy's" for c in crowded]
    notes += [f"  {r['config_id']}: straggler rank(s) {r['straggler_ranks']}: busy "
              + ", ".join(f"{b * 1000:.1f}" for b in r["per_rank_busy_s"]) + " ms/step per rank "
              f"(spread {r['rank_spread_pct']:.0f}%)" for r in records if r.get("straggler_ranks")]
    out = f"{head}\n{body}"
    if notes:
        out += "\n\nnotes:\n" + "\n".join(notes)
    return out
