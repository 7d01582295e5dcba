"""Recommendations honest about their evidence (issue 29, item 5): an accelerator whose
efficiency nothing measured is ranked on the pessimistic end of its interval, so it
cannot win on an assumed figure, and the output says what would change the answer."""

import pytest

from mgbench import catalog
from mgbench.planner import search, uncertainty
from mgbench.planner.cost import Prices
from mgbench.planner.search import PlanOptions, plan

SHAPE = catalog.model_shape("llama3-8b")
OPTS = dict(tokens=1e11, systems=["dgx-h100", "rtx4090-8"], max_gpus=64)


@pytest.fixture
def rtx_assumed(monkeypatch):
    """rtx-4090's efficiency stated as assumed, with a 2x upper end on step time (the
    convention uncertainty.ASSUMED_SLOWDOWN states); h100-sxm's as measured."""
    real = uncertainty.regime

    def regime(gpu, pipelined, profile=None, stack="megatron-lm", moe=None):
        reg = dict(real(gpu, pipelined, profile, stack, moe))
        reg["evidence"] = "assumed" if gpu == "rtx-4090" else "measured"
        if gpu == "rtx-4090":
            reg["high"] = 1.0
        return reg

    monkeypatch.setattr(uncertainty, "regime", regime)


def test_an_unmeasured_accelerator_cheapest_on_its_point_estimate_does_not_win(rtx_assumed):
    # At USD 0.30 per GPU-hour the RTX 4090 is the cheapest on its point estimate, and
    # not at its pessimistic end (twice the step time).
    res = plan(SHAPE, PlanOptions(**OPTS), Prices(None, ["rtx-4090=0.3"]))
    rtx = [r for r in res["options"] if r["gpu"] == "rtx-4090"]
    h100 = [r for r in res["options"] if r["gpu"] == "h100-sxm"]
    best_point = min(rtx, key=lambda r: r["cost_usd"] / r["ranking_factor"])
    assert best_point["cost_usd"] / best_point["ranking_factor"] < min(r["cost_usd"] for r in h100)
    assert res["recommendation"]["gpu"] == "h100-sxm"
    assert res["ranked"][0]["gpu"] == "h100-sxm"
    (line,) = [x for x in res["reasons"] if "would be the cheapest on its point estimate" in x]
    assert "rtx-4090" in line and "assumed" in line and "only if its training throughput per GPU is at least" in line
    # The threshold, by hand: the point throughput x (point cost / the cheapest's cost),
    # as a share of the cheapest's throughput per GPU.
    c = res["ranked"][0]
    need = (best_point["tokens_per_s_point"] / best_point["num_gpus"]) * (
        best_point["cost_usd"] / best_point["ranking_factor"]) / c["cost_usd"]
    assert f"at least {100 * need / (c['tokens_per_s'] / c['num_gpus']):.0f}%" in line


def test_the_same_accelerator_measured_would_win(monkeypatch):
    """The control: with its efficiency measured, the same point estimate wins."""
    real = uncertainty.regime
    monkeypatch.setattr(uncertainty, "regime",
                        lambda gpu, p, profile=None, stack="megatron-lm", moe=None: {
                            **real(gpu, p, profile, stack, moe), "evidence": "measured"})
    res = plan(SHAPE, PlanOptions(**OPTS), Prices(None, ["rtx-4090=0.3"]))
    assert res["ranked"][0]["gpu"] == "rtx-4090"
    assert res["ranked"][0]["ranking_factor"] == 1.0
    assert not [x for x in res["reasons"] if "point estimate" in x]


def test_pessimistic_rows_keep_their_point_estimate_and_interval(rtx_assumed):
    res = plan(SHAPE, PlanOptions(**OPTS), Prices(None, ["rtx-4090=0.3"]))
    for r in res["options"]:
        f = r["ranking_factor"]
        assert f == (2.0 if r["gpu"] == "rtx-4090" else 1.0)
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_s_point"] / f)
        assert r["evidence"] == ("assumed" if r["gpu"] == "rtx-4090" else "measured")
    for r in res["ranked"]:
        if r["gpu"] == "rtx-4090":  # the ranked figure is the interval's upper end
            assert r["days_interval"][1] == pytest.approx(r["days"])
    assert search.evidence_of({"regime": "catalog-assumed"}) == "assumed"
