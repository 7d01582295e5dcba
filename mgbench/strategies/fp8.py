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
One more thing must match: the precision a weight is in when it is cast to float8.
FSDP2's mixed precision (param_dtype bf16) all-gathers rowwise weights in bf16, so each
float8 weight is rounded twice (fp32 -> bf16 -> e4m3); DDP, ZeRO-1 and tensorwise FSDP
(whose float8 all-gather casts the fp32 shard) round once, from fp32. The two differ
where bf16's rounding lands on an e4m3 tie: 2.9% of the entries of a random 176 x 64
weight, rowwise. Measured on the check window (suites/modern.toml's fp8 model, 4 gloo
ranks, seeds 0 and 1), rowwise FSDP's step-1 gradient norm against a reference rounding
from fp32: 4.2e-4 and 8.1e-4 relative (tolerance 1e-3); against one rounding from bf16:
2.0e-5 and 1.8e-5, the level of tensorwise FSDP's other bf16 casts (1.4e-5, 2.1e-5);
and FSDP2 with fp32 parameters matches the fp32-rounding reference to 1e-15. So the
reference of such a config rounds its float8 weights from bf16 too
(:func:`weights_cast_from_gathered`, ``convert(..., gathered_weights=True)``; the dtype is
:func:`fsdp_weight_dtype`, FSDP2's), cached apart
from the others (runner/reference.py). (The check's failure reported in issue 17, 2.1e-3,
was a rowwise config checked against the tensorwise reference: the cache key lacked
fp8_recipe.)

Where the ranks split a micro-batch's tokens, no one-process reference quantises as
they do: under context parallelism each cp rank takes its dynamic scales from its own
part of every sequence. Measured (2 gloo ranks, cp = 2, seeds 0-2): tensorwise (one
scale per tensor over the rank's tokens) 6.8e-4 to 9.5e-4 off in step-1 gradient norm,
inside fp8's tolerance (1.72e-2, set by tensor parallelism's spread, runner/check.py);
rowwise (per-token scales in
forward, only the weight-gradient matmul scaled along tokens) 1.4e-4 to 2.7e-4, bf16
1.3e-4 at most. Data parallelism splits whole micro-batches, as the reference takes
them: DDP matches it to rounding (rowwise 0 in gradient norm).

Tensor parallelism splits each linear instead (strategies/tensor_parallel.py: torchao's
float8 tensor-parallel styles for tensorwise, the plain ones for rowwise; scales over the
whole tensor either way). Its row-parallel partial sums are rounded to bf16 before they
are added, which the next float8 casts amplify: measured (tiny model, 2 gloo ranks, seeds
0-3) 1.8e-4 to 1.0e-3 (tp) and 9.9e-6 to 1.8e-3 (tp_sp) off in step-1 gradient norm,
bf16 tp 8.7e-6 to 3.9e-4. Computing those forward partial sums in fp32 took one case from
1.8e-3 to 6.0e-4 (the backward's partial sums were not tried). This is a reduction-order
effect like bf16's tp2, so `python -m mgbench.runner.tolerance --precisions fp8` measures
it (tp2 1.72e-3 in grad_norm over tiny and mini, seeds 0-2) and fp8's tolerance is 10x
that, as for every precision (runner/check.py); the injected bugs move the gradient norm
by 0.27 or more.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import FP8_ALIGN  # torch._scaled_mm's alignment rule for both dims of a float8 weight

# Linears left in bf16 (see the module docstring): the output projection, named head in
# mgbench's decoder and ViT, lm_head in Hugging Face causal LMs.
SKIPPED_LINEARS = ("head", "lm_head")
# The first CUDA compute capability with float8 tensor cores (Ada, 8.9; Hopper 9.0 and
# Blackwell 10.x after it): torch._scaled_mm refuses float8 below it, so an A100 (8.0)
# would fail every fp8 config's first step.
FP8_MIN_CAPABILITY = (8, 9)


def capability_problem(capability: tuple[int, int], name: str = "this GPU") -> str | None:
    """Why a GPU of CUDA compute ``capability`` cannot run fp8 configs (None when it can)."""
    if tuple(capability) >= FP8_MIN_CAPABILITY:
        return None
    need = ".".join(map(str, FP8_MIN_CAPABILITY))
    return (f"fp8 needs float8 tensor cores, CUDA compute capability >= {need} (Ada, Hopper, Blackwell); "
            f"{name} has compute capability {capability[0]}.{capability[1]}")


def _convertible(module: nn.Module, fqn: str) -> bool:
    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] in SKIPPED_LINEARS:
        return False
    return module.in_features % FP8_ALIGN == 0 and module.out_features % FP8_ALIGN == 0


def fp8_all_gather(recipe: str, fsdp: bool) -> bool:
    """Whether FSDP2 all-gathers the float8 linears' weights already in float8 (torchao's
    ``enable_fsdp_float8_all_gather``, tensorwise only): each rank casts its fp32 shard."""
    return fsdp and recipe == "tensorwise"


def sharded(cfg: Any) -> bool:
    """Whether FSDP2 shards ``cfg``'s weights (ZeRO stage >= 2): its float8 linears are
    then FSDP's to gather (fp8_all_gather, weights_cast_from_gathered)."""
    return cfg.zero_stage >= 2


def fsdp_weight_dtype() -> torch.dtype | None:
    """The dtype FSDP2 all-gathers an fp8 config's parameters in (bf16), read from its
    mixed-precision policy (strategies/pieces.fsdp_mp_policy) so that the reference's cast
    follows it; None: gathered as they are stored (fp32)."""
    from .pieces import fsdp_mp_policy

    return fsdp_mp_policy("fp8").param_dtype


def weights_cast_from_gathered(cfg: Any) -> bool:
    """Whether ``cfg``'s float8 linears cast their weights to float8 from copies in FSDP2's
    gather dtype (:func:`fsdp_weight_dtype`, bf16): fp8 under FSDP2 (ZeRO stage >= 2)
    without the float8 all-gather. Every other fp8 config casts from the fp32 weights;
    non-fp8 configs: False."""
    return (cfg.precision == "fp8" and sharded(cfg) and not fp8_all_gather(cfg.fp8_recipe, sharded(cfg))
            and fsdp_weight_dtype() is not None)


class _CastTo(nn.Module):
    """Parametrization: the weight as a copy in ``dtype`` (the gradient flows back to the
    fp32 weight in fp32, as FSDP2's reduce_dtype = fp32 brings it back)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.to(self.dtype)


def convert(model: nn.Module, recipe: str, fsdp: bool, gathered_weights: bool = False) -> int:
    """Swap the model's eligible linears for torchao float8 linears, in place; returns how
    many were converted. ``fsdp``: the model will be sharded by FSDP2 (tensorwise then
    all-gathers its weights in float8). ``gathered_weights``: each float8 linear reads its
    weight through a cast to FSDP2's gather dtype (:func:`fsdp_weight_dtype`), so its
    float8 cast rounds from that dtype as under FSDP2's all-gather (the one-process
    reference of such a config; module docstring)."""
    import dataclasses
    import logging

    # torchao logs a failed load of its CUDA-only extensions on a CPU-only torch: harmless here.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if fp8_all_gather(recipe, fsdp):
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=config, module_filter_fn=_convertible)
    from torchao.float8.float8_linear import Float8Linear

    n = sum(isinstance(m, Float8Linear) for m in model.modules())
    if n == 0 and before:
        raise ValueError(f"no linear of this model has both dims a multiple of {FP8_ALIGN}: nothing runs in fp8")
    dtype = fsdp_weight_dtype() if gathered_weights else None
    if dtype is not None:
        from torch.nn.utils import parametrize

        for m in [m for m in model.modules() if isinstance(m, Float8Linear)]:
            # unsafe: the parametrization changes the weight's dtype on purpose (torch
            # refuses that otherwise); shape and device stay.
            parametrize.register_parametrization(m, "weight", _CastTo(dtype), unsafe=True)
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
