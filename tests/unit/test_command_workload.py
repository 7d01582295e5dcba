"""workload = "command": the step-event protocol, its parsing, the figures made from it,
the launch line, the suite keys, and the GPU figures read from outside (fake NVML)."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import mgbench
from mgbench import step_events
from mgbench.errors import MgbenchError
from mgbench.runner import command
from mgbench.step_events import StepEnds, match_log, read_step_file
from mgbench.store import RunDir
from mgbench.suite import expand, parse_suite
from mgbench.telemetry import gpu_watch
from tests.unit.nvml_fake import FakeNVML, host

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"


def command_config(text: str, **kw):
    """The one command config of a suite sweep written as TOML lines."""
    [cfg] = expand(parse_suite(f'[sweep]\nworkload = "command"\n{text}'), "cpu", 4)
    return replace(cfg, **kw) if kw else cfg


# --- the protocol: mgbench.step() ------------------------------------------------------

def test_step_appends_protocol_lines_and_is_a_no_op_without_the_variable(tmp_path, monkeypatch):
    path = tmp_path / "steps.txt"
    monkeypatch.delenv(step_events.STEP_FILE_ENV, raising=False)
    mgbench.step(tokens=5)  # no variable: nothing written, no error
    monkeypatch.setenv(step_events.STEP_FILE_ENV, str(path))
    monkeypatch.setenv("RANK", "3")
    t0 = time.time_ns()
    mgbench.step(tokens=512)
    mgbench.step()
    lines = path.read_text().splitlines()
    assert [ln.split()[1:] for ln in lines] == [["512", "3"], ["-", "3"]]
    assert all(t0 <= int(ln.split()[0]) <= time.time_ns() for ln in lines)
    with pytest.raises(TypeError):
        mgbench.step(tokens=1.5)  # tokens are a count


def test_importing_mgbench_does_not_load_torch():
    code = "import mgbench, sys; mgbench.step(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- parsing ----------------------------------------------------------------------------

def test_step_file_ranks_merge_and_malformed_lines_are_counted():
    lines = ["100 8 0", "110 8 1", "garbage", "200 8 0", "205 - 1", "1 2", "", "300 8 0", "x 8 0", "280 8 1",
             "400 8 0"]  # rank 0 reported a 4th step that rank 1 has not: left out
    ends = read_step_file(lines)
    assert ends.ends_ns == [110, 205, 300]  # the slowest rank ends each step
    assert ends.tokens == [16, 8, 16]  # summed over the ranks that gave them
    assert ends.malformed == 3 and ends.ranks == 2


def test_log_regex_with_and_without_a_tokens_group():
    lines = [(10, "step 1 loss 2.0 tokens 1,024"), (20, "eval 3"), (30, "step 2 loss 1.9 tokens 2048"),
             (40, "step 3 loss 1.8 tokens n/a")]
    ends = match_log(lines, r"step \d+ loss \S+ tokens (?P<tokens>\S+)")
    assert ends.ends_ns == [10, 30, 40] and ends.tokens == [1024, 2048, None] and ends.malformed == 1
    plain = match_log(lines, r"^step \d+")
    assert plain.ends_ns == [10, 30, 40] and plain.tokens == [None] * 3
    # stdout's and stderr's reader threads may append out of time order: ends are sorted
    swapped = match_log([lines[2], lines[0], lines[3]], r"^step \d+")
    assert swapped.ends_ns == [10, 30, 40]


def test_step_figures_drop_the_warmup_and_take_tokens_from_events_or_the_suite():
    ms = 1_000_000
    ends = StepEnds(ends_ns=[0, 500 * ms, 600 * ms, 700 * ms, 800 * ms], tokens=[100] * 5)
    f, problem = command.step_figures(ends, warmup_steps=2, tokens_per_step=None, nproc=2)
    assert problem is None
    assert f["step_times_s"] == pytest.approx([0.1, 0.1, 0.1])  # the 0.5 s warm-up step is gone
    assert f["num_steps_seen"] == 5 and f["num_steps_measured"] == 3
    assert f["tokens_per_s"] == pytest.approx(1000) and f["tokens_per_s_per_device"] == pytest.approx(500)
    no_tokens = replace(ends, tokens=[None] * 5)
    f, _ = command.step_figures(no_tokens, 2, tokens_per_step=50, nproc=1)
    assert f["tokens_per_s"] == pytest.approx(500) and f["tokens_per_step"] == 50
    f, _ = command.step_figures(no_tokens, 2, tokens_per_step=None, nproc=1)
    assert f.get("tokens_per_s") is None
    assert "mgbench.step(tokens=N)" in f["tokens_reason"]
    _, problem = command.step_figures(replace(ends, ends_ns=ends.ends_ns[:3]), 2, None, 1)
    assert "1 timed step(s)" in problem and "at least 2" in problem


# --- the launch line ----------------------------------------------------------------------

def test_a_python_script_runs_under_torchrun_and_a_launch_line_as_given():
    cfg = command_config('command = "python3 train.py --lr 1"\nargs = "--bs 8"\nnproc = 2')
    assert command.command_argv(cfg) == ["python3", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                                         "--nproc-per-node=2", "train.py", "--lr", "1", "--bs", "8"]
    given = command_config('command = "torchrun --nproc-per-node 4 train.py"\nnproc = 4')
    assert command.command_argv(given) == ["torchrun", "--nproc-per-node", "4", "train.py"]
    mod = command_config('command = "python -m torch.distributed.run --standalone x.py"')
    assert command.command_argv(mod)[:3] == ["python", "-m", "torch.distributed.run"]
    with pytest.raises(command.CommandLineError, match="cannot pass through torchrun"):
        command.command_argv(command_config('command = "python -c pass"'))


def test_stderr_tail_names_the_exception_not_torchruns_summary():
    tail = ["Traceback (most recent call last):", '  File "x.py", line 3', "RuntimeError: boom", "",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60]
    assert command._error_line(tail) == "RuntimeError: boom"


# --- suite keys -----------------------------------------------------------------------------

def test_keys_of_other_workloads_neither_multiply_nor_confuse_command_configs():
    suite = parse_suite('[sweep]\nworkload = "command"\ncommand = "python t.py"\nargs = ["--bs 8", "--bs 16"]\n'
                        'strategy = ["ddp", "fsdp"]\nprecision = ["fp32", "bf16"]\nnproc = 2')
    configs = expand(suite, "cpu", 4)
    assert len(configs) == 2  # args varies; strategy and precision do not apply
    assert [c.label for c in configs] == ["command n=2: python t.py --bs 8", "command n=2: python t.py --bs 16"]
    assert all(c.config_id.startswith("command-n2-") and c.skip_reason is None for c in configs)
    assert configs[0].identity() != configs[1].identity()
    # gpt configs are not changed by the command keys: pinned to their defaults there
    [gpt] = expand(parse_suite('[sweep]\nargs = "--bs 8"\nstep_pattern = "x"\n'), "cpu", 4)
    assert gpt.args == "" and gpt.step_pattern == "" and gpt.workload == "gpt"


@pytest.mark.parametrize("sweep, message", [
    ('workload = "command"\ncommand = "python t.py"\nstep_pattern = "step (\\\\d+"', "not a valid regular expression"),
    ('workload = "command"\n', 'needs command = "..."'),
    ('workload = "command"\ncommand = "python \'t.py"', "balance its quotes"),
])
def test_bad_command_suites_fail_with_one_line(sweep, message):
    with pytest.raises(MgbenchError, match=message):
        expand(parse_suite(f"[sweep]\n{sweep}\n"), "cpu", 4)


def test_bad_regex_through_the_cli_exits_2_with_one_line(cli):
    p = cli("run", "--set", "workload=\"command\"", "--set", "command=\"python t.py\"",
            "--set", "step_pattern=\"step (\\\\d+\"", "smoke")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "step_pattern" in lines[0] and "regular expression" in lines[0], p.stderr


# --- running: the no-match, interrupt and command-not-found paths (as-given commands: no torchrun) --

def _run_dir(tmp_path) -> RunDir:
    return RunDir.create(tmp_path, "r")


def test_a_pattern_that_never_matches_is_an_error_saying_so(tmp_path):
    cfg = command_config("command = \"/bin/sh -c 'echo hello; echo world'\"\nstep_pattern = 'step \\d+'")
    rec = command.run_command_config(_run_dir(tmp_path), "r", cfg, lambda: False)
    assert rec.status == "error" and rec.exit_code == 0
    assert "matched no line of the command's output" in rec.error and "step \\d+" in rec.error
    assert rec.correct is None and rec.correct_reason == "not checked: the user's own command"
    assert (tmp_path / "r" / rec.log_file).read_text() == "hello\nworld\n"


def test_a_step_file_of_malformed_lines_is_an_error_saying_so(tmp_path):
    # The step file wins over step_pattern; one with no readable line must say so, not
    # blame the pattern (which did match) or claim no file was written.
    cfg = command_config("""command = '''/bin/sh -c 'echo garbage >> "$MGBENCH_STEP_FILE"; echo step 1; echo step 2' '''
step_pattern = 'step \\d+'""")
    rec = command.run_command_config(_run_dir(tmp_path), "r", cfg, lambda: False)
    assert rec.status == "error" and rec.step_source == "step_file" and rec.step_file_malformed == 1
    assert "step file MGBENCH_STEP_FILE names holds no step: 1 line(s)" in rec.error, rec.error


def test_a_signal_stops_the_command_tree_and_records_interrupted(tmp_path):
    cfg = command_config(f'command = "{SCRIPTS / "hang.py"}"\nstep_pattern = "step"')
    run_dir, t0 = _run_dir(tmp_path), time.monotonic()
    log = run_dir.command_log(cfg.config_id)
    # The "signal" arrives once the script has logged its step (or after 20 s on a slow machine).
    rec = command.run_command_config(run_dir, "r", cfg, lambda: "step 1" in log.read_text()
                                     or time.monotonic() - t0 > 20)
    assert rec.status == "interrupted" and rec.exit_code is not None and rec.exit_code < 0
    assert rec.num_steps_seen == 1 and time.monotonic() - t0 < 25


def test_a_missing_program_is_an_error_naming_it(tmp_path):
    cfg = command_config('command = "/no/such/trainer --x"')
    rec = command.run_command_config(_run_dir(tmp_path), "r", cfg, lambda: False)
    assert rec.status == "error" and "/no/such/trainer" in rec.error


# --- GPU figures from outside: NVML's real function names, a fake host -----------------------

@dataclass
class _Proc:  # what nvmlDeviceGetComputeRunningProcesses lists: pid and usedGpuMemory
    pid: int
    usedGpuMemory: int


class ProcNVML(FakeNVML):
    """The fake host, with processes on its GPUs and an energy counter on a settable clock."""

    procs: dict = {}
    now_ns: int = 0

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self.procs.get(h, [])

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return int(self.now_ns / 1e9 * self.gpus[h].power_w * 1000)  # mJ at the clock's time


def test_gpu_watch_reads_the_gpus_the_command_runs_on(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = ProcNVML(host(4, power_w=250.0))
    me = os.getpid()
    nv.procs = {1: [_Proc(me, 3 * 2**30), _Proc(1, 5 * 2**30)], 2: [_Proc(me, 2**30)]}  # pid 1: not the command's
    clock = iter(range(0, 20_000_000_000, 1_000_000_000))
    watch = gpu_watch.GpuWatch(nproc=2, nvml=nv)
    watch.method, watch.update_s = "nvml_counter", 0.1
    monkeypatch.setattr(gpu_watch.time, "time_ns", lambda: nv.now_ns)
    for _ in range(10):
        nv.now_ns = next(clock)
        watch.sample(me)
    f = watch.figures(1_500_000_000, 7_500_000_000, tokens=6000.0, steps=6)
    assert [d.split(":")[0] for d in f["gpu_devices"]] == ["NVML index 1", "NVML index 2"]
    assert f["mem_peak_gib"] == pytest.approx(3.0)  # the command's process only
    assert f["energy_j"] == pytest.approx(2 * 250.0 * 6.0) and f["power_w"] == pytest.approx(500.0)
    assert f["power_w_per_device"] == pytest.approx(250.0) and f["energy_per_token_j"] == pytest.approx(0.5)
    short = watch.figures(1_000_000_000, 2_000_000_000, tokens=10.0, steps=2)
    assert short["energy_j"] is None and "shorter than the 5.0 s" in short["energy_reason"]


def test_gpu_watch_figures_are_null_when_the_command_cannot_be_tied_to_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = ProcNVML(host(4))
    nv.procs = {}
    watch = gpu_watch.GpuWatch(nproc=2, nvml=nv)
    watch.method = "nvml_counter"
    watch.sample(os.getpid())
    f = watch.figures(0, 10**10, tokens=None, steps=3)
    assert f["energy_j"] is None and "which GPUs the command used is unknown" in f["energy_reason"]
    assert "mem_peak_gib" not in f and f["mem_reason"] == f["energy_reason"]
    everyone = gpu_watch.GpuWatch(nproc=4, nvml=nv)  # all visible GPUs are the nproc it uses
    everyone.method = "nvml_counter"
    assert len(everyone.figures(None, None, None, 0)["gpu_devices"]) == 4


def test_every_record_figure_is_declared_once():
    # A dataclass takes a second declaration of a name silently (the last help text wins):
    # tokens_reason was once declared by the vision and the command workloads both.
    import ast
    import inspect

    from mgbench import record

    body = next(n for n in ast.parse(inspect.getsource(record)).body
                if isinstance(n, ast.ClassDef) and n.name == "Record").body
    names = [n.target.id for n in body if isinstance(n, ast.AnnAssign)]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_gpu_watch_names_gpus_as_cuda_visible_devices_does(monkeypatch):
    # CUDA accepts a UUID prefix (GPU-xxxx) in CUDA_VISIBLE_DEVICES: resolved like the
    # built-in workloads' NVML lookup, not refused as an unknown full UUID.
    nv = ProcNVML(host(4))
    third = nv.gpus[2].uuid
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{third[:12]},1")
    # A number is CUDA's, fastest GPU first by default: NVML's index only in PCI order.
    unordered = gpu_watch.GpuWatch(nproc=2, nvml=nv)
    assert unordered._handles == [] and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in unordered.reason
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    watch = gpu_watch.GpuWatch(nproc=2, nvml=ProcNVML(host(4)))
    assert watch.reason is None and [h for _, h in watch._handles] == [2, 1]
    # A MIG instance: the GPU's power is not the command's alone, so the figures are null
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-0123")
    mig = gpu_watch.GpuWatch(nproc=1, nvml=nv)
    assert mig.figures(0, 10**10, None, 3)["energy_j"] is None and "MIG" in mig.reason


def test_gpu_watch_releases_nvml_when_stopped():
    calls = []

    class Counted(ProcNVML):
        def nvmlInit(self):
            calls.append("init")

        def nvmlShutdown(self):
            calls.append("shutdown")

    for _ in range(3):  # one watch per command config of a sweep
        watch = gpu_watch.GpuWatch(nproc=1, nvml=Counted(host(1)))
        watch.stop()
    assert calls == ["init", "shutdown"] * 3


def test_gpu_watch_without_energy_or_power_still_reads_memory(monkeypatch):
    # A GPU whose NVML has neither the energy counter nor a power reading: energy is null
    # with that reason (energy.nvml_method, shared with the built-in workloads' meter),
    # and the command's memory is still reported.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    class NoPower(ProcNVML):
        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            raise RuntimeError("not supported")

        def nvmlDeviceGetPowerUsage(self, h):
            raise RuntimeError("not supported")

    nv = NoPower(host(1))
    me = os.getpid()
    nv.procs = {0: [_Proc(me, 2**30)]}
    watch = gpu_watch.GpuWatch(nproc=1, nvml=nv)
    watch.probe()
    assert watch.method == "none" and "neither energy counter nor power" in watch.energy_reason
    watch.sample(me)
    f = watch.figures(0, 10**10, tokens=100.0, steps=3)
    assert f["energy_j"] is None and "neither energy counter nor power" in f["energy_reason"]
    assert f["mem_peak_gib"] == pytest.approx(1.0)


def test_power_figures_by_hand():
    from mgbench.telemetry.energy import power_figures

    assert power_figures(600.0, 2.0, 4, 1200.0) == {"power_w": 300.0, "power_w_per_device": 75.0,
                                                   "energy_per_token_j": 0.5}
    # Per device unknown (CPU package), no window, no tokens: null, never a guess.
    assert power_figures(600.0, 2.0, None, None) == {"power_w": 300.0, "power_w_per_device": None,
                                                    "energy_per_token_j": None}
    assert power_figures(None, 2.0, 4, 10.0)["power_w"] is None and power_figures(5.0, 0.0, 1, 1.0)["power_w"] is None


def test_a_python_line_naming_no_script_is_refused_saying_how():
    with pytest.raises(command.CommandLineError, match="names no script: give `python SCRIPT.py"):
        command.command_argv(command_config('command = "python3"'))
    with pytest.raises(command.CommandLineError, match="command is empty"):
        command.command_argv(command_config('command = "python3"', command=""))


def test_a_multi_node_launch_skips_the_command_workload_saying_why():
    from mgbench.launching import Cluster
    from mgbench.runner.launch import _only_world

    cmd = command_config('command = "python3 train.py"\nnproc = 4')
    cluster = Cluster(nnodes=2, node_rank=0, rdzv_endpoint="head:29400", nproc_per_node=2)
    [got] = _only_world([cmd], cluster)
    assert "runs the user's launch line on one node" in got.skip_reason


# --- a launch line that starts fewer processes than nproc (issue 30, item 14) ---------------

def test_fewer_ranks_than_nproc_are_said_and_per_device_figures_divide_by_those_that_ran(tmp_path):
    # As `accelerate launch --cpu --num_processes 2` does: one process, while nproc = 2.
    script = tmp_path / "one_process.py"
    script.write_text(f"#!{sys.executable}\nimport time, mgbench\n"
                      "for _ in range(6):\n    time.sleep(0.02)\n    mgbench.step(tokens=100)\n")
    script.chmod(0o755)
    cfg = command_config(f'command = "{script}"\nnproc = 2\nwarmup_steps = 1')
    run_dir = _run_dir(tmp_path)
    rec = command.run_command_config(run_dir, "r", cfg, lambda: False)
    assert rec.status == "ok" and rec.step_source == "step_file", rec.error
    assert rec.ranks_reported == 1
    assert rec.tokens_per_s_per_device == pytest.approx(rec.tokens_per_s)  # one device ran, not two
    assert rec.ranks_warning.startswith("only 1 of nproc = 2 ranks reported steps")
    from mgbench import store
    from mgbench.report.html import warnings
    from mgbench.show import render

    store.write_manifest(run_dir, {"run_id": "r", "status": "complete", "suite": {"name": "c"},
                                   "machine": {"cpu_model": "test"}})
    store.append_record(run_dir, rec)

    notes = render(run_dir.path).split("notes:")[1]
    assert f"{cfg.config_id}: only 1 of nproc = 2 ranks reported steps" in notes
    assert any("only 1 of nproc = 2 ranks reported steps" in w for w in warnings(store.load([run_dir.path])))


def test_as_many_ranks_as_nproc_give_no_warning():
    ends = StepEnds(ends_ns=[0, 10, 20, 30], tokens=[8] * 4, ranks=2)
    cfg = command_config('command = "accelerate launch t.py"\nnproc = 2')
    assert command._ranks_that_ran(cfg, ends, "step_file") == (2, None)
    assert command._ranks_that_ran(cfg, replace(ends, ranks=1), "step_pattern") == (2, None)  # the log cannot tell
