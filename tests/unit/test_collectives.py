"""The collective registry (one entry per collective) and the comm row reader."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mgbench import collectives, store
from mgbench.record import COMM_ROW_VERSION
from mgbench.store import load_comm_fits as load_fits, load_comm_rows as load_rows
from mgbench.errors import MgbenchError
from mgbench.store import RunDir

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "v1-comm"

# nccl-tests doc/PERFORMANCE.md, worked out by hand: all_reduce 2(n-1)/n; all_gather,
# reduce_scatter, all_to_all (n-1)/n; broadcast and sendrecv 1.
BY_HAND = {
    "all_reduce": {2: 1.0, 4: 1.5, 8: 1.75},
    "all_gather": {2: 0.5, 4: 0.75, 8: 0.875},
    "reduce_scatter": {2: 0.5, 4: 0.75, 8: 0.875},
    "all_to_all": {2: 0.5, 4: 0.75, 8: 0.875},
    "broadcast": {2: 1.0, 4: 1.0, 8: 1.0},
    "sendrecv": {2: 1.0, 4: 1.0, 8: 1.0},
}


def test_every_entry_has_its_bus_bandwidth_factor_worked_by_hand():
    # A new registry entry fails here until its factor is written down above.
    assert set(collectives.NAMES) == set(BY_HAND)
    for name, by_n in BY_HAND.items():
        for n, factor in by_n.items():
            assert collectives.REGISTRY[name].busbw(n) == factor, (name, n)
            assert collectives.busbw_factor(name, n) == factor


def test_unknown_collective_names_the_known_ones():
    with pytest.raises(MgbenchError, match="all_reduce"):
        collectives.get("all_reduce_typo")


@pytest.mark.parametrize("name,chunk,send,recv,size", [
    # 64 KiB nominal of float32 on 4 ranks: 16384 elements, or 4096 per rank where S is split
    ("all_reduce", 16384, 16384, 16384, 65536), ("broadcast", 16384, 16384, 16384, 65536),
    ("sendrecv", 16384, 16384, 16384, 65536), ("all_gather", 4096, 4096, 16384, 65536),
    ("reduce_scatter", 4096, 16384, 4096, 65536), ("all_to_all", 4096, 16384, 16384, 65536),
])
def test_layout_is_nccl_tests_size_rule(name, chunk, send, recv, size):
    assert tuple(collectives.get(name).layout(65536, 4, 4)) == (chunk, send, recv, size)


def test_split_sizes_round_down_to_whole_chunks():
    # 4100 B of float32 = 1025 elements: 256 per rank on 4 ranks, so S = 4096 B
    assert collectives.get("all_gather").layout(4100, 4, 4).size_bytes == 4096


# What each collective does, written out with plain tensor ops for n simulated ranks:
# send buffers in, every rank's result out.
SIMULATE = {
    "all_reduce": lambda sends, n, c: [sum(sends)] * n,
    "all_gather": lambda sends, n, c: [_torch().cat(sends)] * n,
    "reduce_scatter": lambda sends, n, c: [sum(sends)[r * c:(r + 1) * c] for r in range(n)],
    "all_to_all": lambda sends, n, c: [_torch().cat([s[r * c:(r + 1) * c] for s in sends]) for r in range(n)],
    "broadcast": lambda sends, n, c: [sends[0]] * n,
    "sendrecv": lambda sends, n, c: [sends[(r - 1) % n] for r in range(n)],
}


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(BY_HAND))
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_fills_and_expected_results_agree_and_a_wrong_element_is_counted(name, n):
    torch = _torch()
    assert set(SIMULATE) == set(collectives.NAMES)
    coll = collectives.get(name)
    lay = coll.layout(8 * 4 * n, 4, n)
    sends = []
    for r in range(n):
        t = torch.empty(lay.send, dtype=torch.float32)
        coll.fill(t, r, n, lay.chunk)
        sends.append(t)
    for r, out in enumerate(SIMULATE[name](sends, n, lay.chunk)):
        assert out.numel() == lay.recv
        exp = coll.expected(out, r, n, lay.chunk)
        assert int((out != exp).sum()) == 0, (name, n, r)
        bad = out.clone()
        bad[-1] += 1  # negative control: one corrupted element is one #wrong
        assert int((bad != exp).sum()) == 1


def test_registry_is_torch_free_at_import():
    code = "import sys, mgbench.collectives, mgbench.planner.calibrate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_committed_v1_comm_run_loads(tmp_path):
    rows = load_rows(FIXTURE)
    assert len(rows) == json.loads((FIXTURE / "manifest.json").read_text())["counts"]["rows"] == 10
    assert {r["collective"] for r in rows} == {"all_reduce", "all_gather"}
    assert all(r["schema_version"] == COMM_ROW_VERSION and r["wrong"] == 0 for r in rows)
    for r in rows:
        assert r["busbw_factor"] == collectives.busbw_factor(r["collective"], r["nproc"])
    fits = load_fits(RunDir(FIXTURE))
    assert set(fits) == {"all_reduce:float32:all", "all_gather:float32:all"}


def test_rows_before_versioning_load_as_current(tmp_path):
    run = RunDir(tmp_path)
    lines = (FIXTURE / "comm.jsonl").read_text().splitlines()
    old = [{k: v for k, v in json.loads(line).items() if k != "schema_version"} for line in lines]
    run.comm_rows.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert load_rows(run) == load_rows(FIXTURE)


def test_rows_from_a_newer_mgbench_are_refused(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    store.append_comm_row(run, {"collective": "all_reduce"})  # stamped with today's version: fine
    assert load_rows(run)[-1]["schema_version"] == COMM_ROW_VERSION
    with open(run.comm_rows, "a") as f:
        f.write(json.dumps({"schema_version": 999, "collective": "all_reduce"}) + "\n")
    with pytest.raises(MgbenchError, match=rf"written by a newer mgbench \(row schema 999 > {COMM_ROW_VERSION}\); upgrade mgbench"):
        load_rows(run)


def test_a_corrupt_row_names_its_line(tmp_path):
    run = RunDir(tmp_path)
    run.comm_rows.write_text('{"collective": "all_reduce"}\n{"collective": \n')
    with pytest.raises(MgbenchError, match=r"comm\.jsonl:2: corrupt comm row"):
        load_rows(run)


def test_a_run_without_comm_files_has_no_rows_or_fits(tmp_path):
    assert load_rows(tmp_path) == [] and load_fits(tmp_path) == {}
