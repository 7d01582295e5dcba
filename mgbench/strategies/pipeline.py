"""Pipeline parallelism: split the decoder into stages and drive a torch schedule.

The model is cut into pp x v chunks balanced by layer count (the first chunks take one
extra layer when the layers do not divide). Which chunks a rank holds, and the bubble a
schedule leaves in theory, are the schedule registry's (:mod:`.schedules`, torch-free):
rank r holds chunks r, r + pp, r + 2 pp ... (v > 1 for the interleaved schedules), or
r and 2 pp - 1 - r for the V-shaped ZB-V and DualPipeV.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..workloads.gpt import DecoderLM, lm_loss
from .schedules import BY_NAME


def chunk_layers(layers: int, chunks: int) -> list[range]:
    """Contiguous layer ranges, sizes differing by at most one."""
    base, extra = divmod(layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def stage_module(model: DecoderLM, chunk: int, num_chunks: int) -> DecoderLM:
    """The part of ``model`` that chunk ``chunk`` runs: its blocks, plus the embedding on
    the first chunk and the final norm and output projection on the last. ``model`` is
    cut in place: a rank holding several chunks passes a model of its own for each."""
    keep = {str(i) for i in chunk_layers(model.shape.layers, num_chunks)[chunk]}
    for key in list(model.blocks.keys()):
        if key not in keep:
            del model.blocks[key]
    if chunk != 0:
        model.tok_emb = None
    if chunk != num_chunks - 1:
        model.norm = None
        model.head = None
    return model


class StageLoss:
    """The loss function a pipeline schedule calls on the last stage, once per micro-batch
    (and once more, on the first step, for its shape inference).

    The schedule runs backward on what this returns, so fp16 loss scaling happens here:
    the loss times the scaler's scale (the gradients every stage then receives are
    scaled, and the scaler unscales them before the optimizer step). :meth:`true_losses`
    turns the schedule's list of scaled losses back into the losses themselves."""

    def __init__(self, scaler: Any = None) -> None:
        self.scaler = scaler

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = lm_loss(output, target)
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def true_losses(self, losses: list[torch.Tensor]) -> list[torch.Tensor]:
        """The step's losses as the schedule returned them, divided by the scale they were
        multiplied with (call before the scaler's update). The scale is a power of two,
        so the division is exact; it stays on the device (no host sync)."""
        if self.scaler is None or not losses:
            return losses
        scale = self.scaler.scale(torch.ones((), device=losses[0].device))
        return [loss / scale for loss in losses]


def schedule_class(name: str) -> type:
    """The torch.distributed.pipelining class of a registered schedule."""
    import torch.distributed.pipelining as pipelining

    return getattr(pipelining, BY_NAME[name].torch_class)


def build_schedule(name: str, stages: list[Any], num_micro: int, loss: "StageLoss") -> Any:
    """The torch schedule over this rank's stages. Single-stage schedules (GPipe, 1F1B)
    take one stage; the others the list. Every one averages gradients over the
    micro-batches (scale_grads, torch's default): zero-bubble schedules too, after their
    split weight-gradient passes (checked by the correctness window)."""
    cls = schedule_class(name)
    multi = BY_NAME[name].fixed_chunks != 1
    return cls(stages if multi else stages[0], n_microbatches=num_micro, loss_fn=loss)


def ddp_stage(module: nn.Module, group: Any, device: torch.device) -> nn.Module:
    """``module`` (a pipeline stage) wrapped in DDP over the data-parallel ``group``, its
    reducer armed by torch's schedule alone (schedules.GRAD_SYNC["ddp_reducer"]).

    torch's pipelining runs each micro-batch's forward under DDP's no_sync and arms the
    reducer itself before the stage's last backward (pipelining/stage.py,
    backward_maybe_with_nosync: reducer.prepare_for_backward). Its metadata inference on
    the first step (schedules.py _initialize_pp_stages -> stage._prepare_forward_infra)
    calls the stage once more, with gradients enabled and outside no_sync: DDP's forward
    then arms the reducer (DDP._post_forward: prepare_for_backward) for a graph nobody
    back-propagates. no_sync only stops a forward from arming it, so the first micro-
    batch's backward fires the reducer's hooks anyway: a stray all-reduce, and the stage's
    parameters recorded once for the bucket rebuild. A forward of the stage before its
    last backward rebuilds the buckets from that record (DDP._pre_forward); a stage that
    runs every forward before its first backward (GPipe, 1F1B at grad_accum == pp,
    interleaved 1F1B at grad_accum 2 and 4 on pp 2) records its parameters again at the
    last backward, and the next step's first forward fails torch's assert ("rebuilt
    parameter indices size is not same as original model parameters size", 10 versus 20
    on the tiny model's stage: tests/unit/test_pipeline_ddp_replicas.py).

    With DDP's own arming turned off (require_backward_grad_sync, the flag no_sync sets
    and restores) the metadata forward is like every other forward of the schedule: only
    the last backward reduces. Safe because nothing else needs the flag here: the
    schedule never runs a forward outside no_sync but that one, and stage.py arms the
    reducer explicitly, whatever the flag says."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrapped = DDP(module, process_group=group, device_ids=[device.index] if device.type == "cuda" else None)
    wrapped.require_backward_grad_sync = False
    return wrapped


def mean_allreduce(modules: list[nn.Module], group: Any) -> Callable[[], None]:
    """A function that averages the gradients of ``modules`` (this rank's stages) over the
    data-parallel ``group``: per stage, the gradients flattened into one buffer per dtype,
    one all-reduce of it, the mean copied back. For the split-backward schedules with
    dp_mode = "ddp" (schedules.GRAD_SYNC["allreduce_after_schedule"]), after the
    schedule's step; every replica runs the same schedule, so the same parameters hold
    gradients on each and the buffers line up."""
    import torch.distributed as dist

    from .pieces import allreduce_flat

    size = dist.get_world_size(group)

    def reduce() -> None:
        for mod in modules:
            allreduce_flat([p.grad for p in mod.parameters() if p.grad is not None], group, divisor=size)

    return reduce


def count_params(modules: list[nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())
