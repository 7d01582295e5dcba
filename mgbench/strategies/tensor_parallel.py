"""Megatron-style tensor parallelism (and sequence parallelism) with DTensor.

Column-parallel q, k, v and MLP input projections, row-parallel output projections, so
each block needs one all-reduce after attention and one after the MLP (forward; the
same in backward). The embedding is split over the vocabulary and the output projection
over its columns, with full logits gathered for the loss. Sequence parallelism shards
the residual stream, the norms and their activations over the sequence, turning each
all-reduce into a reduce-scatter + all-gather pair (Korthikanti et al. 2022).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def block_plan(sequence_parallel: bool) -> dict[str, object]:
    """Plan for one Block (attn_norm, attn.{wq,wk,wv,wo}, mlp_norm, mlp.{w1,w3,w2})."""
    out = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=out),
        "mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(output_layouts=out),
    }
    if sequence_parallel:
        plan.update({
            "attn_norm": SequenceParallel(),
            # Attention and MLP need the whole sequence: gather it at their inputs.
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                       desired_input_layouts=(Replicate(), None, None)),
            "mlp_norm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
    return plan


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Parallelize a DecoderLM (or a pipeline stage of one: missing parts are skipped)."""
    out = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, object] = {}
    if getattr(model, "tok_emb", None) is not None:
        top["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=out)
    if getattr(model, "norm", None) is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if getattr(model, "head", None) is not None:
        top["head"] = ColwiseParallel(input_layouts=out, output_layouts=Replicate())
    if top:
        parallelize_module(model, mesh, top)
    plan = block_plan(sequence_parallel)
    for block in model.blocks.values():
        if getattr(block.mlp, "w3", None) is None:  # GELU MLP: no gate projection
            plan = {k: v for k, v in plan.items() if k != "mlp.w3"}
        parallelize_module(block, mesh, plan)
