"""Prediction intervals: derived from validation residuals, widened where a figure is assumed."""

import pytest

from mgbench.planner import uncertainty as U
from mgbench.planner.validation import predict_run, published_runs


def test_bounds_read_throughput_errors_as_time_ratios():
    # e = (pred - true) / true on throughput: true time = predicted time x (1 + e)
    assert U._bounds([-0.10, 0.05]) == (pytest.approx(0.10), pytest.approx(0.05))
    assert U._bounds([]) == (0.0, 0.0)


def test_catalog_gpu_interval_is_its_validation_residuals():
    dense = [predict_run(r)["error_pct"] / 100 for r in published_runs()
             if r["role"] == "validation" and r["pp"] == 1 and r.get("stack", "megatron-lm") == "megatron-lm"]
    reg = U.regime("a100-sxm-80gb", pipelined=False)
    assert reg["regime"] == "catalog-validated"
    assert reg["low"] == pytest.approx(max(0.0, -min(dense))) and reg["high"] == pytest.approx(max(0.0, max(dense)))
    assert reg["low"] + reg["high"] < 0.1  # the Megatron rows are within a few percent


def test_assumed_efficiency_gets_a_wide_interval_and_says_why():
    # mi300x: its best GEMM measured (efficiency.toml); h100-nvl: carried from the H100
    # PCIe; rtx-pro-6000: no fraction (no bf16 peak in the catalog), so assumed.
    other = U.regime("mi300x", pipelined=False)
    carried = U.regime("h100-nvl", pipelined=False)
    assumed = U.regime("rtx-pro-6000", pipelined=False)
    assert other["regime"] == "catalog-other-gpu" and assumed["regime"] == "catalog-assumed"
    assert carried["regime"] == "catalog-carried"
    assert [r["evidence"] for r in (other, carried, assumed)] == ["measured", "carried", "assumed"]
    assert assumed["high"] >= U.ASSUMED_SLOWDOWN > carried["high"] > other["high"] > \
        U.regime("a100-sxm-80gb", False)["high"]
    assert carried["low"] > other["low"]  # a carried fraction may be off either way
    assert any("by assumption" in r for r in assumed["reasons"])
    assert not any("by assumption" in r for r in other["reasons"] + carried["reasons"])
    assert any("carried from h100-pcie" in r for r in carried["reasons"])


def test_carried_interval_widens_by_the_measured_siblings_spread(monkeypatch):
    # The spread is the largest relative difference of the [carrying] pairs' measured
    # fractions; compounded on both sides with the other-GPU half-widths.
    spread = U.carried_spread()
    pairs = [(a, b) for a, b in __import__("mgbench").catalog.load("efficiency.toml")["carrying"]["pairs"]]
    from mgbench.planner import hardware
    by_hand = max(max(hardware.gemm_fraction(a), hardware.gemm_fraction(b)) /
                  min(hardware.gemm_fraction(a), hardware.gemm_fraction(b)) - 1 for a, b in pairs)
    assert spread["spread"] == pytest.approx(by_hand) and spread["pairs"] == len(pairs)
    # By hand from efficiency.toml: the widest pair is L40S (0.743 of peak) against the
    # RTX 4090 (1.008): 1.008 / 0.743 - 1 = 0.357.
    assert by_hand == pytest.approx(0.357, abs=0.001) and spread["worst"].startswith("l40s")
    other, carried = U.regime("h100-pcie", False), U.regime("h100-nvl", False)
    # By hand: the other-GPU interval is -16% / +24% on step time (0.161 / 0.244, what plan
    # prints); compounded with the 0.357 spread: 1.244 x 1.357 - 1 = 0.688 above and
    # 1 - 0.839 x 0.643 = 0.460 below.
    assert (other["low"], other["high"]) == (pytest.approx(0.161, abs=0.001), pytest.approx(0.244, abs=0.001))
    assert carried["high"] == pytest.approx(0.688, abs=0.002)
    assert carried["low"] == pytest.approx(0.460, abs=0.002)
    assert carried["high"] > other["high"] + 0.35 and carried["low"] > other["low"]  # widened on both sides
    # Negative control: siblings measured alike would not widen it at all.
    monkeypatch.setattr(U, "carried_spread", lambda: {"spread": 0.0, "worst": "none", "pairs": 0})
    same = U.regime("h100-nvl", False)
    assert same["high"] == pytest.approx(other["high"]) and same["low"] == pytest.approx(other["low"])


def test_intervals_bracket_the_prediction():
    iv = U.intervals(2.0, 1000.0, {"regime": "x", "low": 0.25, "high": 0.5, "reasons": []})
    assert iv["step_time_s_interval"] == [pytest.approx(1.5), pytest.approx(3.0)]
    assert iv["evidence"] == "measured"  # where the regime states none
    assert U.intervals(2.0, 1000.0, {"regime": "x", "evidence": "carried", "low": 0.2, "high": 0.5,
                                     "reasons": []})["evidence"] == "carried"
    # throughput is the reciprocal image: 1000 x 2 / 3 to 1000 x 2 / 1.5
    assert iv["tokens_per_s_per_gpu_interval"] == [pytest.approx(666.67, rel=1e-4), pytest.approx(1333.33, rel=1e-4)]


def test_probed_profile_uses_its_recorded_validation():
    reg = U.regime("cpu", False, {"validation": {"run": "r", "max_abs_error_pct": 12.0, "num_configs": 9}})
    assert reg["regime"] == "probed" and reg["low"] == reg["high"] == pytest.approx(0.12)
    assert U.regime("cpu", False, {})["regime"] == "probed-unvalidated"
    # A validation error above 100% would put the interval's low end below 0 s: clamped to 0.
    big = U.regime("cpu", False, {"validation": {"run": "r", "max_abs_error_pct": 140.0, "num_configs": 9}})
    assert big["low"] == 1.0 and big["high"] == pytest.approx(1.4)
    assert U.intervals(2.0, 100.0, big)["step_time_s_interval"] == [0.0, pytest.approx(4.8)]


def test_calibrated_regime_uses_leave_one_out_errors():
    fit = {"num_configs": 3, "rows": [{"loo_error_pct": -8.0}, {"loo_error_pct": 20.0}, {"loo_error_pct": None}]}
    reg = U.calibrated(fit)
    assert reg["high"] == pytest.approx(0.2)


def test_not_distinguishable_fires_only_when_intervals_overlap():
    from mgbench.planner.search import _distinguishable

    def row(cost, name):
        return {"cost_usd": cost, "cost_usd_interval": [cost * 0.9, cost * 1.1], "days_interval": [1.0, 2.0],
                "num_gpus": 8, "gpu": name, "system": name, "regime": "catalog-validated", "interval_reasons": []}

    rows = [row(100.0, "a"), row(105.0, "b"), row(200.0, "c")]
    close = _distinguishable(rows[0], rows)  # the lead against the others
    assert any("not distinguishable" in line and "b" in line and "(c)" not in line for line in close)
    apart = _distinguishable(rows[0], [rows[0], rows[2]])
    assert not any("not distinguishable" in line for line in apart)


def test_a_stacks_interval_comes_from_its_own_published_rows():
    from mgbench.planner.validation import stack_of

    tt = [predict_run(r)["error_pct"] / 100 for r in published_runs()
          if r["role"] == "validation" and stack_of(r) == "torchtitan" and r["pp"] == 1]
    reg = U.regime("a100-sxm-80gb", pipelined=False, stack="torchtitan")
    assert reg["low"] == pytest.approx(max(0.0, -min(tt))) and reg["high"] == pytest.approx(max(0.0, max(tt)))
    assert "torchtitan" in reg["reasons"][0]
    # No pipelined torchtitan row: it borrows Megatron-LM's pipelined rows with its own, and says so.
    pipe = U.regime("a100-sxm-80gb", pipelined=True, stack="torchtitan")
    assert "no published torchtitan run of this class" in pipe["reasons"][0]
    assert pipe["high"] >= U.regime("a100-sxm-80gb", pipelined=True)["high"]
