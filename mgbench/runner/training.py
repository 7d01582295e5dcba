"""The training step and its data, shared by the measured run and the reference."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..strategies.apply import AUTOCAST_DTYPES, Prepared
from ..workloads.gpt import lm_loss, random_batch

MicroBatch = tuple[torch.Tensor, torch.Tensor]


def rank_batches(
    seed: int, steps: range, rank: int, micro_batch: int, grad_accum: int, dp_size: int,
    seq_len: int, vocab: int, device: torch.device,
) -> list[list[MicroBatch]]:
    """For each step, this data-parallel rank's micro-batches of the global batch.

    Rank r takes rows [r * ga * mb, (r + 1) * ga * mb) of the step's global batch, in
    micro-batches of mb rows: together the ranks cover the global batch exactly once,
    which is what makes every layout comparable with the single-process reference.
    Built before timing starts, so data generation is not in the measured window.
    """
    rows = micro_batch * grad_accum
    out = []
    for step in steps:
        g = random_batch(seed, step, rows * dp_size, seq_len, vocab)[rank * rows : (rank + 1) * rows]
        g = g.to(device, non_blocking=True)
        out.append([(g[i : i + micro_batch, :-1], g[i : i + micro_batch, 1:]) for i in range(0, rows, micro_batch)])
    return out


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def train_step(prep: Prepared, micro: list[MicroBatch], device: torch.device, precision: str) -> torch.Tensor:
    """One optimizer step over the micro-batches; returns this rank's mean loss as a
    detached device tensor (no host sync, so step timing is not distorted). On pipeline
    ranks that do not hold the last stage the loss is zero (their loss_weight is 0)."""
    if prep.schedule is not None:
        return _pipeline_step(prep, micro, device, precision)
    n = len(micro)
    total = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro):
        with prep.no_sync(i == n - 1), autocast(device, precision):
            loss = lm_loss(prep.model(x), y) / n
        if prep.scaler is not None:
            prep.scaler.scale(loss).backward()
        else:
            loss.backward()
        total += loss.detach()
    _optimizer_step(prep)
    return total


def _pipeline_step(prep: Prepared, micro: list[MicroBatch], device: torch.device, precision: str) -> torch.Tensor:
    """One step of the pipeline schedule: the first stage feeds the whole batch (the
    schedule splits it into the micro-batches), the last computes the losses; gradients
    are averaged over micro-batches by the schedule (scale_grads)."""
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
    _optimizer_step(prep)
    if losses:
        return torch.stack([l.detach().float() for l in losses]).mean()
    return torch.zeros((), device=device)


def _optimizer_step(prep: Prepared) -> None:
    """Apply the accumulated gradients (through the loss scaler for fp16) and clear them."""
    if prep.scaler is not None:
        prep.scaler.step(prep.optimizer)
        prep.scaler.update()
    else:
        prep.optimizer.step()
    prep.optimizer.zero_grad(set_to_none=True)
