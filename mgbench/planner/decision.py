"""Which option `mgbench plan` leads with, and what would change the answer.

The lead answer
    With a deadline or a budget: the cheapest option that meets it (the ranking's first).
    Without either: the operating point at the knee of the time/cost front, by a rule
    stated in money: the fastest option that costs at most ``premium`` (10% unless
    --premium says otherwise) more than the cheapest. A time/cost front is flat at its
    slow end (the same GPU-hours spread over more GPUs cost about the same) and steep at
    its fast end (communication, bubbles and smaller per-GPU batches make each further
    halving of the time dearer); the premium marks where the output draws the line, and
    the cheapest and the fastest are shown beside it. (A geometric knee, the point
    farthest from the chord in scaled log-log coordinates, was tried first and rejected:
    scaling stretches a front whose costs differ by 6% to fill the square and picks a
    slow point there.) An option that takes more than a year is never the headline
    without the output saying so.

What would change it
    For the lead and its runner-up (the best option on another accelerator by the same
    rule), the price and the efficiency changes at which their order flips, and the odds,
    from their prediction intervals, that the lead is really the cheaper (and the faster):
    each option's true figure is taken as log-uniform over its interval, independently,
    and the odds are integrated on a fixed grid (no sampling: the same answer every run).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import MgbenchError
from .cost import price_hint

YEAR_DAYS = 365.0
# The operating point's premium over the cheapest option (--premium).
PREMIUM = 0.10
# Points of the fixed grid the odds are integrated on (per option).
ODDS_GRID = 400


def front(options: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The priced options no other beats on both days and cost, fastest first."""
    priced = sorted((r for r in options if r.get("cost_usd") is not None), key=lambda r: (r["days"], r["cost_usd"]))
    out: list[dict[str, Any]] = []
    best_cost = math.inf
    for r in priced:
        if r["cost_usd"] < best_cost:
            out.append(r)
            best_cost = r["cost_usd"]
    return out


def check_front(front_rows: list[dict[str, Any]]) -> None:
    """Refuse what is not a time/cost front (fastest first, each next option slower and
    cheaper): the operating point is only defined on one."""
    for a, b in zip(front_rows, front_rows[1:]):
        if not (a["days"] <= b["days"] and a["cost_usd"] > b["cost_usd"]):
            raise ValueError("the operating point needs a time/cost front, fastest first: each next option slower "
                             "and cheaper")


def check_premium(premium: float) -> None:
    """One line for a --premium that is not a fraction of the cheapest cost."""
    if not premium >= 0:  # NaN too
        raise MgbenchError(f"--premium is a fraction of the cheapest cost, 0 or more: got {premium}")


def operating_point(front_rows: list[dict[str, Any]], premium: float = PREMIUM) -> dict[str, Any] | None:
    """The fastest option of a front (as :func:`front` returns it) costing at most
    ``premium`` more than its cheapest; None for an empty front."""
    check_front(front_rows)
    check_premium(premium)
    if not front_rows:
        return None
    limit = front_rows[-1]["cost_usd"] * (1.0 + premium)
    return next(r for r in front_rows if r["cost_usd"] <= limit)


def lead(ranked: list[dict[str, Any]], constrained: bool, premium: float = PREMIUM,
         owned: tuple[str, int] | None = None) -> tuple[dict[str, Any] | None, str, list[str]]:
    """(the lead row, its rule's name, why) over the options meeting the constraints
    (``ranked``: cheapest first). ``owned`` (system, GPUs): the GPUs are paid for, so the
    fastest leads."""
    if not ranked:
        return None, "none", ["no option meets the constraints"]
    if owned is not None:
        return (min(ranked, key=lambda r: (r["days"], r["cost_usd"] or 0.0)), "fastest_owned",
                [f"on the {owned[1]} {owned[0]} GPUs you own the servers are paid for: the fastest layout leads, "
                 "and its cost is the energy it draws (the marginal cost)"])
    if constrained:
        return ranked[0], "cheapest_meeting_constraints", ["the cheapest option that meets the deadline / budget"]
    if all(r.get("cost_usd") is None for r in ranked):
        fastest = min(ranked, key=lambda r: r["days"])
        return fastest, "fastest_unpriced", [f"no option has a price: the fastest leads ({price_hint()})"]
    row = operating_point(front(ranked), premium)
    cheapest = ranked[0]
    why = [f"the operating point (no deadline or budget given): the fastest option that costs at most "
           f"{100 * premium:.0f}% more than the cheapest (--premium); faster ones cost more than that"]
    if cheapest is not row:
        why.append(f"against the cheapest ({_label(cheapest)}, {cheapest['days']:.1f} days, USD "
                   f"{cheapest['cost_usd']:,.0f}): {cheapest['days'] / row['days']:.1f}x sooner for "
                   f"{100 * (row['cost_usd'] / cheapest['cost_usd'] - 1):.1f}% more")
    return row, "operating_point", why


def long_run_warning(row: dict[str, Any] | None) -> str | None:
    """The sentence an option of more than a year needs beside it."""
    if row is None or row["days"] <= YEAR_DAYS:
        return None
    return (f"{_label(row)} takes {row['days'] / YEAR_DAYS:.1f} years: give --deadline-days for the cheapest "
            "option that finishes in time")


def runner_up(lead_row: dict[str, Any], ranked: list[dict[str, Any]], rule: str, premium: float = PREMIUM
              ) -> dict[str, Any] | None:
    """The best option on another accelerator by the lead's rule: the operating point of
    the other accelerators' own front, or their cheapest (priced options; None when there
    is no other accelerator)."""
    others = [r for r in ranked if r["gpu"] != lead_row["gpu"] and r.get("cost_usd") is not None]
    if not others:
        return None
    if rule == "operating_point":
        return operating_point(front(others), premium)
    return min(others, key=lambda r: (r["cost_usd"], r["days"]))


def flips(lead_row: dict[str, Any], other: dict[str, Any] | None, ranked: list[dict[str, Any]] | None = None
          ) -> dict[str, Any]:
    """What would reverse the lead and the runner-up's order on cost: the lead's price rise
    (percent) and the lead's throughput fall (percent) that make the two cost the same,
    and the interval odds that the lead is the cheaper and the faster. Without a
    runner-up, the accelerators of ``ranked`` left out for want of a price are named."""
    if other is None:
        unpriced = sorted({r["gpu"] for r in ranked or [] if r["gpu"] != lead_row["gpu"] and r.get("cost_usd") is None})
        why = (f"no priced option on another accelerator to compare with: {', '.join(unpriced)} planned without a "
               f"price ({price_hint(unpriced[0])})" if unpriced else "no option on another accelerator to compare with")
        return {"runner_up": None, "price_flip_pct": None, "efficiency_flip_pct": None, "odds_cheaper": None,
                "odds_faster": None, "why": [why]}
    if lead_row.get("cost_usd") is None or other.get("cost_usd") is None:
        return {"runner_up": other, "price_flip_pct": None, "efficiency_flip_pct": None, "odds_cheaper": None,
                "odds_faster": odds(lead_row.get("days_interval"), other.get("days_interval")),
                "why": [f"a price is missing: cost flips are unknown ({price_hint()})"]}
    if lead_row["cost_usd"] <= 0 or other["cost_usd"] <= 0:  # a --price of 0: free GPUs
        free = lead_row if lead_row["cost_usd"] <= 0 else other
        return {"runner_up": other, "price_flip_pct": None, "efficiency_flip_pct": None, "odds_cheaper": None,
                "odds_faster": odds(lead_row.get("days_interval"), other.get("days_interval")),
                "why": [f"{free['gpu']} is priced at 0: no price change flips the order on cost"]}
    ratio = other["cost_usd"] / lead_row["cost_usd"]
    # Cost = price x GPU-hours, GPU-hours ~ 1 / throughput: the same ratio flips either.
    price_pct = 100.0 * (ratio - 1.0)
    eff_pct = 100.0 * (1.0 - 1.0 / ratio)
    out = {"runner_up": other, "price_flip_pct": price_pct, "efficiency_flip_pct": eff_pct,
           "odds_cheaper": odds(lead_row.get("cost_usd_interval"), other.get("cost_usd_interval")),
           "odds_faster": odds(lead_row.get("days_interval"), other.get("days_interval"))}
    who = f"{lead_row['gpu']} ({_label(lead_row)})"
    rival = f"{other['gpu']} ({_label(other)})"
    if ratio >= 1:
        out["why"] = [f"{who} stays cheaper than {rival} unless its price rises {price_pct:.0f}% or its training "
                      f"throughput is {eff_pct:.0f}% lower than predicted"]
    else:
        out["why"] = [f"{rival} is cheaper than {who} by {-price_pct:.0f}% but slower; the lead wins on time"]
    if out["odds_cheaper"] is not None:
        out["why"].append(f"odds that {lead_row['gpu']} is really the cheaper, from the two intervals: "
                          f"{100 * out['odds_cheaper']:.0f}%")
    return out


def odds(a: list[float] | None, b: list[float] | None) -> float | None:
    """P(A < B) for A and B log-uniform over their intervals [lo, hi], independent,
    integrated on a fixed grid; None without both intervals. A zero-width interval is a
    point."""
    if not a or not b:
        return None
    if a[0] <= 0 or b[0] <= 0 or a[1] < a[0] or b[1] < b[0]:
        raise ValueError(f"intervals must be positive and ordered, got {a} and {b}")
    la, lb = _log_grid(a), _log_grid(b)
    hits = 0
    j = 0
    for x in la:  # both sorted: count b's above each a
        while j < len(lb) and lb[j] <= x:
            j += 1
        hits += len(lb) - j
    return hits / (len(la) * len(lb))


def _log_grid(iv: list[float]) -> list[float]:
    lo, hi = math.log(iv[0]), math.log(iv[1])
    if hi == lo:
        return [lo]
    return [lo + (hi - lo) * (k + 0.5) / ODDS_GRID for k in range(ODDS_GRID)]


def _label(r: dict[str, Any]) -> str:
    return f"{r['num_gpus']}x {r['gpu']} on {r['system']}"
