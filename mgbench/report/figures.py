"""One function per report figure: DataFrame in, (figure, caption) out, or None when the
runs hold no data for it. Every axis names its unit; every caption says what to read."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..record import identity_of_record

Figure = tuple[go.Figure, str]
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=20, t=50, b=60),
              legend=dict(orientation="h", y=-0.2))


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"].copy() if "status" in df else df.iloc[0:0]


def _correct(df: pd.DataFrame) -> pd.Series:
    return df["correct"].fillna(True).astype(bool) if "correct" in df else pd.Series(True, index=df.index)


def _series_key(df: pd.DataFrame) -> pd.Series:
    """What a line on a scaling plot holds fixed: every workload field of the config
    schema except the device count it scales over (nproc, and dp with it), so configs
    that differ in anything else (compression, precision, model dims) are separate lines.
    Named by the config's label without its device count."""
    def name(r: pd.Series) -> str:
        rec = {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in r.items()}
        fixed = [kv for kv in identity_of_record(rec) if kv[0] not in ("nproc", "dp")]
        label = re.sub(r" n=\d+|dp=\d+ ", "", str(rec.get("label") or rec.get("strategy")))
        return f"{label} #{hashlib.sha1(json.dumps(fixed, default=str).encode()).hexdigest()[:4]}"

    key = df.apply(name, axis=1)
    # The hash only tells lines apart when their names collide; drop it elsewhere.
    bare = key.str.rsplit(" #", n=1).str[0]
    key = key.where(key.groupby(bare).transform("nunique") > 1, bare)
    if "run_id" in df and df["run_id"].nunique() > 1:
        key = key + " " + df["run_id"].astype(str).str.split("-", n=2).str[-1]  # suite name + suffix
    return key


def throughput_scaling(df: pd.DataFrame) -> Figure | None:
    ok = _ok(df)
    if ok.empty:
        return None
    ok["series"] = _series_key(ok)
    fig = go.Figure()
    for name, g in ok.groupby("series", sort=True):
        good = g[_correct(g)].groupby("nproc")["tokens_per_s"].max().sort_index()
        if not good.empty:
            fig.add_trace(go.Scatter(x=good.index, y=good.values, mode="lines+markers", name=name))
            n0, t0 = good.index[0], good.iloc[0]
            fig.add_trace(go.Scatter(x=good.index, y=[t0 * n / n0 for n in good.index], mode="lines",
                                     line=dict(dash="dot", width=1), name=f"ideal ({name})", showlegend=False,
                                     hoverinfo="skip"))
        bad = g[~_correct(g)]
        if not bad.empty:
            fig.add_trace(go.Scatter(x=bad["nproc"], y=bad["tokens_per_s"], mode="markers",
                                     marker=dict(symbol="x", size=12, color="red"), name=f"INCORRECT loss: {name}"))
    fig.update_layout(title="Throughput vs device count", xaxis_title="devices (ranks)",
                      yaxis_title="tokens/s (global)", **LAYOUT)
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig, ("Each line is one strategy and per-rank batch; the dotted line is perfect linear scaling from "
                 "its smallest device count. The gap between them is what communication and synchronisation cost. "
                 "Red crosses are configs whose loss did not match the single-process reference: not winners.")


def scaling_efficiency(df: pd.DataFrame) -> Figure | None:
    ok = _ok(df)
    ok = ok[_correct(ok)]
    if ok.empty or ok["nproc"].nunique() < 2:
        return None
    fig = go.Figure()
    for name, pts in scaling_points(df).items():
        # Above 100% on CPU ranks that share cores is measurement noise, not super-linear
        # scaling: hatched and named as such, never drawn like a result.
        fig.add_trace(go.Bar(x=[str(p["nproc"]) for p in pts], y=[p["efficiency_pct"] for p in pts], name=name,
                             marker_pattern_shape=["x" if p["noise"] else "" for p in pts],
                             hovertext=["noise: above 100% on shared CPU cores" if p["noise"] else "" for p in pts]))
    if not fig.data:
        return None
    fig.add_hline(y=100, line_dash="dot", annotation_text="linear scaling")
    fig.update_layout(title="Scaling efficiency", xaxis_title="devices (ranks)", yaxis_title="efficiency (%)",
                      barmode="group", **LAYOUT)
    return fig, ("Throughput per device relative to the same strategy at its smallest device count (100% = linear). "
                 "On a CPU host, ranks share the cores, so efficiency falls even without communication; a hatched bar "
                 "above 100% there is noise of this machine under load, not a result.")


def scaling_points(df: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Per series, each device count's efficiency (%) against its smallest count, and
    whether it is noise (above 100% on CPU ranks, which share the host's cores)."""
    ok = _ok(df)
    ok = ok[_correct(ok)]
    if ok.empty or ok["nproc"].nunique() < 2:
        return {}
    ok["series"] = _series_key(ok)
    out = {}
    for name, g in ok.groupby("series", sort=True):
        best = g.groupby("nproc")["tokens_per_s"].max().sort_index()
        if len(best) < 2:
            continue
        cpu = bool((g["device"] == "cpu").all()) if "device" in g else False
        n0, t0 = best.index[0], best.iloc[0]
        out[str(name)] = [{"nproc": int(n), "efficiency_pct": 100.0 * t / (t0 * n / n0),
                           "noise": cpu and n > n0 and t / (t0 * n / n0) > 1.0} for n, t in best.items()]
    return out


def step_time_distribution(df: pd.DataFrame) -> Figure | None:
    ok = _ok(df)
    if ok.empty or "step_times_s" not in ok:
        return None
    fig = go.Figure()
    for _, r in ok.iterrows():
        times = r["step_times_s"]
        if isinstance(times, list) and times:
            fig.add_trace(go.Box(y=[t * 1000 for t in times], name=str(r.get("label", r["config_id"]))[:60],
                                 boxpoints="all", jitter=0.3, pointpos=0))
    if not fig.data:
        return None
    fig.update_layout(title="Step time distribution (raw samples)", yaxis_title="step time (ms)",
                      showlegend=False, **{**LAYOUT, "height": 480})
    fig.update_xaxes(tickangle=30)
    return fig, ("Every measured step of every config (the slowest rank's time). A wide box or far outliers mean "
                 "a noisy measurement: raise measured_steps, or set rounds = 5 on a shared machine, before trusting small "
                 "differences.")


BREAKDOWN = [("breakdown_compute_s", "compute"), ("breakdown_exposed_comm_s", "exposed communication"),
             ("breakdown_bubble_s", "pipeline bubble"), ("breakdown_idle_s", "idle / other")]


def time_breakdown(df: pd.DataFrame) -> Figure | None:
    ok = _ok(df)
    ok = ok.copy()
    if "pp_bubble_measured" in ok:
        has = ok["pp_bubble_measured"].notna()
        ok.loc[has, "breakdown_bubble_s"] = ok.loc[has, "pp_bubble_measured"] * ok.loc[has, "step_time_s"]
    cols = [c for c, _ in BREAKDOWN if c in ok]
    if not cols:
        return None
    ok = ok[ok[cols].notna().any(axis=1)]
    if ok.empty:
        return None
    fig = go.Figure()
    labels = [str(x)[:60] for x in ok.get("label", ok["config_id"])]
    for col, name in BREAKDOWN:
        if col in ok:
            fig.add_trace(go.Bar(x=labels, y=(ok[col].fillna(0) * 1000).tolist(), name=name))
    if "breakdown_compute_s" not in ok and "breakdown_bubble_s" in ok:
        rest = (ok["step_time_s"] - ok["breakdown_bubble_s"].fillna(0)) * 1000
        fig.add_trace(go.Bar(x=labels, y=rest.tolist(), name="busy (compute + communication)"))
    fig.update_layout(title="Where the step time goes", yaxis_title="time per step (ms)", barmode="stack", **LAYOUT)
    fig.update_xaxes(tickangle=30)
    return fig, ("Each bar is one config's median step split into its measured parts; only configs where a "
                 "part was measured appear. Exposed communication and bubbles are the time a faster network "
                 "or more micro-batches would win back.")


def memory(df: pd.DataFrame, capacity_gib: float | None, capacity_label: str) -> Figure | None:
    ok = _ok(df)
    if ok.empty or "mem_peak_gib" not in ok or ok["mem_peak_gib"].isna().all():
        return None
    fig = go.Figure()
    for strat, g in ok.groupby("strategy", sort=True):
        fig.add_trace(go.Bar(x=[str(x)[:60] for x in g.get("label", g["config_id"])], y=g["mem_peak_gib"], name=strat))
    if capacity_gib:
        fig.add_hline(y=capacity_gib, line_dash="dash", line_color="red", annotation_text=capacity_label)
    method = ok["mem_method"].dropna().iloc[0] if "mem_method" in ok and ok["mem_method"].notna().any() else "?"
    fig.update_layout(title=f"Peak memory per device while training ({method})",
                      yaxis_title="peak memory per rank (GiB)", **LAYOUT)
    fig.update_xaxes(tickangle=30)
    return fig, ("Training peak of the most loaded rank of each config (from the sharded model on; the build's "
                 "peak is the record's mem_init_peak_gib), against the device's capacity (dashed). On GPUs this "
                 "is the caching allocator's max allocated memory; on CPU it is resident memory of the whole "
                 "process, interpreter and libraries included, so it says little about the model: the tracked "
                 "figure above does.")


def memory_vs_model(df: pd.DataFrame) -> Figure | None:
    """Tracked memory (one step under torch's tracker, busiest rank) beside the analytic
    model's prediction for the same config, both stacked by the model's categories."""
    from .memory_vs_model import MODEL_OF_TRACKED, compare_records

    ok = _ok(df)
    if ok.empty or "mem_tracked_peak_bytes" not in ok or ok["mem_tracked_peak_bytes"].isna().all():
        return None
    rows = [r for r in compare_records(ok.to_dict("records")) if r["reason"] is None]
    if not rows:
        return None
    groups = [f"{str(r['label'])[:40]} ({r['error_pct']:+.0f}%)" for r in rows]
    x = [[g for g in groups for _ in (0, 1)], ["tracked", "predicted"] * len(rows)]
    fig = go.Figure()
    for key in MODEL_OF_TRACKED:
        y = [v / 2**20 for r in rows for v in (r[f"tracked_{key}"], r[f"predicted_{key}"])]
        fig.add_trace(go.Bar(x=x, y=y, name=key.replace("_bytes", "")))
    fig.update_layout(title="Tracked vs predicted memory per rank", yaxis_title="MiB per rank (busiest rank)",
                      barmode="stack", **{**LAYOUT, "height": 480})
    fig.update_xaxes(tickangle=30)
    return fig, ("For each config, left: the tensors torch's memory tracker saw live at the peak of one training "
                 "step on the busiest rank (untimed, after the measured steps); right: `mgbench memory`'s analytic "
                 "model for the same config. The percentage is the predicted total's error against the tracked "
                 "peak. Temporaries include gathered FSDP parameters and communication buffers (DDP gradient "
                 "buckets, FSDP all-gather / reduce-scatter, pipeline send/receive).")


def energy(df: pd.DataFrame) -> Figure | None:
    ok = _ok(df)
    if ok.empty or "energy_per_token_j" not in ok or ok["energy_per_token_j"].isna().all():
        return None
    ok = ok[ok["energy_per_token_j"].notna()]
    labels = [str(x)[:60] for x in ok.get("label", ok["config_id"])]
    fig = go.Figure(go.Bar(x=labels, y=ok["energy_per_token_j"] * 1000, name="energy per token",
                           text=[f"{w:.0f} W" if w is not None and w == w else ""  # a power the window could not give: None
                                 for w in ok.get("power_w", pd.Series(float("nan"), index=ok.index))],
                           textposition="outside"))
    fig.update_layout(title="Energy per token (measured window)", yaxis_title="energy per token (mJ)", **LAYOUT)
    fig.update_xaxes(tickangle=30)
    return fig, ("Energy counter difference over the measured window divided by the tokens trained in it; bar "
                 "labels give the total power of all devices measured (the sum over GPUs), averaged over the "
                 "window. Lower is cheaper to run, whatever the speed.")


def comm_bandwidth(comm: pd.DataFrame, peak_gbps: float | None = None) -> Figure | None:
    if comm is not None and "kind" in comm:
        comm = comm[comm["kind"].fillna("collective") != "copy"]  # copy bandwidth is not a collective's busbw
    if comm is None or comm.empty:
        return None
    fig = go.Figure()
    for (coll, n), g in comm.groupby(["collective", "nproc"], sort=True):
        g = g.sort_values("size_bytes")
        fig.add_trace(go.Scatter(x=g["size_bytes"], y=g["busbw_gbps"], mode="lines+markers", name=f"{coll} n={n}"))
    if peak_gbps:
        fig.add_hline(y=peak_gbps, line_dash="dash", line_color="red", annotation_text="link peak")
    fig.update_layout(title="Collective bus bandwidth vs message size", xaxis_title="message size (bytes)",
                      yaxis_title="bus bandwidth (GB/s)", **LAYOUT)
    fig.update_xaxes(type="log")
    return fig, ("nccl-tests' bus bandwidth: comparable across collectives and rank counts, and with the link's "
                 "peak. Small messages are latency-bound; the plateau is what the link delivers.")


def plan_pareto(plan: dict[str, Any]) -> Figure | None:
    rows = [r for r in plan.get("ranked", []) if r.get("cost_usd") is not None]
    if not rows:
        return None
    fig = go.Figure()
    for sys_name in sorted({r["system"] for r in rows}):
        g = [r for r in rows if r["system"] == sys_name]
        fig.add_trace(go.Scatter(x=[r["days"] for r in g], y=[r["cost_usd"] for r in g], mode="markers",
                                 name=sys_name, text=[f"{r['num_gpus']} GPUs" for r in g]))
    front = plan.get("pareto", [])
    if front:
        fig.add_trace(go.Scatter(x=[r["days"] for r in front], y=[r["cost_usd"] for r in front], mode="lines",
                                 line=dict(color="black", dash="dot"), name="Pareto front"))
    fig.update_layout(title="Time to train vs cost", xaxis_title="days", yaxis_title="cost (USD)", **LAYOUT)
    return fig, "Each point is a system at a GPU count with its best layout; the dotted line joins the options no other option beats on both time and cost."


def plan_usd_per_mtok(plan: dict[str, Any]) -> Figure | None:
    rows = [r for r in plan.get("ranked", []) if r.get("usd_per_million_tokens") is not None]
    if not rows:
        return None
    best: dict[str, float] = {}
    for r in rows:
        best[r["system"]] = min(best.get(r["system"], float("inf")), r["usd_per_million_tokens"])
    fig = go.Figure(go.Bar(x=list(best), y=list(best.values())))
    fig.update_layout(title="Cheapest USD per million tokens, by system", yaxis_title="USD per million tokens",
                      **LAYOUT)
    return fig, "The lowest cost per million training tokens each priced system reaches within the constraints."
