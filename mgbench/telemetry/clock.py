"""Interval timing that does not disturb what it times."""

from __future__ import annotations

import time
from typing import Any

import torch


class StepClock:
    """Times of consecutive intervals: call mark() before the first and after each one.

    CUDA: an event per mark, read after a single synchronisation at the end (the host
    keeps queueing work, so no launch gap or host sync enters the intervals). CPU:
    perf_counter, where the timed ops are synchronous."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def step_times(self) -> list[float]:
        """Seconds of each interval between consecutive marks."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]
