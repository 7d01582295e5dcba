"""gpt-oss's expert epilogue: the clamp of the GLU's inputs and the router-weighted bias
that Megatron-Core runs as eager elementwise passes (moe.epilogue_seconds), checked by
hand; where it is priced and where not (the fused grouped MLP, experts without either,
a dense model); and the model fields that carry it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.hf_config import shape_from_file
from mgbench.model_shape import ModelShape
from mgbench.planner import moe
from mgbench.planner import moe_validation as V
from mgbench.planner.resolve import resolve
from tests.unit.test_model_spec import PUBLISHED

B300_EP8 = "mbridge-26.04-b300-gpt-oss-120b-bf16-ep8"  # BF16, no recompute, force-balanced (load 1)
GB200_EP64 = "mbridge-26.02-gb200-gpt-oss-120b-bf16"  # BF16, recompute_modules layernorm, moe_act
GB300_FUSED = "mbridge-26.06-gb300-gpt-oss-120b-mxfp8"  # MXFP8 with the CuteDSL fused grouped MLP


def _row(rid):
    return next(r for r in V.runs() if r["id"] == rid)


class _Bytes(TorchDispatchMode):
    """Adds up every aten op's input and output bytes (each op reading its inputs and
    writing its outputs once, as EPILOGUE_BYTES counts), views free."""

    VIEWS = {"view", "_unsafe_view", "split", "split_with_sizes", "chunk", "narrow", "slice", "unsqueeze",
             "expand", "t", "alias", "detach", "as_strided", "unbind", "squeeze", "permute", "transpose", "reshape"}

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.split(".")[0] not in self.VIEWS:
            tensors = [a for a in tree_flatten((args, kwargs, out))[0] if isinstance(a, torch.Tensor)]
            self.total += sum(a.numel() * a.element_size() for a in tensors)
        return out


def _replay(forward, grad_like):
    """(forward bytes, backward bytes) of ``forward()``'s ops and its autograd backward."""
    fwd, bwd = _Bytes(), _Bytes()
    with fwd:
        out = forward()
    g = torch.ones_like(out)  # the incoming gradient: not the epilogue's
    with bwd:
        out.backward(g)
    return fwd.total, bwd.total


def test_the_byte_counts_are_torchs():
    # The ops Megatron-Core runs (fused_bias_geglu.weighted_bias_quick_geglu_impl's clamp;
    # experts.TEGroupedMLP._apply_bias, four local experts), replayed in BF16 on CPU torch:
    # the bytes its ops move, per routed row and unit of width, are EPILOGUE_BYTES'.
    n, f, h = 256, 64, 96
    x = torch.randn(n, 2 * f, dtype=torch.bfloat16, requires_grad=True)

    def clamp():
        glu, linear = x.chunk(2, -1)
        return torch.cat((glu.clamp(max=7.0), linear.clamp(min=-7.0, max=7.0)), -1)

    fwd, bwd = _replay(clamp, x)
    assert (fwd / (n * f), bwd / (n * f)) == pytest.approx(moe.EPILOGUE_BYTES["clamp"], abs=0.05)
    counts = [64] * 4
    for dtype, key in ((torch.float32, "bias_fp32_weights"), (torch.bfloat16, "bias_bf16_weights")):
        # Fresh leaves each time: a second backward into the same leaf would add an
        # accumulation Megatron's graph (where the GEMM's output is no leaf) does not run.
        out = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
        biases = [torch.randn(h, dtype=torch.bfloat16, requires_grad=True) for _ in counts]
        probs = torch.rand(n, 1, dtype=dtype, requires_grad=True)

        def bias():
            parts = zip(torch.split(out, counts), biases, torch.split(probs, counts))
            return torch.cat([t + b * p for t, b, p in parts]).to(out.dtype)

        fwd, bwd = _replay(bias, out)
        # Within 0.75 H a row: the router weights' and the biases' own reads.
        assert (fwd / (n * h), bwd / (n * h)) == pytest.approx(moe.EPILOGUE_BYTES[key], abs=0.75), key


def test_the_epilogue_by_hand():
    # gpt-oss-120b: F = H = 2880, 36 MoE layers, top-4. 64 GPUs, GBS 1280, MBS 4: 5
    # micro-batches of 4 x 4096 tokens a rank, 65,536 routed rows each (balanced).
    # HybridEP's fp32 router weights: the clamp 16 F + 30 F, the bias 28 H + 40 H a row.
    # DGX B300: 8 TB/s at the achieved fraction the catalog gives.
    row = _row(B300_EP8)
    assert row["dispatcher"] == "hybridep"
    hw = resolve(precision="bf16", system="dgx-b300")
    rows, passes = 4 * 4096 * 4, 36 * 5
    by_hand = (46 * 2880 + 68 * 2880) * rows * passes / (8e12 * hw.mem_bw_fraction)
    got = V.predict_row(row)["breakdown"]["moe_epilogue_s"]
    assert float(got) == pytest.approx(by_hand, rel=1e-9)
    assert by_hand == pytest.approx(0.588, abs=0.001)  # about a ninth of a 5.4 s published step
    # The all-to-all keeps BF16 router weights (12 H + 16 H), and recomputing the
    # activation (moe_act) runs the clamp's forward again (16 F more).
    row2 = _row(GB200_EP64)
    assert row2["dispatcher"] == "alltoall" and "moe_act" in row2["moe_recompute"]
    hw2 = resolve(precision="bf16", system="gb200-nvl72")
    again = (62 * 2880 + 28 * 2880) * rows * passes / (hw2.mem_bw * hw2.mem_bw_fraction)
    assert float(V.predict_row(row2)["breakdown"]["moe_epilogue_s"]) == pytest.approx(again, rel=1e-9)
    # A whole-block recompute runs the bias's forward again too (28 H), the clamp's (16 F).
    full = V.predict_row({**row, "recompute": "full"})["breakdown"]["moe_epilogue_s"]
    assert float(full) == pytest.approx(by_hand * (46 + 16 + 68 + 28) / (46 + 68), rel=1e-9)


def test_none_under_the_fused_grouped_mlp_or_for_other_experts():
    fused = _row(GB300_FUSED)
    assert moe.options_of(fused).fused_grouped_mlp
    assert float(V.predict_row(fused)["breakdown"]["moe_epilogue_s"]) == 0.0
    # The same run stated without the fused kernel pays it, and runs slower for it.
    unfused = V.predict_row(fused, dataclasses.replace(moe.options_of(fused), fused_grouped_mlp=False))
    assert float(unfused["breakdown"]["moe_epilogue_s"]) > 0.1
    assert unfused["step_time_s"] > V.predict_row(fused)["step_time_s"]
    # Experts without a clamp or biases (DeepSeek-V3, Qwen3) have no epilogue of their own.
    for rid in ("mbridge-25.11-b200-qwen3-30b-a3b-fp8", "mbridge-25.11-gb200-deepseek-v3-bf16"):
        assert float(V.predict_row(_row(rid))["breakdown"]["moe_epilogue_s"]) == 0.0
    # Each half counts alone: the bias without the clamp, the clamp without the bias.
    row = _row(B300_EP8)
    hw = resolve(precision="bf16", system="dgx-b300")
    shape = V.shape_of(row)
    kw = dict(tokens=16384.0, moe_layers=36, num_micro=5, load=1.0, opts=moe.MoeOptions())
    both = moe.epilogue_seconds(shape, hw, **kw)
    bias = moe.epilogue_seconds(dataclasses.replace(shape, glu_clamp=None), hw, **kw)
    clamp = moe.epilogue_seconds(dataclasses.replace(shape, expert_bias=False), hw, **kw)
    # (all-to-all, the default dispatcher: BF16 router weights, 28 H)
    assert bias == pytest.approx(both * 28 / 74) and clamp == pytest.approx(both * 46 / 74)


def test_predict_says_which_way_it_priced_them():
    from click.testing import CliRunner

    from mgbench.cli import main

    base = ["predict", "--model", "gpt-oss-120b", "--system", "dgx-b200", "--num-gpus", "64", "--ep", "8",
            "--micro-batch", "4", "--global-batch", "1280", "--seq-len", "4096", "--json"]
    eager = json.loads(CliRunner().invoke(main, base).output)
    fused = json.loads(CliRunner().invoke(main, [*base, "--precision", "fp8", "--fp8-recipe", "mxfp8",
                                                 "--moe-fused-grouped-mlp"]).output)
    assert eager["breakdown"]["moe_epilogue_s"] > 0
    assert any("priced as Megatron-Core runs them unfused" in n for n in eager["notes"])
    assert fused["breakdown"]["moe_epilogue_s"] == 0
    assert any("inside the fused grouped MLP" in n for n in fused["notes"])
    dense = json.loads(CliRunner().invoke(main, ["predict", "--model", "llama3-8b", "--system", "dgx-b200",
                                                 "--num-gpus", "8", "--json"]).output)
    assert not any("MoE experts" in n for n in dense["notes"])


def test_the_model_fields():
    oss = catalog.model_shape("gpt-oss-120b")
    assert oss.expert_bias and oss.glu_clamp == 7.0
    # Read from a Hugging Face config alike (swiglu_limit).
    hf = shape_from_file(PUBLISHED / "gpt-oss-120b" / "config.json")
    assert hf.expert_bias and hf.glu_clamp == 7.0
    # Neutral values leave a config's dims (and so its id) as they were.
    assert "expert_bias" not in catalog.model_shape("qwen3-30b-a3b").to_dict()
    assert "glu_clamp" not in catalog.model_shape("llama3-8b").to_dict()
    # The runner does not build them: it says so.
    assert "expert_bias, glu_clamp" in oss.runner_problem()
    dims = dict(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=100)
    for bad, match in ((dict(experts=4, top_k=2, glu_clamp=-1.0), "glu_clamp must be a positive number"),
                       (dict(experts=4, top_k=2, glu_clamp=True), "glu_clamp must be a positive number"),
                       (dict(experts=4, top_k=2, expert_bias="yes"), "expert_bias must be true or false"),
                       (dict(expert_bias=True), "apply to MoE models only"),
                       (dict(glu_clamp=7.0), "apply to MoE models only")):
        with pytest.raises(MgbenchError, match=match):
            ModelShape.from_dict({**dims, **bad})


def test_the_fused_grouped_mlp_is_refused_where_it_cannot_run():
    # Transformer Engine's kernel takes MXFP8 on Blackwell: BF16, another FP8 recipe or a
    # Hopper GPU is one line and exit status 2 (a review found it priced the epilogue at 0
    # for BF16 on H100).
    from click.testing import CliRunner

    from mgbench.cli import main

    base = ["predict", "--model", "gpt-oss-120b", "--num-gpus", "64", "--ep", "8", "--micro-batch", "4",
            "--global-batch", "1280", "--seq-len", "4096", "--moe-fused-grouped-mlp"]
    for extra, said in ((["--system", "dgx-b200"], "not bf16 on b200"),
                        (["--system", "dgx-b200", "--precision", "fp8", "--fp8-recipe", "tensorwise"],
                         "not fp8 (tensorwise) on b200"),
                        (["--system", "dgx-h100", "--precision", "fp8", "--fp8-recipe", "mxfp8"], "on h100-sxm")):
        r = CliRunner().invoke(main, [*base, *extra])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output
    ok = CliRunner().invoke(main, [*base, "--system", "dgx-b200", "--precision", "fp8", "--fp8-recipe", "mxfp8"])
    assert ok.exit_code == 0, ok.output
    # MX formats are not enough: CDNA 4 has them, the CuteDSL kernel is NVIDIA's (a second
    # review found an MI355X accepted).
    amd = CliRunner().invoke(main, [*base, "--system", "mi355x-8", "--precision", "fp8", "--fp8-recipe", "mxfp8"])
    assert amd.exit_code == 2 and "NVIDIA Blackwell" in amd.output and "on mi355x" in amd.output, amd.output
    # memory refuses it alike where the precision cannot have it (it names no GPU).
    mem = CliRunner().invoke(main, ["memory", "--model", "gpt-oss-120b", "--num-gpus", "64", "--ep", "8",
                                    "--moe-fused-grouped-mlp"])
    assert mem.exit_code == 2 and "not bf16" in mem.output and "Traceback" not in mem.output, mem.output


def test_every_dispatcher_states_its_router_weights_dtype_and_fp32_training_casts_nothing():
    assert set(moe.FP32_WEIGHTS) == set(moe.DISPATCHERS)
    row = _row(B300_EP8)
    hw = resolve(precision="bf16", system="dgx-b300")
    shape = dataclasses.replace(V.shape_of(row), glu_clamp=None)  # the bias alone
    kw = dict(tokens=16384.0, moe_layers=36, num_micro=5, load=1.0)
    per = {d: float(moe.epilogue_seconds(shape, hw, **kw, opts=moe.MoeOptions(dispatcher=d)))
           for d in moe.DISPATCHERS}
    assert per["deepep"] == pytest.approx(per["hybridep"]) == pytest.approx(per["alltoall"] * 68 / 28)
    # fp32 training: the weights are the activations' dtype, nothing is cast: the BF16-weights
    # ops at 4 bytes an element (24 H + 32 H), under every dispatcher.
    fp32 = {d: float(moe.epilogue_seconds(shape, hw, **kw, opts=moe.MoeOptions(dispatcher=d), act_bytes=4.0))
            for d in moe.DISPATCHERS}
    assert all(v == pytest.approx(per["alltoall"] * 2) for v in fp32.values())


def test_priced_for_megatron_core_only_and_its_saved_copy_in_memory():
    # The counts are Megatron-Core's ops: a stack without stacks.toml expert_epilogue
    # (NeMo AutoModel compiles the clamp into its activation; torchtitan's ops differ) has
    # neither the time nor the clamp's saved copy priced, and says so.
    from mgbench.planner import stack

    assert stack.counts_expert_epilogue("megatron-lm") and not stack.counts_expert_epilogue("torchtitan")
    row = {**_row("automodel-h100-gpt-oss-120b-64"), "stack": "torchtitan"}
    res = V.predict_row(row)
    assert float(res["breakdown"]["moe_epilogue_s"]) == 0.0
    assert any("not priced for the torchtitan stack" in n for n in res["notes"])
    # The same layout on Megatron-Core: the passes, and in memory the clamp's input kept
    # beside the clamped copy, 2 e F a routed row (no moe_act recompute here).
    mega = V.predict_row({**row, "stack": "megatron-lm"})
    assert float(mega["breakdown"]["moe_epilogue_s"]) > 0.0
    from mgbench.planner.memory import memory_per_gpu

    shape = V.shape_of(row)
    kw = dict(seq=4096, micro_batch=2, num_micro=4, ep=64, dp=64, zero=1, precision="bf16",
              **{k: v for k, v in stack.memory_of("megatron-lm").items() if k != "expert_epilogue"})
    with_copy = memory_per_gpu(shape, **kw, expert_epilogue=True)["activations_bytes"]
    without = memory_per_gpu(shape, **kw, expert_epilogue=False)["activations_bytes"]
    # The stacks' own holdings carry it: megatron-lm's with the copy, torchtitan's without.
    assert stack.memory_of("megatron-lm")["expert_epilogue"] and not stack.memory_of("torchtitan")["expert_epilogue"]
    rows = 2 * 4096 * 4 * 1.1  # a micro-batch's routed rows at the default load (1.1), tp 1
    # Without a pipeline one micro-batch is in flight: its 36 layers each keep the copy.
    assert float(with_copy - without) == pytest.approx(2 * 2 * 2880 * rows * 36, rel=1e-6)
    # Recomputing the activation (moe_act) keeps neither the copy nor the clamped output.
    kw["moe"] = moe.MoeOptions(recompute_modules=("moe_act",))
    assert memory_per_gpu(shape, **kw, expert_epilogue=True)["activations_bytes"] == pytest.approx(
        memory_per_gpu(shape, **kw, expert_epilogue=False)["activations_bytes"])
