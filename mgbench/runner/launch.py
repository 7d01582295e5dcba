"""Parent side of `mgbench run`: expand a suite, launch one torchrun job per world
size, follow progress, and leave a complete run folder whatever happens to the jobs.

Failures are isolated per config. A rank that fails a config (OOM, exception) writes
its failure file and exits; torchrun stops the other ranks; this launcher records the
config and relaunches torchrun for the rest of the group. A config that runs past its
``timeout_s`` is a hang: the job is killed and the config recorded as `timeout`. A
rank that dies without a word (SIGKILL, segfault) is an `error` with each rank's
stderr tail saved beside the records. SIGINT / SIGTERM stop the sweep cleanly: the
running config is recorded as `interrupted`, finished ones stay, and `--resume` runs
the rest. A results folder that takes no more writes (a full disk, a quota, a
read-only or foreign folder) ends the run with one line saying so: the records written
so far stay, and `--resume` runs the rest once it is writable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import store
from ..config import RunConfig
from ..dataset import prepare_configs
from ..errors import MgbenchError
from ..launching import (RANK_BANNER, SHARED_FS_WAIT_S, Cluster, child_env, detect_devices, rank_of_stderr,
                         torchrun_argv)
from ..procs import die_with_parent, kill_tree
from .command import run_command_config
from ..record import SCHEMA_VERSION, Record, control_verdict
from ..show import clock
from ..store import RunDir
from ..suite import Suite, expand
from ..telemetry.interconnect import detect
from ..telemetry.machine import fingerprint

Progress = Callable[[str], None]
HEARTBEAT_S = 30.0  # seconds between "still running" lines of one long config
STARTUP_LIMIT_S = 300  # a job that has not started its first config by then is stuck


def describe(rec: dict[str, Any]) -> str:
    """One progress line for a finished config."""
    if rec["status"] == "ok" and rec.get("workload") == "command":
        tps = f"{rec['tokens_per_s']:,.0f} tok/s, " if rec.get("tokens_per_s") is not None else ""
        return f"ok  {tps}step {rec['step_time_s'] * 1000:.1f} ms over {rec['num_steps_measured']} steps"
    if rec["status"] == "ok":
        wrong = "WRONG: " + "/".join(rec.get("check_mismatches") or ["results"]) + " differ from the reference"
        corr = {True: "correct", False: wrong, None: "unchecked"}[rec.get("correct")]
        slow = f", straggler rank(s) {rec['straggler_ranks']}" if rec.get("straggler_ranks") else ""
        rate = (f"{rec['images_per_s']:,.1f} images/s" if rec.get("tokens_per_s") is None
                and rec.get("images_per_s") is not None else f"{rec['tokens_per_s']:,.0f} tok/s")
        return f"ok  {rate}, step {rec['step_time_s'] * 1000:.1f} ms, {corr}{slow}"
    if rec["status"] == "checked":
        return f"checked (negative control, not timed): {control_verdict(rec)}"
    return f"{rec['status']}: {rec.get('error') or rec.get('skip_reason')}"


class StopFlag:
    """Set by SIGINT / SIGTERM; the launcher checks it between polls."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signum


def run_suite(
    suite: Suite,
    results_dir: str | Path = "results",
    run_id: str | None = None,
    device_kind: str | None = None,
    num_devices: int | None = None,
    progress: Progress = print,
    argv: list[str] | None = None,
    resume: str | None = None,
    cluster: Cluster | None = None,
) -> Path:
    """Run every config of a suite (or, with ``resume``, the configs a run folder does
    not have yet); returns the run folder. Callable from tests. With ``cluster``, this
    is one node of a multi-node launch (every node calls it with the same suite and run)."""
    if device_kind is None or num_devices is None:
        device_kind, num_devices = detect_devices()
    if cluster is not None:
        num_devices = cluster.world
    if cluster is not None and not cluster.leader:
        return _follow(suite, results_dir, run_id or resume, device_kind, num_devices, progress, cluster)
    if resume:
        run_dir = RunDir(store.resolve_run(resume, results_dir))
        manifest = store.read_manifest(run_dir)
        run_id = manifest["run_id"]
        repaired = store.repair_tail(run_dir)
        if repaired:
            progress(f"records.jsonl: dropped a half-written last line ({repaired} bytes) left by the kill")
        configs = with_data(expand(suite, device_kind, num_devices), results_dir, progress)
        done = store.recorded_configs(store.read_records(run_dir))
        todo = [c for c in configs if c.config_id not in done]
        progress(f"resuming {run_id}: {len(configs) - len(todo)} of {len(configs)} configs already recorded")
        # This process now runs it: `mgbench status` reads the pid and host to tell it from a dead run.
        manifest.update(status="running", resumed_at=dt.datetime.now().isoformat(timespec="seconds"), pid=os.getpid(),
                        machine={**manifest.get("machine", {}), "hostname": socket.gethostname()})
    else:
        configs = with_data(expand(suite, device_kind, num_devices), results_dir, progress)
        todo = configs
        run_dir, manifest = create_run(suite, results_dir, run_id, device_kind, num_devices, argv,
                                       num_configs=len(configs))
        run_id = manifest["run_id"]
    if cluster is not None:
        manifest["cluster"] = cluster.manifest_entry()
        configs = _only_world(configs, cluster)
        todo = [c for c in configs if c.config_id in {t.config_id for t in todo}]
    stop = StopFlag()
    with _results_writable(run_dir, run_id, manifest):
        store.write_manifest(run_dir, manifest)
        old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            _run_configs(run_dir, run_id, configs, todo, progress, stop, cluster)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        nodes = run_dir.nodes()
        if nodes:
            manifest["nodes"] = [json.loads(p.read_text()) for p in nodes]

        counts: dict[str, int] = defaultdict(int)
        latest = store.latest_records(store.read_records(run_dir))
        for r in latest:
            counts[r["status"]] += 1
        interrupted = final_status(bool(stop.signal), configs, latest) == "interrupted"
        manifest.update(status="interrupted" if interrupted else "complete",
                        finished_at=dt.datetime.now().isoformat(timespec="seconds"), counts=dict(counts))
        store.write_manifest(run_dir, manifest)
    if interrupted:
        progress(f"stopped by {signal.Signals(stop.signal).name}: finished configs are kept; "
                 f"continue with `mgbench run --resume {run_id}`")
    return run_dir.path


def _progress_now(path: Path) -> dict[str, Any] | None:
    """The job's progress file as the launcher polls it: None while absent, half-written or
    damaged (store.read_progress names damage, which `mgbench status` reports; a sweep that
    is measuring must not stop for a heartbeat file: its timeout and startup limits still act)."""
    try:
        return store.read_progress(path)
    except MgbenchError:
        return None


def final_status(signalled: bool, configs: list[RunConfig], latest: list[dict[str, Any]]) -> str:
    """A finished sweep's status: "interrupted" where a signal stopped it before every config
    had a record (an interrupted one's does not count: a resume runs it again), else
    "complete" (a signal that came once every config was recorded interrupted nothing)."""
    done = store.recorded_configs(latest)
    return "interrupted" if signalled and any(c.config_id not in done for c in configs) else "complete"


def create_run(suite: Suite, results_dir: str | Path, run_id: str | None, device_kind: str, num_devices: int,
               argv: list[str] | None = None, status: str = "running",
               num_configs: int | None = None) -> tuple[RunDir, dict[str, Any]]:
    """A new run folder and its manifest (suite text and sweep, machine, interconnect)."""
    run_id = run_id or store.new_run_id(suite.name)
    run_dir = RunDir.create(results_dir, run_id)
    manifest = {
        "run_id": run_id,
        "status": status,
        "started_at": dt.datetime.now().isoformat(timespec="seconds"),
        "finished_at": None,
        "argv": argv or sys.argv,
        "pid": os.getpid(),  # the mgbench process: `mgbench status` tells a killed run from a running one
        "suite": {"name": suite.name, "description": suite.description, "path": suite.path,
                  "sha256": suite.sha256, "text": suite.text, "sweeps": suite.sweeps},
        "device_kind": device_kind,
        "num_devices": num_devices,
        "num_configs": num_configs if num_configs is not None else len(expand(suite, device_kind, num_devices)),
        "machine": fingerprint(),
        "interconnect": detect(),
        "schema_version": SCHEMA_VERSION,
    }
    try:
        store.write_manifest(run_dir, manifest)
    except OSError as e:  # a folder without its manifest is no run: leave the id free for the next try
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise MgbenchError(f"cannot create run folder {run_dir}: {e.strerror} while writing its manifest; free space "
                           "or pass a writable --results-dir") from None
    return run_dir, manifest


# Write errors that mean the results folder takes no more writes, and what frees it: the
# run stops there, saying so, and --resume continues it (records are appended whole and
# fsynced one by one, so those already written stay).
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}
WRITE_REFUSED = _FULL | _READ_ONLY


@contextlib.contextmanager
def _results_writable(run_dir: RunDir, run_id: str, manifest: dict[str, Any] | None = None) -> Iterator[None]:
    """Turn a write into ``run_dir`` that the folder refused (full, over quota,
    read-only, not ours) into one line naming the folder, the file and how to continue;
    any other OSError stays what it is."""
    try:
        yield
    except OSError as e:
        root = run_dir.path.resolve()
        named = isinstance(e.filename, (str, bytes, os.PathLike))
        where = Path(os.fsdecode(e.filename)).resolve() if named else None
        inside = where is not None and where.is_relative_to(root)
        # Not a write the folder refused: another errno, a file elsewhere, or a permission
        # error naming no file (a signal to a process).
        if e.errno not in WRITE_REFUSED or (not inside and (where is not None or e.errno in _READ_ONLY)):
            raise
        if manifest is not None:  # not "running" any more, if the manifest can still be written
            with contextlib.suppress(OSError):
                store.write_manifest(run_dir, {**manifest, "status": "interrupted"})
        what = str(where.relative_to(root)) if where is not None else "its files"
        fix = "free space" if e.errno in _FULL else "make it writable"
        raise MgbenchError(f"{run_dir}: {os.strerror(e.errno).lower()} while writing {what}; {fix} and continue "
                           f"with `mgbench run --resume {run_id}`") from None


def with_data(configs: list[RunConfig], results_dir: str | Path, progress: Progress) -> list[RunConfig]:
    """Every data = "disk" config with its dataset checked or generated (once, in the
    results folder's datasets/), before any run folder or rank exists."""
    return prepare_configs(configs, store.datasets_dir(results_dir), progress)


def _only_world(configs: list[RunConfig], cluster: Cluster) -> list[RunConfig]:
    """A multi-node launch has one world size: configs for any other are skipped, said so."""
    why = (f"this launch has world size {cluster.world} ({cluster.nnodes} nodes x {cluster.nproc_per_node}); "
           "run other world sizes in another launch")
    own = "workload = \"command\" runs the user's launch line on one node: run it without a multi-node launch"
    return [c if c.skip_reason else replace(c, skip_reason=own) if c.workload == "command"
            else c if c.nproc == cluster.world else replace(c, skip_reason=why) for c in configs]


def _follow(suite: Suite, results_dir: str | Path, run: str | None, device_kind: str, num_devices: int,
            progress: Progress, cluster: Cluster) -> Path:
    """A follower node: wait for the leader's run folder on the shared filesystem, then
    take part in the same torchrun jobs, in the same order."""
    if not run:
        raise MgbenchError("a multi-node launch needs the same --run-id (or --resume RUN) on every node")
    path = RunDir(Path(run) if Path(run).is_dir() else Path(results_dir) / store.check_run_id(run))
    t0 = time.monotonic()
    while not path.manifest.exists():
        if time.monotonic() - t0 > SHARED_FS_WAIT_S:
            raise MgbenchError(f"node {cluster.node_rank}: the leader's run folder {path} did not appear in "
                               f"{SHARED_FS_WAIT_S}s: --results-dir must be on a filesystem all nodes share")
        time.sleep(1)
    manifest = store.read_manifest(path)
    configs = _only_world(with_data(expand(suite, device_kind, num_devices), results_dir, progress), cluster)
    done = store.recorded_configs(store.read_records(path))
    todo = [c for c in configs if c.config_id not in done]
    stop = StopFlag()
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _results_writable(path, manifest["run_id"]):
            _run_configs(path, manifest["run_id"], configs, todo, progress, stop, cluster)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return path.path


def _run_configs(run_dir: RunDir, run_id: str, configs: list[RunConfig], todo: list[RunConfig],
                 progress: Progress, stop: StopFlag, cluster: Cluster | None = None) -> None:
    total = len(configs)
    done = total - len(todo)
    leader = cluster is None or cluster.leader
    for cfg in todo:
        if cfg.skip_reason is not None:
            done += 1
            if leader:
                store.append_record(run_dir, Record.skipped(cfg, run_id))
            progress(f"[{done}/{total}] skipped  {cfg.label}: {cfg.skip_reason}")
    runnable = [c for c in todo if c.skip_reason is None]
    groups: dict[tuple[int, str], list[RunConfig]] = defaultdict(list)
    for cfg in runnable:
        if cfg.workload != "command":  # the user's own commands run below, one launch each
            groups[(cfg.nproc, cfg.device)].append(cfg)
    tally = _Tally(done, total, len(runnable), progress)
    for cfg in (c for c in runnable if c.workload == "command"):
        if stop.signal:
            return
        progress(f"running the command of {cfg.label}")
        record = run_command_config(run_dir, run_id, cfg, lambda: stop.signal is not None)
        store.append_record(run_dir, record)
        tally.finished(cfg.label, record.to_dict())
    for gi, ((nproc, device), group) in enumerate(sorted(groups.items())):
        if stop.signal:
            return
        progress(f"launching torchrun: {nproc} {device} rank(s), {len(group)} config(s)")
        for rec in _run_group(run_dir, run_id, gi, nproc, device, group, stop, progress, cluster):
            label = next((c.label for c in group if c.config_id == rec["config_id"]), rec["config_id"])
            tally.finished(label, rec)


class _Tally:
    """The sweep's progress line per finished config: its place in the sweep, what it
    measured, the time since this launch started and an ETA from the configs run so far."""

    def __init__(self, done: int, total: int, to_run: int, progress: Progress) -> None:
        self.done, self.total, self.to_run, self.progress = done, total, to_run, progress
        self.ran = 0
        self.t_start = time.monotonic()

    def finished(self, label: str, rec: dict[str, Any]) -> None:
        self.done += 1
        self.ran += 1
        elapsed = time.monotonic() - self.t_start
        eta = elapsed / self.ran * (self.to_run - self.ran)
        self.progress(f"[{self.done}/{self.total}] {label}: {describe(rec)}  (elapsed {clock(elapsed)}, "
                      f"ETA {clock(eta)})")


def _run_group(run_dir: RunDir, run_id: str, gi: int, nproc: int, device: str, group: list[RunConfig],
               stop: StopFlag, progress: Progress, cluster: Cluster | None = None) -> Iterator[dict[str, Any]]:
    """Run one world size's configs, relaunching torchrun after each failed config;
    yield every record (measured, failed, timed out or interrupted) as it lands.
    On a follower node: the same jobs, but the leader writes the failure records."""
    leader = cluster is None or cluster.leader
    node = "" if cluster is None or cluster.nnodes == 1 else f"-node{cluster.node_rank}"
    remaining = list(group)
    by_id = {c.config_id: c for c in group}
    tail = store.RecordTail(run_dir)
    seen: set[str] = {r["config_id"] for r in tail.new() if r["status"] != "interrupted"}
    attempt = 0
    while remaining and not stop.signal:
        tag = f"group-{gi}-n{nproc}-a{attempt}"
        job_path = run_dir.job(f"{tag}{node}")
        job_path.parent.mkdir(exist_ok=True)
        store.write_json_atomic(job_path, {"run_dir": str(run_dir.path.resolve()), "run_id": run_id,
                                           "configs": [c.to_dict() for c in remaining]})
        progress_path = run_dir.progress(tag)
        log_path = run_dir.job_log(f"{tag}{node}")
        rank_logs = run_dir.rank_logs(f"{tag}{node}")
        killed_for: str | None = None
        with open(log_path, "w") as log:
            argv = torchrun_argv(nproc if cluster is None else cluster.nproc_per_node, job_path, rank_logs,
                                 cluster=cluster, rdzv_id=f"{run_id}-{tag}")
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    env=child_env(nproc, device, tag), start_new_session=True,
                                    preexec_fn=die_with_parent)
            t_launch = time.monotonic()
            shown_round, t_round1 = 0, 0.0
            beat_id, t_beat = None, time.monotonic()  # the config last heard of, and when
            while True:
                rc = proc.poll()
                yield from _new_records(tail, remaining, seen)
                if rc is not None:
                    break
                cur = _progress_now(progress_path)
                if cur and cur.get("rounds", 1) > 1 and cur.get("round", 1) != shown_round:
                    # Records only land after a config's last round: say where the job is.
                    shown_round, now = cur["round"], time.monotonic()
                    t_round1 = now if shown_round == 1 else t_round1
                    eta = "" if shown_round == 1 else \
                        f", ETA {clock((now - t_round1) / (shown_round - 1) * (cur['rounds'] - shown_round + 1))}"
                    progress(f"round {shown_round}/{cur['rounds']} of {len(remaining)} config(s) "
                             f"(elapsed {clock(now - t_launch)}{eta})")
                if cur and cur["config_id"] != beat_id:
                    beat_id, t_beat = cur["config_id"], time.monotonic()
                elif cur and cur["config_id"] in by_id and cur["config_id"] not in seen \
                        and time.monotonic() - t_beat >= HEARTBEAT_S:
                    # A long config says it is alive, as nccl-tests and torchtitan print as they go.
                    t_beat = time.monotonic()
                    c = by_id[cur["config_id"]]
                    progress(f"  still running {c.label}: {clock(time.time() - cur['started'])} so far "
                             f"(stopped as timeout at {clock(c.timeout_s)})")
                if stop.signal:
                    killed_for = "interrupted"
                elif cur and cur["config_id"] not in seen and cur["config_id"] in by_id \
                        and time.time() - cur["started"] > by_id[cur["config_id"]].timeout_s:
                    killed_for = "timeout"
                elif cur is None and time.monotonic() - t_launch > STARTUP_LIMIT_S:
                    killed_for = "startup"
                if killed_for:
                    kill_tree(proc.pid)
                    proc.wait()
                    break
                time.sleep(0.2)
        yield from _new_records(tail, remaining, seen)
        remaining = [c for c in remaining if c.config_id not in seen]
        if not remaining:
            return
        cur = _progress_now(progress_path)
        failed = by_id.get(cur["config_id"]) if cur and cur["config_id"] in {c.config_id for c in remaining} else None
        if not leader:
            # The leader records what failed; wait for that, then relaunch in step with it.
            t0 = time.monotonic()
            while time.monotonic() - t0 < SHARED_FS_WAIT_S and not stop.signal:
                yield from _new_records(tail, remaining, seen)
                if len([c for c in remaining if c.config_id not in seen]) < len(remaining):
                    break
                time.sleep(0.5)
            remaining = [c for c in remaining if c.config_id not in seen]
            attempt += 1
            continue
        if failed is None:
            if killed_for == "interrupted":
                return
            # The job died before it started any of the remaining configs: nothing to
            # blame on one config, so record them all with the job's own words.
            why = f"torchrun job exited with status {proc.returncode} before starting this config"
            for cfg in remaining:
                rec = Record.failed(cfg, run_id, "error", f"{why}; log {run_dir.relative(log_path)}: {_tail(log_path)}")
                store.append_record(run_dir, rec)
                yield rec.to_dict()
            return
        # Every node's log folder (on the shared filesystem): a failed rank may be on any node.
        node_tags = [tag] if not node else [f"{tag}-node{n}" for n in range(cluster.nnodes)]  # type: ignore[union-attr]
        rec = _failure_record(run_dir, run_id, failed, killed_for, proc.returncode, node_tags, log_path, nproc)
        store.append_record(run_dir, rec)
        seen.add(failed.config_id)
        yield rec.to_dict()
        remaining.remove(failed)
        if killed_for == "interrupted":
            return
        attempt += 1
        if remaining:
            progress(f"relaunching torchrun for the {len(remaining)} remaining config(s) of this group")


def _new_records(tail: store.RecordTail, remaining: list[RunConfig], seen: set[str]) -> Iterator[dict[str, Any]]:
    ids = {c.config_id for c in remaining}
    for rec in tail.new():
        if rec["config_id"] in ids and rec["config_id"] not in seen:
            seen.add(rec["config_id"])
            yield rec


def _failure_record(run_dir: RunDir, run_id: str, cfg: RunConfig, killed_for: str | None, returncode: int | None,
                    job_tags: list[str], log_path: Path, nproc: int) -> Record:
    """The record of a config whose job did not finish it, with each rank's stderr tail
    saved beside the records (``job_tags``: the job's log folder on each node)."""
    stderr_files = []
    for rank, src in sorted(_rank_stderrs(run_dir, job_tags, nproc).items()):
        dest = run_dir.stderr_tail(cfg.config_id, rank)
        store.write_text(dest, _tail(src, lines=20, sep="\n", limit=4000) + "\n")
        stderr_files.append(run_dir.relative(dest))
    fails = []
    for f in run_dir.failures(cfg.config_id):
        try:
            fails.append(json.loads(f.read_text()))
        except ValueError:
            pass
    if killed_for == "timeout":
        return Record.failed(cfg, run_id, "timeout", f"still running after timeout_s = {cfg.timeout_s} s (a hang?); "
                             "the job was stopped", stderr_files=stderr_files)
    if killed_for == "interrupted":
        return Record.failed(cfg, run_id, "interrupted", "stopped by a signal while this config ran",
                             stderr_files=stderr_files)
    how = _classify(fails, nproc, returncode, log_path)
    mems = [f.get("mem_peak_gib") for f in fails if f.get("mem_peak_gib") is not None]
    own = [f for f in fails if not _lost_peer(f)]
    if own or fails:
        store.write_text(run_dir.traceback(cfg.config_id), (own or fails)[0]["traceback"])
    # Peak memory: what was known when it failed.
    return Record.failed(cfg, run_id, how["status"], how["error"], error_type=how["error_type"],
                         stderr_files=stderr_files, mem_peak_gib=max(mems) if mems else None)


def _rank_stderrs(run_dir: RunDir, job_tags: list[str], nproc: int) -> dict[int, Path]:
    """Each global rank's stderr file of one job, from the job's log folder on every node.

    torchrun names a rank's folder by its local rank, and in a multi-node launch the
    c10d rendezvous numbers the nodes in an order of its own (by host, not by
    --node-rank): node n's local rank 0 need not be global rank n x nproc_per_node. The
    global rank is the one the rank wrote into the file (launching.run_rank); a file
    without it (a rank that died at start) is attributed by its folder on one node, and
    left out across nodes, where its folder does not tell."""
    out: dict[int, Path] = {}
    for tag in job_tags:
        for local, path in run_dir.rank_stderrs(tag).items():
            rank = rank_of_stderr(path)
            rank = local if rank is None and len(job_tags) == 1 else rank
            if rank is not None and 0 <= rank < nproc:
                out[rank] = path
    return out


# Words gloo and NCCL use when a rank's peer went away: such a failure is a consequence
# of another rank's, not a cause.
_PEER_LOST = ("by peer", "remote worker", "Connection reset", "Connection closed", "NCCL communicator was aborted")


def _lost_peer(fail: dict[str, Any]) -> bool:
    return any(p in fail.get("error", "") for p in _PEER_LOST)


def _classify(fails: list[dict[str, Any]], nproc: int, returncode: int | None, log_path: Path) -> dict[str, Any]:
    """Status and message of a failed config, naming the rank that failed first."""
    own = sorted((f for f in fails if not _lost_peer(f)), key=lambda f: f.get("time", 0))
    if own:
        first = own[0]
        more = "" if len(own) == len(fails) else f" (then {len(fails) - len(own)} rank(s) lost their peer)"
        return {"status": "oom" if first["status"] == "oom" else "error", "error_type": first["error_type"],
                "error": "; ".join(f"rank {f['rank']}: {f['error_type']}: {f['error']}" for f in own) + more}
    silent = sorted(set(range(nproc)) - {f["rank"] for f in fails})
    return {"status": "error", "error_type": "RankDied",
            "error": f"rank(s) {silent} died without an exception (a signal or a crash in native code; "
                     f"torchrun exit status {returncode}){_exit_codes(log_path)}"}


def _exit_codes(log_path: Path) -> str:
    """torchrun's own account of how its ranks ended ("exitcode: -9" is SIGKILL)."""
    try:
        lines = [" ".join(ln.split()) for ln in log_path.read_text(errors="replace").splitlines()
                 if "exitcode" in ln or ln.strip().startswith("rank ")]
    except OSError:
        return ""
    return ": " + "; ".join(dict.fromkeys(lines)) if lines else ""


def _tail(path: Path, lines: int = 3, sep: str = " | ", limit: int = 600) -> str:
    try:
        text = [ln for ln in path.read_text(errors="replace").splitlines()
                if ln.strip() and not ln.startswith(RANK_BANNER)]
    except OSError:
        return ""
    return sep.join(text[-lines:])[-limit:]
