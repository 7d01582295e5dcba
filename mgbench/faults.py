"""The fault grammar of the suite key ``inject`` (torch-free, so the suite validator
can check it); :mod:`mgbench.runner.inject` carries the faults out on the ranks.

One of:
  "none"
  "oom@step=S,rank=R"       raise torch.OutOfMemoryError on rank R at step S
  "crash@step=S,rank=R"     raise RuntimeError on rank R at step S (an exception)
  "kill@step=S,rank=R"      SIGKILL rank R at step S (a rank that dies without a word)
  "hang@step=S,rank=R"      rank R stops at step S and never returns
  "slow@rank=R,factor=F"    rank R burns CPU for (F - 1) x its step's wall time, each step
                            (a CUDA rank first waits for its step's kernels, so the
                            step's time is the GPU's and the delay holds up the next step)
rank defaults to 0 and step to 0. Steps count from the first warm-up step.

Or a deliberate training bug, the negative controls of the correctness check. A bug acts
only inside the check window (a fresh model trained for ``check_steps`` steps on
learnable data), never in the timed steps, so throughput figures are those of the clean
config; the check must then read ``correct: false``:
  "bug:freeze"              the optimizer's learning rate is 0: the weights never change
  "bug:no_grad_sync"        the data-parallel gradient reduction is skipped: each replica
                            steps with its own gradients
  "bug:grad_sum"            gradients are summed over data-parallel ranks instead of averaged
  "bug:drop_micro_batch"    on every data-parallel replica, the first micro-batch of each
                            step (gradient accumulation, or the pipeline schedule's)
                            contributes no gradient (its loss is still reported)
:func:`bug_problem` says why a bug cannot apply to a config (the config is then skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("oom", "crash", "kill", "hang", "slow")
BUGS = ("freeze", "no_grad_sync", "grad_sum", "drop_micro_batch")


@dataclass(frozen=True)
class Injection:
    """A parsed ``inject`` value: a fault (kind in KINDS) or a bug (kind "bug", ``bug`` in BUGS)."""

    kind: str
    step: int = 0
    rank: int = 0
    factor: float = 1.0
    bug: str | None = None


def parse(spec: str) -> Injection | None:
    """Parse an ``inject`` value; ValueError with the grammar on anything else."""
    if spec == "none":
        return None
    if spec.startswith("bug:"):
        name = spec[len("bug:"):]
        if name not in BUGS:
            raise ValueError(f"unknown bug {name!r} in {spec!r}; one of " + ", ".join(f"bug:{b}" for b in BUGS))
        return Injection("bug", bug=name)
    kind, _, args = spec.partition("@")
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(KINDS)} (e.g. \"oom@step=3,rank=1\"), "
                         f"a bug ({', '.join('bug:' + b for b in BUGS)}) or \"none\"")
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


def bug_of(spec: str) -> str | None:
    """The bug an ``inject`` value asks for (None for "none" and for faults)."""
    inj = parse(spec)
    return inj.bug if inj is not None else None


def bug_problem(bug: str, strategy: str, dp: int, grad_accum: int, pp: int = 1) -> str | None:
    """Why ``bug`` cannot be injected into a config (None when it can).

    no_grad_sync and grad_sum change the data-parallel gradient reduction, which only
    exists with dp > 1 (tensor- and pipeline-parallel ranks split one model, they do not
    reduce gradients of replicas). drop_micro_batch needs a second micro-batch per step
    (gradient accumulation, or the pipeline schedule's micro-batches) to leave one out.
    freeze applies to every strategy.
    """
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; one of {', '.join(BUGS)}")
    if bug in ("no_grad_sync", "grad_sum") and dp < 2:
        return (f"bug:{bug} needs data parallelism (dp > 1) to have a gradient reduction to break; "
                f"{strategy} here has dp = {dp}")
    if bug == "drop_micro_batch" and grad_accum < 2:
        what = "the pipeline schedule's micro-batches" if pp > 1 else "gradient accumulation"
        return (f"bug:drop_micro_batch needs more than one micro-batch per step ({what}: grad_accum > 1); "
                f"{strategy} here has grad_accum = {grad_accum}")
    return None
