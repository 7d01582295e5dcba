"""The same-software A100 / H100 pairs (data/generation_pairs.toml): loaded with their
sources, scored as ratios and per GPU, and the other-GPU interval built from them."""

import copy
import re
from pathlib import Path

import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.planner import stack, uncertainty, validation


def _clear() -> None:
    validation._pairs_data.cache_clear()
    validation._pair_rows.cache_clear()
    uncertainty._residuals.cache_clear()


@pytest.fixture
def pairs_file(monkeypatch):
    """Replace generation_pairs.toml's parsed content for one test (caches cleared around it)."""
    real = catalog.load
    data = copy.deepcopy(real("generation_pairs.toml"))

    def load(name):
        return data if name == "generation_pairs.toml" else real(name)

    monkeypatch.setattr(catalog, "load", load)
    _clear()
    yield data
    monkeypatch.setattr(catalog, "load", real)
    _clear()


def test_pairs_load_each_with_its_source():
    pairs = validation.generation_pairs()
    assert len(pairs) == 37 and len({p["id"] for p in pairs}) == 37
    assert [p["id"] for p in pairs if p["role"] == "calibration"] == ["mpt-7b-8192"]
    src = catalog.load("generation_pairs.toml")["source"]
    assert src["commit"] in src["url"] and src["a100_table"] and src["h100_table"] and src["models_source"]
    for p in pairs:
        assert p["source"] and f"{p['seq']}, 8 GPUs" in p["source"], p["id"]
        assert p["a100"]["system"] == "dgx-a100" and p["h100"]["system"] == "dgx-h100"
        assert p["a100"]["stack"] == p["h100"]["stack"] == "llm-foundry"
        assert src["commit"][:9] in p["a100"]["source"]


def test_a_hand_checked_pair():
    # llm-foundry README: MPT-7B at 4096 on 8 GPUs, micro-batch 16, accumulation 2:
    # A100 80GB 3,684 tokens/s per GPU, H100 80GB BF16 8,611: a speed-up of 2.337.
    (p,) = [p for p in validation.generation_pairs() if p["id"] == "mpt-7b-4096"]
    assert p["published_ratio"] == pytest.approx(8611 / 3684) == pytest.approx(2.3374, abs=1e-4)
    assert p["a100"]["global_batch"] == p["h100"]["global_batch"] == 16 * 2 * 8
    assert p["a100"]["recompute"] == "full" and p["a100"]["zero"] == 3
    (row,) = [r for r in validation.pair_table() if r["id"] == "mpt-7b-4096"]
    a, h = validation.predict_run(p["a100"]), validation.predict_run(p["h100"])
    assert row["predicted_ratio"] == pytest.approx(h["predicted"] / a["predicted"])
    assert row["ratio_error_pct"] == pytest.approx(100 * (h["predicted"] / a["predicted"] / (8611 / 3684) - 1))
    # A pair whose two rows accumulated differently is priced with each side's own batch.
    (q,) = [p for p in validation.generation_pairs() if p["id"] == "mpt-13b-2048"]
    assert (q["a100"]["global_batch"], q["h100"]["global_batch"]) == (2 * 3 * 8, 2 * 1 * 8)


def test_llm_foundry_stack_is_solved_from_its_calibration_pair():
    assert stack.efficiency("llm-foundry") == pytest.approx(validation.solve_stack("llm-foundry"), abs=0.001)
    (cal,) = [r for r in validation.pair_table() if r["role"] == "calibration"]
    assert cal["a100"]["error_pct"] == pytest.approx(0.0, abs=0.2)


def test_summary_reports_the_bad_band_as_it_is():
    bands = {b["band"]: b for b in validation.pair_summary()}
    assert bands["all"]["pairs"] == 37 == sum(bands[n]["pairs"] for n, _, _ in validation.SEQ_BANDS)
    # Short, GEMM-bound sequences: the model's H100 speed-up is too high (positive errors).
    assert bands["seq <= 2K"]["ratio_error_pct"][1] > 20.0
    assert bands["seq >= 16K"]["ratio_mean_abs_error_pct"] < bands["seq <= 2K"]["ratio_mean_abs_error_pct"]


def test_other_gpu_interval_compounds_the_a100_class_with_the_ratio_residuals():
    res = uncertainty._residuals()
    ratio = uncertainty._bounds([r["ratio_error_pct"] / 100 for r in validation.pair_table()])
    dense = uncertainty._bounds(res["megatron-lm:dense"])
    reg = uncertainty.regime("h100-sxm", pipelined=False)
    assert (reg["low"], reg["high"]) == pytest.approx(uncertainty._compound(dense, ratio))
    assert any("37 same-software A100 / H100 pairs" in r for r in reg["reasons"])
    assert not any("assumed to carry" in r for r in reg["reasons"])
    assert any("assumed to carry the same way" in r for r in uncertainty.regime("h200", False)["reasons"])


def test_a_pair_the_model_gets_wrong_falls_outside_and_widens_the_interval(pairs_file):
    before = uncertainty.regime("h100-sxm", pipelined=False)["high"]
    bad = copy.deepcopy(pairs_file["pairs"][0])
    bad["id"], bad["h100"]["tokens_per_s_per_gpu"] = "broken", bad["h100"]["tokens_per_s_per_gpu"] / 2
    pairs_file["pairs"].append(bad)
    _clear()
    cov = uncertainty.cross_generation_coverage()
    (row,) = [r for r in cov["ratio"] if r["id"] == "broken"]
    assert row["error_pct"] > 100.0 and not row["inside"]
    assert uncertainty.regime("h100-sxm", pipelined=False)["high"] > before + 0.5
    # The coverage docs/planner.md states is the computed one: with the broken pair it no longer is.
    assert uncertainty.coverage_statement() not in _planner_page()


@pytest.mark.parametrize("broken, message", [
    ({"source": ""}, "has no source"),
    ({"model": "mpt-99b"}, "names model 'mpt-99b'"),
])
def test_a_pair_without_source_or_shape_is_refused(pairs_file, broken, message):
    pairs_file["pairs"][3].update(broken)
    with pytest.raises(MgbenchError, match=re.escape(message)):
        validation.generation_pairs()


def _planner_page() -> str:
    return " ".join((Path(__file__).parents[2] / "docs" / "planner.md").read_text().split())


def test_planner_page_states_the_computed_coverage():
    assert uncertainty.coverage_statement() in _planner_page()


def test_planner_page_states_the_computed_moe_coverage():
    assert uncertainty.moe_coverage_statement() in _planner_page()
