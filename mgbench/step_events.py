"""The step-event protocol between a user's training script and `mgbench run`
(``workload = "command"``): :func:`step` writes the events, :func:`read_step_file`
and :func:`match_log` read them back. Torch-free and cheap to import.

The step file
-------------
mgbench names the file in the environment variable ``MGBENCH_STEP_FILE`` of the
command it launches. Each call of ``mgbench.step(tokens=N)`` appends one line::

    <time_ns> <tokens> <rank>\\n

``time_ns``: ``time.time_ns()`` when the optimizer step finished (wall clock, ns);
``tokens``: the tokens this process trained in that step, or ``-`` when not given;
``rank``: the process's ``RANK`` (set by torchrun / accelerate / deepspeed; 0 when
unset). Fields are separated by one space; every line is written with one ``write()``
on a file opened with O_APPEND, so lines from several ranks never interleave. An event
whose tokens are a CUDA tensor is written once its value has reached the host (at a
later call, or at exit): a line can land a step or two after the step it reports, and
the reader orders each rank's events by time. A line that does not read as three such
fields is left out (and counted).

Step k ends when the slowest rank has reported its k-th event (a step ends when its
slowest rank ends); its tokens are the sum over the ranks that reported them. Scripts
that cannot import mgbench are measured through ``step_pattern`` instead: a regex
matching one output line per finished step, timed when the launcher reads the line,
with an optional named group ``tokens``.
"""

from __future__ import annotations

import atexit
import operator
import os
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

STEP_FILE_ENV = "MGBENCH_STEP_FILE"

_open: dict[str, int] = {}  # step file path -> file descriptor, opened once per process
# Events not written yet, oldest first: (step file path, time_ns, rank, token count). One
# waits only while its count, or an earlier event's, is on its way from the GPU.
_pending: list[tuple[str, int, str, _Count]] = []
_pending_at_exit: list[object] = []  # flush, once registered to run at exit


def step(tokens: int | None = None) -> None:
    """Report one finished optimizer step to mgbench; call it after ``optimizer.step()``.

    ``tokens``: the tokens this process trained in the step (optional; mgbench sums
    them over ranks): an int, a numpy integer or an integer tensor. A CUDA tensor's
    value is not read now, which would wait for the GPU to finish everything queued
    (``.item()`` synchronises) and so change the step being measured: its copy to the
    host is queued behind the step's work, and the event's line (timed now) is written
    once the copy has landed, at a later call or when the process exits. Does nothing
    when ``MGBENCH_STEP_FILE`` is unset, so a script can call it unconditionally.
    """
    path = os.environ.get(STEP_FILE_ENV)
    if not path:
        return
    t = time.time_ns()
    _pending.append((path, t, os.environ.get("RANK", "0"), _count_of(tokens)))
    _write_ready()


def flush() -> None:
    """Write every event still waiting for its token count, waiting for the counts
    (run at exit; a script may call it earlier)."""
    _write_ready(wait=True)


class _Count:
    """A token count that is known now (``value``), or a tensor's, copied towards the host."""

    def __init__(self, value: int | None = None, host: object = None, copied: object = None) -> None:
        self.value, self.host, self.copied = value, host, copied

    def ready(self, wait: bool) -> bool:
        if self.copied is None:
            return True
        if wait:
            self.copied.synchronize()  # type: ignore[attr-defined]
            return True
        return bool(self.copied.query())  # type: ignore[attr-defined]

    def text(self) -> str:
        if self.copied is not None:
            self.value = operator.index(self.host)  # the copy has landed: a host read, no device sync
        return "-" if self.value is None else str(self.value)


def _count_of(tokens: object) -> _Count:
    """``tokens`` as a count to write: read now unless it is a CUDA tensor."""
    if tokens is None:
        return _Count()
    # torch only where the caller passed a tensor: this module stays torch-free to import.
    if type(tokens).__module__.split(".")[0] != "torch" or tokens.device.type != "cuda":  # type: ignore[attr-defined]
        return _Count(operator.index(tokens))  # ints, numpy ints, host tensors (no device to wait on)
    import torch

    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.numel() != 1:  # type: ignore[attr-defined]
        raise TypeError(f"tokens must be an integer or a one-element integer tensor, not {tokens!r}")
    if not _pending_at_exit:  # registered after torch's own exit handlers, so it runs before them
        _pending_at_exit.append(atexit.register(flush))
    # non_blocking to the CPU lands in pinned memory: the copy is queued on the current
    # stream, after the work that computes the count, and the host does not wait for it.
    host = tokens.detach().to("cpu", non_blocking=True)  # type: ignore[attr-defined]
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(tokens.device))  # type: ignore[attr-defined]
    return _Count(host=host, copied=copied)


def _write_ready(wait: bool = False) -> None:
    """Write the oldest events whose counts are ready, in the order they were reported."""
    while _pending and _pending[0][3].ready(wait):
        path, t, rank, count = _pending.pop(0)
        fd = _open.get(path)
        if fd is None:
            fd = _open[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{t} {count.text()} {rank}\n".encode())


@dataclass
class StepEnds:
    """Step ends read from a step file or a log: wall-clock ns and tokens (None: not given)."""

    ends_ns: list[int] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)
    malformed: int = 0  # lines left out
    ranks: int = 1  # ranks that reported steps


_LINE = re.compile(r"(\d+) (\d+|-) (\d+)")


def read_step_file(lines: Iterable[str]) -> StepEnds:
    """Parse step-file lines (see the module docstring) into step ends: the k-th step
    ends at the latest of the ranks' k-th events; steps not every rank reported yet are
    left out."""
    per_rank: dict[int, list[tuple[int, int | None]]] = {}
    bad = 0
    for line in lines:
        m = _LINE.fullmatch(line.strip())
        if not m:
            bad += line.strip() != ""
            continue
        t, n, rank = int(m[1]), None if m[2] == "-" else int(m[2]), int(m[3])
        per_rank.setdefault(rank, []).append((t, n))
    if not per_rank:
        return StepEnds(malformed=bad, ranks=0)
    out = StepEnds(malformed=bad, ranks=len(per_rank))
    for events in zip(*(sorted(ev) for ev in per_rank.values())):
        out.ends_ns.append(max(t for t, _ in events))
        counts = [n for _, n in events if n is not None]
        out.tokens.append(sum(counts) if counts else None)
    return out


def match_log(lines: Iterable[tuple[int, str]], pattern: str) -> StepEnds:
    """Step ends from timed log lines (``(time_ns, text)``): each line matching
    ``pattern`` ends a step; its named group ``tokens``, where present and a number
    (1,024 and 1_024 read as 1024), gives that step's tokens."""
    rx = re.compile(pattern)
    out = StepEnds()
    # By time: stdout and stderr are read by two threads, whose appends can land out of
    # order (a step logged on each stream would otherwise give a negative step time).
    for t, text in sorted(lines, key=lambda line: line[0]):
        m = rx.search(text)
        if not m:
            continue
        out.ends_ns.append(t)
        raw = m.groupdict().get("tokens")
        digits = raw.replace(",", "").replace("_", "") if raw else ""
        out.tokens.append(int(digits) if digits.isdigit() else None)
        out.malformed += bool(raw) and not digits.isdigit()
    return out
