"""FP8 attention (Transformer Engine's fp8_dpa, Megatron-Bridge's
fp8_dot_product_attention): the step takes (1 - the FP8 / BF16 kernel-time ratio measured
on the GPU) of the BF16 kernel's seconds, at the rate measured in the same run
(efficiency.toml [fp8_attention]), off attention's priced seconds; checked by hand where
attention runs as layer GEMMs (Blackwell) and where the fused kernel's own fraction
prices it (Hopper); refused without FP8, under blockwise, without the fused kernel, on a
GPU with no measurement, and in the published rows without the line that sets it."""

from __future__ import annotations

import json

import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.layout import Layout
from mgbench.planner import hardware, layout_time, perf
from mgbench.planner.memory import stage_layers
from mgbench.planner import moe_validation as V
from mgbench.planner.resolve import resolve

LLAMA = catalog.model_shape("llama3-8b")
LAYOUT = dict(seq=8192, global_batch=64, micro_batch=1, tp=1, pp=1, dp=8, zero=1, recompute=0, precision="fp8")


def _step(hw, **kw):
    return layout_time.step_time(LLAMA, hw, **{**LAYOUT, **kw})


def test_blackwell_takes_the_ratio_off_the_measured_kernels_seconds():
    hw = resolve(precision="fp8", system="dgx-b200")
    # b200 carries gb200's measurement: Llama's GQA at 8,192, per-tensor FP8 (delayed, the
    # megatron-lm stack's default recipe) and MXFP8, beside the BF16 kernel at 0.557 of peak
    assert hardware.fp8_attention_points("b200") == hardware.fp8_attention_points("gb200")
    for recipe, ratio in (("delayed", 0.879), ("mxfp8", 0.983)):
        base, fp8 = _step(hw, fp8_recipe=recipe), _step(hw, fp8_recipe=recipe, fp8_attention=True)
        assert base["breakdown"]["attention_s"] == 0.0  # no kernel fraction applied on B200: GEMM-priced
        # By hand: the causal kernel's forward, 2 x 32 heads x (128 + 128) x 8192 / 2 FLOPs a
        # token and layer, 3.5 passes (FlashAttention's convention), 32 layers, the busiest
        # GPU's 64 x 8192 / 8 tokens, at 0.557 of the bf16 peak; then the stack's efficiency.
        flops = 3.5 * 2 * 32 * 256 * 4096 * 32 * (64 * 8192 / 8)
        kernel = flops / (hw.peak_tflops * 1e12 * 0.557) / hw.stack_eff
        assert base["step_time_s"] - fp8["step_time_s"] == pytest.approx(kernel * (1.0 - ratio), rel=1e-6)
        # ... which is less than the same ratio of the GEMM-rate stand-in (12 L h s FLOPs a
        # token, causality not halved), what the first version took it off (review F2)
        scores = 12 * 32 * 4096 * 8192 * (64 * 8192 / 8) / (hw.peak_tflops * 1e12 * hw.compute_eff) / hw.stack_eff
        assert scores * (1.0 - ratio) > 1.1 * kernel * (1.0 - ratio)
        assert any("--fp8-attention, " + ("mxfp8" if recipe == "mxfp8" else "fp8") in n for n in fp8["notes"])


def test_the_saving_is_never_more_than_attentions_priced_seconds(monkeypatch):
    # a kernel measured at 1% of peak would take 100 x the FLOPs' time: FP8 at half of it
    # may take off no more than the priced seconds
    hw = resolve(precision="fp8", system="dgx-b200")
    slow = {"mxfp8": [[4096, 0.5]], "fp8": [[4096, 0.5]], "bf16_fraction": [[4096, 0.01]]}
    _with_table(monkeypatch, {"b200": {"kind": "measured", "gqa": slow, "mla": slow}})
    base, fp8 = _step(hw), _step(hw, fp8_attention=True)
    assert base["step_time_s"] - fp8["step_time_s"] == pytest.approx(base["breakdown"]["scores_s"] / hw.stack_eff,
                                                                     rel=1e-6)


def test_each_kind_of_attention_takes_its_own_ratio():
    pts = hardware.fp8_attention_points("gb300")
    gb300 = resolve(precision="fp8", system="gb300-nvl72")
    # halfway between 4,096 and 8,192 in log2: the mean of the two points
    mla = pts["mla"]["mxfp8"]
    ratio, _, scaling = layout_time.fp8_attention_terms(catalog.model_shape("deepseek-v3"), gb300, "fp8", "mxfp8",
                                                        4096 * 2 ** 0.5)
    assert mla[1][0] == 4096 and mla[2][0] == 8192
    assert scaling == "mxfp8" and ratio == pytest.approx((mla[1][1] + mla[2][1]) / 2)
    # gpt-oss: its sliding windows carry the GQA figure (no valid FP8 window measurement)
    ratio, _, scaling = layout_time.fp8_attention_terms(catalog.model_shape("gpt-oss-120b"), gb300, "fp8",
                                                        "tensorwise", 4096)
    assert scaling == "fp8" and ratio == pytest.approx(dict(pts["gqa"]["fp8"])[4096])
    # held at the measured ends
    far, _, _ = layout_time.fp8_attention_terms(LLAMA, gb300, "fp8", "mxfp8", 65536)
    assert far == pytest.approx(pts["gqa"]["mxfp8"][-1][1])


def test_a_pipelined_mtp_model_takes_the_saving_off_every_stage_once():
    # DeepSeek-V3 at pp 4: the MTP module's share of the FLOP-priced part moves to the last
    # stage; FP8 attention must come off that part too, or the last stage keeps BF16 time
    hw = resolve(precision="fp8", system="gb300-nvl72")
    ds = catalog.model_shape("deepseek-v3")
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=4, dp=16, zero=1, recompute=0, precision="fp8",
              ep=8, fp8_recipe="mxfp8")
    base = layout_time.step_time(ds, hw, **kw)
    fp8 = layout_time.step_time(ds, hw, fp8_attention=True, **kw)
    b = base["breakdown"]
    ratio, fraction, _ = layout_time.fp8_attention_terms(ds, hw, "fp8", "mxfp8", 4096)
    assert fraction == pytest.approx(dict(hardware.fp8_attention_points("gb300")["mla"]["bf16_fraction"])[4096])
    kernel = b["flash_unit_s"] / fraction
    saved = kernel * (1.0 - ratio) / hw.stack_eff  # the stage's scores, at the measured kernel's rate
    # the FLOP-priced part a stage hands the last one shrinks by the MTP modules' share of
    # the saving, and the last stage's MTP time by that share scaled to the whole model
    own, mtp = perf.block_flops_per_token(ds, 4096.0, 0)
    lps = stage_layers(ds.layers, 4, None)[0]
    expected = saved * mtp / (own + mtp) * ds.layers / lps
    assert b["mtp_last_stage_s"] - fp8["breakdown"]["mtp_last_stage_s"] == pytest.approx(expected, rel=1e-6)


def test_hopper_prices_the_fused_kernels_seconds_at_the_ratio(monkeypatch):
    hw = resolve(precision="fp8", system="dgx-h100")
    # the table's BF16 fraction set to the kernel fraction Hopper prices attention at, so
    # the measured kernel is the priced one: half of it comes off
    frac = float(perf.attention_fraction(hw, 8192))
    one = {"mxfp8": [[4096, 0.9]], "fp8": [[4096, 0.5]], "bf16_fraction": [[4096, frac]]}
    _with_table(monkeypatch, {"h100-sxm": {"kind": "measured", "gqa": one, "mla": one}})
    base, fp8 = _step(hw), _step(hw, fp8_attention=True)
    kernel = base["breakdown"]["attention_s"]
    assert kernel > 0.0
    assert base["step_time_s"] - fp8["step_time_s"] == pytest.approx(kernel * 0.5 / hw.stack_eff, rel=1e-6)


def test_refused_without_fp8_a_measurement_or_an_fp8_attention_recipe():
    with pytest.raises(MgbenchError, match="--fp8-attention applies to --precision fp8"):
        Layout(num_gpus=8, precision="bf16", fp8_attention=True)
    with pytest.raises(MgbenchError, match="--fp8-attention applies to --precision fp8"):
        _step(resolve(precision="bf16", system="dgx-h100"), precision="bf16", fp8_attention=True)
    with pytest.raises(MgbenchError, match="no FP8 / BF16 fused-attention time measured for h100-sxm"):
        _step(resolve(precision="fp8", system="dgx-h100"), fp8_attention=True)
    with pytest.raises(MgbenchError, match="no FP8 attention under the blockwise recipe"):
        _step(resolve(precision="fp8", system="dgx-b200"), fp8_recipe="blockwise", fp8_attention=True)
    with pytest.raises(MgbenchError, match="no FP8 attention under the blockwise recipe"):
        Layout(num_gpus=8, precision="fp8", fp8_recipe="blockwise", fp8_attention=True)
    with pytest.raises(MgbenchError, match="drop --no-flash-attention"):
        Layout(num_gpus=8, precision="fp8", flash_attention=False, fp8_attention=True)


def _with_table(monkeypatch, table):
    real = catalog.load
    monkeypatch.setattr(catalog, "load", lambda name: {**real(name), "fp8_attention": table}
                        if name == "efficiency.toml" else real(name))


def test_the_ratio_table_is_checked(monkeypatch):
    good = {"gqa": {"mxfp8": [[4096, 1.0]], "fp8": [[4096, 0.9]], "bf16_fraction": [[4096, 0.5]]},
            "mla": {"mxfp8": [[4096, 0.7]], "fp8": [[4096, 0.6]], "bf16_fraction": [[4096, 0.4]]}}
    _with_table(monkeypatch, {"b200": {"kind": "measured", **good}, "b300": {"kind": "carried", "from": "b200"}})
    assert hardware.fp8_attention_points("b300")["mla"]["fp8"] == ((4096.0, 0.6),)
    _with_table(monkeypatch, {"b200": {"kind": "carried", "from": "b300"}, "b300": {"kind": "carried", "from": "b200"}})
    with pytest.raises(MgbenchError, match="circle"):
        hardware.fp8_attention_points("b300")
    _with_table(monkeypatch, {"b300": {"kind": "carried", "from": "b200"}})
    with pytest.raises(MgbenchError, match="not an entry of the table"):
        hardware.fp8_attention_points("b300")
    _with_table(monkeypatch, {"b200": {"kind": "measured", **good, "mla": {"mxfp8": [[4096, 0.0]], "fp8": [[4096, 0.6]]}}})
    with pytest.raises(MgbenchError, match=r"mla.mxfp8 must be a list of \[sequence, ratio\] pairs"):
        hardware.fp8_attention_points("b200")
    # a kernel fraction over the peak, or none beside the ratios
    _with_table(monkeypatch, {"b200": {"kind": "measured", **good,
                                       "gqa": {**good["gqa"], "bf16_fraction": [[4096, 1.2]]}}})
    with pytest.raises(MgbenchError, match=r"gqa.bf16_fraction must be a list of \[sequence, fraction\] pairs, "
                                           "both positive, the fraction at most 1"):
        hardware.fp8_attention_points("b200")
    _with_table(monkeypatch, {"b200": {"kind": "measured", **good, "mla": {"mxfp8": [[4096, 0.7]], "fp8": [[4096, 0.6]]}}})
    with pytest.raises(MgbenchError, match=r"mla.bf16_fraction must be a list"):
        hardware.fp8_attention_points("b200")


def test_published_rows_state_it_with_its_source():
    rows = [r for r in V.runs() if r.get("fp8_attention")]
    assert len(rows) == 24  # 19, then five rows of the twenty-third session's search
    assert all(r["precision"] == "fp8" and r["fp8_attention_source"] for r in rows)
    assert Layout.from_published(rows[0]).fp8_attention is True
    row = dict(rows[0])
    assert V.fp8_attention_row_problem(row) is None
    assert "precision fp8" in V.fp8_attention_row_problem({**row, "precision": "bf16"})
    assert "fp8_attention_source" in V.fp8_attention_row_problem({**row, "fp8_attention_source": ""})
    assert "true or false" in V.fp8_attention_row_problem({**row, "fp8_attention": "yes"})
    assert "blockwise" in V.fp8_attention_row_problem({**row, "fp8_recipe": "blockwise"})
    with pytest.raises(MgbenchError, match="fp8_attention without fp8_attention_source"):
        V.check_rows([{**row, "fp8_attention_source": None}])


def test_the_cli_takes_it_and_refuses_it_without_fp8(cli):
    ok = cli("predict", "--model", "llama3-8b", "--system", "dgx-b200", "--num-gpus", "8", "--precision", "fp8",
             "--fp8-attention", "--json")
    assert ok.returncode == 0, ok.stderr
    assert any("--fp8-attention" in n for n in json.loads(ok.stdout)["notes"])
    bad = cli("plan", "--model", "llama3-8b", "--tokens", "1e11", "--fp8-attention")
    assert bad.returncode == 2 and bad.stderr.count("--fp8-attention applies to --precision fp8") == 1, bad.stderr
    assert "Traceback" not in bad.stderr
    # blockwise refused once for the plan, not once a system
    block = cli("plan", "--model", "llama3-8b", "--tokens", "1e11", "--precision", "fp8", "--fp8-recipe", "blockwise",
                "--fp8-attention")
    assert block.returncode == 2 and block.stderr.count("blockwise recipe") == 1, block.stderr
    # a GPU with no measurement: one line, exit 2
    hop = cli("predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--precision", "fp8",
              "--fp8-attention")
    assert hop.returncode == 2 and "no FP8 / BF16 fused-attention time measured for h100-sxm" in hop.stderr
    assert "Traceback" not in hop.stderr


def test_plan_over_every_system_skips_a_gpu_without_a_measurement_and_says_so():
    # plan over the catalog (no --systems): a GPU with no FP8 / BF16 time is left out with a
    # note, the others ranked; named in --systems it is refused (the CLI test above)
    from mgbench.planner import search

    res = search.plan(LLAMA, search.PlanOptions(tokens=1e10, seq_len=4096, global_batch_tokens=2**20, max_gpus=8,
                                                precision="fp8", fp8_attention=True))
    measured = {hardware.systems()[r["system"]]["gpu"] for r in res["ranked"]}
    assert measured and measured <= set(hardware.fp8_attention_gpus())
    assert any(n.startswith("dgx-h100 not considered: --fp8-attention: no FP8 / BF16 fused-attention time measured "
                            "for h100-sxm") for n in res["reasons"]), res["reasons"]


def test_the_saving_is_scaled_by_the_stacks_efficiency():
    # every other test here runs at a stack efficiency of 1: under torchtitan's 0.894 the
    # saving, as every block term, is divided by it
    base_hw = resolve(precision="fp8", system="dgx-b200")
    hw = resolve(precision="fp8", system="dgx-b200", stack="torchtitan")
    assert hw.stack_eff == pytest.approx(0.894)

    def saving(h):
        return _step(h, fp8_recipe="mxfp8")["step_time_s"] - _step(h, fp8_recipe="mxfp8", fp8_attention=True)["step_time_s"]

    assert saving(hw) == pytest.approx(saving(base_hw) / 0.894, rel=1e-6)


def test_the_stored_fractions_are_the_sources_milliseconds():
    # efficiency.toml's source lines quote the BF16 forward + backward milliseconds (batch 2,
    # causal): 3.5 x the causal forward FLOPs over them over the 2,500 TFLOP/s peak gives the
    # stored fraction; and the planner's kernel seconds at it give the milliseconds back
    peak = {g: catalog.accelerator_peak(g, "bf16") * 1e12 for g in ("gb200", "gb300")}
    assert peak["gb200"] == peak["gb300"] == 2.5e15  # what efficiency.toml's comment divides by

    def frac(heads, width, s, ms):
        return 3.5 * 2 * 2 * heads * s * s / 2 * width / (ms * 1e-3) / peak["gb300"]

    gb300, gb200 = hardware.fp8_attention_points("gb300"), hardware.fp8_attention_points("gb200")
    assert dict(gb300["gqa"]["bf16_fraction"])[4096] == pytest.approx(frac(64, 256, 4096, 1.424), abs=0.001)
    assert dict(gb300["mla"]["bf16_fraction"])[4096] == pytest.approx(frac(128, 320, 4096, 3.991), abs=0.001)
    assert dict(gb200["mla"]["bf16_fraction"])[32768] == pytest.approx(frac(128, 320, 32768, 263.002), abs=0.001)
    hw = resolve(precision="fp8", system="gb300-nvl72")
    ds = catalog.model_shape("deepseek-v3")
    one_layer = perf.flash_attention_s(ds, hw, 4096, 0, 2 * 4096 / (ds.layers + ds.mtp_layers),
                                       fraction=dict(gb300["mla"]["bf16_fraction"])[4096])
    assert one_layer == pytest.approx(3.991e-3, rel=0.003)


def test_materialised_attention_is_refused_in_the_step_too():
    with pytest.raises(MgbenchError, match="drop --no-flash-attention"):
        _step(resolve(precision="fp8", system="dgx-b200"), flash=False, fp8_attention=True)
