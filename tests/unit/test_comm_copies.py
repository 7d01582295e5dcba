"""`mgbench comm` on one GPU: the rank count defaults to the devices present, a single
rank measures copy bandwidth instead of collectives that move nothing, and CPU ranks say
copies are not applicable."""

import json

import pytest
import torch

from mgbench import store
from mgbench.comm import copies
from mgbench.comm.fit import fit
from mgbench.comm.run import default_nproc, render
from mgbench.comm.worker import applies
from mgbench.store import RunDir


def test_default_rank_count_is_the_devices_present():
    """The default was --nproc 2 everywhere: an error on a one-GPU machine."""
    assert default_nproc("cuda", 1) == 1
    assert default_nproc("cuda", 8) == 8
    assert default_nproc("cpu", 4) == 2


def test_one_rank_measures_no_collective():
    """On one rank every collective's busbw read 0 (2(n-1)/n = 0): not measured at all now."""
    assert not any(applies(name, 1) for name in ("all_reduce", "all_gather", "broadcast", "sendrecv"))
    assert applies("all_reduce", 2)


def test_one_cpu_rank_is_refused_with_the_fix(cli):
    p = cli("comm", "--nproc", "1")
    assert p.returncode == 2
    assert "--nproc 1: on CPU, collectives need 2 or more ranks and copy bandwidth needs a GPU" in p.stderr
    assert "Traceback" not in p.stderr


def test_copy_rows_arithmetic():
    r = copies.row("copy_h2d_pinned", 2**30, [0.02, 0.021, 0.019], 0)
    assert r["time_s"] == 0.02 and r["algbw_gbps"] == pytest.approx(2**30 / 0.02 / 1e9)
    assert r["busbw_gbps"] == r["algbw_gbps"] and r["busbw_factor"] == 1.0 and r["nproc"] == 1
    assert r["kind"] == "copy" and r["pinned"] and r["direction"] == "cpu->cuda"
    assert set(copies.COPIES) == {"copy_d2d", "copy_h2d_pinned", "copy_h2d_pageable", "copy_d2h_pinned",
                                  "copy_d2h_pageable"}


def one_gpu_run(root, rows):
    """A comm run folder as a one-GPU `mgbench comm` leaves it."""
    run = RunDir.create(root, "g1")
    store.write_json_atomic(run.manifest, {
        "run_id": "g1", "kind": "comm", "machine": {},
        "interconnect": {"summary": "1 GPU(s); no active NVLink; PCIe gen5 x16 (now gen1 x16: idle links train down)",
                         "gpus": [{"index": 0, "name": "NVIDIA H100 PCIe", "pcie_gen": 1, "pcie_width": 16,
                                   "pcie_gen_max": 5, "pcie_width_max": 16, "nvlinks_active": 0}]},
        "comm": {"nproc": 1, "device": "cuda", "collectives": [], "copies": list(copies.COPIES),
                 "collectives_reason": "one rank: a collective moves nothing between devices"}})
    for r in rows:
        store.append_comm_row(run, r)
    keys = sorted({(r["collective"], r["dtype"], r["scope"]) for r in rows})
    store.write_json_atomic(run.comm_fit, {":".join(k): fit([r for r in rows if (r["collective"], r["dtype"],
                                                                                  r["scope"]) == k]) for k in keys})
    return run


def test_one_gpu_table_shows_copies_against_pcie_and_why_no_collectives(tmp_path):
    sizes = [2**20, 2**24, 2**28]
    rows = [copies.row(name, s, [5e-6 + s / bw] * 3, 0)
            for name, bw in (("copy_h2d_pinned", 50e9), ("copy_d2d", 1300e9)) for s in sizes]
    one_gpu_run(tmp_path, rows)
    table = render(tmp_path / "g1")
    assert "collectives: none measured (one rank" in table
    assert "copy bandwidth (rank 0's GPU" in table and "63.0 GB/s" in table
    h2d = [line for line in table.splitlines() if line.startswith("copy_h2d_pinned") and str(2**28) in line][0]
    assert f"{100 * (2**28 / (5e-6 + 2**28 / 50e9) / 1e9) / 63.0:.1f}" in h2d
    d2d = [line for line in table.splitlines() if line.startswith("copy_d2d") and str(2**28) in line][0]
    assert d2d.split()[-1] == "-"  # device memory, not the PCIe link
    assert "copy_h2d_pinned: alpha-beta fit" in table
    assert "out of bounds values: 0" in table


def test_comm_rows_of_version_1_are_collectives(tmp_path):
    run = RunDir(tmp_path)
    run.comm_rows.write_text(json.dumps({"schema_version": 1, "collective": "all_reduce"}) + "\n")
    assert store.load_comm_rows(run)[0]["kind"] == "collective"


@pytest.mark.gpu
def test_copies_on_a_real_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: measures host<->device and device<->device copies")
    dev = torch.device("cuda", 0)
    for name in copies.COPIES:
        r = copies.measure(name, 64 * 2**20, dev, warmup=2, iters=5)
        assert r["wrong"] == 0 and r["algbw_gbps"] > 1.0, r
