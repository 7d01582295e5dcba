"""Two torchrun agents on localhost acting as two nodes; and Slurm, where one runs."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from mgbench import store
from mgbench.store import RunDir
from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_make_one_world_and_one_run_folder(tmp_path):
    port = free_port()
    common = ["-m", "mgbench.cli", "run", "smoke", "--run-id", "mn", "--nnodes", "2", "--rdzv-endpoint",
              f"127.0.0.1:{port}", "--nproc-per-node", "1", "--set", 'strategy=["ddp","fsdp"]', "--set", "nproc=[1,2]",
              "--set", "track_memory=false"]  # one rank per node: the world still spans both (CI time)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    nodes = [subprocess.Popen([sys.executable, *common, "--node-rank", str(r)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [n.communicate(timeout=400)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs
    run = tmp_path / "results" / "mn"
    recs = {(r["strategy"], r["nproc"]): r for r in store.read_records(run)}
    for strat in ("ddp", "fsdp"):
        assert recs[(strat, 2)]["status"] == "ok" and recs[(strat, 2)]["correct"] is True
        assert recs[(strat, 1)]["status"] == "skipped" and "world size 2 (2 nodes x 1)" in recs[(strat, 1)]["skip_reason"]
    m = store.read_manifest(run)
    assert m["cluster"]["world_size"] == 2 and m["status"] == "complete"
    assert sorted(n["node_rank"] for n in m["nodes"]) == [0, 1]
    assert all("interconnect" in n for n in m["nodes"])
    assert "node 1 done; node 0 writes the results" in outs[1]


def test_multi_node_needs_a_shared_run_id(cli):
    p = cli("run", "smoke", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1")
    assert p.returncode == 2 and "same --run-id" in p.stderr


def slurm_ready() -> str | None:
    """None when a Slurm controller answers here; otherwise why not."""
    if not shutil.which("sbatch"):
        return "sbatch not installed (.ci/run installs slurm-wlm and starts a one-node cluster)"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not any(s.startswith("idle") or s.startswith("mix") for s in out.stdout.split()):
        return f"no idle Slurm node: sinfo said {out.stdout.strip() or out.stderr.strip()!r}"
    return None


def test_slurm_submit_runs_a_smoke_suite(cli, tmp_path):
    why = slurm_ready()
    if why is not None:
        if os.environ.get("CI") and os.environ.get("MGBENCH_SLURM_EXPECTED"):
            pytest.fail(f"CI set up Slurm but it is not usable: {why}")
        pytest.skip(why)
    p = cli("slurm", "smoke", "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu", "--run-id", "sl",
            "--set", 'strategy=["ddp"]', "--set", "nproc=2", "--set", "track_memory=false", "--time", "00:10:00", "--submit")
    assert p.returncode == 0, p.stderr
    run = tmp_path / "results" / "sl"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        st = json.loads(cli("status", "sl", "--json").stdout)
        if st["slurm_state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") or st["status"] == "complete":
            break
        time.sleep(3)
    log = "".join(f.read_text() for f in RunDir(run).slurm_outputs())
    recs = store.read_records(run)
    assert [r["status"] for r in recs] == ["ok"], log
    assert store.read_manifest(run)["slurm"]["job_id"]


def test_comm_across_two_nodes_splits_intra_and_inter(tmp_path):
    port = free_port()
    common = ["-m", "mgbench.cli", "comm", "--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--run-id", "cm", "--collectives", "all_reduce,all_gather", "--max-bytes", "65536"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    nodes = [subprocess.Popen([sys.executable, *common, "--node-rank", str(r)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [n.communicate(timeout=300)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs
    rows = [json.loads(line) for line in (tmp_path / "results" / "cm" / "comm.jsonl").read_text().splitlines()]
    by_scope = {(r["scope"], r["nproc"]) for r in rows}
    assert by_scope == {("all", 4), ("intra", 2), ("inter", 2)}
    assert all(r["wrong"] == 0 for r in rows)
    assert "inter-node groups" in outs[0] and "intra-node groups" in outs[0]
