"""Process hygiene: no rank outlives the sweep that started it (Linux)."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from contextlib import contextmanager
from typing import Any, Iterator

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (so a
    SIGKILLed `mgbench run` takes its torchrun job with it). No-op where unsupported."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (children before grandchildren)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces; the parent pid is the 2nd field after ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def kill_tree(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM a process and everything below it; SIGKILL whatever is left after grace."""
    tree = [pid] + descendants(pid)
    for p in tree:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.1)
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextmanager
def sigterm_raises(exc: type[BaseException]) -> Iterator[None]:
    """Within: SIGTERM raises ``exc`` (in the main thread, where Python delivers signals;
    elsewhere nothing changes), so that code the signal would otherwise end outright can
    clean up or record what it was doing; the handler that was in place is back on leaving."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise exc()

    before = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def local_pid(manifest: dict[str, Any]) -> int | None:
    """The pid of the mgbench process a run's manifest names, where it ran on this host
    (another node's process cannot be seen from here) and its pid is recorded; else None."""
    import socket

    pid = manifest.get("pid")
    on_this_host = (manifest.get("machine") or {}).get("hostname") == socket.gethostname()
    return pid if isinstance(pid, int) and on_this_host else None


def process_alive(manifest: dict[str, Any]) -> bool:
    """Whether the mgbench process a manifest names runs now on this host (not this one)."""
    pid = local_pid(manifest)
    return pid is not None and pid != os.getpid() and alive(pid)


def run_status(manifest: dict[str, Any]) -> tuple[Any, str | None]:
    """A run's status as `mgbench status`, `show` and `report` tell it, and why where it is
    not the manifest's own: "dead" where the manifest says running but its mgbench process on
    this host is gone (a Slurm job's runs elsewhere and is left to the scheduler's state)."""
    status = manifest.get("status")
    pid = local_pid(manifest)
    if status == "running" and not (manifest.get("slurm") or {}).get("job_id") and pid is not None and not alive(pid):
        return "dead", (f"the manifest says running, but its mgbench process {pid} on this host is gone; resume with "
                        f"`mgbench run --resume {manifest.get('run_id')}`")
    return status, None
