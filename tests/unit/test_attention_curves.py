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
    curves = catalog.load("efficiency.toml")["attention_curves"]
    assert set(curves["kernels"]) == set(BACKEND)
    assert curves["measured_on"] == "h200" and "h200" in curves["accelerators"]
    for kernel, c in curves["kernels"].items():
        for seq, frac in c["points"]:
            assert frac == pytest.approx(measured_fraction(BACKEND[kernel], seq), abs=5e-4)


def test_every_stack_names_its_kernel_and_one_that_does_not_is_refused():
    from mgbench.errors import MgbenchError
    from mgbench.planner import hardware, stack

    kernels = set(catalog.load("efficiency.toml")["attention_curves"]["kernels"])
    assert all(hardware.stack_attention_kernel(name) in kernels for name in stack.stacks())
    with pytest.raises(MgbenchError, match="states no attention_kernel"):
        hardware.stack_attention_kernel("a-stack-stacks-toml-lacks")
