"""``workload = "command"``: run the user's own training launch and measure it from
outside (launcher side; torch-free).

The command line (``command`` + ``args``) runs in a session of its own, so its whole
process tree can be stopped. A line starting with ``python`` (``python train.py ...``,
``python -m pkg.train ...``) is run under torchrun with ``nproc`` ranks, by that same
interpreter; anything else (``torchrun ...``, ``accelerate launch ...``,
``deepspeed ...``, ``python -m torch.distributed.run ...``, a shell script) runs as
given, and ``nproc`` then says how many devices it uses (for per-device figures and the
GPUs NVML reads). No shell is involved: wrap pipes or variable assignments in
``bash -c '...'``.

The command's environment adds (beside what torchrun sets for its ranks):

- ``MGBENCH_STEP_FILE``: the step file :func:`mgbench.step` appends to
  (protocol: :mod:`mgbench.step_events`);
- ``MGBENCH_CONFIG_ID``, ``MGBENCH_NPROC``, ``MGBENCH_WARMUP_STEPS``, ``MGBENCH_DEVICE``
  (cpu or cuda): a script may read them to know it runs under mgbench;
- ``PYTHONPATH`` led by mgbench's own folder (``import mgbench`` works in any
  interpreter), ``PYTHONUNBUFFERED=1`` (log lines arrive as they are printed: the
  step_pattern times them on arrival), and on CPU ``OMP_NUM_THREADS`` (the cores shared
  between ranks) and an empty ``CUDA_VISIBLE_DEVICES`` (``device = "cpu"`` hides GPUs).

Step ends come from the step file when the command wrote one, else from the lines
matching ``step_pattern``. Step k's time is end(k) - end(k-1); the first
``warmup_steps`` steps (and the first step, which has no start) are dropped.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from typing import IO, Any, Callable

from .. import stats, store
from ..config import RunConfig
from ..launching import child_env
from ..procs import die_with_parent, kill_tree
from ..record import Record
from ..step_events import STEP_FILE_ENV, StepEnds, match_log, read_step_file
from ..store import RunDir

_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
# `python -m X` where X is itself a launcher: run as given.
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                     "deepspeed.launcher.runner")
STDERR_TAIL_LINES = 20
# A line that names an exception ("RuntimeError: ...", "[rank0]: torch.OutOfMemoryError: ...").
EXCEPTION_LINE = re.compile(r"^\s*(\[rank\d+\]:\s*)?[\w.]*(Error|Exception|Interrupt)\b")
# Where torchrun's own report of a failed child begins (its elastic agent's log line).
_TORCHRUN_REPORT = re.compile(r"torch[./]distributed[./]elastic")
_OOM = ("OutOfMemoryError", "CUDA out of memory")


class CommandLineError(ValueError):
    """A command line mgbench cannot launch as asked; the message says how to fix it."""


def command_argv(cfg: RunConfig) -> list[str]:
    """The argv mgbench runs for a command config (see the module docstring)."""
    words = shlex.split(cfg.command) + shlex.split(cfg.args)
    if not words:
        raise CommandLineError("command is empty")
    if not _PYTHON.fullmatch(os.path.basename(words[0])):
        return words
    rest = [w for w in words[1:] if w != "-u"]  # torchrun runs its ranks unbuffered anyway
    if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in _LAUNCHER_MODULES:
        return words
    if not rest:
        raise CommandLineError(f"command {cfg.command!r} names no script: give `python SCRIPT.py ...`")
    if rest[0].startswith("-") and rest[0] != "-m":
        raise CommandLineError(f"python option {rest[0]!r} before the script cannot pass through torchrun: drop it, "
                               "or give your own `torchrun ...` line")
    return [words[0], "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={cfg.nproc}", *rest]


def command_env(cfg: RunConfig, run_dir: RunDir) -> dict[str, str]:
    """The command's environment (see the module docstring)."""
    env = child_env(cfg.nproc, cfg.device, f"command-{cfg.config_id}")
    env.update({STEP_FILE_ENV: str(run_dir.step_file(cfg.config_id).resolve()), "MGBENCH_CONFIG_ID": cfg.config_id,
                "MGBENCH_NPROC": str(cfg.nproc), "MGBENCH_WARMUP_STEPS": str(cfg.warmup_steps),
                "MGBENCH_DEVICE": cfg.device})
    if cfg.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class _Output:
    """Reads the command's stdout and stderr as they come: every line into the log,
    the lines matching step_pattern with their arrival time, stderr's last lines."""

    def __init__(self, proc: subprocess.Popen, log: IO[bytes], pattern: str) -> None:
        self.matched: list[tuple[int, str]] = []
        self.write_error: OSError | None = None  # the log could not be written (a full disk)
        self.stderr = collections.deque(maxlen=STDERR_TAIL_LINES)
        # stderr split where torchrun's own report of a failed child begins: the command's
        # last lines before it (its cause), and the report (the child's exit status).
        self.before_report: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.report: collections.deque[str] = collections.deque(maxlen=400)
        self._rx = re.compile(pattern) if pattern else None
        self._log, self._lock = log, threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(s, err), daemon=True)
                         for s, err in ((proc.stdout, False), (proc.stderr, True))]
        for t in self._threads:
            t.start()

    def _read(self, stream: IO[bytes], is_err: bool) -> None:
        for raw in iter(stream.readline, b""):
            t = time.time_ns()
            line = raw.decode(errors="replace").rstrip("\n")
            if self._rx is not None and self._rx.search(line):
                self.matched.append((t, line))
            if is_err:
                self.stderr.append(line)
                if self.report or _TORCHRUN_REPORT.search(line):
                    self.report.append(line)
                else:
                    self.before_report.append(line)
            with self._lock:
                if self.write_error is None:
                    try:
                        self._log.write((line + "\n").encode())
                    except OSError as e:
                        # Keep reading (a command whose pipe is not drained blocks); the
                        # launcher raises it once the command has ended.
                        self.write_error = e

    def join(self, timeout_s: float = 10.0) -> None:
        for t in self._threads:
            t.join(timeout_s)


def step_figures(ends: StepEnds, warmup_steps: int, tokens_per_step: int | None,
                 nproc: int) -> tuple[dict[str, Any], str | None]:
    """Record fields from step ends: step-time statistics of the steps after the warm-up,
    tokens/s; and why the config cannot be ok (None: it can)."""
    n = len(ends.ends_ns)
    first = max(warmup_steps, 1)  # index of the end that opens the measured window
    times = [(b - a) / 1e9 for a, b in zip(ends.ends_ns[first - 1:], ends.ends_ns[first:])]
    out: dict[str, Any] = {"num_steps_seen": n}
    if len(times) < 2:
        return out, (f"the command reported {n} finished step(s); with warmup_steps = {warmup_steps} that leaves "
                     f"{len(times)} timed step(s), and at least 2 are needed: run more steps or lower warmup_steps")
    out.update(stats.step_time_fields(times), step_times_s=times, num_steps_measured=len(times),
               window_ns=(ends.ends_ns[first - 1], ends.ends_ns[-1]))
    median = out["step_time_s"]
    out["repeat_medians_s"] = [median]
    tokens = ends.tokens[first:]
    if tokens and all(t is not None for t in tokens):
        # Tokens the command reported: a constant count per step over the median step
        # time (as for built-in workloads); a varying one as the window's total over its time.
        per = tokens[0] if len(set(tokens)) == 1 else None
        tps = per / median if per else sum(tokens) / sum(times)  # type: ignore[arg-type]
        out.update(tokens_per_step=per, tokens_per_s=tps, window_tokens=sum(tokens))  # type: ignore[arg-type]
    elif tokens_per_step:
        out.update(tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_step / median,
                   window_tokens=tokens_per_step * len(times))
    else:
        out["tokens_reason"] = ("no tokens per step: pass mgbench.step(tokens=N), a (?P<tokens>...) group in "
                                "step_pattern, or tokens_per_step in the suite")
    if out.get("tokens_per_s") is not None:
        out["tokens_per_s_per_device"] = out["tokens_per_s"] / nproc
    return out, None


def read_steps(cfg: RunConfig, run_dir: RunDir, matched: list[tuple[int, str]]) -> tuple[StepEnds, str]:
    """The step ends of a finished command: its step file when it wrote one, else its
    log lines matching step_pattern; and which source it was."""
    path = run_dir.step_file(cfg.config_id)
    if path.exists() and path.stat().st_size:
        return read_step_file(path.read_text(errors="replace").splitlines()), "step_file"
    return match_log(matched, cfg.step_pattern) if cfg.step_pattern else StepEnds(ranks=0), "step_pattern"


def run_command_config(run_dir: RunDir, run_id: str, cfg: RunConfig, stopped: Callable[[], bool],
                       gpu_watch: Callable[[int], Any] | None = None) -> Record:
    """Run one command config to its end, timeout or interruption; returns its record
    (the caller appends it). ``stopped()`` is polled: True stops the command
    (SIGINT / SIGTERM of `mgbench run`)."""
    started = dt.datetime.now().isoformat(timespec="seconds")
    log_path, step_path = run_dir.command_log(cfg.config_id), run_dir.step_file(cfg.config_id)
    step_path.unlink(missing_ok=True)  # a resumed config starts a fresh step file
    common: dict[str, Any] = {"started_at": started, "log_file": run_dir.relative(log_path)}
    try:
        argv = command_argv(cfg)
    except CommandLineError as e:
        return Record.failed(cfg, run_id, "error", str(e), error_type="CommandLineError", **common)
    common["command_argv"] = argv
    # Unbuffered: every line is on disk as it comes, and a write that fails (a full disk)
    # leaves nothing behind for close() to fail on again.
    with open(log_path, "wb", buffering=0) as log:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=command_env(cfg, run_dir), start_new_session=True,
                                    preexec_fn=die_with_parent)
        except OSError as e:
            return Record.failed(cfg, run_id, "error", f"cannot start {argv[0]!r}: {e.strerror}; check the "
                                 "command's first word (a path, or a program on PATH)", error_type="OSError", **common)
        out = _Output(proc, log, cfg.step_pattern)
        watch = (gpu_watch or _default_watch)(cfg.nproc) if cfg.device == "cuda" else None
        if watch is not None:
            watch.start(proc.pid)
        killed_for = None
        while proc.poll() is None:
            if stopped():
                killed_for = "interrupted"
            elif time.monotonic() - t0 > cfg.timeout_s:
                killed_for = "timeout"
            if killed_for:
                kill_tree(proc.pid)
                break
            time.sleep(0.1)
        proc.wait()
        wall = time.monotonic() - t0
        _kill_group(proc.pid)  # what the command left behind in its session
        out.join()
        if watch is not None:
            watch.stop()
    if out.write_error is not None:
        e = out.write_error
        raise OSError(e.errno, e.strerror, e.filename or str(log_path)) from e  # the launcher says so
    ends, source = read_steps(cfg, run_dir, out.matched)
    ran, ranks_warning = _ranks_that_ran(cfg, ends, source)
    fields, problem = step_figures(ends, cfg.warmup_steps, cfg.tokens_per_step, ran)
    if killed_for or proc.returncode != 0:
        fields = {"num_steps_seen": fields["num_steps_seen"]}  # no statistics of a run that did not finish
    window, window_tokens = fields.pop("window_ns", None), fields.pop("window_tokens", None)
    tail = "\n".join(out.stderr)
    common.update(finished_at=dt.datetime.now().isoformat(timespec="seconds"), exit_code=proc.returncode, wall_s=wall, stderr_tail=tail or None, step_source=source,
                  step_file_malformed=ends.malformed if source == "step_file" else None)
    if watch is not None:
        common.update(watch.figures(*(window or (None, None)), window_tokens, fields.get("num_steps_measured") or 0))
    else:
        why = "on CPU a command's memory and energy are not measured (mgbench reads them from NVML on GPUs)"
        common.update(energy_method="none", energy_reason=why, mem_reason=why)
    common.update(fields)
    common.update(correct=None, correct_reason="not checked: the user's own command")
    if source == "step_file":
        common.update(ranks_reported=ends.ranks, ranks_warning=ranks_warning)
    if killed_for == "timeout":
        return Record.failed(cfg, run_id, "timeout", f"still running after timeout_s = {cfg.timeout_s} s (a hang?); "
                             "the command's process tree was stopped", **common)
    if killed_for == "interrupted":
        return Record.failed(cfg, run_id, "interrupted", "stopped by a signal while this config ran", **common)
    if proc.returncode != 0:
        last = _error_line(out.before_report, out.stderr)
        status = "oom" if any(w in tail for w in _OOM) else "error"
        child = _child_exit(out.report)
        code = f"{child} (torchrun {proc.returncode})" if child is not None and child != proc.returncode \
            else f"{proc.returncode}"
        return Record.failed(cfg, run_id, status, f"the command exited with status {code}"
                             + (f": {last.strip()[:300]}" if last else "") + f" (log: {common['log_file']})",
                             error_type="CommandFailed", **common)
    if not ends.ends_ns:
        problem = _no_steps(cfg, ends, source)
    if problem:
        return Record.failed(cfg, run_id, "error", problem + f" (log: {common['log_file']})",
                             error_type="NoSteps", **common)
    sample = run_dir.sample(cfg.config_id)
    store.write_json_atomic(sample, {"config_id": cfg.config_id, "step_source": source, "step_ends_ns": ends.ends_ns,
                                     "step_tokens": ends.tokens, "step_times_s": fields["step_times_s"]})
    return Record(cfg, run_id, "ok", samples_file=run_dir.relative(sample), **common)


def _ranks_that_ran(cfg: RunConfig, ends: StepEnds, source: str) -> tuple[int, str | None]:
    """The ranks per-device figures divide by, and a warning when they are not nproc.

    A launch line given as is (``accelerate launch --cpu --num_processes 2`` starts one
    process) may run another number of processes than the config's nproc. The step file
    names the rank of each event, so when it holds another number of ranks, those that
    ran are the devices: dividing by nproc would halve (or double) every per-device
    figure. A step_pattern's log lines do not say which rank wrote them: nproc stands."""
    if source != "step_file" or ends.ranks in (0, cfg.nproc):
        return cfg.nproc, None
    r, n = ends.ranks, cfg.nproc
    why = (f"only {r} of nproc = {n} ranks reported steps: the launch line started fewer processes than nproc (or "
           "only some ranks call mgbench.step())" if r < n else
           f"{r} ranks reported steps but nproc = {n}: the launch line started more processes than nproc")
    return r, f"{why}; per-device figures are divided by the {r} rank(s) that reported"


def _error_line(before_report: Any, tail: Any = ()) -> str:
    """The line that says what failed: the last exception line the command wrote before
    torchrun's own report of it began (``before_report``), else its last line with words;
    without such lines (no torchrun, or the report is all there is), the same from
    ``tail``, torchrun's ChildFailedError lines and its "To enable traceback" left out."""
    def own(lines: Any) -> list[str]:  # what torchrun itself wrote left out
        return [ln for ln in lines if not _TORCHRUN_REPORT.search(ln) and "ChildFailedError" not in ln
                and "To enable traceback" not in ln]

    for lines in (own(before_report), own(tail)):
        exc = [ln for ln in lines if EXCEPTION_LINE.search(ln)]
        words = [ln for ln in lines if any(c.isalnum() for c in ln)]
        if exc or words:
            return (exc or words)[-1]
    return ""


def _child_exit(report: Any) -> int | None:
    """The failed child's own exit status in torchrun's report: its "Root Cause" entry
    ("exitcode : 2"), not another rank's it stopped (-15); torchrun itself exits 1."""
    lines = list(report)
    root = next((i for i, ln in enumerate(lines) if "Root Cause" in ln), 0)
    for ln in lines[root:]:
        if (m := re.search(r"\bexitcode\s*[:=]?\s*\(?(-?\d+)", ln)):
            return int(m.group(1))
    return None


def _no_steps(cfg: RunConfig, ends: StepEnds, source: str) -> str:
    if source == "step_file":  # it wrote one (which wins over step_pattern), but no line of it reads as a step
        return (f"the step file {STEP_FILE_ENV} names holds no step: {ends.malformed} line(s) of it are not "
                "'<time_ns> <tokens or -> <rank>' (write them through mgbench.step())")
    if cfg.step_pattern:
        return (f"step_pattern '{cfg.step_pattern}' matched no line of the command's output, and it wrote no step "
                "file: check the pattern against the log")
    return ("the command reported no steps: call mgbench.step() after each optimizer step, or set step_pattern "
            "to a regex matching its per-step log line")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _default_watch(nproc: int) -> Any:
    from ..telemetry.gpu_watch import GpuWatch

    return GpuWatch(nproc)
