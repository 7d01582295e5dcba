"""The training step and its data, shared by the measured run and the reference."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..strategies.pieces import AUTOCAST_DTYPES, Prepared
from ..workloads.gpt import lm_loss, random_batch

MicroBatch = tuple[torch.Tensor, torch.Tensor]
# (seed, step, rows, seq_len, vocab) -> (rows, seq_len + 1) token ids of a step's global
# batch: random_batch (throughput) or synthetic.learnable_batch (the correctness check).
BatchSource = Callable[[int, int, int, int, int], torch.Tensor]


@dataclass
class StepHooks:
    """Optional callbacks into :func:`train_step`, used by the correctness check window
    (grad-norm capture, injected bugs); the timed loop passes none, so its steps run
    exactly as before.

    backward_loss(i, loss): the tensor whose gradient micro-batch i contributes (the
        loss itself when absent); the reported loss is always the true one. Pipelines
        compute their losses inside the schedule and do not call it.
    before_optimizer: called in order after every backward and gradient reduction of
        the step (pipelines: after the schedule), just before the optimizer step.
    before_step(i) / after_step(): around each step of a check window (the fault
        injector, when the window stands in for the first warm-up steps).
    """

    backward_loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    before_optimizer: list[Callable[[Prepared], None]] = field(default_factory=list)
    before_step: list[Callable[[int], None]] = field(default_factory=list)
    after_step: list[Callable[[], None]] = field(default_factory=list)


def rank_batches(
    seed: int, steps: range, rank: int, micro_batch: int, grad_accum: int, dp_size: int,
    seq_len: int, vocab: int, device: torch.device, source: BatchSource = random_batch,
) -> list[list[MicroBatch]]:
    """For each step, this data-parallel rank's micro-batches of the global batch.

    Rank r takes rows [r * ga * mb, (r + 1) * ga * mb) of the step's global batch, in
    micro-batches of mb rows: together the ranks cover the global batch exactly once,
    which is what makes every layout comparable with the single-process reference.
    Built before timing starts, so data generation is not in the measured window.
    ``source`` makes the global batch (random tokens unless told otherwise).
    """
    rows = micro_batch * grad_accum
    out = []
    for step in steps:
        g = source(seed, step, rows * dp_size, seq_len, vocab)[rank * rows : (rank + 1) * rows]
        g = g.to(device, non_blocking=True)
        out.append([(g[i : i + micro_batch, :-1], g[i : i + micro_batch, 1:]) for i in range(0, rows, micro_batch)])
    return out


def batches_for(cfg: Any, steps: range, rank: int, dp_size: int, device: torch.device, learnable: bool = False,
                grad_accum: int | None = None) -> list[list[MicroBatch]]:
    """``cfg``'s workload's micro-batches for each step on this data-parallel rank, split
    as :func:`rank_batches` splits tokens: random data for the timed steps, learnable
    data (``learnable``) for the correctness check. Token batches for decoder LMs
    (mgbench's own and Hugging Face models), (images, labels) for the vision workload.
    ``grad_accum``: micro-batches per rank and step (the config's unless given: the
    reference takes the whole global batch as micro-batches on one rank)."""
    ga = cfg.grad_accum if grad_accum is None else grad_accum
    if cfg.workload == "vision":
        from ..workloads.vision import rank_batches as image_batches

        return image_batches(cfg, steps, rank, ga, dp_size, device, learnable)
    from ..workloads.synthetic import learnable_batch

    return rank_batches(cfg.seed, steps, rank, cfg.micro_batch, ga, dp_size, cfg.seq_len, cfg.shape.vocab, device,
                        source=learnable_batch if learnable else random_batch)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def train_step(prep: Prepared, micro: list[MicroBatch], device: torch.device, precision: str,
               hooks: StepHooks | None = None) -> torch.Tensor:
    """One optimizer step over the micro-batches; returns this rank's mean loss as a
    detached device tensor (no host sync, so step timing is not distorted). On pipeline
    ranks that do not hold the last stage the loss is zero (their loss_weight is 0).
    ``hooks``: see :class:`StepHooks` (the check window's; None in the timed loop)."""
    if prep.schedule is not None:
        return _pipeline_step(prep, micro, device, precision, hooks)
    n = len(micro)
    total = torch.zeros((), device=device)
    with prep.step_context() if prep.step_context is not None else contextlib.nullcontext():
        for i, (x, y) in enumerate(micro):
            if prep.shard_batch is not None:  # context parallelism: this rank's tokens of each sample
                x, y = prep.shard_batch(x, y)
            with prep.no_sync(i == n - 1), autocast(device, precision):
                loss = lm_loss(prep.model(x), y) / n
            grad_loss = hooks.backward_loss(i, loss) if hooks is not None and hooks.backward_loss else loss
            if prep.moe_layers:
                # MoE: the load-balancing loss joins the gradient, not the reported loss.
                from ..workloads.moe import aux_loss

                aux = aux_loss(prep.moe_layers)
                grad_loss = grad_loss if aux is None else grad_loss + aux / n
            if prep.scaler is not None:
                prep.scaler.scale(grad_loss).backward()
            else:
                grad_loss.backward()
            total += loss.detach()
    _optimizer_step(prep, hooks)
    return total


def _pipeline_step(prep: Prepared, micro: list[MicroBatch], device: torch.device, precision: str,
                   hooks: StepHooks | None = None) -> torch.Tensor:
    """One step of the pipeline schedule: the first stage feeds the whole batch (the
    schedule splits it into the micro-batches), the last computes the losses through
    ``prep.stage_loss``, which also scales them for fp16 (the schedule runs backward
    itself); gradients are averaged over micro-batches by the schedule (scale_grads), and
    over data-parallel replicas by their wrapper or ``prep.reduce_grads``."""
    x = torch.cat([m[0] for m in micro])
    y = torch.cat([m[1] for m in micro])
    losses: list[torch.Tensor] = []
    with autocast(device, precision):
        if prep.is_first and prep.is_last:
            prep.schedule.step(x, target=y, losses=losses)
        elif prep.is_first:
            prep.schedule.step(x)
        elif prep.is_last:
            prep.schedule.step(target=y, losses=losses)
        else:
            prep.schedule.step()
    if prep.reduce_grads is not None:  # replicas that no wrapper reduces (schedules.GRAD_SYNC)
        prep.reduce_grads()
    # What backward ran on is scaled for fp16: report the losses themselves (before the
    # optimizer step, whose scaler update may change the scale).
    losses = prep.stage_loss.true_losses(losses)
    _optimizer_step(prep, hooks)
    if losses:
        return torch.stack([l.detach().float() for l in losses]).mean()
    return torch.zeros((), device=device)


def _optimizer_step(prep: Prepared, hooks: StepHooks | None = None) -> None:
    """Apply the accumulated gradients (through the loss scaler for fp16) and clear them;
    ``hooks.before_optimizer`` run first, on the step's final (reduced) gradients."""
    for hook in hooks.before_optimizer if hooks is not None else ():
        hook(prep)
    if prep.scaler is not None:
        prep.scaler.step(prep.optimizer)
        prep.scaler.update()
    else:
        prep.optimizer.step()
    prep.optimizer.zero_grad(set_to_none=True)
