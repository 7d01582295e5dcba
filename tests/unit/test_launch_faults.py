"""The launcher's faults without real torchrun jobs: which rank wrote which stderr tail
in a multi-node launch, run ids that would lead out of the results folder, and a
results folder that takes no more writes (issue 30, items 9 to 11). A fake torchrun
(a short Python process) stands in for the ranks where a job is needed."""

import errno
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mgbench import store
from mgbench.errors import MgbenchError
from mgbench.launching import Cluster
from mgbench.runner import launch
from mgbench.store import RunDir
from mgbench.suite import parse_suite
from tests.conftest import REPO
from tests.factories import make_config

BANNER = "[mgbench] global rank"  # the first line of each rank's stderr (launching.run_rank)

# What torchrun leaves behind on one node of a job whose config failed: each local rank's
# stderr.log (its global rank first, as the ranks write it), the progress file naming the
# config that was running; then it exits 1. argv: log dir, job file, the global rank of
# each local rank ("2,3").
FAKE_TORCHRUN = r"""
import json, re, sys, time
from pathlib import Path
log_dir, job, ranks = Path(sys.argv[1]), Path(sys.argv[2]), [int(r) for r in sys.argv[3].split(",")]
cid = json.loads(job.read_text())["configs"][0]["config_id"]
for local, rank in enumerate(ranks):
    d = log_dir / "rdzv_fake" / "attempt_0" / str(local)
    d.mkdir(parents=True)
    (d / "stderr.log").write_text(f"[mgbench] global rank {rank} (local rank {local})\n"
                                  f"rank {rank}: gloo: Connection reset by peer\n")
progress = job.parent.parent / "progress" / (re.sub(r"-node\d+$", "", job.stem) + ".json")
progress.write_text(json.dumps({"config_id": cid, "started": time.time()}))
sys.exit(1)
"""


def fake_torchrun(monkeypatch, ranks: str) -> None:
    monkeypatch.setattr(launch, "torchrun_argv", lambda nproc, job_path, log_dir, **kw:
                        [sys.executable, "-c", FAKE_TORCHRUN, str(log_dir), str(job_path), ranks])


# --- item 9: stderr tails go to the global rank that wrote them ---------------------------

def test_stderr_tails_are_attributed_to_global_ranks_when_node_order_differs_from_node_rank(tmp_path, monkeypatch):
    # Two nodes of two ranks. The c10d rendezvous put the node started with --node-rank 1
    # first: its local ranks are global ranks 0 and 1, the leader's are 2 and 3. Global
    # rank 1 (node 1, local rank 1) is the one that failed.
    cfg = make_config(strategy="ddp", nproc=4)
    run_dir = RunDir.create(tmp_path, "mn")
    tag = "group-0-n4-a0"
    for local, (rank, text) in enumerate([(0, "rank 0: gloo: Connection reset by peer"),
                                          (1, "RuntimeError: boom on global rank 1")]):
        d = run_dir.rank_logs(f"{tag}-node1") / "rdzv_other" / "attempt_0" / str(local)
        d.mkdir(parents=True)
        (d / "stderr.log").write_text(f"{BANNER} {rank} (local rank {local})\nTraceback ...\n{text}\n")
    store.write_json_atomic(run_dir.failure(cfg.config_id, 1), {
        "config_id": cfg.config_id, "rank": 1, "time": 1.0, "status": "error", "error_type": "RuntimeError",
        "error": "boom on global rank 1", "traceback": "Traceback ...\nRuntimeError: boom on global rank 1\n"})
    fake_torchrun(monkeypatch, "2,3")  # the leader's own job
    leader = Cluster(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:1", nproc_per_node=2)

    [rec] = list(launch._run_group(run_dir, "mn", 0, 4, "cpu", [cfg], launch.StopFlag(), lambda m: None, leader))

    assert rec["status"] == "error" and rec["error"].startswith("rank 1: RuntimeError: boom on global rank 1")
    tails = {int(re.search(r"\.rank(\d+)\.stderr\.txt$", f)[1]): (run_dir.path / f).read_text()
             for f in rec["stderr_files"]}
    assert "boom on global rank 1" in tails[1]  # node 1's local rank 1, not the leader's
    assert "rank 2: gloo" in tails[2] and "rank 3: gloo" in tails[3]  # the leader's local ranks 0 and 1
    assert "rank 0: gloo" in tails[0]
    assert rec["stderr_files"] == [f"logs/{cfg.config_id}.rank{r}.stderr.txt" for r in range(4)]
    assert not any(BANNER in t for t in tails.values())  # the banner is no part of the tail


def test_each_rank_names_its_global_rank_first_then_runs_its_module(tmp_path):
    # torchrun's argv starts every rank through mgbench.launching, which writes the
    # global rank torchrun gave it (RANK) and then runs the module with its arguments.
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "0"}
    p = subprocess.run([sys.executable, "-m", "mgbench.launching", "calendar", "2024", "1"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[0].startswith(f"{BANNER} 5 ")
    assert "January 2024" in p.stdout
    err = tmp_path / "stderr.log"
    err.write_text(p.stderr + "more lines\n")
    from mgbench.launching import rank_of_stderr, torchrun_argv

    assert rank_of_stderr(err) == 5
    argv = torchrun_argv(2, pathlib.Path("job.json"), tmp_path)
    assert argv[-5:] == ["-m", "mgbench.launching", "mgbench.runner.worker", "--job", "job.json"]


# --- item 10: a run id is one plain folder name under the results folder ------------------

# A user's command that prints four steps: a run of it costs a shell, no torch.
COMMAND_SUITE = """name = "cmds"
[sweep]
workload = "command"
command = "/bin/sh -c 'for i in 1 2 3 4; do echo step $i; sleep 0.01; done'"
step_pattern = 'step \\d+'
warmup_steps = 1
args = ["a", "b"]
"""


@pytest.mark.parametrize("bad", ["../escape", "a/b", "a\\b", "..", ".hidden", "x..y", ""])
def test_check_run_id_refuses_anything_but_one_plain_folder_name(tmp_path, bad):
    with pytest.raises(MgbenchError, match="a run id is one plain folder name"):
        store.check_run_id(bad)
    with pytest.raises(MgbenchError, match="a run id is one plain folder name"):
        RunDir.create(tmp_path / "results", bad)
    assert list(tmp_path.iterdir()) == []
    assert store.check_run_id("20261121-093012-smoke-1a2b") == "20261121-093012-smoke-1a2b"
    assert store.check_run_id("exp.1_b") == "exp.1_b"


@pytest.mark.parametrize("bad", ["../escape", ".hidden", ""])
def test_run_refuses_a_run_id_that_leaves_results_in_one_line_writing_nothing(cli, tmp_path, bad):
    (tmp_path / "c.toml").write_text(COMMAND_SUITE)
    p = cli("run", "c.toml", "--run-id", bad, "--no-report", "--no-projection", timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert p.stderr.startswith(f"mgbench: error: run id {bad!r}: ")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["c.toml"]  # no results/, no escape/


def test_resume_does_not_take_an_id_that_leads_out_of_results(cli, tmp_path):
    # A run folder beside results/: `--resume ../escape` must not find it through results/.
    launch.create_run(parse_suite(COMMAND_SUITE), tmp_path, "escape", "cpu", 4, status="interrupted")
    (tmp_path / "results").mkdir()
    before = sorted(f.relative_to(tmp_path) for f in tmp_path.rglob("*"))
    p = cli("run", "--resume", "../escape", "--no-report", "--no-projection", timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "not a run id (it holds a path separator)" in p.stderr
    assert sorted(f.relative_to(tmp_path) for f in tmp_path.rglob("*")) == before  # nothing written
    with pytest.raises(MgbenchError, match="not a run id"):
        store.resolve_run("../escape", tmp_path / "results")


# --- item 11: a results folder that takes no more writes ------------------------------------

def _full_disk_after(monkeypatch, n: int) -> None:
    """records.jsonl takes ``n`` records, then the disk is full: the next write() fails
    (naming no file, as a failed write does)."""
    appends = []

    class Full:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def open_(path, mode="r", *a, **kw):
        f = open(path, mode, *a, **kw)
        if pathlib.Path(path).name == "records.jsonl" and "a" in mode:
            appends.append(path)
            return Full(f) if len(appends) > n else f
        return f

    monkeypatch.setattr(store, "open", open_, raising=False)  # store's writers, not the rest of the process


def test_a_full_disk_ends_the_run_in_one_line_and_resume_finishes_it(tmp_path, monkeypatch):
    from mgbench.cli import main

    (tmp_path / "c.toml").write_text(COMMAND_SUITE)
    args = ["--results-dir", str(tmp_path / "results"), "--no-report", "--no-projection", "--device", "cpu"]
    _full_disk_after(monkeypatch, 1)
    res = CliRunner().invoke(main, ["run", str(tmp_path / "c.toml"), "--run-id", "full", *args])
    run = tmp_path / "results" / "full"
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output
    line = f"mgbench: error: {run}: no space left on device while writing records.jsonl; free space and " \
           "continue with `mgbench run --resume full`"
    assert res.stderr.strip() == line
    [first] = store.read_records(run)  # the record written before the disk filled up, intact
    assert first["status"] == "ok" and first["num_steps_measured"] == 3
    assert store.read_manifest(run)["status"] == "interrupted"

    monkeypatch.undo()  # space freed
    res = CliRunner().invoke(main, ["run", "--resume", "full", *args])
    assert res.exit_code == 0, res.output
    recs = store.read_records(run)
    assert [r["status"] for r in recs] == ["ok", "ok"] and recs[0] == first
    assert store.read_manifest(run)["status"] == "complete"


def test_a_full_disk_while_saving_a_failed_configs_stderr_tails_is_one_line(tmp_path, monkeypatch):
    # The traceback: OSError [Errno 28] from launch._failure_record, writing a
    # rank's stderr tail after its torchrun job failed.
    suite = parse_suite('[sweep]\nmodel = "tiny"\nstrategy = "ddp"\nnproc = 2\nseq_len = 16\n'
                        'track_memory = false\n')
    fake_torchrun(monkeypatch, "0,1")
    write_text = pathlib.Path.write_text

    def full(self, *a, **kw):
        if self.name.endswith(".stderr.txt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    results = tmp_path / "results"
    with pytest.raises(MgbenchError) as e:
        launch.run_suite(suite, results, "r1", "cpu", 2, progress=lambda m: None)
    [job] = (results / "r1" / "jobs").glob("*.json")
    cid = json.loads(job.read_text())["configs"][0]["config_id"]
    assert str(e.value) == (f"{results / 'r1'}: no space left on device while writing logs/{cid}.rank0.stderr.txt; "
                            "free space and continue with `mgbench run --resume r1`")
    assert store.read_records(results / "r1") == []

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)  # space freed: --resume records the config
    launch.run_suite(suite, results, device_kind="cpu", num_devices=2, progress=lambda m: None, resume="r1")
    [rec] = store.read_records(results / "r1")
    assert rec["status"] == "error" and rec["config_id"] == cid and len(rec["stderr_files"]) == 2


def test_errors_that_are_no_refused_write_stay_what_they_are(tmp_path):
    run_dir = RunDir.create(tmp_path, "r")
    with pytest.raises(FileNotFoundError):
        with launch._results_writable(run_dir, "r"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(run_dir.path / "x"))
    with pytest.raises(PermissionError):  # a permission error on no file of the run (a signal)
        with launch._results_writable(run_dir, "r"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
    with pytest.raises(MgbenchError, match=r"read-only file system while writing manifest.json; make it writable"):
        with launch._results_writable(run_dir, "r"):
            raise OSError(errno.EROFS, "Read-only file system", str(run_dir.manifest))
