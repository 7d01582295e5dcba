"""The answer `mgbench plan` leads with and what would change it (issue 27): the operating point at the knee of
the time/cost front, the flip points and the odds, each by hand, each rule fed a broken
input once to show it refuses it."""

import json
import math

import pytest
from click.testing import CliRunner

from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.planner import decision as D


def row(gpu, n, days, cost, lo=0.9, hi=1.2, system="s"):
    return {"gpu": gpu, "num_gpus": n, "system": system, "days": days, "cost_usd": cost,
            "days_interval": [days * lo, days * hi], "cost_usd_interval": [cost * lo, cost * hi]}


def test_the_operating_point_by_hand():
    # Cheapest USD 100 (100 days). Within 10%: USD 110 or less. The fastest such is 10 days
    # at USD 108; 3 days at USD 500 costs 5x.
    front = [row("a", 64, 1, 1000), row("a", 32, 3, 500), row("a", 8, 10, 108), row("a", 2, 50, 104),
             row("a", 1, 100, 100)]
    assert D.operating_point(front) is front[2]
    assert D.operating_point(front, premium=0.0) is front[-1]  # no premium: the cheapest
    assert D.operating_point(front, premium=10.0) is front[0]  # any premium: the fastest
    # A flat front (costs within 6%): the fastest leads.
    flat = [row("h100", 256, 4.5, 81619), row("h100", 32, 33.9, 76877), row("h100", 4, 270.3, 76553)]
    assert D.operating_point(flat) is flat[0]
    assert D.operating_point([]) is None


def test_the_operating_point_refuses_what_is_not_a_front():
    # A row beaten on both days and cost is not on a front: the rule is undefined there.
    broken = [row("a", 4, 1, 1000), row("a", 3, 2, 2000), row("a", 1, 10, 100)]
    with pytest.raises(ValueError, match="needs a time/cost front"):
        D.operating_point(broken)
    assert [r["days"] for r in D.front(broken)] == [1, 10]  # front() drops it
    with pytest.raises(MgbenchError, match="--premium"):
        D.operating_point(D.front(broken), premium=-0.1)


def test_flip_points_by_hand():
    lead, other = row("mi300x", 8, 10, 1000), row("h100", 8, 8, 1500)
    f = D.flips(lead, other)
    # Cost = price x GPU-hours: the lead's price may rise 50%, or its throughput fall 1/3, before they cost the same.
    assert f["price_flip_pct"] == pytest.approx(50.0) and f["efficiency_flip_pct"] == pytest.approx(100 / 3)
    assert "unless its price rises 50%" in f["why"][0]
    assert D.flips(lead, None)["price_flip_pct"] is None
    unpriced = dict(other, cost_usd=None, cost_usd_interval=None)
    assert D.flips(lead, unpriced)["price_flip_pct"] is None and "price is missing" in D.flips(lead, unpriced)["why"][0]


def test_odds_by_hand():
    assert D.odds([1, 2], [3, 4]) == 1.0 and D.odds([3, 4], [1, 2]) == 0.0
    assert D.odds([1, 4], [1, 4]) == pytest.approx(0.5, abs=0.01)
    # [1, 4] against the point 2: log-uniform, P(A < 2) = log 2 / log 4 = 0.5.
    assert D.odds([1, 4], [2, 2]) == pytest.approx(0.5, abs=0.01)
    # [1, 8] against the point 2: log 2 / log 8 = 1/3.
    assert D.odds([1, 8], [2, 2]) == pytest.approx(1 / 3, abs=0.01)
    with pytest.raises(ValueError, match="positive and ordered"):
        D.odds([2, 1], [1, 2])
    assert D.odds(None, [1, 2]) is None


def test_a_long_run_is_never_the_headline_unsaid():
    assert D.long_run_warning(row("a", 1, 750, 100)).startswith("1x a on s takes 2.1 years")
    assert D.long_run_warning(row("a", 1, 30, 100)) is None


def test_plan_leads_with_an_operating_point_and_shows_the_cheapest_and_the_fastest():
    # Every system, to 256 GPUs, one schedule: the choice among them is what is tested (the
    # schedule search is tested in test_plan_predict_agree.py; 1,024 GPUs took 6.5 s a plan,
    # 256 take 2.8, and the lead, the cheapest, the fastest and the runner-up all exist there).
    args = ["plan", "--model", "llama3-8b", "--tokens", "1e12", "--max-gpus", "256", "--schedule", "1f1b"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    lead = res["lead"]["row"]
    assert res["lead"]["rule"] == "operating_point" and lead["days"] < 90
    assert res["cheapest"]["cost_usd"] <= lead["cost_usd"] and res["fastest"]["days"] <= lead["days"]
    assert res["recommendation"] == lead and res["flips"]["runner_up"] is not None
    text = CliRunner().invoke(main, args).output
    assert "the fastest option that costs at most 10% more than the cheapest" in text
    assert "cheapest:" in text and "fastest:" in text
    assert "what would change the answer" in text
    # With a deadline: the cheapest that meets it, as before.
    res = json.loads(CliRunner().invoke(main, [*args, "--deadline-days", "30", "--json"]).output)
    assert res["lead"]["rule"] == "cheapest_meeting_constraints" and res["lead"]["row"]["days"] <= 30


@pytest.mark.parametrize("args,words", [(["--premium", "-0.1"], "--premium is a fraction"),
                                        (["--server-price", "dgx-h100=lots"], "--server-price 'dgx-h100=lots'"),
                                        (["--server-price", "nosuch=1000"], "a known system"),
                                        (["--utilisation", "1.5"], "between 0 and 1"),
                                        (["--depreciation-years", "0"], "must be positive")])
def test_bad_plan_assumptions_are_one_line_and_exit_2(args, words):
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e9", "--systems", "dgx-h100",
                                  "--max-gpus", "8", *args])
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
