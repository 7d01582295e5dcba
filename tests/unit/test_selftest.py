"""`python -m mgbench.selftest` (issue 15, Acceptance): without CUDA it says so in one line
and exits 2; what it prints per config and for comm, from records built through the
schema; and its CPU variant end to end (slow: two torchrun launches and a comm sweep)."""

import subprocess
import sys

import pytest

from mgbench import selftest
from tests.conftest import REPO
from tests.factories import make_config, make_record

GPU = "NVIDIA H100 80GB HBM3"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="a CUDA device is visible: the selftest would run (tests/gpu covers it)")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mgbench.selftest"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={"PYTHONPATH": str(REPO), **__import__("os").environ})
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == selftest.NO_CUDA and "\n" not in p.stderr.strip()
    assert not (tmp_path / "results").exists()  # nothing run, nothing written


def gpu_record(**figures):
    cfg = make_config(model="gpt2-small", strategy="single", precision="bf16", seq_len=1024, micro_batch=8,
                      device="cuda")
    base = dict(step_time_s=0.05, device_name=GPU, device_memory_gib=79.6, correct=True, mfu_pct=40.0,
                peak_tflops=989.0, mfu_peak_precision="bf16", tf32_matmul=False, energy_per_token_j=2e-3,
                energy_window_s=5.2, num_energy_steps=104, energy_method="nvml_counter",
                energy_update_interval_s=0.1, mem_peak_gib=6.0, mem_method="cuda_max_allocated",
                mem_tracked_peak_bytes=int(5.5 * 2**30))
    base.update(figures)
    return make_record(cfg, **base).to_dict()


def test_a_gpu_record_prints_mfu_energy_memory_and_prediction():
    lines = "\n".join(selftest.config_lines(gpu_record()))
    assert "matches the single-process reference" in lines
    assert "MFU 40.0% of 989 TFLOPS (bf16 peak; TF32 matmuls off)" in lines
    assert "energy 2.000 mJ/token over a 5.2 s window (104 steps, nvml_counter, counter updates every 100 ms)" in lines
    assert "memory peak 6.00 GiB (cuda_max_allocated), tracked tensors 5.50 GiB; `mgbench memory` models" in lines
    assert "measured / model" in lines
    assert "`mgbench predict`: " in lines and "(h100-sxm, dgx-h100); measured / predicted" in lines


def test_nulls_are_printed_with_their_reasons():
    rec = gpu_record(mfu_pct=None, mfu_reason="no peak", energy_per_token_j=None, energy_reason="no NVML",
                     correct=False, correct_reason="loss differs", device_name="NVIDIA Future GPU")
    lines = "\n".join(selftest.config_lines(rec))
    assert "DIFFERS: loss differs" in lines and "MFU - (no peak)" in lines and "energy - (no NVML)" in lines
    assert "`mgbench predict`: - (no catalog entry for 'NVIDIA Future GPU')" in lines


def test_verdict_fails_on_a_wrong_or_failed_config_and_names_it():
    ok = gpu_record()
    skipped = make_record(make_config(strategy="tp", nproc=2, model="tiny", device="cuda"), status="skipped",
                          skip_reason="needs 2 ranks but only 1 GPUs").to_dict()
    assert selftest.verdict([ok, skipped], True) == (
        0, "selftest passed: 1 configs ok and matching their references, comm complete (1 skipped: they need more GPUs)")
    bad = gpu_record(correct=False)
    status, line = selftest.verdict([ok, bad], True)
    assert status == 1 and bad["label"] in line
    assert selftest.verdict([ok], False)[0] == 1
    assert selftest.verdict([skipped], True)[0] == 1  # nothing ran is not a pass


def test_a_negative_control_passes_when_caught_and_fails_when_missed():
    cfg = make_config(strategy="ddp", nproc=2, model="tiny", device="cuda", inject="bug:grad_sum")
    caught = make_record(cfg, status="checked", correct=False, check_mismatches=["grad_norm"]).to_dict()
    missed = make_record(cfg, status="checked", correct=True, check_mismatches=[]).to_dict()
    ok = gpu_record()
    assert selftest.verdict([ok, caught], True)[0] == 0
    status, line = selftest.verdict([ok, missed], True)
    assert status == 1 and missed["label"] in line
    assert selftest.config_lines(caught) == [f"{caught['label']}: checked: negative control bug:grad_sum caught: "
                                             "grad_norm differ from the reference"]
    assert "NOT CAUGHT" in selftest.config_lines(missed)[0]


@pytest.mark.extended  # its configs and comm run are covered one by one in CI
def test_cpu_variant_runs_the_whole_flow(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mgbench.selftest", "--device", "cpu"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), **__import__("os").environ})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    out = p.stdout
    assert "selftest passed: 3 configs ok" in out
    assert "pp n=2 [dp=1 tp=1 pp=2] 1f1b tiny mb=2 s=32 ga=2 fp16: ok, matches the single-process reference" in out
    for what in ("MFU - (no peak FLOPS", "energy ", "`mgbench memory` models", "`mgbench predict`: - (",
                 "copy bandwidth: - (copy bandwidth needs a GPU", "all_reduce float32:"):
        assert what in out, what


def test_a_wrong_comm_result_fails_the_selftest(tmp_path):
    from mgbench.store import RunDir, append_comm_row

    rd = RunDir.create(tmp_path, "c")
    row = {"collective": "all_reduce", "kind": "collective", "size_bytes": 1024, "count": 256, "dtype": "float32",
           "nproc": 2, "time_s": 1e-4, "algbw_gbps": 1.0, "busbw_gbps": 1.0, "busbw_factor": 1.0, "wrong": 0}
    append_comm_row(rd, row)
    assert selftest.comm_correct(rd.path)
    append_comm_row(rd, {**row, "size_bytes": 2048, "wrong": 1})  # one wrong element
    assert not selftest.comm_correct(rd.path)
