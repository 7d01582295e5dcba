"""Buying versus renting (issue 27, item 2): the owned GPU-hour, the break-even
utilisation and months, by hand; --own plans on hardware already owned; bad assumptions
are refused in one line."""

import json

import pytest
from click.testing import CliRunner

from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.planner import ownership as O

A = O.Assumptions(depreciation_years=6, utilisation=0.7, electricity_usd_per_kwh=0.086,
                  hosting_usd_per_kw_month=217.30, pue=1.2, power_fraction=0.8)


def test_the_owned_gpu_hour_of_a_dgx_b200_by_hand():
    srv = O.server("dgx-b200")
    assert (srv["usd"], srv["gpus"], srv["power_kw"]) == (515000, 8, 14.3)
    p = O.owned_gpu_hour(srv, A)
    capex = 515000 / 8 / (6 * 8760)  # 1.2248: straight-line over six years
    hosting = 217.30 * 14.3 / 8 / 730  # 0.5321: colocation per kW-month, paid always
    energy = 14.3 * 0.8 / 8 * 1.2 * 0.086  # 0.1476: while it trains
    assert p["capex_full_usd_per_gpu_hour"] == pytest.approx(capex)
    assert p["hosting_full_usd_per_gpu_hour"] == pytest.approx(hosting)
    assert p["energy_usd_per_gpu_hour"] == pytest.approx(energy)
    assert p["owned_usd_per_gpu_hour"] == pytest.approx((capex + hosting) / 0.7 + energy)  # 2.657


def test_break_even_by_hand():
    srv = O.server("dgx-b200")
    p = O.owned_gpu_hour(srv, A)
    fixed = p["capex_full_usd_per_gpu_hour"] + p["hosting_full_usd_per_gpu_hour"]
    # Against USD 5.25 on demand: owning wins from 1.757 / (5.25 - 0.148) = 34.4% utilisation,
    # and at 70% pays the USD 64,375 a GPU back after 64,375 / (730 (0.7 x 5.102 - 0.532)) = 29.0 months.
    assert O.break_even_utilisation(p, 5.25) == pytest.approx(fixed / (5.25 - p["energy_usd_per_gpu_hour"]))
    months = 515000 / 8 / (730 * (0.7 * (5.25 - p["energy_usd_per_gpu_hour"]) - p["hosting_full_usd_per_gpu_hour"]))
    assert O.break_even_months(srv, p, 5.25, A) == pytest.approx(months) and 28 < months < 30
    # Against USD 2.25 spot: owning wins only above 84% utilisation; at 70% the 94 months it
    # would take outlast the six-year write-off: never.
    assert O.break_even_utilisation(p, 2.25) == pytest.approx(0.8356, abs=1e-3)
    assert O.break_even_months(srv, p, 2.25, A) is None
    # A rent below the energy alone: owning never catches up (the broken case says so, no number).
    assert O.break_even_utilisation(p, 0.1) is None and O.break_even_months(srv, p, 0.1, A) is None
    assert O.break_even_utilisation(p, None) is None


def test_a_server_without_a_public_price_is_null_with_the_reason_and_an_override_prices_it():
    srv = O.server("mi300x-8")
    assert srv["usd"] is None and "--server-price mi300x-8=USD" in srv["null_reason"]
    assert O.owned_gpu_hour(srv, A)["owned_usd_per_gpu_hour"] is None
    given = O.server("mi300x-8", {"mi300x-8": 250000})
    assert given["usd"] == 250000 and given["null_reason"] is None and given["price_source"] == "--server-price"


@pytest.mark.parametrize("field,value,words", [("utilisation", 1.5, "between 0 and 1"),
                                               ("depreciation_years", 0, "must be positive"),
                                               ("pue", 0.9, "at least 1"),
                                               ("electricity_usd_per_kwh", -1, "cannot be negative")])
def test_impossible_assumptions_are_refused(field, value, words):
    import dataclasses

    with pytest.raises(MgbenchError, match=words):
        dataclasses.replace(A, **{field: value}).check()


def test_plan_prints_buy_versus_rent_and_plans_on_owned_gpus():
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "dgx-b200,dgx-h100",
                                  "--max-gpus", "64", "--json"])
    res = json.loads(r.output)
    by = {o["system"]: o for o in res["ownership"]}
    assert by and all(o["owned_usd_per_gpu_hour"] is None or o["owned_usd_per_gpu_hour"] > 0 for o in by.values())
    own = json.loads(CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e11",
                                               "--own", "dgx-h100:16", "--json"]).output)
    lead = own["lead"]["row"]
    assert own["owned"] == {"system": "dgx-h100", "gpus": 16} and lead["system"] == "dgx-h100"
    assert lead["num_gpus"] <= 16 and own["lead"]["rule"] == "fastest_owned"
    # Its cost is the energy: USD per GPU-hour = 10.2 kW x 0.8 / 8 x PUE 1.2 x 0.086.
    energy = 10.2 * 0.8 / 8 * 1.2 * 0.086
    assert lead["cost_usd"] == pytest.approx(lead["gpu_hours"] * energy)
    for bad in ("dgx-h100", "nosuch:8", "dgx-h100:0"):
        r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e11", "--own", bad])
        assert r.exit_code == 2 and "--own" in r.output and "Traceback" not in r.output


def test_a_low_confidence_server_price_is_said_beside_the_answer():
    from mgbench.commands.planning import _ownership_line

    assert O.server("dgx-b200")["price_confidence"] == "low"
    line = _ownership_line(O.compare("dgx-b200", A, {"on_demand": 5.25}))
    assert "low-confidence figure: check it with --server-price dgx-b200=USD" in line
    given = _ownership_line(O.compare("dgx-b200", A, {"on_demand": 5.25}, {"dgx-b200": 480000}))
    assert "confidence" not in given
