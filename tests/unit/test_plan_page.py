"""`mgbench plan --html FILE` (issue 27, item 5): one self-contained page with the
time/cost front and its intervals, the options per accelerator with their evidence, the
lead layout's memory and buying against renting; rendered in headless Chromium without
script errors, every figure holding data; a figure without data is said, not drawn."""

import re

import pytest
from click.testing import CliRunner

from mgbench import catalog
from mgbench.cli import main
from mgbench.planner.cost import Prices
from mgbench.planner.search import PlanOptions, plan
from mgbench.report.plan_page import build_plan_report, front_figure
from tests import report_check


@pytest.fixture(scope="module")
def planned():
    return plan(catalog.model_shape("llama3-8b"), PlanOptions(tokens=1e12, systems=["dgx-h100", "dgx-b200"],
                                                              max_gpus=256), Prices(None, []))


def test_the_page_is_written_self_contained_and_names_the_lead(planned, tmp_path):
    out = build_plan_report(planned, tmp_path / "sub" / "plan.html")
    page = out.read_text()
    lead = planned["lead"]["row"]
    assert f"{lead['num_gpus']}x {lead['gpu']}" in page
    assert re.search(r"<script[^>]*\bsrc=", page) is None  # plotly.js inlined: no script fetched
    for title in ("Time to train against cost", "Best option per accelerator", "Memory per GPU of the lead layout",
                  "Buying against renting"):
        assert title in page


@pytest.mark.skipif(report_check.chromium() is None, reason="no Chromium here (.ci/run installs it): the page is not "
                                                            "rendered")
def test_the_page_renders_without_script_errors_and_every_figure_holds_data(planned, tmp_path):
    res = report_check.check(build_plan_report(planned, tmp_path / "plan.html"))
    assert res["errors"] == []
    assert len(res["figures"]) == 4 and all(f["with_data"] > 0 for f in res["figures"]), res["figures"]


def test_a_plan_without_prices_or_servers_says_what_is_not_available(planned, tmp_path):
    bare = {k: v for k, v in planned.items() if k not in ("ownership", "flips", "lead_memory")}
    unpriced = [dict(r, cost_usd=None, usd_per_million_tokens=None) for r in planned["options"]]
    bare.update(options=unpriced, ranked=[], pareto=[], cheapest=None)
    assert front_figure(bare) is None  # nothing priced: no empty plot
    page = build_plan_report(bare, tmp_path / "bare.html").read_text()
    assert "not available: no option has a price" in page
    assert "not available: no lead layout" in page or planned["lead"]["row"] is not None
    assert "not available: no server in the plan has a public price" in page
    assert "not available: no runner-up" in page


def test_plan_html_option_writes_the_page(tmp_path):
    out = tmp_path / "p.html"
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "dgx-h100",
                                  "--max-gpus", "16", "--html", str(out)])
    assert r.exit_code == 0, r.output
    assert out.exists() and f"plan report: {out}" in r.output
