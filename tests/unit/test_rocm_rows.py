"""The AMD Instinct MoE rows (published_moe_runs.toml, rule of the twenty-fourth session):
they stay out of every solve of the NVIDIA host constants, DeepSeek-V2-Lite's variant is the
published model, they are reported as a part of their own, and the ROCm host factor's gate
(docs/planner.md) refuses a term that pushes a held-out row over the worst-row target."""

from __future__ import annotations

import pytest

from mgbench.planner import moe_validation as V

AMD = [r for r in V.runs() if not V.on_nvidia(r)]


def test_the_amd_rows_are_there_and_alternate():
    assert len(AMD) == 17 and {r["system"] for r in AMD} == {"mi355x-8"}
    # the file's alternation continued, fit first (the rule)
    assert [r["split"] for r in AMD] == ["fit", "held_out"] * 8 + ["fit"]


def test_no_amd_row_feeds_the_host_constants():
    fit_amd = {r["id"] for r in AMD if r["split"] == "fit"}
    assert fit_amd  # they are fit rows on Megatron-Core off EFA: only the vendor keeps them out
    assert all(V.stack_of(r) == V.STACK for r in AMD)
    assert not fit_amd & {r["id"] for r in V.host_fit_rows()}
    assert not fit_amd & set(V.solve_host()["rows"])


def test_deepseek_v2_lite_is_the_published_model():
    # DeepSeek-AI's model card: 15.7B parameters, 2.4B activated (DeepSeek-V2-Lite); the
    # active figure without the input embedding, as DeepSeek counts (counts.toml), cut to
    # its two published digits
    shape = V.shape_of(next(r for r in AMD if "lite" in r["id"]))
    assert shape.name == "deepseek-v2-lite" and all(r["model"] == "deepseek-v2-lite" for r in AMD if "lite" in r["id"])
    assert shape.num_params() == pytest.approx(15.7e9, rel=0.005)
    active = shape.num_active_params() - shape.hidden * shape.vocab  # less the input embedding
    assert 2.4e9 <= active < 2.5e9
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.experts, shape.q_lora_rank) == (
        27, 2048, 16, 16, 64, None)


def test_rows_differing_only_in_unpriced_steps_are_one_configuration():
    lite = [r for r in AMD if "lite" in r["id"] and r["micro_batch"] == 12]
    # MBS 12: the baseline and loss fusion (all-to-all), then DeepEP, sync-free, launch options
    configs = {V.configuration(r) for r in lite}
    assert len(lite) == 5 and len(configs) == 2


def test_the_amd_part_is_reported_apart():
    line = V.stack_line(V.scored_rows(AMD), AMD)
    assert "Megatron-Core on AMD Instinct (Primus)" in line
    assert "on NVIDIA" not in line  # none of these rows is counted with NVIDIA's


def test_the_gate_by_hand():
    assert V.factor_adopted([20.0, 10.0], [5.0, 12.0])  # mean 15 -> 8.5, nothing crosses
    assert not V.factor_adopted([20.0, 10.0], [25.0, 12.0])  # mean rises
    assert not V.factor_adopted([40.0, 10.0], [1.0, 31.0])  # mean falls, a row crosses 30%
    assert V.factor_adopted([40.0, 10.0], [35.0, 10.0])  # over before and still over: not a crossing
    assert not V.factor_adopted([30.0, 10.0], [30.1, 1.0])  # 30% is within; 30.1% is over: a crossing
    assert V.factor_adopted([30.0, 10.0], [30.0, 1.0])
    assert not V.factor_adopted([20.0, 10.0], [10.0, 20.0])  # the mean must fall, not stay
    assert not V.factor_adopted([], [])


def test_the_solve_finds_a_known_factor():
    rows = V.rocm_rows("fit")
    faked = []
    for r in rows:
        base, host = V.rocm_host_terms(r)
        step = base + 2.5 * host
        faked.append({**r, "published": r["global_batch"] * r["seq"] / (step * r["num_gpus"])})
    got = V.solve_rocm_host_factor(faked)
    assert got["factor"] == pytest.approx(2.5) and got["mean_abs_pct"] == pytest.approx(0.0, abs=1e-9)


def test_the_rocm_factor_is_refused_by_its_gate():
    # Solved 1.8 on the nine fit rows; the held-out mean falls (15.4% -> 10.7%) but
    # DeepSeek-V2-Lite at MBS 2 goes from -8.8% to -34.3%: the additive form cannot hold a
    # floor that MBS 1 and 2 share (docs/planner.md), so the gate says no and the planner
    # keeps the NVIDIA constants on AMD.
    assert V.solve_rocm_host_factor()["factor"] == pytest.approx(1.8)
    assert V.rocm_host_report().endswith("rule's gate on the held-out rows: not adopted")


def test_a_prediction_on_amd_says_its_host_constants_are_nvidias(monkeypatch):
    # predict's and plan's evidence lines (moe_pairs.evidence_notes) on an AMD system: the
    # constants are NVIDIA's, and what the AMD rows say of them, counted from the file
    from statistics import mean

    from mgbench import catalog
    from mgbench.planner import moe, moe_pairs

    shape = catalog.model_shape("deepseek-v2")
    notes = moe_pairs.evidence_notes(shape, moe.MoeOptions(), system="mi355x-8", ep=8)
    said = [n for n in notes if n.startswith("MoE host time on mi355x (amd)")]
    errs = [s["error_pct"] for s in V.scored_rows(AMD)]
    assert len(said) == 1 and "solved on NVIDIA GPUs (CUDA) only" in said[0]
    assert f"the {len(AMD)} scored eager published runs on amd GPUs: predicted throughput {mean(errs):+.1f}%" in said[0]
    # not on NVIDIA's GPUs, not where the layers are graphed (no host launches), not on a probed device
    assert V.vendor_record_note("dgx-h100") is None and V.vendor_record_note("mi355x-8", cuda_graphs=True) is None
    assert V.vendor_record_note(None) is None
    assert not [n for n in moe_pairs.evidence_notes(shape, moe.MoeOptions(), system="dgx-h100", ep=8)
                if n.startswith("MoE host time")]
    # a vendor no published run has used
    real = catalog.accelerator_vendor
    monkeypatch.setattr(catalog, "accelerator_vendor", lambda k: "intel" if k == "mi300x" else real(k))
    assert "no scored published run on intel GPUs tests them" in V.vendor_record_note("mi300x-8")


def test_only_amd_rows_are_the_amd_part(monkeypatch):
    # A row on another vendor's GPUs (none yet) is neither NVIDIA's nor AMD's: it stays out
    # of the host solve, the ROCm factor's rows and the AMD part of the report.
    other = next(r for r in AMD if r["split"] == "fit")
    real = V.vendor_of
    monkeypatch.setattr(V, "vendor_of", lambda r: "intel" if r["id"] == other["id"] else real(r))
    assert other["id"] not in {r["id"] for r in V.rocm_rows("fit")}
    assert other["id"] not in {r["id"] for r in V.host_fit_rows()}
    line = V.stack_line([{"id": other["id"], "split": "fit", "error_pct": 5.0}], [other])
    assert "AMD Instinct" not in line
