"""The benchmark side as a first user met it (a reviewer's read-only pass, each item
reproduced): a sweep that can run nothing, failed configs and --strict, the newest run,
a killed run's status, click's own errors, comm's bounds, machine-readable output, a
comm run in `show`, and the table's numbers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mgbench import store
from mgbench.cli import main
from mgbench.show import number
from tests.factories import make_config, make_record, make_run


def _run(args, **kw):
    return CliRunner().invoke(main, args, **kw)


def test_a_sweep_that_can_run_nothing_is_one_line_exit_2_and_writes_no_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _run(["run", "smoke", "--set", "strategy=tp", "--set", "nproc=3", "--device", "cpu"])
    assert r.exit_code == 2 and "nothing to run: every one of the 1 configs is skipped" in r.output
    # The runner's reasons said once per layout, not once per reason.
    assert r.output.count("on world size 3") == 1 and "does not divide the 4 attention heads" in r.output
    assert not (tmp_path / "results").exists()
    ok = _run(["run", "smoke", "--set", "strategy=tp", "--set", "nproc=2", "--device", "cpu", "--dry-run"])
    assert ok.exit_code == 0 and "1 runnable" in ok.output  # negative control: a layout that runs
    js = json.loads(_run(["run", "smoke", "--device", "cpu", "--dry-run", "--json"]).output)
    assert js["suite"] == "smoke" and all({"config_id", "label", "skip_reason"} <= set(c) for c in js["configs"])


@pytest.mark.parametrize("strict", [False, True])
def test_failed_configs_are_named_and_strict_exits_1(tmp_path, monkeypatch, strict):
    import mgbench.runner.launch as launch

    cfg, bad = make_config(strategy="ddp", nproc=2), make_config(strategy="fsdp", nproc=2)
    rd = make_run(tmp_path / "results", "r", [make_record(cfg, "r", step_times_s=[0.1] * 6),
                                              make_record(bad, "r", status="error", error="rank 1: boom")],
                  status="complete", suite={"name": "smoke"})
    monkeypatch.setattr(launch, "run_suite", lambda *a, **k: rd.path)
    monkeypatch.setattr("mgbench.show.render", lambda run_dir, fmt="table": "table")
    args = ["run", "smoke", "--device", "cpu", "--no-report", "--no-projection", "--results-dir",
            str(tmp_path / "results"), *(["--strict"] if strict else [])]
    r = _run(args)
    assert "1 config(s) failed (1 error)" in r.output
    assert r.exit_code == (1 if strict else 0), r.output


def test_show_and_status_take_the_run_that_started_last(tmp_path):
    root = tmp_path / "results"
    make_run(root, "slow", started_at="2026-11-27T10:00:00", status="complete")
    make_run(root, "20261127-110000-smoke-ab12", started_at="2026-11-27T11:00:00", status="complete")
    assert store.latest_run(root).name == "20261127-110000-smoke-ab12"  # "slow" sorts last by name only
    r = _run(["status", "--results-dir", str(root)])
    assert r.exit_code == 0 and "20261127-110000-smoke-ab12" in r.output


def test_a_killed_runs_status_reads_dead(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # its pid is gone now
    root = tmp_path / "results"
    make_run(root, "k", status="running", pid=p.pid, machine={"hostname": socket.gethostname()}, num_configs=3)
    r = _run(["status", "k", "--results-dir", str(root)])
    assert "run k: dead (the manifest says running, but its mgbench process" in r.output and "--resume k" in r.output
    js = json.loads(_run(["status", "k", "--results-dir", str(root), "--json"]).output)
    assert js["status"] == "dead" and "--resume k" in js["status_reason"]
    import os

    make_run(root, "alive", status="running", pid=os.getpid(), machine={"hostname": socket.gethostname()})
    assert "running" in _run(["status", "alive", "--results-dir", str(root)]).output  # negative control
    make_run(root, "elsewhere", status="running", pid=p.pid, machine={"hostname": "another-node"})
    assert "dead" not in _run(["status", "elsewhere", "--results-dir", str(root)]).output


@pytest.mark.parametrize("args,words", [
    (["run", "--timeout", "abc"], "Invalid value for '--timeout': 'abc' is not a valid integer"),
    (["status", "x", "--bogus"], "No such option '--bogus'"),
    (["comm", "--iters", "0"], "Invalid value for '--iters': 0 is not in the range x>=1"),
    (["comm", "--warmup", "-1"], "Invalid value for '--warmup'"),
])
def test_clicks_own_errors_are_one_line_and_exit_2(args, words):
    r = _run(args)
    assert r.exit_code == 2 and r.output.startswith("mgbench: error: ") and words in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "--help`" in r.output


def test_a_comm_run_shows_its_own_table_and_refuses_training_formats(tmp_path):
    root = tmp_path / "results"
    rd = make_run(root, "c", kind="comm", status="complete", comm={"nproc": 2, "device": "cpu"},
                  interconnect={"summary": "loopback"})
    row = {"collective": "all_reduce", "dtype": "float32", "scope": "all", "size_bytes": 4096, "count": 1024,
           "time_s": 5e-4, "algbw_gbps": 0.008, "busbw_gbps": 0.008, "wrong": 0, "nproc": 2}
    (rd.path / "comm.jsonl").write_text(json.dumps(row) + "\n")
    (rd.path / "comm_fit.json").write_text(json.dumps({"all_reduce:float32:all": None}))
    shown = _run(["show", "c", "--results-dir", str(root)])
    assert shown.exit_code == 0, shown.output
    assert "busbw(GB/s)" in shown.output and "4096" in shown.output  # the comm table, not an empty training one
    r = _run(["show", "c", "--json", "--results-dir", str(root)])
    assert r.exit_code == 2 and "is a `mgbench comm` run" in r.output


def test_table_numbers_read_as_the_progress_line_says_them():
    assert number(15156.3) == "15,156" and number(10020.0) == "10,020" and number(0.012774) == "0.01277"
    assert number(999.94) == "999.9"


def test_show_csv_writes_lists_as_json(tmp_path):
    root = tmp_path / "results"
    cfg = make_config(strategy="ddp", nproc=2)
    make_run(root, "r", [make_record(cfg, "r", step_times_s=[0.1, 0.2, 0.1, 0.1, 0.1, 0.1])], status="complete",
             suite={"name": "smoke"})
    import csv
    import io

    out = _run(["show", "r", "--csv", "--results-dir", str(root)]).output
    row = next(csv.DictReader(io.StringIO(out)))
    assert json.loads(row["step_times_s"]) == [0.1, 0.2, 0.1, 0.1, 0.1, 0.1]


def test_show_notes_a_noisy_median_and_ranks_sharing_cores(tmp_path):
    from mgbench.show import render

    root = tmp_path / "results"
    noisy, quiet = make_config(strategy="ddp", nproc=2), make_config(strategy="fsdp", nproc=2)
    rd = make_run(root, "r", [
        make_record(noisy, "r", step_times_s=[0.1] * 6, step_time_s=0.1, step_time_ci95_low_s=0.08,
                    step_time_ci95_high_s=0.12, rank_spread_reason="4 ranks x 1 thread(s) on 2 cores: a rank ..."),
        make_record(quiet, "r", step_times_s=[0.1] * 6, step_time_s=0.1, step_time_ci95_low_s=0.099,
                    step_time_ci95_high_s=0.101)], status="complete", suite={"name": "smoke"}, machine={})
    text = render(rd.path)
    assert "noisy, the median step time's 95% interval above 10% of it" in text and f"{noisy.config_id} (40%)" in text
    assert quiet.config_id not in text.split("notes:")[1]  # 2%: not noisy
    assert "ranks share this host's cores (4 ranks x 1 thread(s) on 2 cores)" in text


def test_a_waiting_slurm_job_says_what_it_waits_for(tmp_path, monkeypatch):
    from mgbench import cluster

    assert cluster.parse_state_line("PENDING|Resources\n") == ("PENDING", "Resources")
    assert cluster.parse_state_line("RUNNING|None\n") == ("RUNNING", None)
    assert cluster.parse_state_line("PENDING|None") == ("PENDING", None)
    assert cluster.parse_state_line("COMPLETED \n") == ("COMPLETED", None)  # sacct's line
    assert cluster.parse_state_line("") == ("", None)
    root = tmp_path / "results"
    make_run(root, "sl", status="running", slurm={"job_id": "42"}, num_configs=2)
    monkeypatch.setattr(cluster, "job_state", lambda job: ("PENDING", "QOSMaxGRESPerUser"))
    r = _run(["status", "sl", "--results-dir", str(root)])
    assert "Slurm job 42: PENDING (waiting for QOSMaxGRESPerUser: `squeue -j 42 --start`" in r.output, r.output
    assert json.loads(_run(["status", "sl", "--results-dir", str(root), "--json"]).output)["slurm_reason"] == \
        "QOSMaxGRESPerUser"
    monkeypatch.setattr(cluster, "job_state", lambda job: ("RUNNING", None))
    assert "waiting" not in _run(["status", "sl", "--results-dir", str(root)]).output


def test_status_names_the_config_running_now(tmp_path):
    import os
    import time

    root = tmp_path / "results"
    done, now = make_config(strategy="ddp", nproc=2), make_config(strategy="fsdp", nproc=2)
    rd = make_run(root, "live", [make_record(done, "live", step_times_s=[0.1] * 6)], status="running",
                  pid=os.getpid(), machine={"hostname": socket.gethostname()}, num_configs=2)
    (rd.path / "progress" / "g.json").write_text(json.dumps({"config_id": now.config_id, "started": time.time() - 42,
                                                             "round": 1, "rounds": 1}))
    out = _run(["status", "live", "--results-dir", str(root)]).output
    assert f"running now: {now.config_id}, 4" in out
    # A config already recorded is not running (its progress file is the last one written).
    (rd.path / "progress" / "g.json").write_text(json.dumps({"config_id": done.config_id, "started": time.time(),
                                                             "round": 1, "rounds": 1}))
    assert "running now" not in _run(["status", "live", "--results-dir", str(root)]).output


# A torchrun stand-in: starts the job's first config (as worker.mark_started does), runs
# 1.5 s and ends without a record.
FAKE_LONG_CONFIG = """
import json, os, pathlib, sys, time
job = json.loads(pathlib.Path(sys.argv[1]).read_text())
path = pathlib.Path(job["run_dir"]) / "progress" / (os.environ.get("MGBENCH_GROUP", "group") + ".json")
path.write_text(json.dumps({"config_id": job["configs"][0]["config_id"], "started": time.time(), "round": 1,
                            "rounds": 1}))
time.sleep(1.5)
"""


def test_a_long_config_says_it_is_still_running(tmp_path, monkeypatch):
    from mgbench.runner import launch
    from mgbench.store import RunDir

    assert 10 <= launch.HEARTBEAT_S <= 60  # a line at least every minute, not a flood
    monkeypatch.setattr(launch, "HEARTBEAT_S", 0.4)
    monkeypatch.setattr(launch, "torchrun_argv", lambda nproc, job_path, log_dir, **kw:
                        [sys.executable, "-c", FAKE_LONG_CONFIG, str(job_path)])
    cfg = make_config(strategy="ddp", nproc=2)
    said: list[str] = []
    list(launch._run_group(RunDir.create(tmp_path, "r"), "r", 0, 2, "cpu", [cfg], launch.StopFlag(), said.append))
    beats = [m for m in said if m.startswith("  still running")]
    assert beats and cfg.label in beats[0] and "so far" in beats[0], said
    assert len(beats) <= 4  # one every 0.4 s of a 1.5 s config


def test_resuming_a_complete_run_changes_nothing(tmp_path):
    root = tmp_path / "results"
    rd = make_run(root, "done", status="complete", suite={"name": "smoke"})
    before = (rd.path / "manifest.json").read_text()
    r = _run(["run", "--resume", "done", "--results-dir", str(root)])
    assert r.exit_code == 0 and "nothing to resume: run done is complete" in r.output
    assert (rd.path / "manifest.json").read_text() == before
    bad = _run(["run", "--timeout", "0"])
    assert bad.exit_code == 2 and "'--timeout': 0 is not in the range x>=1" in bad.output


def test_a_failed_comm_rank_is_named_with_its_exception(tmp_path):
    from mgbench.comm.run import rank_error
    from mgbench.store import RunDir

    d = tmp_path / "logs" / "rdzv" / "attempt_0" / "1"
    d.mkdir(parents=True)
    (d / "stderr.log").write_text("Traceback (most recent call last):\n  File x\n"
                                  "TypeError: unsupported operand type(s) for /: 'int' and 'NoneType'\n")
    assert rank_error(RunDir(tmp_path).rank_stderrs("rdzv")) == "rank 1: TypeError: unsupported operand type(s) for /: 'int' and 'NoneType'"
    assert rank_error(RunDir(tmp_path).rank_stderrs("nothing")) is None
    # Teardown noise after the cause is not the cause.
    (d / "stderr.log").write_text("Traceback (most recent call last):\n  File x\nRuntimeError: the cause\n"
                                  "Exception ignored in: <function X.__del__>\nTraceback (most recent call last):\n"
                                  "AttributeError: 'NoneType' object has no attribute 'close'\n")
    assert rank_error(RunDir(tmp_path).rank_stderrs("rdzv")) == "rank 1: RuntimeError: the cause"


def test_mgbench_alone_shows_the_help_not_an_error():
    r = _run([])
    assert r.output.startswith("Usage: ") and "Benchmark and plan" in r.output and "mgbench: error" not in r.output


def test_a_resumed_run_names_the_process_that_resumed_it(tmp_path):
    # Its manifest's pid is the first process's until a resume: `status` would call the
    # resumed run dead while it runs.
    import os

    from mgbench.runner import launch
    from mgbench.store import RunDir
    from mgbench.suite import expand, parse_suite

    suite = parse_suite('[sweep]\nmodel = "tiny"\nstrategy = "ddp"\nnproc = 2\nseq_len = 16\ntrack_memory = false\n')
    root = tmp_path / "results"
    cfgs = expand(suite, "cpu", 2)
    make_run(root, "r", [make_record(c, "r", step_times_s=[0.1] * 6) for c in cfgs], status="interrupted",
             pid=1, machine={"hostname": "another-node"}, suite={"name": suite.name, "text": suite.text,
                                                                  "sweeps": suite.sweeps, "path": None, "sha256": ""})
    launch.run_suite(suite, root, device_kind="cpu", num_devices=2, progress=lambda m: None, resume="r")
    m = store.read_manifest(RunDir(root / "r"))
    assert m["pid"] == os.getpid() and m["machine"]["hostname"] == socket.gethostname()


@pytest.mark.parametrize("extra,words", [
    (["--premium", "nan"], "--premium is a fraction"),
    (["--price", "dgx-h100=nan"], "a price is a finite number"),
    (["--pue", "nan"], "--pue is facility power over IT power"),
    (["--server-price", "dgx-h100=nan"], "--server-price 'dgx-h100=nan'"),
])
def test_nan_assumptions_are_refused(extra, words):
    r = _run(["plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "dgx-h100", "--max-gpus", "8", *extra])
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output


# --- memory, probe, report, slurm, data, command: a third reviewer's items -----------------

def test_slurm_auto_asks_the_compute_nodes_for_gpus_whatever_this_node_has(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _run(["slurm", "smoke", "--nodes", "2", "--gpus-per-node", "4", "--run-id", "s1"])
    assert r.exit_code == 0, r.output
    script = (tmp_path / "results" / "s1" / "job.sbatch").read_text()
    assert "--gpus-per-node=4" in script and "--device cuda" in script and "ranks: cuda" in r.output
    cpu = _run(["slurm", "smoke", "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu", "--run-id", "s2"])
    assert cpu.exit_code == 0 and "--device cpu" in (tmp_path / "results" / "s2" / "job.sbatch").read_text()


def test_memory_trace_refuses_an_moe_model_in_one_line():
    r = _run(["memory", "--model", "tiny-moe", "--trace", "--seq-len", "256"])
    assert r.exit_code == 2 and "an MoE model's routing sizes depend on the data" in r.output


def test_the_runners_memory_model_shards_hsdp_within_its_groups():
    from mgbench.planner.memory import memory_for_config

    hsdp = memory_for_config(make_config(model="gpt2-small", strategy="hsdp", nproc=4, replicas=2, seq_len=128))
    fsdp2 = memory_for_config(make_config(model="gpt2-small", strategy="fsdp", nproc=2, seq_len=128))
    fsdp4 = memory_for_config(make_config(model="gpt2-small", strategy="fsdp", nproc=4, seq_len=128))
    # 4 ranks in 2 replicas of 2 hold what 2 FSDP ranks hold, not what 4 do.
    assert hsdp["params_bytes"] == pytest.approx(fsdp2["params_bytes"])
    assert hsdp["params_bytes"] > fsdp4["params_bytes"] * 1.5


def test_report_refuses_what_it_cannot_write_or_read_in_one_line(tmp_path):
    root = tmp_path / "results"
    make_run(root, "r", [make_record(make_config(strategy="ddp", nproc=2), "r", step_times_s=[0.1] * 6)],
             status="complete", suite={"name": "smoke"})
    (tmp_path / "out").mkdir()
    r = _run(["report", "r", "--results-dir", str(root), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "a folder; give the page's file name" in r.output
    assert not list((tmp_path / "out").iterdir())  # no half page left behind
    (tmp_path / "notplan.json").write_text('{"a": 1}')
    r = _run(["report", "r", "--results-dir", str(root), "--plan", str(tmp_path / "notplan.json")])
    assert r.exit_code == 2 and "not a plan (no ranked, recommendation" in r.output


def test_a_report_of_a_run_with_no_record_says_so(tmp_path):
    from mgbench.report.html import build

    root = tmp_path / "results"
    make_run(root, "empty", status="submitted", suite={"name": "smoke"})
    page = build(["empty"], tmp_path / "e.html", root, projection=False).read_text()
    assert "no config recorded yet (run status: submitted)" in page
    assert "every config ran, matched the reference" not in page


def test_data_make_and_probe_refuse_a_place_they_cannot_write(tmp_path, monkeypatch):
    from mgbench import dataset

    def refused(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(dataset, "generate", refused)
    r = _run(["data", "make", str(tmp_path / "ds"), "--tokens", "1000", "--vocab", "256"])
    assert r.exit_code == 2 and "cannot write the dataset (Permission denied)" in r.output
    r = _run(["probe", "-o", str(tmp_path), "--no-comm", "--max-ranks", "1"])
    assert r.exit_code == 2 and "a folder; give the profile's file name" in r.output  # before any measuring
    r = _run(["probe", "--layer-tokens", "0"])
    assert r.exit_code == 2 and "'--layer-tokens': 0 is not in the range x>=1" in r.output


@pytest.mark.parametrize("extra,words", [
    (["--params", "nan"], "--params must be a positive finite count, got nan"),
    (["--params", "7e9", "--zero", "3", "--largest-layer-params", "-5"], "above 0 and at most the model's"),
    (["--params", "7e9", "--largest-layer-params", "1e8"], "add --zero 3"),
])
def test_memory_refuses_counts_it_cannot_mean(extra, words):
    r = _run(["memory", "--num-gpus", "8", *extra])
    assert r.exit_code == 2 and words in r.output, r.output


# What torchrun 2.x writes when rank 0 of 2 exits 2 and it stops rank 1 (SIGTERM): 30 lines,
# more than the 20 of stderr the record keeps.
TORCHRUN_2_RANKS = """python: can't open file '/x/nosuch.py': [Errno 2] No such file or directory
W1127 12:00:00.000000 120 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 124 closing signal SIGTERM
E1127 12:00:00.000000 120 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 2) local_rank: 0 (pid: 123) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    return f(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 919, in main
    run(args)
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 270, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/x/nosuch.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_12:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 124)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 124
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_12:00:00
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 123)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_failed_command_names_the_childs_cause_and_status_not_torchruns(tmp_path):
    from mgbench.runner.command import _child_exit, _error_line, _Output

    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stderr.write({TORCHRUN_2_RANKS!r})"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with open(tmp_path / "log", "wb") as log:
        out = _Output(proc, log, "")
        proc.wait()
        out.join()
    assert len(out.stderr) == 20 and "[Errno 2]" not in "".join(out.stderr)  # the tail alone has lost the cause
    assert _error_line(out.before_report, out.stderr) == \
        "python: can't open file '/x/nosuch.py': [Errno 2] No such file or directory"
    assert _child_exit(out.report) == 2  # the root cause's, not the stopped rank's -15
    assert _child_exit(["no report"]) is None
    # Without torchrun (a plain command), the tail's own last exception line.
    assert _error_line([], ["step 3", "RuntimeError: boom", "exiting"]) == "RuntimeError: boom"


@pytest.mark.parametrize("cmd", ["memory", "predict"])
def test_the_help_examples_run_as_written(cmd):
    # `--help` teaches with them; one lacked the --num-gpus its --tp needs. Examples with a
    # placeholder (PROFILE, RUN) or --trace (seconds of tracing) are left to the docs' tests.
    import shlex

    text = _run([cmd, "--help"]).output
    lines = [ln.split("#")[0].strip() for ln in text.splitlines() if ln.strip().startswith(f"mgbench {cmd} ")]
    ran = 0
    for line in lines:
        args = shlex.split(line)[1:]
        if any(a.isupper() for a in args) or "--trace" in args:
            continue
        r = _run(args)
        assert r.exit_code == 0, f"{line}\n{r.output}"
        ran += 1
    assert ran >= 2


def test_params_alone_are_held_as_the_stack_holds_them():
    # --params used to price 2 + 2 + 12 bytes whatever --stack said; --model took the stack's.
    def states(*extra):
        return json.loads(_run(["memory", "--params", "8.03e9", "--json", *extra]).output)

    mega, titan, ds = states(), states("--stack", "torchtitan"), states("--stack", "deepspeed")
    assert mega["grads_bytes"] == pytest.approx(4 * 8.03e9)  # Megatron's fp32 main_grad
    assert titan["params_bytes"] == pytest.approx(4 * 8.03e9) and titan["optimizer_bytes"] == pytest.approx(8 * 8.03e9)
    assert ds["model_states_bytes"] == pytest.approx(16 * 8.03e9)  # the ZeRO paper's 2 + 2 + 12
    model = json.loads(_run(["memory", "--model", "llama3-8b", "--json"]).output)
    assert model["grads_bytes"] / model["params_bytes"] == pytest.approx(mega["grads_bytes"] / mega["params_bytes"])


def test_parameter_counts_say_what_they_include():
    from mgbench import catalog
    from mgbench.commands.planning import parameter_counts

    ds = parameter_counts(catalog.model_shape("deepseek-v3"))
    # DeepSeek-V3 report: 671B total and 37B activated, the MTP module apart.
    assert ds.startswith("683B parameters (671B + 11.6B in the MTP module(s))") and "36.6B without the input" in ds
    oss = parameter_counts(catalog.model_shape("gpt-oss-120b"))
    assert "5.13B without the input embedding" in oss  # OpenAI's model card: 5.1B active
    assert parameter_counts(catalog.model_shape("llama3-8b")) == "8.03B parameters"  # dense, no MTP


def test_trace_refuses_a_stack_it_would_ignore_and_a_written_slurm_job_reads_written(tmp_path, monkeypatch):
    r = _run(["memory", "--model", "gpt2-small", "--trace", "--stack", "torchtitan", "--num-gpus", "2"])
    assert r.exit_code == 2 and "--stack torchtitan would change nothing" in r.output
    # Given explicitly, the default stack is refused too; the runner's own (mgbench) is what the trace holds.
    r = _run(["memory", "--model", "gpt2-small", "--trace", "--stack", "megatron-lm", "--num-gpus", "2"])
    assert r.exit_code == 2 and "--stack megatron-lm would change nothing" in r.output
    monkeypatch.chdir(tmp_path)
    assert _run(["slurm", "smoke", "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu", "--run-id", "w"]).exit_code == 0
    assert "run w: written" in _run(["status", "w"]).output  # nothing queued: not "submitted"


def test_a_pipeline_of_fewer_micro_batches_than_stages_is_said():
    one = json.loads(_run(["memory", "--model", "llama3-8b", "--num-gpus", "8", "--pp", "4", "--json"]).output)
    assert any("1 micro-batch(es) a step on 4 pipeline stages" in n and "--global-batch 8" in n for n in one["notes"])
    full = json.loads(_run(["memory", "--model", "llama3-8b", "--num-gpus", "8", "--pp", "4", "--global-batch", "8",
                            "--json"]).output)
    assert not any("micro-batch(es) a step" in n for n in full["notes"])


def test_a_failed_sbatch_leaves_the_run_written_not_submitted(tmp_path, monkeypatch):
    import mgbench.cluster as cluster
    from mgbench.errors import MgbenchError

    def refused(script):
        raise MgbenchError("sbatch: command not found")

    monkeypatch.setattr(cluster, "submit", refused)
    monkeypatch.chdir(tmp_path)
    r = _run(["slurm", "smoke", "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu", "--run-id", "f", "--submit"])
    assert r.exit_code == 2 and "sbatch" in r.output
    assert store.read_manifest(tmp_path / "results" / "f")["status"] == "written"


def test_params_mode_prices_the_gathered_layer_in_16_bits_and_says_nothing_of_pipelines():
    def gathered(*extra):
        return json.loads(_run(["memory", "--params", "8e9", "--zero", "3", "--num-gpus", "8",
                                "--largest-layer-params", "2e8", "--json", *extra]).output)

    assert gathered("--stack", "torchtitan")["gathered_params_bytes"] == pytest.approx(2 * 2 * 2e8)  # bf16, twice
    assert gathered("--stack", "megatron-lm")["gathered_params_bytes"] == pytest.approx(2 * 2 * 2e8)
    assert gathered("--precision", "fp8")["gathered_params_bytes"] == pytest.approx(2 * 1 * 2e8)
    piped = json.loads(_run(["memory", "--params", "8e9", "--num-gpus", "8", "--pp", "4", "--json"]).output)
    assert not any("micro-batch(es) a step" in n for n in piped["notes"])  # no activations counted here


def test_show_takes_one_format(tmp_path):
    root = tmp_path / "results"
    make_run(root, "r", [make_record(make_config(strategy="ddp", nproc=2), "r", step_times_s=[0.1] * 6)],
             status="complete", suite={"name": "smoke"}, machine={})
    both = _run(["show", "r", "--json", "--csv", "--results-dir", str(root)])
    assert both.exit_code == 2 and "give one of them" in both.output
    assert json.loads(_run(["show", "r", "--json", "--results-dir", str(root)]).output)["records"]
    assert "config_id" in _run(["show", "r", "--csv", "--results-dir", str(root)]).output.splitlines()[0]


def test_probe_phases_are_numbered_with_the_time_so_far():
    import time

    from mgbench.probe.run import numbered

    said = []
    say = numbered(said.append, 3, time.monotonic() - 65, " (hint)")
    say("GEMM")
    say("attention")
    assert said == ["[1/3, 1:05] GEMM (hint)", "[2/3, 1:05] attention"]


def test_probe_phase_count_by_hand():
    from mgbench.probe.run import phase_count

    assert phase_count("cpu", [1, 2, 4], ["float32"], True, 1) == 3 + 1 + 2   # ranks, framework, 2 all-reduces
    assert phase_count("cpu", [1, 2, 4], ["float32"], False, 1) == 4
    assert phase_count("cpu", [1], ["float32"], True, 1) == 2               # no all-reduce on one rank
    assert phase_count("cuda", [], ["bfloat16", "float16", "float32"], True, 8) == 7
    assert phase_count("cuda", [], ["bfloat16"], True, 1) == 2              # one GPU: no all-reduce run
