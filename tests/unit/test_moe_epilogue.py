"""gpt-oss's expert epilogue: the clamp of the GLU's inputs and the router-weighted bias
that Megatron-Core runs as eager elementwise passes (moe.epilogue_seconds), checked by
hand; where it is priced and where not (the fused grouped MLP, experts without either,
a dense model); and the model fields that carry it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.hf_config import shape_from_file
from mgbench.model_shape import ModelShape
from mgbench.planner import moe
from mgbench.planner import moe_validation as V
from mgbench.planner.resolve import resolve
from tests.unit.test_model_spec import PUBLISHED

B300_EP8 = "mbridge-26.04-b300-gpt-oss-120b-bf16-ep8"  # BF16, no recompute, force-balanced (load 1)
GB200_EP64 = "mbridge-26.02-gb200-gpt-oss-120b-bf16"  # BF16, recompute_modules layernorm, moe_act
GB300_FUSED = "mbridge-26.06-gb300-gpt-oss-120b-mxfp8"  # MXFP8 with the CuteDSL fused grouped MLP


def _row(rid):
    return next(r for r in V.runs() if r["id"] == rid)


def test_the_epilogue_by_hand():
    # gpt-oss-120b: F = H = 2880, 36 MoE layers, top-4. 64 GPUs, GBS 1280, MBS 4: 5
    # micro-batches of 4 x 4096 tokens a rank, 65,536 routed rows each (balanced). Bytes a
    # row: the clamp 36 F (16 forward + 20 backward) and the bias 64 H (28 + 36).
    # DGX B300: 8 TB/s at the achieved fraction the catalog gives.
    row = _row(B300_EP8)
    hw = resolve(precision="bf16", system="dgx-b300")
    rows, passes = 4 * 4096 * 4, 36 * 5
    by_hand = (36 * 2880 + 64 * 2880) * rows * passes / (8e12 * hw.mem_bw_fraction)
    got = V.predict_row(row)["breakdown"]["moe_epilogue_s"]
    assert float(got) == pytest.approx(by_hand, rel=1e-9)
    assert by_hand == pytest.approx(0.516, abs=0.001)  # half a second of a 5.4 s published step
    # Recomputing the activation (moe_act) runs the clamp's forward again: 16 F more a row.
    row2 = _row(GB200_EP64)
    hw2 = resolve(precision="bf16", system="gb200-nvl72")
    again = (52 * 2880 + 64 * 2880) * rows * passes / (hw2.mem_bw * hw2.mem_bw_fraction)
    assert float(V.predict_row(row2)["breakdown"]["moe_epilogue_s"]) == pytest.approx(again, rel=1e-9)


def test_none_under_the_fused_grouped_mlp_or_for_other_experts():
    fused = _row(GB300_FUSED)
    assert moe.options_of(fused).fused_grouped_mlp
    assert float(V.predict_row(fused)["breakdown"]["moe_epilogue_s"]) == 0.0
    # The same run stated without the fused kernel pays it, and runs slower for it.
    unfused = V.predict_row(fused, dataclasses.replace(moe.options_of(fused), fused_grouped_mlp=False))
    assert float(unfused["breakdown"]["moe_epilogue_s"]) > 0.1
    assert unfused["step_time_s"] > V.predict_row(fused)["step_time_s"]
    # Experts without a clamp or biases (DeepSeek-V3, Qwen3) have no epilogue of their own.
    for rid in ("mbridge-25.11-b200-qwen3-30b-a3b-fp8", "mbridge-25.11-gb200-deepseek-v3-bf16"):
        assert float(V.predict_row(_row(rid))["breakdown"]["moe_epilogue_s"]) == 0.0
    # Each half counts alone: the bias without the clamp, the clamp without the bias.
    row = _row(B300_EP8)
    hw = resolve(precision="bf16", system="dgx-b300")
    shape = V.shape_of(row)
    kw = dict(tokens=16384.0, moe_layers=36, num_micro=5, load=1.0, opts=moe.MoeOptions())
    both = moe.epilogue_seconds(shape, hw, **kw)
    bias = moe.epilogue_seconds(dataclasses.replace(shape, glu_clamp=None), hw, **kw)
    clamp = moe.epilogue_seconds(dataclasses.replace(shape, expert_bias=False), hw, **kw)
    assert bias == pytest.approx(both * 64 / 100) and clamp == pytest.approx(both * 36 / 100)


def test_predict_says_which_way_it_priced_them():
    from click.testing import CliRunner

    from mgbench.cli import main

    base = ["predict", "--model", "gpt-oss-120b", "--system", "dgx-b200", "--num-gpus", "64", "--ep", "8",
            "--micro-batch", "4", "--global-batch", "1280", "--seq-len", "4096", "--json"]
    eager = json.loads(CliRunner().invoke(main, base).output)
    fused = json.loads(CliRunner().invoke(main, [*base, "--precision", "fp8", "--moe-fused-grouped-mlp"]).output)
    assert eager["breakdown"]["moe_epilogue_s"] > 0
    assert any("priced as Megatron-Core runs them unfused" in n for n in eager["notes"])
    assert fused["breakdown"]["moe_epilogue_s"] == 0
    assert any("inside the fused grouped MLP" in n for n in fused["notes"])
    dense = json.loads(CliRunner().invoke(main, ["predict", "--model", "llama3-8b", "--system", "dgx-b200",
                                                 "--num-gpus", "8", "--json"]).output)
    assert not any("MoE experts" in n for n in dense["notes"])


def test_the_model_fields():
    oss = catalog.model_shape("gpt-oss-120b")
    assert oss.expert_bias and oss.glu_clamp == 7.0
    # Read from a Hugging Face config alike (swiglu_limit).
    hf = shape_from_file(PUBLISHED / "gpt-oss-120b" / "config.json")
    assert hf.expert_bias and hf.glu_clamp == 7.0
    # Neutral values leave a config's dims (and so its id) as they were.
    assert "expert_bias" not in catalog.model_shape("qwen3-30b-a3b").to_dict()
    assert "glu_clamp" not in catalog.model_shape("llama3-8b").to_dict()
    # The runner does not build them: it says so.
    assert "expert_bias, glu_clamp" in oss.runner_problem()
    dims = dict(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=100)
    for bad, match in ((dict(experts=4, top_k=2, glu_clamp=-1.0), "glu_clamp must be a positive number"),
                       (dict(experts=4, top_k=2, glu_clamp=True), "glu_clamp must be a positive number"),
                       (dict(experts=4, top_k=2, expert_bias="yes"), "expert_bias must be true or false"),
                       (dict(expert_bias=True), "apply to MoE models only"),
                       (dict(glu_clamp=7.0), "apply to MoE models only")):
        with pytest.raises(MgbenchError, match=match):
            ModelShape.from_dict({**dims, **bad})
