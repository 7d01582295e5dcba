"""Assemble one self-contained HTML report: plotly.js inlined once, every figure a div
that shares it, so the file opens from file:// with the network off."""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

import pandas as pd

from .. import __version__, store
from ..stats import MIN_CI_SAMPLES
from ..procs import run_status
from ..record import FAILED_STATUSES, control_verdict
from ..show import NOISY_CI_PCT, input_bound_note, noise_pct
from . import figures

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c8cdd8}nav{padding:8px 32px;background:#e9ecf2}nav a{margin-right:16px;color:#1d2330}
main{padding:8px 32px 48px}section{background:#fff;border-radius:8px;padding:16px 20px;margin:16px 0;
box-shadow:0 1px 3px rgba(0,0,0,.08)}h2{margin-top:0}p.caption{color:#4a5264;margin:2px 0 18px;font-size:14px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border-bottom:1px solid #e3e6ec;padding:4px 10px;
text-align:left}th{background:#f0f2f6}ul.warn li{margin:4px 0}.bad{color:#b3261e;font-weight:600}
.note{color:#6b7280;font-style:italic}
"""


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    if not rows:
        return '<p class="note">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in columns)
    body = []
    for r in rows:
        cells = []
        for k, _ in columns:
            v = r.get(k)
            if isinstance(v, float):
                v = None if v != v else f"{v:,.4g}"  # NaN: unknown
            cells.append(f"<td>{html.escape('-' if v is None else str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def warnings(df: pd.DataFrame) -> list[str]:
    """Things a careful reader should know, each with what to do about it. Warnings that
    many configs share are given once, with the configs listed."""
    out: list[str] = []
    shared: dict[str, list[str]] = {}
    for _, r in df.iterrows():
        label = r.get("label") or r.get("config_id")
        status = r.get("status")
        if status in (*FAILED_STATUSES, "interrupted"):
            out.append(f"{label}: {status}: {r.get('error')}")
            continue
        if status == "checked":  # a negative control: worth a line only when the check missed its bug
            correct = r.get("correct")
            rec = {**r.to_dict(), "correct": None if correct is None or pd.isna(correct) else bool(correct)}
            if rec["correct"] is not False:
                out.append(f"{label}: negative control {control_verdict(rec)}")
            continue
        if status != "ok":
            continue
        if r.get("correct") is False:
            out.append(f"{label}: INCORRECT — {r.get('correct_reason')}; its throughput is not a result")
        med = r.get("step_time_s")
        lo = r.get("step_time_ci95_low_s")
        width = noise_pct(r)
        if width is not None and width > NOISY_CI_PCT:
            shared.setdefault(f"noisy: the 95% CI of the median step time is wider than {NOISY_CI_PCT:.0f}% of it; "
                              "raise measured_steps, or set rounds = 5 on a shared machine, before comparing these",
                              []).append(f"{label} ({width:.0f}%)")
        elif med and (lo is None or pd.isna(lo)):
            shared.setdefault(f"fewer than {MIN_CI_SAMPLES} measured steps, so no confidence interval; raise "
                              "measured_steps", []).append(
                str(label))
        times = r.get("step_times_s")
        if isinstance(times, list) and len(times) > 2 and med and times[0] > 2 * med:
            out.append(f"{label}: the first measured step was {times[0] / med:.1f}x the median; raise warmup_steps")
        window = r.get("energy_window_s")
        if r.get("energy_j") is not None and pd.notna(r.get("energy_j")) and window is not None and window < 5:
            shared.setdefault("energy measured over less than 5 s: the NVML counter updates in coarse steps; raise "
                              "measured_steps for a steadier energy per token", []).append(f"{label} ({window:.1f} s)")
        if r.get("input_bound") == True:  # noqa: E712 (pandas may hand numpy bools; NaN: not a disk config)
            out.append(f"{label}: {input_bound_note(r)}")
        if isinstance(r.get("ranks_warning"), str):  # NaN where no record has one
            out.append(f"{label}: {r['ranks_warning']}")
        strag = r.get("straggler_ranks")
        if isinstance(strag, list) and strag:
            out.append(f"{label}: straggler rank(s) {strag} (per-rank busy time spread {r.get('rank_spread_pct'):.0f}%)")
    for series, pts in figures.scaling_points(df).items():
        noisy = [p for p in pts if p["noise"]]
        if noisy:
            shared.setdefault("scaling efficiency above 100% on CPU ranks that share the host's cores: noise of this "
                              "machine under load, not super-linear scaling; rerun with rounds = 5 on a quiet machine",
                              []).extend(f"{series} at {p['nproc']} ranks ({p['efficiency_pct']:.0f}%)" for p in noisy)
    return out + [f"{what} — {', '.join(who)}" for what, who in shared.items()]


def _figure_block(fig_caption: tuple[Any, str] | None, missing: str) -> str:
    if fig_caption is None:
        return f'<p class="note">{html.escape(missing)}</p>'
    fig, caption = fig_caption
    div = fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})
    return f'<div class="figure">{div}</div><p class="caption">{html.escape(caption)}</p>'


def memory_section(df: pd.DataFrame, cap: float | None, cap_label: str) -> str:
    """Tracked vs predicted memory (figure and per-config table), then the device peaks."""
    from .memory_vs_model import AGREEMENT_PCT, compare_records

    rows = compare_records(df.to_dict("records")) if not df.empty else []
    shown = [{"label": r["label"],
              "tracked": r.get("tracked_total_bytes", 0) / 2**20 if r["reason"] is None else None,
              "predicted": r.get("predicted_total_bytes", 0) / 2**20 if r["reason"] is None else None,
              "error_pct": r.get("error_pct"),
              "verdict": r["reason"] or ("agrees" if r["agrees"] else f"off by more than {AGREEMENT_PCT:g}%")}
             for r in rows]
    table = _table(shown, [("label", "config"), ("tracked", "tracked MiB"), ("predicted", "predicted MiB"),
                           ("error_pct", "error %"), ("verdict", "")])
    return (_figure_block(figures.memory_vs_model(df), "no tracked memory in these runs (runs from before "
                                                       "tracking, or every config failed)")
            + "<h3>Tracked peak vs the analytic model, per config</h3>" + table
            + _figure_block(figures.memory(df, cap, cap_label), "no device memory figures"))


def projection_section(run_dir: Path, results_dir: str | Path, p: dict[str, Any] | None = None) -> str:
    """The closing section: the run's workload on catalog hardware (predicted, with
    intervals) and the model checked against this machine (planner/projection.py);
    ``p`` when the caller already has it."""
    from ..planner.projection import projection
    from ..planner.search import schedule_label

    try:
        p = p if p is not None else projection(run_dir, results_dir)
    except Exception as e:  # a projection problem must not cost the report
        return f'<p class="note">no projection: {html.escape(str(e))}</p>'
    if "null_reason" in p:
        return f'<p class="note">no projection: {html.escape(p["null_reason"])}</p>'
    rows = []
    for r in p["catalog"]:
        if not r["fits"]:
            rows.append({"system": r["system"], "layout": r["reason"]})
            continue
        lo, hi = r["tokens_per_s_per_gpu_interval"]
        rows.append({"system": r["system"], "layout": f"{r['num_gpus']} GPUs, tp={r['tp']} pp={r['pp']} dp={r['dp']} "
                                                      f"ZeRO-{r['zero']} mb={r['micro_batch']}"
                                                      + (f" {lab}" if (lab := schedule_label(r)) else ""),
                     "tps": f"{r['tokens_per_s_per_gpu']:,.0f}", "interval": f"{lo:,.0f} to {hi:,.0f}",
                     "mem": f"{r['memory_per_gpu_bytes'] / 1e9:.2f}",
                     "usd": "-" if r["usd_per_million_tokens"] is None else f"{r['usd_per_million_tokens']:.3g}",
                     "regime": r["regime"]})
    out = (f"<p>{html.escape(p['model'])} at sequence {p['seq_len']} in {p['precision']} on one node of each system: "
           "predictions of mgbench's planner, not measurements, each with its interval and where the interval comes "
           "from.</p>" + _table(rows, [("system", "system"), ("layout", "best layout"), ("tps", "tokens/s/GPU"),
                                       ("interval", "interval"), ("mem", "GB/GPU"), ("usd", "$/M tokens"),
                                       ("regime", "interval from")]))
    m = p["this_machine"]
    if "null_reason" in m:
        out += f"<h3>This machine</h3><p class='note'>{html.escape(m['null_reason'])}</p>"
    else:
        out += ("<h3>This machine: the model against what was just measured</h3>"
                + (f"<p>mean |error| {m['mape']:.0f}% over {m['num_predicted']} configs (max "
                   f"{m['max_abs_error_pct']:.0f}%), from the profile {html.escape(Path(m['profile']).name)}</p>"
                   if m["mape"] is not None else "<p class='note'>no config could be predicted</p>")
                + _table([{"label": r["label"], "measured": f"{r['measured_s']:.4f}",
                           "predicted": "-" if r["predicted_s"] is None else f"{r['predicted_s']:.4f}",
                           "error": r["reason"] if r["predicted_s"] is None else f"{r['error_pct']:+.0f}%"}
                          for r in m["rows"]], [("label", "config"), ("measured", "measured s"),
                                                ("predicted", "predicted s"), ("error", "error")]))
    if p.get("cpu_note"):
        out += f"<p class='note'>{html.escape(p['cpu_note'])}</p>"
    return out


def build(runs: list[str | Path], output: str | Path, results_dir: str | Path = "results",
          plan: dict[str, Any] | None = None, compare_rows: list[dict[str, Any]] | None = None,
          projection: "dict[str, Any] | bool" = True) -> Path:
    """Write the report for one or many runs (and optionally a plan and a comparison).
    ``projection``: the first run's closing projection as `run` computed it, True to
    compute it here, False for none."""
    from plotly.offline import get_plotlyjs

    paths = [store.resolve_run(r, results_dir) for r in runs]
    manifests = [store.read_manifest(p) for p in paths]
    df = store.load(paths)
    comm = pd.DataFrame([row for p in paths for row in store.load_comm_rows(p)])

    m0 = manifests[0]["machine"]
    gpus = m0.get("gpus") or []
    if gpus:
        cap, cap_label = gpus[0]["memory_gib"], f"{gpus[0]['name']} memory"
    else:
        cap, cap_label = m0.get("ram_gib"), "host RAM (shared by all ranks)"

    counts = df["status"].value_counts().to_dict() if not df.empty else {}
    ok = df[(df["status"] == "ok")] if not df.empty else df
    best = []
    if not ok.empty:
        good = ok[ok["correct"].fillna(True).astype(bool)] if "correct" in ok else ok
        # Token workloads only: vision records count images (images_per_s), not tokens.
        good = good[good["tokens_per_s"].notna()] if "tokens_per_s" in good else good
        for strat, g in good.groupby("strategy"):
            r = g.loc[g["tokens_per_s"].idxmax()]
            best.append({"strategy": strat, "label": r.get("label"), "tokens_per_s": r["tokens_per_s"],
                         "tokens_per_s_per_device": r["tokens_per_s_per_device"], "mfu_pct": r.get("mfu_pct"),
                         "mem_peak_gib": r.get("mem_peak_gib"), "run_id": r.get("run_id")})
        best.sort(key=lambda x: -x["tokens_per_s"])

    sections: list[tuple[str, str, str]] = []
    machine_rows = [{"run": m["run_id"], "suite": (m.get("suite") or {}).get("name"), "status": run_status(m)[0],
                     "host": m["machine"].get("hostname"), "cpu": m["machine"].get("cpu_model"),
                     "gpus": f"{m['machine'].get('gpu_count')} x {m['machine'].get('gpu_name')}" if m["machine"].get("gpu_count") else "none",
                     "torch": m["machine"].get("torch"), "mgbench": m["machine"].get("mgbench"),
                     "git": (m["machine"].get("git_sha") or "-")[:12], "started": m.get("started_at")} for m in manifests]
    warn = warnings(df) if not df.empty else []
    summary = (
        _table(machine_rows, [(k, k) for k in ("run", "suite", "status", "host", "cpu", "gpus", "torch", "mgbench", "git", "started")])
        + "<h3>Configs by status</h3>" + _table([counts], [(k, k) for k in counts])
        + "<h3>Best correct config per strategy</h3>"
        + _table(best, [("strategy", "strategy"), ("label", "config"), ("tokens_per_s", "tokens/s"),
                        ("tokens_per_s_per_device", "tokens/s/device"), ("mfu_pct", "MFU %"),
                        ("mem_peak_gib", "peak GiB"), ("run_id", "run")])
        + "<h3>Warnings</h3>"
        + ("<ul class='warn'>" + "".join(f"<li>{html.escape(w)}</li>" for w in warn) + "</ul>" if warn
           else '<p class="note">none: every config ran, matched the reference and measured steadily</p>' if len(df)
           else "<ul class='warn'><li>no config recorded yet (run status: "
                + html.escape(", ".join(str(run_status(m)[0]) for m in manifests)) + "): nothing here is a result</li></ul>")
    )
    sections.append(("summary", "Summary", summary))
    sections.append(("scaling", "Scaling",
                     _figure_block(figures.throughput_scaling(df), "no successful configs to plot")
                     + _figure_block(figures.scaling_efficiency(df), "only one device count: no scaling efficiency")
                     + _figure_block(figures.step_time_distribution(df), "no step-time samples")))
    sections.append(("breakdown", "Time breakdown",
                     _figure_block(figures.time_breakdown(df),
                                   "no configs with a measured breakdown (pipeline bubbles or profiled communication)")))
    sections.append(("memory", "Memory", memory_section(df, cap, cap_label)))
    reasons = sorted(set(df["energy_reason"].dropna())) if "energy_reason" in df else []
    sections.append(("energy", "Energy", _figure_block(
        figures.energy(df), "energy not measured: " + ("; ".join(reasons) if reasons else "no configs"))))
    sections.append(("comm", "Communication", _figure_block(
        figures.comm_bandwidth(comm), "no collective measurements in these runs (run `mgbench comm`)")))
    if plan is not None:
        rec = plan.get("recommendation")
        body = ("<h3>Recommendation</h3><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in plan.get("reasons", []))
                + "</ul>" + _figure_block(figures.plan_pareto(plan), "no priced options to plot")
                + _figure_block(figures.plan_usd_per_mtok(plan), "no priced options")
                + _table(plan.get("ranked", [])[:15], [(k, k) for k in ("system", "num_gpus", "tp", "pp", "dp", "zero",
                                                                        "micro_batch", "recompute", "days", "cost_usd",
                                                                        "usd_per_million_tokens", "energy_kwh")]))
        if rec is None:
            body = '<p class="bad">no layout meets the constraints</p>' + body
        sections.append(("plan", f"Plan: {plan.get('model')} on {plan.get('tokens'):.3g} tokens", body))
    if compare_rows is not None:
        sections.append(("compare", "Comparison", _table(compare_rows, [
            ("label", "config"), ("metric", "metric"), ("base", "base"), ("new", "new"), ("change_pct", "change %"),
            ("p_value", "p"), ("p_basis", "p from"), ("verdict", "verdict")]) + '<p class="caption">A change counts '
            "only when it is significant (Mann-Whitney U, p &lt; 0.05, on window medians when each run has 5 or more, "
            "else on raw step times) and past the threshold; otherwise ~.</p>"))

    if projection is not False:
        sections.append(("projection", "Projection",
                         projection_section(paths[0], results_dir, None if projection is True else projection)))

    title = "mgbench report: " + ", ".join(m["run_id"] for m in manifests)
    nav = "".join(f'<a href="#{sid}">{html.escape(name)}</a>' for sid, name, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{html.escape(name)}</h2>{content}</section>' for sid, name, content in sections)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<header><h1>{html.escape(title)}</h1><p>generated {dt.datetime.now().isoformat(timespec='seconds')} "
            f"by mgbench {__version__}</p></header><nav>{nav}</nav><main>{body}</main></body></html>")
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(page)
        tmp.replace(out)
    except OSError:  # a full disk, a read-only folder, a directory named like the page: leave no half page
        tmp.unlink(missing_ok=True)
        raise
    return out
