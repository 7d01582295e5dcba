"""Hardware profiles: how measured figures become the planner's inputs."""

import json

import pytest

from mgbench.errors import MgbenchError
from mgbench.probe import profile as P


def make_profile(device="cpu", cores=2, comm=True, **over):
    """A profile as `mgbench probe` writes it, with round figures for hand calculation."""
    prof = {
        "profile_version": 1, "hostname": "box", "device": device, "device_name": "cpu", "accelerator": None,
        "num_devices": 1, "cores": cores, "host_memory_bytes": 16e9, "probe_s": 10.0,
        "gemm": [{"dtype": "float32", "threads": 1, "typical_tflops": 0.1, "best_tflops": 0.2, "shapes": []},
                 {"dtype": "float32", "threads": cores, "typical_tflops": 0.16, "best_tflops": 0.3, "shapes": []}],
        "attention": [], "memory": {"bytes_per_s": 15e9, "median_bytes_per_s": 12e9},
        "comm": {"nproc": 2, "dtype": "float32",
                 "all_reduce": {"alpha_s": 400e-6, "bw_gbps": 2.0, "fit_mean_abs_error_pct": 5.0}}
        if comm else {"null_reason": "skipped (--no-comm)"},
    }
    prof.update(over)
    return prof


def test_one_cpu_rank_gets_every_core():
    hw = P.hardware(make_profile(), "fp32", ranks=1)
    # peak = the fastest GEMM at the rank's thread count (2); efficiency = typical / that
    assert hw.peak_tflops * hw.compute_eff == pytest.approx(0.16)
    assert hw.mem_bw == pytest.approx(12e9)


def test_cpu_ranks_share_the_cores():
    # 2 ranks on 2 cores: 1 thread each, the full 1-thread speed (0.1 TFLOP/s) each
    hw2 = P.hardware(make_profile(), "fp32", ranks=2)
    assert hw2.peak_tflops * hw2.compute_eff == pytest.approx(0.1)
    # 4 ranks on 2 cores: 1 thread each, time-shared: half of it
    hw4 = P.hardware(make_profile(), "fp32", ranks=4)
    assert hw4.peak_tflops * hw4.compute_eff == pytest.approx(0.05)
    assert hw4.mem_bw == pytest.approx(3e9)  # the host's bandwidth over 4 ranks
    assert P.rank_share(make_profile(cores=16), 4) == (4, 1.0)


def test_a_thread_count_never_probed_is_unknown_not_its_neighbours_speed():
    with pytest.raises(MgbenchError, match="no float32 GEMMs at 4 thread"):
        P.hardware(make_profile(cores=16), "fp32", ranks=4)  # probed at 1 and 16 threads only


def test_allreduce_fit_becomes_ring_step_latency_and_bus_bandwidth():
    link = P.comm_link(make_profile(), ranks=2)
    # n = 2: alpha / (2 (n - 1)) per ring step; busbw = algbw x 2 (n - 1) / n
    assert link["alpha_s"] == pytest.approx(200e-6)
    assert link["bw"] == pytest.approx(2.0e9)


def test_multi_rank_prediction_without_a_collective_fit_is_refused():
    with pytest.raises(MgbenchError, match="no collective fit"):
        P.hardware(make_profile(comm=False), "fp32", ranks=2)
    P.hardware(make_profile(comm=False), "fp32", ranks=1)  # one rank prices no collective


def test_missing_dtype_names_what_the_profile_has():
    with pytest.raises(MgbenchError, match="no bfloat16 GEMMs.*float32"):
        P.hardware(make_profile(), "bf16", ranks=1)


def test_catalog_gpu_keeps_the_catalog_peak_for_mfu():
    prof = make_profile(device="cuda", device_name="NVIDIA H100 80GB HBM3", accelerator="h100-sxm",
                        device_memory_bytes=80e9,
                        gemm=[{"dtype": "bfloat16", "threads": 1, "typical_tflops": 600.0, "best_tflops": 750.0,
                               "shapes": []}])
    hw = P.hardware(prof, "bf16", ranks=1)
    assert hw.peak_tflops == 989.0  # catalog dense bf16 peak, so MFU means what it usually means
    assert hw.compute_eff == pytest.approx(600.0 / 989.0)


def test_read_profile_errors_are_one_clear_line(tmp_path):
    with pytest.raises(MgbenchError, match="no such file.*mgbench probe"):
        P.read_profile(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MgbenchError, match="not a JSON profile"):
        P.read_profile(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(MgbenchError, match="not an mgbench hardware profile"):
        P.read_profile(other)
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(make_profile(profile_version=99)))
    with pytest.raises(MgbenchError, match="newer"):
        P.read_profile(newer)


def test_cpu_ranks_that_fill_the_cores_hide_no_communication():
    assert P.overlap(make_profile(), ranks=2, default=1.0) == 0.0  # 2 ranks x 1 thread on 2 cores
    assert P.overlap(make_profile(), ranks=1, default=1.0) == 1.0  # nothing to hide
    assert P.overlap(make_profile(cores=16), ranks=2, default=1.0) == 0.0  # 2 x 8 threads fill 16 cores
    assert P.overlap(make_profile(device="cuda"), ranks=8, default=1.0) == 1.0


def test_memory_budget_is_device_memory_or_a_share_of_host_ram():
    assert P.memory_budget(make_profile(), 4)["device_memory_bytes"] == pytest.approx(4e9)  # 16 GB over 4 ranks
    gpu = make_profile(device="cuda", device_name="H100", device_memory_bytes=80e9)
    assert P.memory_budget(gpu, 8)["device_memory_bytes"] == 80e9  # one device per rank
    unknown = P.memory_budget(make_profile(host_memory_bytes=None), 1)
    assert unknown["device_memory_bytes"] is None and "unknown" in unknown["budget_source"]


def test_probe_writes_the_catalogs_profile_type():
    from mgbench.hardware_profile import HardwareProfile

    # A CPU host: no datasheet peak, so the fastest probed GEMM stands as the peak.
    hp = P.hardware_profile(make_profile())
    assert hp.evidence == "measured" and hp.gemm_best.kind == "measured"
    assert hp.gemm_best.value == pytest.approx(1.0) and hp.gemm_layer.value == pytest.approx(0.16 / 0.3)
    assert hp.mem_bw.value == pytest.approx(12e9 / 1e12)
    # all_reduce fit on 2 ranks: busbw = algbw x 2 (n - 1) / n = 2 GB/s
    (c,) = hp.collectives
    assert (c.gpus, c.scope, c.busbw.value) == (2, "intra", pytest.approx(2.0))
    assert hp.gemm_fixed.value is None and "own GEMM shapes" in hp.gemm_fixed.reason
    assert HardwareProfile.from_dict(hp.to_dict()) == hp
    # A catalog GPU: fractions of its datasheet peak.
    gpu = make_profile(device="cuda", device_name="NVIDIA H100 80GB HBM3", accelerator="h100-sxm",
                       gemm=[{"dtype": "bfloat16", "threads": 1, "typical_tflops": 600.0, "best_tflops": 700.0,
                              "shapes": []}],
                       attention=[{"dtype": "bfloat16", "typical_tflops": 300.0, "shapes": []}],
                       copies={"copy_h2d_pinned": 50.0})
    hp = P.hardware_profile(gpu)
    # attention: the probe's 300 TFLOP/s count 3 forward passes; the fraction counts 3.5
    assert hp.gemm_best.value == pytest.approx(700 / 989) and hp.attention.value == pytest.approx(300 * 3.5 / 3 / 989)
    assert hp.peaks["bf16"].kind == "datasheet" and hp.host_link.value == 50.0


def test_a_profile_with_a_broken_typed_profile_is_refused(tmp_path):
    prof = make_profile()
    old = tmp_path / "old.json"
    old.write_text(json.dumps(prof))
    assert P.read_profile(old) == prof  # written before the typed profile: still read
    good = tmp_path / "good.json"
    good.write_text(json.dumps({**prof, "hardware_profile": P.hardware_profile(prof).to_dict()}))
    P.read_profile(good)
    bad = P.hardware_profile(prof).to_dict()
    bad["gemm_best"] = {**bad["gemm_best"], "source": None, "kind": "measured"}
    bad["gemm_best"].pop("source")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**prof, "hardware_profile": bad}))
    with pytest.raises(MgbenchError, match="hardware_profile is not valid.*needs a source"):
        P.read_profile(broken)


def test_probed_hardware_is_measured_and_priced_at_its_own_shapes():
    hw = P.hardware(make_profile(), "fp32", ranks=1)
    assert hw.evidence == "measured" and hw.gemm_shapes is False and hw.mem_bw_fraction == 1.0


def test_a_probed_gpu_without_a_sourced_tdp_has_unknown_power_not_a_crash():
    # H800: the catalog publishes no TDP for it (hardware.toml leaves the key out), so the
    # probed Hardware says NaN (unknown), as resolve does; an H100 keeps its 700 W.
    import math

    def probed(name, acc):
        return P.hardware(make_profile(device="cuda", device_name=name, accelerator=acc, device_memory_bytes=80e9,
                                       gemm=[{"dtype": "bfloat16", "threads": 1, "typical_tflops": 600.0,
                                              "best_tflops": 750.0, "shapes": []}]), "bf16", ranks=1)
    assert math.isnan(probed("NVIDIA H800", "h800").tdp_w)
    assert probed("NVIDIA H100 80GB HBM3", "h100-sxm").tdp_w == 700.0


def _probed_h100(**over):
    figures = {"device_memory_bytes": 80e9, "memory": {"bytes_per_s": 3.0e12, "median_bytes_per_s": 2.8e12},
               "gemm": [{"dtype": "bfloat16", "threads": 1, "typical_tflops": 600.0, "best_tflops": 700.0,
                         "shapes": []}],
               "attention": [{"dtype": "bfloat16", "typical_tflops": 330.0, "shapes": []}]}
    ident = {"device_name": "NVIDIA H100 80GB HBM3", "accelerator": "h100-sxm"}
    return make_profile(device="cuda", **{**ident, **figures, **over})


def test_a_probed_gpu_is_priced_from_its_typed_profile():
    # What `plan --hardware` / `predict --hardware` price a GPU machine with: the typed
    # profile's figures, by hand: matmuls 600 / 989, attention 330 x 3.5 / 3 / 989, 2.8 TB/s.
    hw = P.hardware(_probed_h100(), "bf16", ranks=1)
    assert hw.peak_tflops == 989.0 and hw.compute_eff == pytest.approx(600 / 989)
    assert hw.attn_eff == pytest.approx(330 * 3.5 / 3 / 989)  # the probed kernel (in FlashAttention's FLOPs)
    assert hw.mem_bw == pytest.approx(2.8e12) and hw.mem_bw_fraction == 1.0
    assert hw.evidence == "measured" and "attention measured" in hw.evidence_detail
    # 2 devices: the all-reduce fit on 2 ranks (alpha 400 us, algbw 2 GB/s) gives the links
    hw2 = P.hardware(_probed_h100(), "bf16", ranks=2)
    assert hw2.intra_alpha_s == pytest.approx(200e-6) and hw2.intra_bw == pytest.approx(2.0e9)


def test_a_probed_gpu_without_attention_prices_it_as_gemms():
    hw = P.hardware(_probed_h100(attention=[]), "bf16", ranks=1)
    assert hw.attn_eff is None and "attention measured (none: priced as GEMMs)" in hw.evidence_detail


def test_a_probed_gpu_at_another_probed_precision_uses_that_dtype():
    gemm = [{"dtype": "bfloat16", "threads": 1, "typical_tflops": 600.0, "best_tflops": 700.0, "shapes": []},
            {"dtype": "float32", "threads": 1, "typical_tflops": 50.0, "best_tflops": 60.0, "shapes": []}]
    hw = P.hardware(_probed_h100(gemm=gemm), "fp32", ranks=1)
    fp32_peak = 67.0  # hardware.toml h100-sxm fp32
    assert hw.peak_tflops == fp32_peak and hw.compute_eff == pytest.approx(50 / fp32_peak)
    assert hw.attn_eff is None  # attention was probed in bf16 only
    with pytest.raises(MgbenchError, match="no float16 GEMMs"):
        P.hardware(_probed_h100(gemm=gemm), "fp16", ranks=1)


def test_a_probed_catalog_gpu_without_a_datasheet_peak_at_the_precision_stands_on_its_fastest_gemm():
    # hardware.toml has no bf16 peak for the RTX PRO 6000 (its source publishes none): the
    # probed best GEMM (700) is the peak, and the layer GEMMs (600) are 600 / 700 of it.
    prof = _probed_h100(accelerator="rtx-pro-6000", device_name="NVIDIA RTX PRO 6000 Blackwell")
    assert P.catalog.accelerator_peak("rtx-pro-6000", "bf16") is None
    hw = P.hardware(prof, "bf16", ranks=1)
    assert hw.peak_tflops == 700.0 and hw.compute_eff == pytest.approx(600 / 700)
    assert P.hardware_profile(prof).peaks["bf16"].kind == "measured"


def test_a_probed_gpu_without_a_memory_bandwidth_is_refused_in_one_line():
    with pytest.raises(MgbenchError, match="no memory bandwidth"):
        P.hardware(_probed_h100(memory={}), "bf16", ranks=1)
