"""Every system and every accelerator of the catalog can be predicted and planned on.

A buyer's first command is `mgbench predict --gpu X` or `mgbench plan --systems S`: no
catalog entry may fail it with a traceback or "no system in the catalog uses X". An
accelerator whose datasheet publishes no bf16 peak must say so in one line (exit 2) and
still work at a precision it has a peak for.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from mgbench import catalog
from mgbench.cli import main
from mgbench.planner import hardware
from mgbench.planner.search import PlanOptions, plan

SYSTEMS = sorted(catalog.systems())
ACCELERATORS = sorted(catalog.accelerators())
SMALL = catalog.model_shape("gpt2-small")


def _precision(gpu: str) -> str:
    """bf16 where the catalog has its peak, else the first precision it has one for."""
    peaks = catalog.accelerator(gpu)["tflops"]
    return "bf16" if "bf16" in peaks else next(p for p in ("fp32", "tf32", "fp16") if p in peaks)


def _predict(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["predict", "--model", "gpt2-small", "--seq-len", "1024", "--zero", "3", "--json",
                                  *args])
    return r.exit_code, r.output


def test_every_accelerator_is_in_a_system_and_every_system_names_known_parts():
    used = {s["gpu"] for s in catalog.systems().values()}
    assert set(ACCELERATORS) <= used, set(ACCELERATORS) - used
    for name, s in catalog.systems().items():
        assert s["gpu"] in catalog.accelerators(), name
        for key in ("intra_link", "inter_link", "host_link"):
            assert key not in s or s[key] in catalog.links(), (name, key)
        assert s.get("source") and s.get("retrieved"), name
    for name, link in catalog.links().items():
        assert 0 < link["bw_eff"] <= 1 and link["peak_gbps"] > 0 and link.get("eff_source"), name


@pytest.mark.parametrize("system", SYSTEMS)
def test_predict_runs_on_every_system(system):
    gpu = catalog.systems()[system]["gpu"]
    n = catalog.systems()[system]["gpus_per_node"]
    code, out = _predict("--system", system, "--num-gpus", str(n), "--precision", _precision(gpu))
    assert code == 0, out
    res = json.loads(out)
    assert res["tokens_per_s"] > 0 and math.isfinite(res["step_time_s"]) and res["fits"] in (True, False)


@pytest.mark.parametrize("gpu", ACCELERATORS)
def test_predict_runs_on_every_accelerator_by_gpu_alone(gpu):
    code, out = _predict("--gpu", gpu, "--num-gpus", "1", "--precision", _precision(gpu))
    assert code == 0, out
    assert json.loads(out)["tokens_per_s"] > 0


@pytest.mark.parametrize("gpu", [g for g in ACCELERATORS if "bf16" not in catalog.accelerator(g)["tflops"]])
def test_an_accelerator_without_a_bf16_peak_says_so_in_one_line(gpu):
    code, out = _predict("--gpu", gpu, "--num-gpus", "1")
    assert code == 2 and "Traceback" not in out
    assert f"catalog has no bf16 peak for {gpu}" in out and "choose another --precision" in out


@pytest.mark.parametrize("system", SYSTEMS)
def test_plan_runs_restricted_to_every_system(system):
    gpu = catalog.systems()[system]["gpu"]
    res = plan(SMALL, PlanOptions(tokens=1e9, seq_len=1024, global_batch_tokens=2**18, systems=[system],
                                  max_gpus=16, precision=_precision(gpu)))
    rec = res["recommendation"]
    assert rec is not None and rec["system"] == system and rec["days"] > 0
    # Cost is a number where a price is known, and null with the reason where it is not.
    assert rec["cost_usd"] is None or rec["cost_usd"] > 0
    assert res["prices"][system]


@pytest.mark.parametrize("gpu", [g for g in ACCELERATORS if "tdp_w" not in catalog.accelerator(g)])
def test_a_gpu_without_a_sourced_tdp_plans_with_unknown_energy(gpu):
    hw = hardware.resolve(gpu=gpu, precision=_precision(gpu))
    assert math.isnan(hw.tdp_w)
    rec = plan(SMALL, PlanOptions(tokens=1e9, seq_len=1024, global_batch_tokens=2**18, systems=[hw.system],
                                  max_gpus=8, precision=_precision(gpu)))["recommendation"]
    assert rec["energy_kwh"] is None and rec["days"] > 0


def test_the_default_plan_leaves_out_systems_without_the_precision_and_says_why():
    res = plan(SMALL, PlanOptions(tokens=1e9, seq_len=1024, global_batch_tokens=2**18, max_gpus=8))
    notes = [r for r in res["reasons"] if "not considered" in r]
    assert any(r.startswith("rtx6000ada-8 not considered") and "no bf16 peak" in r for r in notes)
    assert res["recommendation"] is not None


def test_a_cloud_instance_type_is_never_priced_at_its_gpus_market_price():
    """gcp-a4 has no on-demand price of its own in data/prices.toml (Google sells A4 by
    reservation, DWS and Spot): its cost is unknown with the reason, not B200's market
    median; a catalog server with the same GPU still takes the GPU's price, and an instance
    type with a listed price takes its own (Azure's MI300X VM, not MI300X's median)."""
    from mgbench.planner.cost import Prices

    prices = Prices()
    assert prices.lookup("dgx-b200", "b200")[0] is not None
    usd, why = prices.lookup("gcp-a4", "b200")
    # the reason prices.toml records for the missing price, then how to give one
    assert usd is None and "no on-demand list price" in why and "--price gcp-a4=USD (USD per GPU-hour)" in why
    # an instance type prices.toml says nothing about gets the generic reason
    del prices.table["on_demand"]["gcp-a4"]
    usd, why = prices.lookup("gcp-a4", "b200")
    assert usd is None and "gcp instance type gcp-a4" in why and "--price gcp-a4=USD (USD per GPU-hour)" in why
    prices = Prices()
    # a catalog server without a price names its accelerator, with the same unit
    assert prices.lookup("h100-pcie-8", "h100-pcie")[1].endswith("pass --price h100-pcie=USD (USD per GPU-hour)")
    assert Prices(None, ["gcp-a4=9.5"]).lookup("gcp-a4", "b200")[0] == 9.5
    assert prices.lookup("azure-nd-mi300x-v5", "mi300x")[0] == pytest.approx(48.00 / 8)
    assert "second-hand" in prices.lookup("azure-nd-mi300x-v5", "mi300x")[1]  # the source says so
    assert "second-hand" not in prices.lookup("aws-p5", "h100-sxm")[1]
    assert prices.lookup("azure-nd-mi300x-v5", "mi300x")[0] != prices.lookup("mi300x-8", "mi300x")[0]


def test_every_missing_cloud_price_says_why_and_the_plan_shows_it():
    """prices.toml's entries without usd are prices looked for and not found: each has a
    null_reason, and a plan over such a system shows that reason, not a generic line."""
    from mgbench import catalog
    from mgbench.planner.cost import Prices

    data = catalog.load("prices.toml")
    unpriced = [(t, n) for t in ("on_demand", "spot", "reserved_1yr", "reserved_3yr")
                for n, e in data.get(t, {}).items() if "usd" not in e]
    assert {n for _, n in unpriced} >= {"aws-p5e", "gcp-a4", "azure-nd-h200-v5"}
    for t, n in unpriced:
        assert data[t][n].get("null_reason"), (t, n)
    res = plan(SMALL, PlanOptions(tokens=1e9, seq_len=1024, global_batch_tokens=2**18, max_gpus=8,
                                  systems=["azure-nd-h200-v5"]))
    assert "exactly 1.30x apart" in res["prices"]["azure-nd-h200-v5"]
    assert Prices().lookup("azure-nd-h200-v5", "h200")[0] is None
