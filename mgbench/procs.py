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
