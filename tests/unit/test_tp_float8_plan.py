"""Which tensor-parallel styles a block's plan takes (strategies/tensor_parallel.py),
decided without a process group: torchao's float8 styles for tensorwise float8 linears
(which only run on CUDA under sequence parallelism: gloo cannot all-gather float8), the
plain ones otherwise, and no entry for a projection the block lacks (GELU MLP: no w3)."""

import importlib.util

import pytest
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from mgbench.config import RunConfig
from mgbench.strategies.tensor_parallel import block_plan, float8_styles_on
from mgbench.workloads.gpt import DecoderLM

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
SHAPE = dict(layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=176, vocab=256)


def _block(recipe=None, mlp="swiglu"):
    model = DecoderLM(RunConfig(model=dict(SHAPE, mlp=mlp)).shape, 32)
    if recipe:
        from mgbench.strategies import fp8

        fp8.convert(model, recipe, fsdp=False)
    return model.blocks["0"]


def _styles(plan):
    return {k: type(v).__name__ for k, v in plan.items()}


def test_only_gloo_with_sequence_parallelism_keeps_the_plain_styles():
    assert float8_styles_on("cuda", True) and float8_styles_on("cuda", False) and float8_styles_on("cpu", False)
    assert not float8_styles_on("cpu", True)


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install mgbench[fp8])")
def test_tensorwise_float8_linears_take_torchaos_float8_styles_where_they_can_run():
    block = _block("tensorwise")
    cuda_sp = _styles(block_plan(True, block, float8_styles_on("cuda", True)))
    assert {cuda_sp[f] for f in ("attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3")} == {"Float8ColwiseParallel"}
    assert {cuda_sp[f] for f in ("attn.wo", "mlp.w2")} == {"Float8RowwiseParallel"}
    # One float8 cast before sequence parallelism's all-gather serves every reader.
    assert cuda_sp["attn"] == cuda_sp["mlp"] == "PrepareFloat8ModuleInput"
    # Gloo with sequence parallelism: the plain styles, exactly (not their float8 subclasses).
    gloo_sp = block_plan(True, block, float8_styles_on("cpu", True))
    assert {type(gloo_sp[f]) for f in ("attn.wq", "mlp.w1", "mlp.w3")} == {ColwiseParallel}
    assert {type(gloo_sp[f]) for f in ("attn.wo", "mlp.w2")} == {RowwiseParallel}
    assert type(gloo_sp["attn"]) is type(gloo_sp["mlp"]) is PrepareModuleInput
    # Gloo without it: the float8 styles (no float8 all-gather there).
    assert _styles(block_plan(False, block, float8_styles_on("cpu", False)))["mlp.w2"] == "Float8RowwiseParallel"
    # Rowwise scaling: the plain styles everywhere (torchao's styles cast tensorwise).
    rowwise = block_plan(True, _block("rowwise"), float8_styles_on("cuda", True))
    assert type(rowwise["attn.wq"]) is ColwiseParallel and type(rowwise["mlp"]) is PrepareModuleInput


def test_a_gelu_block_has_no_gate_projection_in_its_plan():
    assert "mlp.w3" in block_plan(True)  # no block: the full SwiGLU plan
    assert "mlp.w3" in block_plan(True, _block())
    gelu = block_plan(True, _block(mlp="gelu"))
    assert "mlp.w3" not in gelu and "mlp.w1" in gelu and "mlp" in gelu


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install mgbench[fp8])")
def test_a_gelu_float8_block_gathers_its_mlp_input_in_float8():
    # Its one reader (w1) is a tensorwise float8 linear: the missing w3 does not veto it.
    plan = _styles(block_plan(True, _block("tensorwise", mlp="gelu"), float8_styles_on("cuda", True)))
    assert "mlp.w3" not in plan and plan["mlp"] == "PrepareFloat8ModuleInput"
