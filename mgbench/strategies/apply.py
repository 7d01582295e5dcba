"""Turn a freshly built model into a trained-under-strategy model + optimizer.

Every strategy here is data parallel over all ranks: rank r holds micro-batches
r * grad_accum ... of each global batch. What differs is what each rank stores and
which collectives run (see STRATEGIES).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..workloads.gpt import DecoderLM

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# AdamW settings of the benchmark. Values from common LM practice (GPT-3 / Llama):
# they matter only in that every strategy and the reference use the same ones.
OPTIMIZER_KW: dict[str, Any] = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}


class Checkpointed(nn.Module):
    """Recompute a block's activations in backward instead of storing them."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, *args, use_reentrant=False)


def apply_activation_checkpointing(model: DecoderLM, mode: str) -> None:
    """none; selective = every 2nd block (torchtitan's layer-wise selective AC with
    frequency 2); full = every block."""
    if mode == "none":
        return
    every = 2 if mode == "selective" else 1
    for i, key in enumerate(list(model.blocks.keys())):
        if i % every == 0:
            model.blocks[key] = Checkpointed(model.blocks[key])


def apply_compile(model: DecoderLM) -> None:
    """Compile each block separately (as torchtitan does): smaller graphs, and FSDP
    hooks stay between them."""
    for key in list(model.blocks.keys()):
        model.blocks[key].compile()


@dataclass
class Prepared:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any  # GradScaler or None
    no_sync: Callable[[bool], ContextManager[Any]]  # no_sync(is_last_micro_step)


def _fsdp(model: DecoderLM, device: torch.device, precision: str, reshard: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # An explicit mesh of the device type: on CPU this is what lets FSDP2 use gloo.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dtype = AUTOCAST_DTYPES[precision]
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
    for block in model.blocks.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    # The root holds embedding, final norm and head; it is resharded only at the end.
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)


def prepare(strategy: str, model: DecoderLM, device: torch.device, precision: str) -> Prepared:
    """Wrap the model for ``strategy`` and build its AdamW (sharded where the strategy says)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    scaler = None
    if strategy in ("single", "ddp", "zero1"):
        model = model.to(device)
        wrapped: nn.Module = model
        if strategy in ("ddp", "zero1"):
            wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
                wrapped.parameters(), optimizer_class=torch.optim.AdamW, **OPTIMIZER_KW
            )
        else:
            opt = torch.optim.AdamW(wrapped.parameters(), **OPTIMIZER_KW)
        if precision == "fp16":
            scaler = torch.amp.GradScaler(device.type)

        def no_sync(last: bool) -> ContextManager[Any]:
            if last or strategy == "single":
                return contextlib.nullcontext()
            return wrapped.no_sync()

        return Prepared(wrapped, opt, scaler, no_sync)

    if strategy in ("fsdp", "fsdp_grad_op"):
        model = model.to(device)
        _fsdp(model, device, precision, reshard=(strategy == "fsdp"))
        opt = torch.optim.AdamW(model.parameters(), **OPTIMIZER_KW)
        if precision == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            # Gradients are shards: found-inf must be agreed across ranks, which the
            # sharded scaler does with an all-reduce.
            scaler = ShardedGradScaler(device.type)

        @contextlib.contextmanager
        def fsdp_no_sync(last: bool):  # type: ignore[no-untyped-def]
            model.set_requires_gradient_sync(last)
            yield

        return Prepared(model, opt, scaler, fsdp_no_sync)

    raise ValueError(f"strategy {strategy!r} is not implemented")
