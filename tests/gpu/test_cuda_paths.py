"""The GPU paths that no CPU test can reach, end to end through the real commands on one
rank (issue 15, "Also"): a 1-rank NCCL run through `mgbench run` with the correctness
check, CUDA memory peaks, NVML energy and a non-null MFU; a 1-rank `mgbench comm` (copy
bandwidths); and `python -m mgbench.selftest`. Skipped without CUDA (see conftest.py)."""

import json
import subprocess
import sys

import pytest

from mgbench import catalog, store
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.gpu

SUITE = """name = "gpu-one-rank"
[sweep]
model = "mini"
strategy = ["single", "ddp", "fsdp"]
nproc = 1
precision = ["bf16", "fp16"]
seq_len = 256
micro_batch = 4
warmup_steps = 3
measured_steps = 10
check_steps = 3
timeout_s = 300
"""


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("gpu-run")
    (cwd / "g.toml").write_text(SUITE)
    p = run_cli("run", "g.toml", "--device", "cuda", "--run-id", "g1", "--no-report", "--no-projection", cwd=cwd,
                timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return store.latest_records(store.read_records(cwd / "results" / "g1"))


def test_one_rank_nccl_run_trains_correctly(one_rank_run):
    assert len(one_rank_run) == 6
    for r in one_rank_run:
        assert r["status"] == "ok", (r["label"], r.get("error"))
        assert r["backend"] == "nccl" and r["correct"] is True, (r["label"], r.get("correct_reason"))
        assert r["mem_method"].startswith("cuda") and r["mem_peak_gib"] > 0


def test_energy_comes_from_nvml_over_a_long_enough_window(one_rank_run):
    for r in one_rank_run:
        assert r["energy_method"] in ("nvml_counter", "nvml_power_sampling"), r["energy_reason"]
        assert r["energy_j"] > 0 and r["energy_per_token_j"] > 0 and r["power_w"] > 0
        assert r["energy_window_s"] >= (r.get("energy_min_window_s") or 0) * 0.99


def test_mfu_is_known_for_a_catalog_gpu(one_rank_run):
    import torch

    name = torch.cuda.get_device_name(0)
    memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if catalog.match_accelerator(name, memory_gib) is None:
        pytest.skip(f"{name!r} ({memory_gib:.0f} GiB) is not in mgbench/data/hardware.toml: MFU is null by design")
    for r in one_rank_run:
        assert r["device_name"] == name
        assert 0 < r["mfu_pct"] < 100 and r["mfu_peak_precision"] == r["precision"], r["mfu_reason"]
        assert r["tf32_matmul"] in (True, False) and r["fp32_matmul_setting"]


def test_one_rank_comm_measures_copy_bandwidth(tmp_path):
    p = run_cli("comm", "--device", "cuda", "--nproc", "1", "--json", "--max-bytes", str(64 * 2**20), cwd=tmp_path,
                timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)["rows"]
    copies = {r["collective"] for r in rows if r.get("kind") == "copy"}
    assert {"copy_d2d", "copy_h2d_pinned", "copy_h2d_pageable", "copy_d2h_pinned", "copy_d2h_pageable"} <= copies
    assert all(r["algbw_gbps"] > 0 and r["wrong"] == 0 for r in rows if r.get("kind") == "copy")


@pytest.mark.slow
def test_selftest_passes_on_this_gpu(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mgbench.selftest"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=900, env={"PYTHONPATH": str(REPO), **__import__("os").environ})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    for what in ("MFU", "mJ/token", "`mgbench memory` models", "`mgbench predict`", "copy bandwidth"):
        assert what in p.stdout
