"""Parent side of `mgbench run`: expand a suite, launch one torchrun job per world
size, follow progress, and leave a complete run folder whatever happens to the jobs."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from .. import store
from ..suite import RunConfig, Suite, expand
from ..telemetry.machine import fingerprint

Progress = Callable[[str], None]


def detect_devices() -> tuple[str, int]:
    """("cuda", GPU count) when CUDA devices are visible, else ("cpu", CPU ranks allowed).

    CPU ranks allowed is max(4, cores): gloo ranks on one host share the cores, and
    tests need 4 ranks even on a 2-core machine; beyond that oversubscription only
    measures the scheduler.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda", torch.cuda.device_count()
    return "cpu", cpu_rank_limit()


def cpu_rank_limit() -> int:
    """How many gloo ranks a CPU config may ask for on this host (see detect_devices)."""
    return max(4, os.cpu_count() or 1)


def torchrun_argv(nproc: int, plan_path: Path) -> list[str]:
    """torchrun (torch.distributed.run) on this host, rendezvous on a free local port."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc-per-node={nproc}", "-m", "mgbench.runner.worker", "--plan", str(plan_path),
    ]


def child_env(nproc: int, device: str) -> dict[str, str]:
    env = dict(os.environ)
    # The worker must import this same mgbench, installed or not.
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        # Share the cores between ranks instead of letting each rank spawn one thread
        # per core (which oversubscribes and measures contention, not the strategy).
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    return env


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def describe(rec: dict[str, Any]) -> str:
    """One progress line for a finished config."""
    if rec["status"] == "ok":
        corr = {True: "correct", False: "WRONG LOSS", None: "unchecked"}[rec.get("correct")]
        return f"ok  {rec['tokens_per_s']:,.0f} tok/s, step {rec['step_time_s'] * 1000:.1f} ms, {corr}"
    return f"{rec['status']}: {rec.get('error') or rec.get('skip_reason')}"


def skipped_record(cfg: RunConfig, run_id: str) -> dict[str, Any]:
    from .worker import base_record

    return {**base_record(cfg, run_id), "status": "skipped", "error": None, "skip_reason": cfg.skip_reason}


def run_suite(
    suite: Suite,
    results_dir: str | Path = "results",
    run_id: str | None = None,
    device_kind: str | None = None,
    num_devices: int | None = None,
    progress: Progress = print,
    argv: list[str] | None = None,
) -> Path:
    """Run every config of a suite; returns the run folder. Callable from tests."""
    if device_kind is None or num_devices is None:
        device_kind, num_devices = detect_devices()
    configs = expand(suite, device_kind, num_devices)
    run_id = run_id or store.new_run_id(suite.name)
    run_dir = store.create_run_dir(results_dir, run_id)
    manifest: dict[str, Any] = {
        "run_id": run_id,
        "status": "running",
        "started_at": dt.datetime.now().isoformat(timespec="seconds"),
        "finished_at": None,
        "argv": argv or sys.argv,
        "suite": {"name": suite.name, "description": suite.description, "path": suite.path,
                  "sha256": suite.sha256, "text": suite.text},
        "device_kind": device_kind,
        "num_devices": num_devices,
        "num_configs": len(configs),
        "machine": fingerprint(),
        "schema_version": store.SCHEMA_VERSION,
    }
    store.write_json_atomic(run_dir / "manifest.json", manifest)

    runnable = [c for c in configs if c.skip_reason is None]
    total = len(configs)
    done = 0
    for cfg in configs:
        if cfg.skip_reason is not None:
            done += 1
            store.append_record(run_dir, skipped_record(cfg, run_id))
            progress(f"[{done}/{total}] skipped  {cfg.label}: {cfg.skip_reason}")

    groups: dict[tuple[int, str], list[RunConfig]] = defaultdict(list)
    for cfg in runnable:
        groups[(cfg.nproc, cfg.device)].append(cfg)
    t_start = time.monotonic()
    finished = 0
    for gi, ((nproc, device), group) in enumerate(sorted(groups.items())):
        progress(f"launching torchrun: {nproc} {device} rank(s), {len(group)} config(s)")
        for rec in _run_group(run_dir, run_id, gi, nproc, device, group):
            done += 1
            finished += 1
            elapsed = time.monotonic() - t_start
            eta = elapsed / finished * (len(runnable) - finished)
            label = next((c.label for c in group if c.config_id == rec["config_id"]), rec["config_id"])
            progress(f"[{done}/{total}] {label}: {describe(rec)}  (elapsed {_fmt_s(elapsed)}, ETA {_fmt_s(eta)})")

    recs = store.read_records(run_dir)
    counts: dict[str, int] = defaultdict(int)
    for r in recs:
        counts[r["status"]] += 1
    manifest.update(status="complete", finished_at=dt.datetime.now().isoformat(timespec="seconds"),
                    counts=dict(counts))
    store.write_json_atomic(run_dir / "manifest.json", manifest)
    return run_dir


def _run_group(run_dir: Path, run_id: str, gi: int, nproc: int, device: str, group: list[RunConfig]):
    """Launch one torchrun job for a group; yield each record as it lands, then one
    error/timeout record for every config the job did not finish."""
    plan_path = run_dir / "plans" / f"group-{gi}-n{nproc}.json"
    plan_path.parent.mkdir(exist_ok=True)
    store.write_json_atomic(plan_path, {"run_dir": str(run_dir.resolve()), "run_id": run_id,
                                        "configs": [c.to_dict() for c in group]})
    log_path = run_dir / "logs" / f"group-{gi}-n{nproc}.log"
    # The group may use what its configs may use together, plus start-up.
    timeout = sum(c.timeout_s for c in group) + 120
    ids = {c.config_id for c in group}
    seen: set[str] = {r["config_id"] for r in store.read_records(run_dir)}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(torchrun_argv(nproc, plan_path), stdout=log, stderr=subprocess.STDOUT,
                                env=child_env(nproc, device), start_new_session=True)
        t0 = time.monotonic()
        timed_out = False
        while True:
            rc = proc.poll()
            for rec in store.read_records(run_dir):
                if rec["config_id"] in ids and rec["config_id"] not in seen:
                    seen.add(rec["config_id"])
                    yield rec
            if rc is not None:
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                _kill_group(proc)
                continue
            time.sleep(0.5)
    missing = [c for c in group if c.config_id not in seen]
    if not missing:
        return
    tail = _tail(log_path)
    status = "timeout" if timed_out else "error"
    why = (f"torchrun job passed its {timeout}s limit" if timed_out
           else f"torchrun job exited with status {proc.returncode} before this config finished")
    for cfg in missing:
        rec = {**skipped_record(cfg, run_id), "status": status, "skip_reason": None,
               "error": f"{why}; log {log_path.relative_to(run_dir)}: {tail}"}
        store.append_record(run_dir, rec)
        yield rec


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop torchrun and every rank it started (they share its session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            pass


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-600:]
