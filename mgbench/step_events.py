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
unset). Fields are separated by one space; every line is written with one
``write()`` on a file opened with O_APPEND, so lines from several ranks never
interleave. A line that does not read as three such fields is left out (and counted).

Step k ends when the slowest rank has reported its k-th event (a step ends when its
slowest rank ends); its tokens are the sum over the ranks that reported them. Scripts
that cannot import mgbench are measured through ``step_pattern`` instead: a regex
matching one output line per finished step, timed when the launcher reads the line,
with an optional named group ``tokens``.
"""

from __future__ import annotations

import operator
import os
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

STEP_FILE_ENV = "MGBENCH_STEP_FILE"

_open: dict[str, int] = {}  # step file path -> file descriptor, opened once per process


def step(tokens: int | None = None) -> None:
    """Report one finished optimizer step to mgbench; call it after ``optimizer.step()``.

    ``tokens``: the tokens this process trained in the step (optional; mgbench sums
    them over ranks). Does nothing when ``MGBENCH_STEP_FILE`` is unset, so a script can
    call it unconditionally.
    """
    path = os.environ.get(STEP_FILE_ENV)
    if not path:
        return
    t = time.time_ns()
    n = "-" if tokens is None else str(operator.index(tokens))  # ints, numpy ints, integer tensors
    fd = _open.get(path)
    if fd is None:
        fd = _open[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{t} {n} {os.environ.get('RANK', '0')}\n".encode())


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
