"""`mgbench plan --html FILE`: the plan as one self-contained page a buyer can show others.

The lead answer and why, the cheapest and the fastest beside it, and four figures: the
time/cost front with every option's interval, the best option per accelerator with the
evidence behind its efficiency, the lead layout's memory against the device, and buying
against renting over utilisation. plotly.js is inlined once (the run report's way), so
the file opens from file:// with the network off. A figure whose inputs are missing or
empty is replaced by a sentence saying so, never drawn empty.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from .. import __version__
from ..planner.cost import price_hint
from .figures import LAYOUT
from .html import CSS, _figure_block, _table

Figure = tuple[go.Figure, str]
MEMORY_PARTS = (("params_bytes", "weights"), ("grads_bytes", "gradients"), ("optimizer_bytes", "optimizer"),
                ("activations_bytes", "activations"), ("gathered_params_bytes", "gathered weights"),
                ("temporaries_bytes", "temporaries"), ("fixed_bytes", "fixed per process"),
                ("allowance_bytes", "allowance"))


def _label(r: dict[str, Any]) -> str:
    return f"{r['num_gpus']}x {r['gpu']} ({r['system']})"


def _above(r: dict[str, Any], interval: str, value: str) -> float:
    return r[interval][1] - r[value] if r.get(interval) else 0.0


def _below(r: dict[str, Any], interval: str, value: str) -> float:
    return r[value] - r[interval][0] if r.get(interval) else 0.0


def front_figure(plan: dict[str, Any]) -> Figure | None:
    """Every priced option, days against cost on log axes with its intervals; the front
    joined; the lead, the cheapest and the fastest named."""
    rows = [r for r in plan.get("options") or plan.get("ranked", []) if r.get("cost_usd") is not None]
    if not rows:
        return None
    fig = go.Figure()
    for gpu in sorted({r["gpu"] for r in rows}):
        g = [r for r in rows if r["gpu"] == gpu]
        err = {}  # intervals where computed (the front, the lead, the ranking's top), none drawn elsewhere
        if any(r.get("days_interval") for r in g):
            err["error_x"] = dict(type="data", symmetric=False, thickness=1,
                                  array=[_above(r, "days_interval", "days") for r in g],
                                  arrayminus=[_below(r, "days_interval", "days") for r in g])
        if any(r.get("cost_usd_interval") for r in g):
            err["error_y"] = dict(type="data", symmetric=False, thickness=1,
                                  array=[_above(r, "cost_usd_interval", "cost_usd") for r in g],
                                  arrayminus=[_below(r, "cost_usd_interval", "cost_usd") for r in g])
        fig.add_trace(go.Scatter(x=[r["days"] for r in g], y=[r["cost_usd"] for r in g], mode="markers", name=gpu,
                                 text=[_label(r) for r in g], **err))
    front = plan.get("pareto") or []
    if front:
        fig.add_trace(go.Scatter(x=[r["days"] for r in front], y=[r["cost_usd"] for r in front], mode="lines",
                                 line=dict(color="black", dash="dot"), name="front"))
    for key, symbol in (("cheapest", "diamond"), ("fastest", "triangle-up")):
        r = plan.get(key)
        if r and r.get("cost_usd") is not None:
            fig.add_trace(go.Scatter(x=[r["days"]], y=[r["cost_usd"]], mode="markers+text", name=key, text=[key],
                                     textposition="top center", marker=dict(size=14, symbol=symbol)))
    lead = (plan.get("lead") or {}).get("row")
    if lead and lead.get("cost_usd") is not None:
        fig.add_trace(go.Scatter(x=[lead["days"]], y=[lead["cost_usd"]], mode="markers+text", name="lead",
                                 text=["lead"], textposition="bottom center",
                                 marker=dict(size=18, symbol="star", color="crimson")))
    fig.update_layout(title="Time to train against cost", xaxis_title="days", yaxis_title="cost (USD)", **LAYOUT)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig, ("Each point is a system at a GPU count with its best layout, its bars the prediction interval. "
                 "The dotted line joins the options no other beats on both time and cost; the lead is chosen by "
                 "the rule said first under Recommendation.")


def accelerator_figure(plan: dict[str, Any]) -> Figure | None:
    """The best option per accelerator: USD per million tokens (days when unpriced), with
    the regime of its interval (how its efficiency is known) beside it."""
    best: dict[str, dict[str, Any]] = {}
    for r in plan.get("options") or plan.get("ranked", []):
        key = r.get("usd_per_million_tokens")
        if key is None and r.get("days") is None:
            continue
        cur = best.get(r["gpu"])
        rank = (key is None, key if key is not None else r["days"])
        if cur is None or rank < (cur.get("usd_per_million_tokens") is None,
                                  cur.get("usd_per_million_tokens") or cur["days"]):
            best[r["gpu"]] = r
    if not best:
        return None
    priced = all(r.get("usd_per_million_tokens") is not None for r in best.values())
    gpus = sorted(best, key=lambda g: best[g].get("usd_per_million_tokens") or best[g]["days"])
    values = [best[g]["usd_per_million_tokens"] if priced else best[g]["days"] for g in gpus]
    evidence = [best[g].get("regime") or "regime not computed" for g in gpus]
    fig = go.Figure(go.Bar(x=gpus, y=values, text=evidence, textposition="auto",
                           hovertext=["; ".join(best[g].get("interval_reasons") or []) for g in gpus]))
    fig.update_layout(title="Best option per accelerator", xaxis_title="accelerator",
                      yaxis_title="USD per million tokens" if priced else "days", **LAYOUT)
    return fig, ("Each accelerator's best layout. The label is where its efficiency comes from (the interval's "
                 "regime: validated on published runs, carried from another GPU, or assumed); hover for the reasons.")


def memory_figure(plan: dict[str, Any]) -> Figure | None:
    """The lead layout's memory per GPU, component by component, against the device's."""
    mem = plan.get("lead_memory")
    if not mem or not mem.get("total_bytes"):
        return None
    fig = go.Figure()
    for key, name in MEMORY_PARTS:
        if mem.get(key):
            fig.add_trace(go.Bar(x=[mem[key] / 1e9], y=["lead layout"], orientation="h", name=name))
    if not fig.data:
        return None
    device = mem.get("device_memory_bytes")
    if device:
        fig.add_vline(x=device / 1e9, line_dash="dash", line_color="red", annotation_text="device memory")
    fig.update_layout(title="Memory per GPU of the lead layout", barmode="stack", xaxis_title="GB", **LAYOUT)
    return fig, ("What one GPU holds at its peak, as `mgbench memory` counts it for this layout and stack; the "
                 "dashed line is the device's memory.")


def ownership_figure(plan: dict[str, Any]) -> Figure | None:
    """Owned USD per used GPU-hour as utilisation varies, against each rental tier."""
    systems = [o for o in plan.get("ownership") or [] if not o.get("null_reason")]
    if not systems:
        return None
    us = [k / 100 for k in range(10, 101, 2)]
    fig = go.Figure()
    for o in systems:
        fixed = o["capex_full_usd_per_gpu_hour"] + o["hosting_full_usd_per_gpu_hour"]
        fig.add_trace(go.Scatter(x=[100 * u for u in us], y=[fixed / u + o["energy_usd_per_gpu_hour"] for u in us],
                                 mode="lines", name=f"own {o['system']}"))
        for tier, rent in o["rent"].items():
            if rent is None:
                continue
            fig.add_trace(go.Scatter(x=[10, 100], y=[rent, rent], mode="lines", line=dict(dash="dot"),
                                     name=f"rent {o['gpu']} {tier.replace('_', ' ')}"))
            u = o["break_even_utilisation"].get(tier)
            if u is not None:
                fig.add_trace(go.Scatter(x=[100 * u], y=[rent], mode="markers", marker=dict(size=10),
                                         name=f"{o['system']} break-even ({tier.replace('_', ' ')})"))
    fig.update_layout(title="Buying against renting", xaxis_title="utilisation (%)",
                      yaxis_title="USD per used GPU-hour", **LAYOUT)
    fig.update_yaxes(type="log")
    return fig, ("An owned server's cost per GPU-hour it trains: its price written off over the stated years and its "
                 "hosting are paid whether it runs or not, so they fall as utilisation rises; energy is paid only "
                 "while it trains. Where a solid line crosses a dotted one, owning starts to pay.")


def _ownership_table(plan: dict[str, Any]) -> str:
    rows = []
    for o in plan.get("ownership") or []:
        if o.get("null_reason"):
            rows.append({"system": o["system"], "owned": None, "note": o["null_reason"]})
            continue
        for tier, rent in o["rent"].items():
            if rent is None:
                continue
            rows.append({"system": o["system"], "owned": round(o["owned_usd_per_gpu_hour"], 3), "tier": tier,
                         "rent": rent, "break-even utilisation": o["break_even_utilisation"][tier],
                         "break-even months": o["break_even_months"][tier]})
    return _table(rows, [(k, k) for k in ("system", "owned", "tier", "rent", "break-even utilisation",
                                         "break-even months", "note")])


def _lines(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in items) + "</ul>"


def build_plan_report(plan: dict[str, Any], output: str | Path) -> Path:
    """Write the plan's page to ``output`` (folders made as needed) and return its path."""
    from plotly.offline import get_plotlyjs

    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    lead = (plan.get("lead") or {}).get("row")
    head = (f"{_label(lead)}: {lead['days']:.1f} days" + (f", USD {lead['cost_usd']:,.0f}" if lead.get("cost_usd")
                                                         is not None else "") if lead else "no recommendation")
    flips = plan.get("flips") or {}
    sections = [
        ("Recommendation", f"<p><b>{html.escape(head)}</b></p>" + _lines(plan.get("reasons", []))),
        ("Time and cost", _figure_block(front_figure(plan), f"not available: no option has a price ({price_hint()})")),
        ("Accelerators", _figure_block(accelerator_figure(plan), "not available: no option was evaluated")),
        ("Memory", _figure_block(memory_figure(plan), "not available: no lead layout")),
        ("Buy or rent", _figure_block(ownership_figure(plan), "not available: no server in the plan has a public "
                                      "price (pass --server-price SYSTEM=USD)") + _ownership_table(plan)),
        ("What would change the answer", _lines(flips.get("why") or ["not available: no runner-up to compare"])),
        ("Options", _table(plan.get("ranked", []), [(k, k) for k in (
            "system", "num_gpus", "tp", "pp", "dp", "cp", "ep", "zero", "micro_batch", "recompute", "schedule",
            "virtual_stages", "days",
            "cost_usd", "usd_per_million_tokens", "mfu", "regime")])),
    ]
    body = "".join(f"<section><h2>{html.escape(t)}</h2>{b}</section>" for t, b in sections)
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mgbench plan: {html.escape(str(plan.get('model')))}"
            f"</title><style>{CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<header><h1>Plan: {html.escape(str(plan.get('model')))} on {plan.get('tokens', 0):.3g} tokens</h1>"
            f"<p>mgbench {__version__}, {stamp}; predictions with their intervals, not measurements</p></header>"
            f"<main>{body}</main></body></html>")
    out.write_text(page)
    return out
