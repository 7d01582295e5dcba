import dataclasses

import pytest

from mgbench import catalog
from mgbench.planner import hardware, perf, validation
from mgbench.planner.predict import Layout, predict


def test_ring_all_reduce_alpha_beta_by_hand():
    # 8 ranks, 1 GB, 100 GB/s, 2 us per step: 2*7*2us + 2*7/8 * 1e9/1e11
    t = perf.ring_time(1e9, 8, 100e9, 2e-6, 2.0)
    assert float(t) == pytest.approx(14 * 2e-6 + 1.75 * 0.01)
    assert float(perf.ring_time(1e9, 1, 100e9, 2e-6, 2.0)) == 0.0


def test_link_efficiencies_come_from_reference_measurements():
    links = hardware.links()
    assert links["nvlink4"]["peak_gbps"] * links["nvlink4"]["bw_eff"] == pytest.approx(369, abs=1)
    assert links["nvlink3"]["peak_gbps"] * links["nvlink3"]["bw_eff"] == pytest.approx(231, abs=1)


def test_hardware_flops_with_recompute():
    shape = catalog.model_shape("gpt2-small")
    model = shape.flops_per_token(1024)
    assert float(perf.hardware_flops_per_token(shape, 1024, 0)) == model
    assert float(perf.hardware_flops_per_token(shape, 1024, 2)) == pytest.approx(model * 4 / 3)
    # every_2nd: the forward of 6 of the 12 blocks again (2 FLOPs a weight, 4 L h s of attention).
    blocks_fwd = 2 * shape.layers * shape.params_per_layer() + 4 * shape.layers * shape.attn_dim * 1024
    assert float(perf.hardware_flops_per_token(shape, 1024, 1)) == pytest.approx(model + blocks_fwd / 2)


def test_pipeline_bubble_is_p_minus_1_over_m():
    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-h100")
    out = perf.step_time(shape, hw, seq=4096, global_batch=64, micro_batch=1, tp=1, pp=4, dp=2, zero=1, recompute=2)
    b = out["breakdown"]
    m = 64 / 2
    assert float(b["bubble_s"]) == pytest.approx(float(b["compute_s"]) * 3 / m)
    inter = perf.step_time(shape, hw, seq=4096, global_batch=64, micro_batch=1, tp=1, pp=4, dp=2, zero=1,
                           recompute=2, schedule="interleaved", virtual_stages=2)
    assert float(inter["breakdown"]["bubble_s"]) == pytest.approx(float(b["bubble_s"]) / 2)


def test_more_bandwidth_never_hurts_and_compute_scales_with_peak():
    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-h100")
    kw = dict(seq=4096, global_batch=256, micro_batch=1, tp=8, pp=1, dp=8, zero=1, recompute=0)
    base = perf.step_time(shape, hw, **kw)
    fast = perf.step_time(shape, dataclasses.replace(hw, inter_bw=hw.inter_bw * 10, intra_bw=hw.intra_bw * 10), **kw)
    assert float(fast["step_time_s"]) < float(base["step_time_s"])
    double = perf.step_time(shape, dataclasses.replace(hw, peak_tflops=hw.peak_tflops * 2), **kw)
    assert float(double["breakdown"]["matmul_s"]) == pytest.approx(float(base["breakdown"]["matmul_s"]) / 2)


def test_predictions_match_published_megatron_runs_within_15_percent():
    rows, mae = validation.error_table()
    scored = [r for r in rows if r["role"] == "validation"]
    assert len(scored) == 8
    assert mae < 15.0, rows
    assert all(abs(r["error_pct"]) < 15.0 for r in scored)


def test_stored_defaults_are_the_solved_ones():
    mm, passes = validation.solve_defaults()
    d = hardware.planner_defaults()
    assert d["matmul_eff"] == pytest.approx(mm, abs=0.001)
    assert d["elementwise_passes"] == pytest.approx(passes, abs=0.01)


def test_predict_reports_fit_and_breakdown():
    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-h100")
    res = predict(shape, hw, Layout(num_gpus=8, zero=3, micro_batch=1, seq_len=8192, recompute="full"))
    for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
              "hardware_tflops_per_gpu", "mfu", "memory", "fits", "breakdown"):
        assert k in res
    assert res["fits"] is True
    assert res["tokens_per_s_per_gpu"] == pytest.approx(res["tokens_per_s"] / 8)
    assert res["mfu"] == pytest.approx(res["model_tflops_per_gpu"] / 989.0)
    assert res["hardware_tflops_per_gpu"] > res["model_tflops_per_gpu"]  # recompute counts in HFU only
