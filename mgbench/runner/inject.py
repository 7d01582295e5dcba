"""Fault injection on the ranks: make a config misbehave on purpose so recovery paths
run for real (:class:`Injector`, around the timed steps), and training bugs that the
correctness check must catch (:func:`apply_bug`, inside the check window only). The
grammar (suite key ``inject``) lives in :mod:`mgbench.faults`.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any

from ..faults import BUGS, parse

if TYPE_CHECKING:
    from ..strategies.pieces import Prepared
    from .training import StepHooks


class Injector:
    """Called by the measured loop around each step of one rank. ``device``: the rank's
    device (a CUDA rank's slow step waits for its GPU; see after_step)."""

    def __init__(self, spec: str, rank: int, device: Any = None) -> None:
        self.inj = parse(spec)
        self.rank = rank
        self.device = device
        self._t0 = 0.0

    def _slow_here(self) -> bool:
        return self.inj is not None and self.inj.kind == "slow" and self.inj.rank == self.rank

    def _sync(self) -> None:
        """Wait for this rank's queued GPU work (nothing to wait for on CPU)."""
        if self.device is not None and getattr(self.device, "type", None) == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def before_step(self, step: int) -> None:
        inj = self.inj
        if inj is None or inj.kind == "bug" or inj.rank != self.rank:
            return
        if self._slow_here():
            self._sync()  # the step starts with an idle GPU, so its time below is its own
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
        if inj is None or not self._slow_here():
            return
        # A CUDA step returns once its kernels are queued: without waiting for them, the
        # step's wall time is only the launch time, and a CPU delay while the GPU still
        # works through the queue delays nothing. Wait, then hold the rank for
        # (factor - 1) x the whole step; the next step (and the step clock's next event)
        # is queued only after that, so the rank's measured step grows by that much.
        self._sync()
        # Burn CPU rather than sleep, so the rank looks like a slower device (busy, not
        # idle), for (factor - 1) x this step's wall time.
        end = time.perf_counter() + (time.perf_counter() - self._t0) * (inj.factor - 1.0)
        while time.perf_counter() < end:
            pass


def apply_bug(prep: "Prepared", bug: str) -> "StepHooks":
    """Break a freshly prepared model on purpose (a negative control of the check).

    Changes ``prep`` in place where the bug lives in the optimizer or in the gradient
    reduction, and returns the :class:`~mgbench.runner.training.StepHooks` the check
    window must pass to ``train_step`` for the rest. Only for the check window's own
    model: the timed loop never sees a bug. Raises ValueError where the bug has nothing to
    break (``faults.bug_problem`` tells a config so beforehand).
    """
    from .training import StepHooks

    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; one of {', '.join(BUGS)}")
    hooks = StepHooks()
    if bug == "freeze":
        # lr = 0 also stops AdamW's decoupled weight decay (p *= 1 - lr * wd): frozen exactly.
        # ZeRO-1 copies its param_groups into the local optimizer at every step.
        for group in prep.optimizer.param_groups:
            group["lr"] = 0.0
    elif bug == "no_grad_sync":
        _skip_grad_sync(prep)
    elif bug == "grad_sum":
        if prep.dp_size < 2:
            raise ValueError("bug:grad_sum needs dp > 1")
        hooks.before_optimizer.append(_sum_not_mean)
    elif bug == "drop_micro_batch":
        if prep.schedule is not None:
            _drop_first_pipeline_micro_batch(prep.schedule)
        else:
            # Forward and backward still run (so every wrapper's hooks fire as usual), but
            # micro-batch 0 contributes a zero gradient.
            hooks.backward_loss = lambda i, loss: loss * 0.0 if i == 0 else loss
    return hooks


def _sum_not_mean(prep: "Prepared") -> None:
    """Gradients reduced by mean over dp ranks, scaled back up to their sum."""
    from .fingerprint import unique_params

    for p in unique_params(prep.modules):
        if p.grad is not None:
            p.grad.mul_(prep.dp_size)


def _skip_grad_sync(prep: "Prepared") -> None:
    """Each data-parallel replica keeps its own gradients: DDP never all-reduces (nor does
    mgbench's own all-reduce of unwrapped pipeline stages), FSDP takes its own shard of
    its own unreduced gradient instead of reduce-scattering. (HSDP: FSDP2 has no custom
    hook for its all-reduce across replicas, which still averages the replicas'
    unreduced shards: a gradient of half the batch at 2 x 2, caught all the same.)"""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddps = [m for m in prep.modules if isinstance(m, DDP)]
    fsdps = [s for m in prep.modules for s in m.modules() if isinstance(s, FSDPModule)]
    if prep.dp_size >= 2 and prep.reduce_grads is not None:
        # Pipeline stages that mgbench all-reduces itself after the schedule: skip that.
        prep.reduce_grads = None
        return
    if prep.dp_size < 2 or not (ddps or fsdps):
        raise ValueError("bug:no_grad_sync needs a data-parallel gradient reduction (dp > 1, DDP, FSDP or a "
                         "pipeline's all-reduce)")
    if ddps and prep.schedule is None:
        # The step's last micro-batch is the one that syncs: run it under no_sync too.
        # (no_sync rather than a comm hook: a compression hook may already be registered.)
        ddp = ddps[0]
        prep.no_sync = lambda last: ddp.no_sync()
    else:
        # Pipeline stages: the schedule drives DDP's reducer itself, so replace what it
        # reduces with: nothing.
        for m in ddps:
            m.register_comm_hook(None, _local_grads_hook)
    for m in fsdps:
        m.set_custom_reduce_scatter(_local_reduce_scatter())


def _local_grads_hook(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook that communicates nothing: the bucket keeps this rank's
    gradients. Unannotated on purpose: DDP's register_comm_hook rejects a ``bucket``
    annotated as anything but dist.GradBucket (and with postponed annotations it reads
    the string)."""
    import torch

    fut: Any = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _local_reduce_scatter() -> Any:
    """An FSDP2 reduce-scatter that keeps this rank's own chunk of its own gradients.

    Built on FSDP2's default implementation (private module, torch >= 2.8) for its
    buffer allocation; only the call is replaced."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    class LocalReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> None:
            n, r = group.size(), group.rank()
            mine = input_tensor.view(n, -1)[r]
            if op == dist.ReduceOp.AVG:
                output_tensor.copy_(mine)  # the mean of one contribution
            else:
                # A SUM that FSDP divides by n around the call (fp16 reductions): undo it.
                output_tensor.copy_(mine * n)
            return None

    return LocalReduceScatter()


def _drop_first_pipeline_micro_batch(schedule: Any) -> None:
    """Micro-batch 0 of every step of the schedule contributes no gradient: its loss keeps
    its value (so the reported loss is unchanged) but backpropagates zero.

    Wraps the schedule's per-micro-batch loss computation (a private method of torch's
    pipelining schedules, stable from torch 2.4 to 2.13: the last stage appends each
    micro-batch's loss to ``_internal_losses``, which backward and the reported losses
    then read)."""
    original = schedule._maybe_compute_loss

    def compute(stage: Any, output: Any, target_mbs: Any, mb_index: int, *args: Any, **kwargs: Any) -> None:
        original(stage, output, target_mbs, mb_index, *args, **kwargs)
        if mb_index == 0 and stage.is_last and schedule._internal_losses:
            loss = schedule._internal_losses[-1]
            schedule._internal_losses[-1] = loss.detach() + loss * 0.0

    schedule._maybe_compute_loss = compute
