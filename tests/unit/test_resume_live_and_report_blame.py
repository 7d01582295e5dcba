"""Two defects an audit found (2026-11-29): `run --resume` of a run whose mgbench process
is still alive on this host started a second launcher in the same folder (every config
recorded twice, each timing the other's load); and `report` blamed -o for an OSError that
came from reading a run's files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from mgbench import cli as cli_mod
from mgbench import procs
from mgbench.cli import main
from tests.factories import make_config, make_record, make_run


def _running_run(root: Path, run_id: str, pid: int, host: str | None = None):
    return make_run(root, run_id, [make_record(make_config(strategy="single", nproc=1), run_id, step_times_s=[0.1] * 5)],
                    status="running", pid=pid, machine={"hostname": host or socket.gethostname(), "cpu_model": "cpu"},
                    suite={"name": "smoke", "description": "", "text": "", "sha256": ""})


def test_resume_refuses_a_run_whose_process_is_alive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _running_run(tmp_path / "results", "live", sleeper.pid)
        r = CliRunner().invoke(main, ["run", "--resume", "live", "--no-report", "--no-projection"])
        assert r.exit_code == 2, r.output
        assert f"run live is running (mgbench process {sleeper.pid} on this host)" in r.output
        assert "Traceback" not in r.output
        # Nothing was written to the run's folder by the refused launcher.
        assert len((tmp_path / "results" / "live" / "records.jsonl").read_text().splitlines()) == 1
    finally:
        sleeper.kill()
        sleeper.wait()


def test_only_a_live_process_on_this_host_counts():
    here = {"hostname": socket.gethostname()}
    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    assert not procs.process_alive({"pid": dead_pid.pid, "machine": here})
    assert procs.run_status({"status": "running", "pid": dead_pid.pid, "machine": here, "run_id": "r"})[0] == "dead"
    assert not procs.process_alive({"pid": os.getpid(), "machine": here})  # the resuming process itself
    assert not procs.process_alive({"pid": os.getppid(), "machine": {"hostname": "another-node"}})
    assert procs.process_alive({"pid": os.getppid(), "machine": here})
    assert not procs.process_alive({"machine": here})  # no pid recorded
    # running elsewhere, under Slurm, or finished: the manifest's word stands
    assert procs.run_status({"status": "running", "pid": dead_pid.pid, "machine": {"hostname": "n2"}})[0] == "running"
    assert procs.run_status({"status": "running", "pid": dead_pid.pid, "machine": here,
                             "slurm": {"job_id": "7"}})[0] == "running"
    assert procs.run_status({"status": "complete", "pid": dead_pid.pid, "machine": here}) == ("complete", None)


def test_show_status_and_report_agree_that_a_killed_run_is_dead(tmp_path, monkeypatch):
    """`status` said dead for a run whose process was killed, `show` and `report` running."""
    monkeypatch.chdir(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _running_run(tmp_path / "results", "k", gone.pid)
    runner = CliRunner()
    assert "run k: dead" in runner.invoke(main, ["status", "k"]).output
    shown = runner.invoke(main, ["show", "k"])
    assert shown.exit_code == 0 and "status dead" in shown.output.splitlines()[0], shown.output
    r = runner.invoke(main, ["report", "k", "-o", "k.html"])
    assert r.exit_code == 0, r.output
    assert "<td>dead</td>" in (tmp_path / "k.html").read_text()


def test_report_tells_a_read_error_from_a_write_error(tmp_path):
    target = tmp_path / "reports" / "r.html"
    writing = [None, target, target.parent / ".r.html.tmp-123", target.parent, tmp_path]
    for name in writing:
        assert cli_mod._writing_to(OSError(13, "Permission denied", None if name is None else str(name)), target), name
    reading = tmp_path / "results" / "run" / "records.jsonl"
    assert not cli_mod._writing_to(OSError(13, "Permission denied", str(reading)), target)


def test_a_signal_after_the_last_config_leaves_the_run_complete():
    """Ctrl-C once every config was recorded marked the run interrupted and asked for a
    resume that had nothing to run."""
    from mgbench.runner.launch import final_status

    a, b = make_config(strategy="ddp", nproc=1), make_config(strategy="ddp", nproc=2)
    both = [{"config_id": a.config_id, "status": "ok"}, {"config_id": b.config_id, "status": "oom"}]
    assert final_status(True, [a, b], both) == "complete"
    assert final_status(True, [a, b], both[:1]) == "interrupted"  # b not recorded
    assert final_status(True, [a, b], [both[0], {"config_id": b.config_id, "status": "interrupted"}]) == "interrupted"
    assert final_status(False, [a, b], both[:1]) == "complete"  # no signal: whatever ended it was not one


def test_the_launcher_reads_a_damaged_progress_file_as_absent(tmp_path):
    """store.read_progress names a damaged progress file (for `mgbench status`); the launcher
    polling it mid-sweep takes it as no heartbeat instead of stopping the sweep."""
    import pytest

    from mgbench import store
    from mgbench.errors import MgbenchError
    from mgbench.runner.launch import _progress_now

    f = tmp_path / "progress.json"
    f.write_text("[1, 2]")
    with pytest.raises(MgbenchError):
        store.read_progress(f)
    assert _progress_now(f) is None
    f.write_text('{"config_id": "c", "started": 1.0}')
    assert _progress_now(f)["config_id"] == "c"


def test_what_a_resume_leaves_alone_is_one_rule():
    from mgbench import store

    recs = [{"config_id": "a", "status": "interrupted"}, {"config_id": "b", "status": "oom"},
            {"config_id": "a", "status": "ok"}, {"config_id": "c", "status": "ok"},
            {"config_id": "c", "status": "interrupted"}]
    assert store.recorded_configs(recs) == {"a": "ok", "b": "oom"}  # c's latest record was interrupted
