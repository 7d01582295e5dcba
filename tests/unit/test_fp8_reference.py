"""fp8's single-process reference (issue 17, item 3) and the fp8 / gradient-compression
refusals of the suite, without a process group.

Rowwise fp8 under FSDP failed the correctness check (gradient norm 2.1e-3 off, tolerance
1e-3) because the reference cache key had no fp8_recipe: a rowwise config in a run with a
tensorwise one was checked against the tensorwise reference. Beyond that, FSDP2 all-gathers
rowwise weights in bf16, so its float8 weights are rounded from bf16, and the reference of
such a config does the same (strategies/fp8.py). The runs on gloo ranks are in
tests/unit/test_check_gloo.py and suites/modern.toml.
"""

import copy
import importlib.util

import pytest
import torch

from mgbench import suite as S
from mgbench.runner.reference import check_key
from mgbench.runner.tolerance import check_config
from mgbench.strategies import fp8

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
CPU = torch.device("cpu")
MODEL = "{ layers = 4, hidden = 64, heads = 4, kv_heads = 2, ffn_hidden = 176, vocab = 256 }"


def _key(strategy, precision="fp8", **kw):
    return check_key(check_config(strategy, precision=precision, **kw), CPU)


def test_reference_key_tells_fp8_recipes_and_weight_casts_apart():
    # Tensorwise and rowwise fp8 compute different numbers: one reference each.
    assert _key("fsdp", fp8_recipe="rowwise") != _key("fsdp", fp8_recipe="tensorwise")
    assert _key("ddp", fp8_recipe="rowwise") != _key("ddp", fp8_recipe="tensorwise")
    # Rowwise under FSDP2 casts its float8 weights from bf16 (ZeRO-2 and -3 alike), DDP from fp32.
    assert _key("fsdp", fp8_recipe="rowwise") != _key("ddp", fp8_recipe="rowwise")
    assert _key("fsdp", fp8_recipe="rowwise") == _key("fsdp_grad_op", fp8_recipe="rowwise")
    # Tensorwise FSDP2 all-gathers float8 cast from the fp32 shard: DDP's reference.
    assert _key("fsdp", fp8_recipe="tensorwise") == _key("ddp", fp8_recipe="tensorwise")
    # Other precisions: still one reference for every strategy.
    assert _key("fsdp", precision="bf16") == _key("ddp", precision="bf16")
    rule = {(s, r): fp8.weights_cast_from_gathered(check_config(s, precision="fp8", fp8_recipe=r))
            for s in ("ddp", "zero1", "fsdp", "fsdp_grad_op") for r in ("tensorwise", "rowwise")}
    assert [k for k, v in rule.items() if v] == [("fsdp", "rowwise"), ("fsdp_grad_op", "rowwise")]
    assert not fp8.weights_cast_from_gathered(check_config("fsdp", precision="bf16"))


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install mgbench[fp8])")
def test_bf16_weights_round_the_float8_weight_from_bf16():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))
    cast, rounded = copy.deepcopy(plain), copy.deepcopy(plain)
    with torch.no_grad():
        rounded[0].weight.copy_(rounded[0].weight.to(torch.bfloat16).float())
    for m, bf16 in ((plain, False), (cast, True), (rounded, False)):
        assert fp8.convert(m, "rowwise", fsdp=False, gathered_weights=bf16) == 1
    x = torch.randn(8, 64)
    y_cast = cast(x)
    # The cast model computes what float8 casts of bf16 weights compute, not what the
    # fp32 weights give (without the cast, y_cast would equal plain's output).
    assert torch.equal(y_cast.float(), rounded(x).float())
    assert not torch.equal(y_cast.float(), plain(x).float())
    # The trained parameter is still the fp32 weight, and its gradient comes back in fp32.
    y_cast.float().square().sum().backward()
    (param,) = list(cast.parameters())
    assert param.dtype == torch.float32 and param.grad is not None and param.grad.dtype == torch.float32


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install mgbench[fp8])")
def test_the_reference_casts_weights_to_the_dtype_fsdp_gathers_in(monkeypatch):
    """The reference's weight cast follows FSDP2's mixed-precision policy (one place:
    pieces.AUTOCAST_DTYPES["fp8"] through fsdp_mp_policy), not a bf16 of its own: with the
    gather dtype changed to fp16, the reference's weights are fp16 too."""
    from mgbench.strategies import pieces

    def cast_dtype():
        m = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))
        fp8.convert(m, "rowwise", fsdp=False, gathered_weights=True)
        return m[0].weight.dtype

    assert fp8.fsdp_weight_dtype() == pieces.fsdp_mp_policy("fp8").param_dtype == torch.bfloat16
    assert cast_dtype() == torch.bfloat16
    monkeypatch.setitem(pieces.AUTOCAST_DTYPES, "fp8", torch.float16)
    assert pieces.fsdp_mp_policy("fp8").param_dtype == torch.float16 and cast_dtype() == torch.float16
    # Gathered as stored (no mixed precision): nothing to round, no separate reference.
    monkeypatch.setitem(pieces.AUTOCAST_DTYPES, "fp8", None)
    assert cast_dtype() == torch.float32
    assert not fp8.weights_cast_from_gathered(check_config("fsdp", precision="fp8", fp8_recipe="rowwise"))


def _skips(body: str) -> list[str | None]:
    return [c.skip_reason for c in S.expand(S.parse_suite(f'name = "t"\n[sweep]\nmodel = {MODEL}\n' + body), "cpu", 4)]


@pytest.mark.parametrize("body, words", [
    ('strategy = "fsdp+tp"\nnproc = 4\n', "float8 pipeline stages and fp8 fsdp+tp are not built yet"),
    ('strategy = "pp"\nnproc = 2\ngrad_accum = 2\n', "float8 pipeline stages and fp8 fsdp+tp are not built yet"),
    ('strategy = "pp+tp+dp"\nnproc = 4\ngrad_accum = 2\ncheck_steps = 0\n', "float8 pipeline stages"),
])
def test_fp8_refuses_tensor_pipeline_and_context_parallelism(body, words):
    # Refused whether torchao is installed or not (the refusal comes first).
    (why,) = _skips(body + 'precision = "fp8"\n')
    assert why is not None and words in why, why
    # The same layouts without fp8 run.
    assert _skips(body) == [None]


@pytest.mark.extras  # both ways: refused without torchao, runs with it
def test_fp8_tensor_parallelism_runs_checked():
    # tp / tp_sp run with the check on: fp8's tolerance includes tensor parallelism's
    # measured spread (runner/check.py); fsdp+tp and pipelines stay refused above.
    got = _skips('strategy = ["tp", "tp_sp"]\nnproc = 2\nprecision = "fp8"\n')
    assert got == [None, None] if HAS_TORCHAO else all("install mgbench[fp8]" in why for why in got)


def test_fp8_tensor_parallel_shards_must_stay_16_aligned_on_cuda():
    from mgbench.config import RunConfig

    # tiny: ffn_hidden 176 (aligned) splits into 88 per rank at tp = 2, which CUDA's
    # scaled matmul refuses; a 64-wide ffn splits into 32.
    why = S._fp8_tp_shard_problem(RunConfig(model="tiny").shape, 2)
    assert why is not None and "w1's 176 output features split 2 ways" in why and "tp = 2" in why
    ok = RunConfig(model=dict(layers=2, hidden=64, heads=2, kv_heads=2, ffn_hidden=64, vocab=256)).shape
    assert S._fp8_tp_shard_problem(ok, 2) is None
    assert S._fp8_tp_shard_problem(ok, 4) is None  # 64 / 4 = 16 everywhere
    assert "wq's 64 output features split 8 ways" in S._fp8_tp_shard_problem(ok, 8)


@pytest.mark.extras  # both ways: refused without torchao, runs with it
def test_fp8_runs_with_context_parallelism_in_both_recipes():
    # Per-rank scales over a part of each sequence: 6.8e-4 to 9.5e-4 (tensorwise) off the
    # reference in gradient norm, inside fp8's tolerance (runner/check.py).
    got = _skips('strategy = "cp"\nnproc = 4\nlayout = {cp = 2}\nprecision = "fp8"\n'
                 'fp8_recipe = ["tensorwise", "rowwise"]\n')
    assert got == [None, None] if HAS_TORCHAO else all("install mgbench[fp8]" in why for why in got)


@pytest.mark.extras  # both ways: refused without torchao, runs with it
def test_fp8_data_parallel_has_no_refusal():
    got = _skips('strategy = ["ddp", "fsdp"]\nnproc = 2\nprecision = "fp8"\nfp8_recipe = "rowwise"\n')
    if HAS_TORCHAO:
        assert got == [None, None]
    else:
        assert all("install mgbench[fp8]" in why for why in got)


def test_bf16_gradient_compression_is_refused_on_cpu_before_torch_2_13(monkeypatch):
    body = 'strategy = "ddp"\nnproc = 2\ngrad_compression = "bf16"\n'
    monkeypatch.setattr(S, "_torch_version", lambda: (2, 6))
    (why,) = _skips(body)
    assert why == "bf16 gradient compression on CPU: gloo reduces bf16 from torch 2.13 on; use fp16"
    assert _skips(body.replace("bf16", "fp16")) == [None]
    monkeypatch.setattr(S, "_torch_version", lambda: (2, 13))
    assert _skips(body) == [None]
