"""The step model prices each GEMM at its own shape (planner/perf.py gemm_seconds,
shaped_gemms) and memory-bound work at the achieved bandwidth: small GEMMs pay a fixed
cost, skinny ones (MoE experts with few rows) are bound by memory, large ones run at the
matmul efficiency's rate as before."""

import dataclasses

import numpy as np
import pytest

from mgbench import catalog
from mgbench.planner import hardware, layout_time, perf


def _kw(**over):
    kw = dict(seq=2048, global_batch=64, micro_batch=1, tp=1, pp=1, dp=8, zero=1, recompute=0)
    kw.update(over)
    return kw


def _terms_kw(**over):
    """compute_terms' arguments (no ZeRO stage: data-parallel traffic is layout_time's)."""
    kw = _kw(**over)
    kw.pop("zero")
    return kw


def test_gemm_seconds_by_hand():
    hw = dataclasses.replace(hardware.resolve(system="dgx-a100"), gemm_fixed_s=1e-5, gemm_norm=1.5)
    rate, bw = 200e12, hw.mem_bw * hw.mem_bw_fraction
    f, b = 2 * 4096 * 4096 * 4096, 2.0 * 3 * 4096 * 4096
    by_hand = 1e-5 + ((f / rate) ** 1.5 + (b / bw) ** 1.5) ** (1 / 1.5)
    assert float(perf.gemm_seconds(f, b, hw, rate)) == pytest.approx(by_hand)
    inf = dataclasses.replace(hw, gemm_norm=float("inf"))
    assert float(perf.gemm_seconds(f, b, inf, rate)) == pytest.approx(1e-5 + max(f / rate, b / bw))


@pytest.mark.parametrize("model", ["llama3-8b", "gpt2-small", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"])
def test_shaped_gemms_hold_the_blocks_linear_flops(model):
    # Every FLOP the rate priced is in a shaped GEMM or in the remainder: the shapes add
    # time, never drop work. Per micro-batch and block, at tp = 2.
    shape = catalog.model_shape(model)
    hw = hardware.resolve(system="dgx-h100")
    T = 4096.0
    g = perf.shaped_gemms(shape, hw, tokens_micro=T, tp=2, ep=1, passes=3.0, rate=1e15, precision="bf16")
    block_weights = shape.num_matmul_params() - shape.num_head_matmul_params() - shape.num_mtp_params(active=True)
    per_block = 6.0 * block_weights * T / 2 / shape.layers
    norms = 6.0 * 2 * shape.hidden * T / 2  # the two norm scales a block counts as matmul weights
    assert float(g["flops"]) == pytest.approx(per_block - norms, rel=1e-9)
    assert float(g["seconds"]) > float(g["flops"]) / 1e15


def test_large_gemms_keep_the_rate_small_ones_pay():
    h100 = hardware.resolve(system="dgx-h100")
    big = layout_time.step_time(catalog.model_shape("llama3-70b"), h100, **_kw(seq=8192, tp=8, dp=1, global_batch=8))
    small = layout_time.step_time(catalog.model_shape("gpt2-small"), h100, **_kw(tp=8, dp=1, global_batch=8))
    share = lambda out: float(out["breakdown"]["gemm_shape_s"] / out["breakdown"]["matmul_s"])  # noqa: E731
    assert share(big) < 0.05  # 70B's GEMMs: within a few percent of the rate
    assert share(small) > 0.15  # GPT-2 small split 8 ways: GEMMs of a few hundred columns
    flat = layout_time.step_time(catalog.model_shape("gpt2-small"), dataclasses.replace(h100, gemm_shapes=False),
                                 **_kw(tp=8, dp=1, global_batch=8))
    assert float(flat["breakdown"]["gemm_shape_s"]) == 0.0
    assert float(small["step_time_s"]) > float(flat["step_time_s"])


def test_expert_gemms_are_a_named_term_priced_at_their_skinny_shape():
    shape = catalog.model_shape("qwen3-30b-a3b")
    hw = hardware.resolve(system="dgx-h100")
    kw = _terms_kw(seq=4096, global_batch=8, dp=8)
    terms = lambda **k: perf.compute_terms(shape, hw, **{**kw, **k})  # noqa: E731
    one, eight = terms(ep=1), terms(ep=8)
    assert float(one["expert_gemm_s"]) > 0.0
    assert float(perf.compute_terms(catalog.model_shape("llama3-8b"), hw, **kw)["expert_gemm_s"]) == 0.0
    # m = ep x tokens x top_k / experts rows an expert: 4096 x 8 / 128 = 256 at ep 1, 2048
    # at ep 8. The same FLOPs; the skinny GEMMs take longer (operand traffic, fixed cost).
    assert float(one["expert_gemm_s"]) > 1.2 * float(eight["expert_gemm_s"])
    rate = hw.peak_tflops * 1e12 * hw.compute_eff
    expert_flops = 6.0 * shape.top_k * shape.expert_params() * shape.moe_layers * 8 * 4096 / 8
    assert float(one["expert_gemm_s"]) > 1.5 * expert_flops / rate
    assert float(eight["expert_gemm_s"]) > expert_flops / rate
    # Inside the linears (what fp8 speeds up), not beside them.
    assert float(one["expert_gemm_s"]) < float(one["linear_s"])


def test_a_gddr_card_and_a_small_model_on_a_big_gpu_come_out_bandwidth_bound():
    def slowdown(system, model, **over):
        hw = hardware.resolve(system=system)
        kw = _kw(**over)
        base = float(layout_time.step_time(catalog.model_shape(model), hw, **kw)["step_time_s"])
        half = float(layout_time.step_time(catalog.model_shape(model), dataclasses.replace(hw, mem_bw=hw.mem_bw / 2),
                                           **kw)["step_time_s"])
        return half / base - 1.0

    # Half the memory bandwidth: a small model on an RTX 4090 or a B200 slows by a quarter or
    # more, about twice what a 70B on H100s (data parallel, 4096 tokens a micro-batch) loses.
    big = slowdown("dgx-h100", "llama3-70b", seq=4096, dp=8, zero=3, global_batch=64)
    assert big < 0.12
    assert slowdown("rtx4090-8", "gpt2-small", micro_batch=8, global_batch=64) > max(0.25, 2 * big)
    assert slowdown("dgx-b200", "gpt2-small", micro_batch=8, global_batch=64) > max(0.25, 2 * big)


def test_memory_bound_work_streams_at_the_achieved_bandwidth():
    hw = hardware.resolve(system="dgx-a100")
    shape = catalog.model_shape("llama3-8b")
    achieved = perf.compute_terms(shape, hw, **_terms_kw())
    datasheet = perf.compute_terms(shape, dataclasses.replace(hw, mem_bw_fraction=1.0), **_terms_kw())
    assert float(achieved["elementwise_s"]) == pytest.approx(float(datasheet["elementwise_s"]) * 2.039 / 1.70)


def test_compute_terms_stays_vectorised():
    shape = catalog.model_shape("mixtral-8x7b")
    hw = hardware.resolve(system="dgx-h100")
    tp, dp, ep = np.array([1, 2, 4, 8]), np.array([8, 4, 2, 1]), np.array([8, 4, 2, 1])
    kw = dict(seq=4096, global_batch=64, micro_batch=np.array([1, 2, 1, 4]), pp=1, recompute=np.array([0, 2, 3, 4]))
    vec = perf.compute_terms(shape, hw, tp=tp, dp=dp, ep=ep, **kw)
    for i in range(4):
        one = perf.compute_terms(shape, hw, tp=int(tp[i]), dp=int(dp[i]), ep=int(ep[i]), seq=4096, global_batch=64,
                                 micro_batch=int(kw["micro_batch"][i]), pp=1, recompute=int(kw["recompute"][i]))
        for k in ("blocks_s", "linear_s", "gemm_shape_s", "expert_gemm_s", "elementwise_s", "head_s"):
            assert float(np.asarray(vec[k])[i]) == pytest.approx(float(one[k])), k
