"""FP8 training through torchao's float8 linears (``precision = "fp8"``; extra ``mgbench[fp8]``).

What fp8 means here: every ``nn.Linear`` of the decoder blocks becomes a torchao
``Float8Linear`` (inputs, weights and output gradients cast to float8 with dynamic
scales, matmuls through ``torch._scaled_mm``) and everything else runs under bf16
autocast, as torchtitan's float8 converter does. The output projection (``head``) stays
bf16: the final logits are the most precision-sensitive matmul and torchtitan leaves
it out of float8 by default too. Attention's score and value matmuls (SDPA) are not
linears and stay bf16.

Recipes (``fp8_recipe``): ``tensorwise`` (one scale per tensor; under FSDP2 the weights
are all-gathered in float8, torchao's ``enable_fsdp_float8_all_gather``) and
``rowwise`` (one scale per row; all-gathered in bf16).

The single-process reference of an fp8 config runs the same conversion and autocast in
one process: the check then asks whether the parallel strategy computes what fp8
training computes, not whether fp8 training matches bf16 (it does not, by design).
"""

from __future__ import annotations

from typing import Any

from torch import nn

# torchao requires both dims of a float8 matmul's weight to be multiples of 16
# (torch._scaled_mm's alignment rule).
FP8_ALIGN = 16
# Linears left in bf16 (see the module docstring): the output projection, named head in
# mgbench's decoder and ViT, lm_head in Hugging Face causal LMs.
SKIPPED_LINEARS = ("head", "lm_head")


def _convertible(module: nn.Module, fqn: str) -> bool:
    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] in SKIPPED_LINEARS:
        return False
    return module.in_features % FP8_ALIGN == 0 and module.out_features % FP8_ALIGN == 0


def convert(model: nn.Module, recipe: str, fsdp: bool) -> int:
    """Swap the model's eligible linears for torchao float8 linears, in place; returns how
    many were converted. ``fsdp``: the model will be sharded by FSDP2 (tensorwise then
    all-gathers its weights in float8)."""
    import dataclasses
    import logging

    # torchao logs a failed load of its CUDA-only extensions on a CPU-only torch: harmless here.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if recipe == "tensorwise" and fsdp:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=config, module_filter_fn=_convertible)
    from torchao.float8.float8_linear import Float8Linear

    n = sum(isinstance(m, Float8Linear) for m in model.modules())
    if n == 0 and before:
        raise ValueError(f"no linear of this model has both dims a multiple of {FP8_ALIGN}: nothing runs in fp8")
    return n


def fp8_fields(precision: str, device_type: str) -> dict[str, Any]:
    """Record fields that say what an fp8 config's speed means (empty for other precisions)."""
    if precision != "fp8":
        return {}
    note = None
    if device_type == "cpu":
        note = ("fp8 on CPU ranks: torch's CPU scaled matmul has no float8 units behind it, so the run checks fp8 "
                "numerics only; its speed says nothing about fp8 hardware")
    return {"fp8_speed_reason": note}
