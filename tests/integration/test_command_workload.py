"""workload = "command" end to end: one `mgbench run` of four user scripts on gloo CPU
ranks (tests/fixtures/scripts): a plain DDP script measured by its log lines, one that
calls mgbench.step(tokens=...), one that crashes and one that hangs."""

import shlex
import sys
from pathlib import Path

import pytest

from mgbench import store

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
PY = shlex.quote(sys.executable)


def _suite() -> str:
    q = lambda name: shlex.quote(str(SCRIPTS / name))  # noqa: E731
    return f"""
name = "commands"
[[sweep]]   # a plain `python script.py`: mgbench runs it under torchrun with 2 ranks
workload = "command"
command = "{PY} {q('ddp_log.py')} --steps 8"
args = "--bs 4"
step_pattern = 'step \\d+ loss \\S+ tokens (?P<tokens>\\d+)'
nproc = 2
warmup_steps = 2
[[sweep]]   # the user's own torchrun line, run as given
workload = "command"
command = "{PY} -m torch.distributed.run --standalone --nproc-per-node 2 {q('ddp_step.py')} --steps 8"
nproc = 2
warmup_steps = 2
[[sweep]]
workload = "command"
command = "{q('crash.py')}"
step_pattern = 'step \\d+'
[[sweep]]
workload = "command"
command = "{q('hang.py')}"
step_pattern = 'step \\d+'
timeout_s = 3
"""


@pytest.fixture(scope="module")
def command_run(tmp_path_factory):
    from tests.conftest import run_cli

    cwd = tmp_path_factory.mktemp("cmd")
    (cwd / "commands.toml").write_text(_suite())
    p = run_cli("run", "commands.toml", "--run-id", "c1", "--no-report", "--no-projection", cwd=cwd)
    assert p.returncode == 0, p.stderr + p.stdout
    run_dir = cwd / "results" / "c1"
    return {_script(r): r for r in store.read_records(run_dir)}, run_dir, p


def _script(rec: dict) -> str:
    return next(Path(w).name for w in shlex.split(rec["command"]) if w.endswith(".py"))


def test_a_log_regex_times_a_plain_ddp_script(command_run):
    recs, run_dir, _ = command_run
    r = recs["ddp_log.py"]
    assert r["status"] == "ok", r["error"]
    assert r["step_source"] == "step_pattern" and r["num_steps_seen"] == 8 and r["num_steps_measured"] == 6
    assert r["command_argv"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=2" in r["command_argv"] and r["command_argv"][-2:] == ["--bs", "4"]
    assert r["tokens_per_step"] == 4 * 16 * 2  # from the (?P<tokens>) group
    assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["step_time_s"])
    assert r["step_time_p10_s"] <= r["step_time_s"] <= r["step_time_p90_s"] and len(r["step_times_s"]) == 6
    assert r["correct"] is None and r["correct_reason"] == "not checked: the user's own command"
    assert r["exit_code"] == 0 and r["wall_s"] > 0 and r["mem_peak_gib"] is None and r["mem_reason"]
    assert r["energy_j"] is None and "on CPU" in r["energy_reason"]
    assert r["label"] == f"command n=2: {sys.executable} {SCRIPTS / 'ddp_log.py'} --steps 8 --bs 4" \
        + r" step_pattern=step \d+ loss \S+ tokens (?P<tokens>\d+) warmup_steps=2 timeout_s=900"
    assert "step 8 loss" in (run_dir / r["log_file"]).read_text()


def test_mgbench_step_events_give_step_times_and_tokens(command_run):
    recs, run_dir, _ = command_run
    r = recs["ddp_step.py"]
    assert r["status"] == "ok", r["error"]
    assert r["step_source"] == "step_file" and r["step_file_malformed"] == 0
    assert r["num_steps_seen"] == 8 and r["num_steps_measured"] == 6
    assert r["command_argv"][:3] == [sys.executable, "-m", "torch.distributed.run"]  # as given
    assert r["tokens_per_step"] == 2 * 4 * 16  # each rank's tokens, summed
    assert r["tokens_per_s_per_device"] == pytest.approx(r["tokens_per_s"] / 2)
    assert (run_dir / r["samples_file"]).exists()


def test_a_crash_and_a_hang_are_recorded_and_the_sweep_goes_on(command_run):
    recs, _, p = command_run
    crash, hang = recs["crash.py"], recs["hang.py"]
    assert crash["status"] == "error" and crash["exit_code"] == 1
    assert "RuntimeError: deliberate crash in step 3" in crash["error"]
    assert "Traceback" in crash["stderr_tail"] and crash["step_time_s"] is None
    assert hang["status"] == "timeout" and "timeout_s = 3 s" in hang["error"] and hang["num_steps_seen"] == 1
    assert len(recs) == 4 and "[4/4]" in p.stdout
