"""Megatron-style tensor parallelism (and sequence parallelism) with DTensor.

Column-parallel q, k, v and MLP input projections, row-parallel output projections, so
each block needs one all-reduce after attention and one after the MLP (forward; the
same in backward). The embedding is split over the vocabulary and the output projection
over its columns, with full logits gathered for the loss. Sequence parallelism shards
the residual stream, the norms and their activations over the sequence, turning each
all-reduce into a reduce-scatter + all-gather pair (Korthikanti et al. 2022).

Float8 tensor parallelism (``precision = "fp8"``, strategies/fp8.py), as torchtitan
applies it: a block's float8 linears with tensorwise scaling take torchao's float8
styles (Float8ColwiseParallel, Float8RowwiseParallel, and PrepareFloat8ModuleInput at
attention's and the MLP's input under sequence parallelism), which cast each input to
float8 before it is communicated, so sequence parallelism's all-gathers carry float8
(on NCCL; gloo has no float8 dtypes: :func:`apply_tensor_parallel`).
Rowwise scaling keeps the plain styles (torchao's float8 styles cast with one scale
per tensor): its all-gathers stay bf16 and each float8 linear casts its DTensor inputs
itself. Either way every dynamic scale is taken over the whole (DTensor) tensor, amax
reduced across the tp ranks, so a rank quantises its shard as one process would the
whole tensor. The embedding and the output projection are not float8 linears. What
still differs from one process: the row-parallel matmuls' partial sums are rounded to
bf16 before they are added, and the next float8 casts amplify that: a reduction-order
effect, held to fp8's tolerance, which includes tp2's measured spread (runner/check.py).
"""

from __future__ import annotations

import sys

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

COLWISE = ("attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3")
ROWWISE = ("attn.wo", "mlp.w2")


def _float8_tensorwise(module: nn.Module | None) -> bool:
    """Whether ``module`` is a torchao float8 linear scaling its input tensorwise (the
    scaling torchao's float8 tensor-parallel styles cast with)."""
    # No torchao float8 linear exists unless torchao's float8 module was imported
    # (strategies/fp8.convert): plain configs never import torchao here.
    mod = sys.modules.get("torchao.float8.float8_linear")
    if mod is None or not isinstance(module, mod.Float8Linear):
        return False
    from torchao.float8.config import ScalingGranularity

    return module.config.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE


def block_plan(sequence_parallel: bool, block: nn.Module | None = None, float8_styles: bool = True
               ) -> dict[str, object]:
    """Plan for one Block (attn_norm, attn.{wq,wk,wv,wo}, mlp_norm, mlp.{w1,w3,w2}).
    ``block``: the block to be split; the plan leaves out the projections it lacks (a GELU
    MLP has no mlp.w3), and its tensorwise float8 linears get torchao's float8 styles
    (module docstring). Without it, or without float8 linears: the plain styles.
    ``float8_styles``: False keeps the plain styles for float8 linears too (their
    communication then stays bf16; see :func:`apply_tensor_parallel`)."""
    out = Shard(1) if sequence_parallel else Replicate()

    def sub(fqn: str) -> nn.Module | None:
        try:
            return block.get_submodule(fqn) if block is not None else None
        except AttributeError:  # GELU MLP: no mlp.w3
            return None

    float8 = {fqn: float8_styles and _float8_tensorwise(sub(fqn)) for fqn in COLWISE + ROWWISE}
    if float8["attn.wq"] or float8["mlp.w1"]:
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )
    present = [fqn for fqn in COLWISE + ROWWISE if block is None or sub(fqn) is not None]
    plan: dict[str, object] = {}
    for fqn in present:
        if fqn in COLWISE:
            plan[fqn] = Float8ColwiseParallel() if float8[fqn] else ColwiseParallel()
        else:
            plan[fqn] = (Float8RowwiseParallel(output_layouts=out) if float8[fqn]
                         else RowwiseParallel(output_layouts=out))
    if sequence_parallel:
        # Attention and MLP need the whole sequence: gather it at their inputs, in float8
        # when every projection reading it is a tensorwise float8 linear (the one cast
        # before the all-gather then serves them all; a plain linear cannot read float8).
        readers = {"attn": ("attn.wq", "attn.wk", "attn.wv"), "mlp": ("mlp.w1", "mlp.w3")}
        for name, layouts in (("attn", (Shard(1), None, None)), ("mlp", (Shard(1),))):
            gathered = (Replicate(),) + (None,) * (len(layouts) - 1)
            if all(float8[f] for f in readers[name] if f in present):
                plan[name] = PrepareFloat8ModuleInput(input_layouts=layouts, desired_input_layouts=gathered)
            else:
                plan[name] = PrepareModuleInput(input_layouts=layouts, desired_input_layouts=gathered)
        plan["attn_norm"] = SequenceParallel()
        plan["mlp_norm"] = SequenceParallel()
    return plan


def float8_styles_on(device_type: str, sequence_parallel: bool) -> bool:
    """Whether torchao's float8 styles split the tensorwise float8 linears of a mesh on
    ``device_type``. Sequence parallelism's float8 styles all-gather float8 tensors (inputs
    in forward, output gradients in backward), which gloo refuses (torch 2.13:
    "RuntimeError: Invalid scalar type"); NCCL gathers them as bytes. On gloo the plain
    styles gather bf16 and each float8 linear casts the gathered tensor itself:
    tensorwise scales are global amaxes either way, so the float8 values are the same."""
    return device_type == "cuda" or not sequence_parallel


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
    float8_styles = float8_styles_on(mesh.device_type, sequence_parallel)
    for block in model.blocks.values():
        parallelize_module(block, mesh, block_plan(sequence_parallel, block, float8_styles))
