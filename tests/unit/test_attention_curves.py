"""efficiency.toml's GH100 attention curves are the H200 lease's measurements (the mean of
its two calls, committed under results/), not numbers typed in: recomputed here from the
raw kernel rates, in FlashAttention's FLOP convention."""

import json
from pathlib import Path

import pytest

from mgbench import catalog
from mgbench.planner import perf

LEASE = Path(__file__).resolve().parents[2] / "results" / "h200-lease-2026-11-27"
BACKEND = {"flash2": "flash", "cudnn": "cudnn"}


def measured_fraction(backend, seq):
    rates = []
    for i in (1, 2):
        rows = json.loads((LEASE / f"kernels-{i}.json").read_text())["attention"]
        (r,) = [r for r in rows if r["backend"] == backend and r["seq"] == seq and r["causal"]]
        rates.append(perf.FLASH_FWD_BWD_PASSES * r["fwd_flops"] / r["fwd_bwd_s"])
    return sum(rates) / len(rates) / 989e12  # the H200's dense bf16 peak


def test_the_curves_are_the_leases_measurements():
    curves = catalog.load("efficiency.toml")["attention_curve"]
    assert {c["kernel"] for c in curves} == set(BACKEND)
    for c in curves:
        assert c["measured_on"] == "h200" and "h200" in c["accelerators"]
        for seq, frac in c["points"]:
            assert frac == pytest.approx(measured_fraction(BACKEND[c["kernel"]], seq), abs=5e-4)
