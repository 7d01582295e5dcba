"""Fault injection: make a config misbehave on purpose so recovery paths run for real.

Suite key ``inject``, one of:
  "none"
  "oom@step=S,rank=R"       raise torch.OutOfMemoryError on rank R at step S
  "crash@step=S,rank=R"     raise RuntimeError on rank R at step S (an exception)
  "kill@step=S,rank=R"      SIGKILL rank R at step S (a rank that dies without a word)
  "hang@step=S,rank=R"      rank R stops at step S and never returns
  "slow@rank=R,factor=F"    rank R burns CPU for (F - 1) x its step's wall time, each step
rank defaults to 0 and step to 0. Steps count from the first warm-up step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

KINDS = ("oom", "crash", "kill", "hang", "slow")


@dataclass(frozen=True)
class Injection:
    kind: str
    step: int = 0
    rank: int = 0
    factor: float = 1.0


def parse(spec: str) -> Injection | None:
    """Parse an ``inject`` value; ValueError with the grammar on anything else."""
    if spec == "none":
        return None
    kind, _, args = spec.partition("@")
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(KINDS)} (e.g. \"oom@step=3,rank=1\") or \"none\"")
    fields: dict[str, str] = {}
    for part in filter(None, args.split(",")):
        k, eq, v = part.partition("=")
        if not eq or k not in ("step", "rank", "factor"):
            raise ValueError(f"bad fault argument {part!r} in {spec!r}; use step=N, rank=N, factor=X")
        fields[k] = v
    try:
        inj = Injection(kind, int(fields.get("step", 0)), int(fields.get("rank", 0)), float(fields.get("factor", 1.0)))
    except ValueError:
        raise ValueError(f"bad number in {spec!r}") from None
    if inj.step < 0 or inj.rank < 0 or inj.factor < 1.0:
        raise ValueError(f"{spec!r}: step and rank must be >= 0 and factor >= 1")
    return inj


class Injector:
    """Called by the measured loop around each step of one rank."""

    def __init__(self, spec: str, rank: int) -> None:
        self.inj = parse(spec)
        self.rank = rank
        self._t0 = 0.0

    def before_step(self, step: int) -> None:
        inj = self.inj
        if inj is None or inj.rank != self.rank:
            return
        self._t0 = time.perf_counter()
        if inj.step != step:
            return
        if inj.kind == "oom":
            import torch

            raise torch.OutOfMemoryError(f"injected OOM at step {step} on rank {self.rank}")
        if inj.kind == "crash":
            raise RuntimeError(f"injected crash at step {step} on rank {self.rank}")
        if inj.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if inj.kind == "hang":
            while True:  # the launcher's per-config timeout must end this
                time.sleep(3600)

    def after_step(self) -> None:
        inj = self.inj
        if inj is None or inj.rank != self.rank or inj.kind != "slow":
            return
        # Burn CPU rather than sleep, so the rank looks like a slower device (busy, not
        # idle), for (factor - 1) x this step's wall time.
        end = time.perf_counter() + (time.perf_counter() - self._t0) * (inj.factor - 1.0)
        while time.perf_counter() < end:
            pass
