"""The fault grammar of the suite key ``inject`` (torch-free, so the suite validator
can check it); :mod:`mgbench.runner.inject` carries the faults out on the ranks.

One of:
  "none"
  "oom@step=S,rank=R"       raise torch.OutOfMemoryError on rank R at step S
  "crash@step=S,rank=R"     raise RuntimeError on rank R at step S (an exception)
  "kill@step=S,rank=R"      SIGKILL rank R at step S (a rank that dies without a word)
  "hang@step=S,rank=R"      rank R stops at step S and never returns
  "slow@rank=R,factor=F"    rank R burns CPU for (F - 1) x its step's wall time, each step
rank defaults to 0 and step to 0. Steps count from the first warm-up step.
"""

from __future__ import annotations

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
