"""Published MoE A/B pairs (planner/moe_pairs.py): rows that differ in one knob, the
published ratio beside the predicted one, and the verdict on the model's lever."""

import pytest

from mgbench.planner import moe_pairs as P
from mgbench.planner import moe_validation as V


def _rows():
    return {r["id"]: r for r in V.runs()}


def test_verdicts_by_hand():
    assert P.verdict(1.10, 1.12) == "agrees"          # 1.12 / 1.10 = 1.018
    assert P.verdict(0.961, 1.303) == "opposite"      # published -3.9%, predicted +30%
    assert P.verdict(1.220, 1.491) == "too large"
    assert P.verdict(1.258, 1.000) == "too small"     # the model prices no effect
    assert P.verdict(1.03, 0.97) == "too small"       # opposite signs, both inside the band
    assert P.verdict(0.90, 1.00, band=0.2) == "agrees"


def test_the_published_pairs_are_found_with_their_ratios():
    found = P.pairs()
    by = {(p["a"], p["b"]): p for p in found}
    rows = _rows()
    # CUDA graphs of the whole step, Megatron-LM's recipe README, 16 GB200: the one knob
    g = by[("mlm-recipes-gb200-qwen3-30b-a3b-mxfp8-partialcg-16gpu", "mlm-recipes-gb200-qwen3-30b-a3b-mxfp8-fullcg-16gpu")]
    assert g["knob"] == "moe.cuda_graphs" and g["same_release"]
    assert g["published_ratio"] == pytest.approx(28119 / 22345, rel=1e-3)
    sa, sb = V.score(rows[g["a"]]), V.score(rows[g["b"]])
    assert g["predicted_ratio"] == pytest.approx(sb["predicted"] / sa["predicted"])
    # HybridEP against all-to-all for GPT-OSS 120B on 64 B200: published 13045 against 13568
    d = by[("mbridge-26.04.01-b200-gpt-oss-120b-bf16-ep8", "mbridge-26.04-b200-gpt-oss-120b-bf16-ep8-hybridep")]
    assert d["knob"] == "moe.dispatcher" and not d["same_release"]
    assert d["published_ratio"] == pytest.approx(13045 / 13568)
    assert d["verdict"] == "opposite"  # the model prices HybridEP's layers cheaper; the run was 4% slower
    # every pair differs in exactly one knob, and no re-measured configuration counts twice
    again = V.repeats(V.runs())
    for p in found:
        ka, kb = P.knobs(rows[p["a"]]), P.knobs(rows[p["b"]])
        assert [k for k in ka if ka[k] != kb[k]] == [p["knob"]]
        assert p["a"] not in again and p["b"] not in again
    assert not any(p["a"] == "mlperf-v6.0-b300-gpt-oss-20b-8-cisco" or p["b"] == "mlperf-v6.0-b300-gpt-oss-20b-8-cisco"
                   for p in found)


def test_a_pair_the_model_gets_backwards_is_called_opposite():
    # Negative control on a made pair: one real row and the same row with its micro-batch
    # doubled (one knob). Published as the model predicts: "agrees"; published moving 20%
    # the other way from the predicted effect: "opposite".
    rows = _rows()
    base = rows["mlm-recipes-gb200-qwen3-30b-a3b-mxfp8-partialcg-16gpu"]
    # two knobs apart (system and graphs): no pair
    assert P.pairs(rows=[rows["mlm-recipes-gb200-qwen3-30b-a3b-mxfp8-fullcg-16gpu"],
                         rows["mbridge-26.02.01-b200-qwen3-30b-a3b-mxfp8-mbs4"]]) == []
    a = dict(base, id="fake-a")
    b = dict(base, id="fake-b", micro_batch=base["micro_batch"] * 2)
    got = P.pairs(rows=[a, b])
    assert len(got) == 1 and got[0]["knob"] == "micro_batch" and got[0]["published_ratio"] == 1.0
    q = got[0]["predicted_ratio"] - 1.0
    assert q != 0.0
    same = P.pairs(rows=[a, dict(b, published=base["published"] * (1 + q))])
    assert same[0]["verdict"] == "agrees" and same[0]["effect_error"] == pytest.approx(0.0, abs=1e-9)
    backwards = P.pairs(rows=[a, dict(b, published=base["published"] * (1 - 0.2 * (1 if q > 0 else -1)))])
    assert backwards[0]["verdict"] == "opposite"


def test_the_report_sums_each_knob():
    text = P.report()
    summary = P.by_knob(P.pairs())
    for knob, s in summary.items():
        assert f"{knob}: {s['pairs']} pairs, mean |effect error| {100 * s['mean_abs_effect_error']:.1f}%" in text
    assert summary["moe.dispatcher"]["opposite"] >= 2


def test_plan_says_how_the_gpu_count_pairs_bear_out_an_moe_plan():
    # plan chooses the GPU count: for an MoE model it says what the published GPU-count
    # pairs showed; for a dense model (no MoE pairs apply) it says nothing of them.
    from mgbench import catalog
    from mgbench.planner.search import PlanOptions, plan

    opts = PlanOptions(tokens=1e11, systems=["dgx-b200"], max_gpus=16)
    s = P.by_knob(P.pairs())["num_gpus"]
    moe_reasons = plan(catalog.model_shape("qwen3-30b-a3b"), opts)["reasons"]
    line = next(x for x in moe_reasons if x.startswith("the GPU count: on the "))
    assert f"{s['pairs']} published A/B pairs" in line and f"{s['too small']} too small" in line
    dense = plan(catalog.model_shape("llama3-8b"), opts)["reasons"]
    assert not any("published A/B pairs" in x for x in dense)
