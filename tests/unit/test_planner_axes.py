"""The planner's terms for issue 17's axes (expert and context parallelism, FP8, HSDP, CPU
offload, zero-bubble schedules), each against a hand calculation, and the options of
`memory` / `predict` / `plan` that reach them."""

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from mgbench import catalog
from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.layout import Layout
from mgbench.planner import hardware, layout_time, perf
from mgbench.planner import memory as M
from mgbench.planner.search import PlanOptions, plan
from mgbench.strategies.schedules import theoretical_bubble

MIXTRAL = catalog.model_shape("mixtral-8x7b")
LLAMA8 = catalog.model_shape("llama3-8b")
H100 = hardware.resolve(system="dgx-h100")


def mem(shape, **kw):
    return {k: float(np.asarray(v)) for k, v in M.memory_per_gpu(shape, **kw).items()}


# --- memory ---------------------------------------------------------------------------------

def test_expert_states_are_sharded_by_ep_then_by_the_expert_data_parallel_group():
    expert = 32 * 8 * 3 * 4096 * 14336  # Mixtral: 32 MoE layers x 8 experts x SwiGLU(4096, 14336)
    dense = MIXTRAL.num_params() - expert
    assert MIXTRAL.num_expert_params() == expert
    got = mem(MIXTRAL, seq=1024, dp=16, zero=3, ep=8)
    # bf16 weights, 2 bytes: dense over the 16 data-parallel ranks, experts / 8 over 16 / 8 = 2.
    assert got["params_bytes"] == pytest.approx(2 * dense / 16 + 2 * expert / 8 / 2, rel=1e-12)
    # ZeRO-1: weights whole (experts / ep), optimizer states sharded alike.
    z1 = mem(MIXTRAL, seq=1024, dp=16, zero=1, ep=8)
    assert z1["params_bytes"] == pytest.approx(2 * dense + 2 * expert / 8, rel=1e-12)
    assert z1["optimizer_bytes"] == pytest.approx(12 * dense / 16 + 12 * expert / 8 / 2, rel=1e-12)


def test_a_dense_model_is_unchanged_by_the_new_defaults():
    a = M.memory_per_gpu(LLAMA8, seq=4096, tp=2, pp=2, dp=2, zero=1, num_micro=4, recompute=1)
    b = M.memory_per_gpu(LLAMA8, seq=4096, tp=2, pp=2, dp=2, zero=1, num_micro=4, recompute=1, ep=1, cp=1,
                         replicas=1, offload=False)
    assert all(float(a[k]) == float(b[k]) for k in a)


def test_moe_block_activations_by_hand():
    tokens, e, h, fe = 1000, 2.0, 4096, 14336
    # Mixtral: top-2 routed rows as Megatron-Core's grouped MLP keeps them (the first GEMM's
    # input e h, the fused SwiGLU's input 2 e F and the second GEMM's input e F), router
    # logits + fp32 probabilities (e + 4) x 8, minus the dense SwiGLU of width ffn_hidden
    # counted by layer_activations.
    per_token = 2 * e * (h + 3 * fe) + (e + 4) * 8 - 4 * e * 14336
    assert float(M.moe_mlp_extra(MIXTRAL, tokens, 1, "bf16")) == pytest.approx(tokens * per_token, rel=1e-12)
    # The busiest rank's load (1.1) holds 10% more routed rows; moe_act recomputes F a row.
    loaded = 1.1 * 2 * e * (h + 3 * fe) + (e + 4) * 8 - 4 * e * 14336
    assert float(M.moe_mlp_extra(MIXTRAL, tokens, 1, "bf16", 1.1)) == pytest.approx(tokens * loaded, rel=1e-12)
    act = 2 * e * (h + 2 * fe) + (e + 4) * 8 - 4 * e * 14336
    assert float(M.moe_mlp_extra(MIXTRAL, tokens, 1, "bf16", 1.0, ("moe_act",))) == pytest.approx(tokens * act)


def test_context_parallelism_divides_activations_and_adds_the_gathered_kv():
    S = 16384
    cp2 = mem(LLAMA8, seq=S, micro_batch=1, dp=4, cp=2)
    half = mem(LLAMA8, seq=S // 2, micro_batch=1, dp=4)
    # s / cp tokens a rank: the same saved activations as a sequence of s / 2 on one rank.
    assert cp2["activations_bytes"] == pytest.approx(half["activations_bytes"], rel=1e-12)
    # K and V of the whole sequence and their gradients: 4 e s b k, k = 8 kv heads x 128.
    kv = 4 * 2.0 * S * 1 * 8 * 128
    assert float(M.cp_kv_bytes(LLAMA8, S, 1, 1, 2, "bf16")) == kv
    assert cp2["temporaries_bytes"] - half["temporaries_bytes"] == pytest.approx(kv, rel=1e-9)
    # ZeRO shards over dp x cp ranks (the cp ranks hold the same weights).
    z3 = mem(LLAMA8, seq=S, dp=4, cp=2, zero=3)
    assert z3["params_bytes"] == pytest.approx(2 * LLAMA8.num_params() / 8, rel=1e-9)


def test_fp8_keeps_bf16_states_and_activations_and_gathers_weights_in_one_byte():
    bf, f8 = mem(LLAMA8, seq=2048, dp=8, zero=3), mem(LLAMA8, seq=2048, dp=8, zero=3, precision="fp8")
    for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "temporaries_bytes"):
        assert f8[k] == bf[k], k
    assert f8["gathered_params_bytes"] == pytest.approx(bf["gathered_params_bytes"] / 2)
    # Without ZeRO-3 a block's float8 weight casts (1 byte a weight) are a temporary.
    bf0, f80 = mem(LLAMA8, seq=2048), mem(LLAMA8, seq=2048, precision="fp8")
    assert f80["temporaries_bytes"] - bf0["temporaries_bytes"] == pytest.approx(LLAMA8.params_per_layer())


def test_offload_moves_model_states_to_the_host():
    on, off = mem(LLAMA8, seq=2048, dp=8, zero=3, offload=True), mem(LLAMA8, seq=2048, dp=8, zero=3)
    assert on["host_bytes"] == pytest.approx(off["model_states_bytes"]) and off["host_bytes"] == 0
    assert on["params_bytes"] == on["grads_bytes"] == on["optimizer_bytes"] == 0
    assert on["gathered_params_bytes"] == off["gathered_params_bytes"]  # the working set stays on the device


def test_hsdp_shards_inside_a_replica():
    got = mem(LLAMA8, seq=2048, dp=16, zero=3, replicas=4)
    assert got["model_states_bytes"] == pytest.approx(16 * LLAMA8.num_params() / 4, rel=1e-9)


@pytest.mark.parametrize("schedule,expected", [("interleaved_zb", 4 * (1 + 3 / 8)), ("zbv", 4.0),
                                               ("dualpipev", 5.0), ("1f1b", 4.0)])
def test_in_flight_micro_batches_of_the_new_schedules(schedule, expected):
    assert float(M.in_flight(4, 16, schedule, virtual_stages=2)) == pytest.approx(expected)


# --- time -----------------------------------------------------------------------------------

def test_one_term_changed_moves_predict_plan_and_calibrate_alike(monkeypatch):
    """There is one step model: a change to one of its terms (here the FLOPs a token
    costs, recomputation included) reaches predict, plan's vectorised search and the
    calibration fit, with no second copy left behind."""
    from mgbench.planner import calibrate
    from mgbench.planner.cost import Prices
    from mgbench.layout import Layout
    from mgbench.planner.predict import predict
    from mgbench.planner.search import PlanOptions, plan
    from tests.factories import make_config, make_record

    def measure():
        lay = Layout(num_gpus=8, zero=3, seq_len=4096, micro_batch=2)
        step = predict(LLAMA8, H100, lay)["breakdown"]["compute_s"]
        best = plan(LLAMA8, PlanOptions(tokens=1e10, systems=["dgx-h100"], max_gpus=8), Prices(None, []))
        rec = make_record(make_config(strategy="fsdp", nproc=2, seq_len=64), step_time_s=1.0).to_dict()
        return float(step), best["ranked"][0]["days"], calibrate.features(rec)["compute"]

    before = measure()
    real = perf.hardware_flops_per_token
    monkeypatch.setattr(perf, "hardware_flops_per_token", lambda *a: 2.0 * real(*a))
    after = measure()
    # Compute is all GEMM FLOPs but the elementwise and flash-attention terms: more than
    # 1.3x, and calibration's FLOP feature exactly 2x.
    assert after[0] > 1.3 * before[0] and after[1] > 1.3 * before[1]
    assert after[2] == pytest.approx(2.0 * before[2])


def test_ep_all_to_all_by_hand_intra_and_inter_node():
    # Mixtral's top-2 rows over an ep group of 8 consecutive ranks (one node of dgx-h100):
    # 2 x 7/8 rows a token over NVLink; of 16 (two nodes), 2 x 7/16 inside, 2 x 8/16 across.
    from mgbench.planner import moe

    tokens, e, h, k = 4096, 2.0, 4096, 2
    opts = moe.MoeOptions(imbalance=1.0)
    row = tokens * h * e / moe.nccl_all_to_all_share()  # NCCL's all-to-all: 0.97 of the links' rates
    got = moe.a2a_seconds(MIXTRAL, H100, tokens=tokens, ep=8, elem_bytes=e, opts=opts)
    assert float(got) == pytest.approx(7 * H100.intra_alpha_s + row * k * 7 / 8 / H100.intra_bw)
    inter = moe.a2a_seconds(MIXTRAL, H100, tokens=tokens, ep=16, elem_bytes=e, opts=opts)
    wire = max(row * k * 7 / 16 / H100.intra_bw, row * k * 8 / 16 / H100.inter_bw)
    assert float(inter) == pytest.approx(7 * H100.intra_alpha_s + H100.inter_alpha_s + wire)
    assert float(inter) > 4 * float(got)  # half the rows on the NIC share: 4.8x the NVLink time
    # A step: 4 of them (dispatch and combine, forward and backward) per MoE layer and micro-batch.
    dispatch, combine = moe.a2a_directions(MIXTRAL, H100, tokens=tokens, ep=8, act_bytes=e, opts=opts, moe_layers=32,
                                           num_micro=3, moe_rerun_share=0.0)
    assert float(dispatch) == float(combine) == pytest.approx(2 * 32 * 3 * float(got))


def test_cp_kv_exchange_by_hand():
    s, cp = 65536, 4
    nbytes = s * 1 * 2 * (8 * 128) * 2.0  # K and V of the whole sequence, bf16
    ring = (cp - 1) * H100.intra_alpha_s + (cp - 1) / cp * nbytes / H100.intra_bw
    got = layout_time.cp_kv_exchange_s(LLAMA8, H100, seq=s, micro_batch=1, tp=1, cp=cp, span=cp, precision="bf16",
                                       layers=32, num_micro=2, recompute=0)
    assert float(got) == pytest.approx(2 * 32 * 2 * ring)  # all-gather forward, reduce-scatter backward


def test_fp8_speeds_up_the_blocks_linears_by_the_measured_fp8_rate():
    kw = dict(seq=8192, global_batch=8, micro_batch=1, tp=1, pp=1, dp=8, zero=3, recompute=0)
    # GEMMs at the large-GEMM rate, whatever their shape (the shape model adds to linear_s:
    # test_gemm_shapes.py), so that the linears are their FLOPs over the rate by hand.
    H100 = dataclasses.replace(globals()["H100"], gemm_shapes=False)
    bf = layout_time.step_time(LLAMA8, H100, **kw)
    f8 = layout_time.step_time(LLAMA8, H100, precision="fp8", **kw)
    b = bf["breakdown"]
    # The blocks' linears at the bf16 GEMM rate: their share of the blocks' FLOPs (flash
    # attention runs in its own kernel, perf.flash_attention_s, and fp8 leaves it alone).
    blocks_flops = (perf.hardware_flops_per_token(LLAMA8, 8192, 0) - perf.head_flops_per_token(LLAMA8)) * 8 * 8192 / 8
    blocks_per_token = perf.hardware_flops_per_token(LLAMA8, 8192, 0) - perf.head_flops_per_token(LLAMA8)
    frac = 1.0 - float(perf.attention_flops_per_token(LLAMA8, 8192, 0) / blocks_per_token)  # all but attention
    linears = blocks_flops * frac / (H100.peak_tflops * 1e12 * H100.compute_eff)
    assert float(b["linear_s"]) == pytest.approx(linears, rel=1e-9)
    # FP8 linears at the FP8 peak x the H100's measured FP8 best-GEMM fraction (1402.6 of
    # 1979) over its bf16 one (794.5 of 989): 0.5 / 0.882 = 0.567 of their bf16 seconds.
    fp8_rate = (989.0 / 1979.0) / ((1402.6 / 1979.0) / (794.5 / 989.0))
    saved = linears * (1 - fp8_rate) / H100.stack_eff
    cast = float(f8["breakdown"]["fp8_cast_s"])  # what quantizing costs: the next test, by hand
    assert cast > 0.0 and float(b["fp8_cast_s"]) == 0.0
    assert float(b["compute_s"] - f8["breakdown"]["compute_s"]) == pytest.approx(saved - cast, rel=1e-9)
    assert float(f8["mfu"]) == pytest.approx(float(f8["model_tflops_per_gpu"]) / 989.0)  # bf16 peak
    # Without a measured FP8 GEMM the bf16 fraction is carried: the peaks' ratio alone.
    unmeasured = dataclasses.replace(H100, fp8_gemm_ratio=None)
    f8u = layout_time.step_time(LLAMA8, unmeasured, precision="fp8", **kw)
    saved_u = linears * (1 - 989.0 / 1979.0) / H100.stack_eff
    assert float(b["compute_s"] - f8u["breakdown"]["compute_s"]) == pytest.approx(saved_u - cast, rel=1e-9)
    assert any("no FP8" in n for n in f8u["notes"]) and any("measured FP8" in n for n in f8["notes"])


def test_fp8_pays_for_quantizing_every_linears_input_and_output_gradient_by_hand():
    # Llama 3 8B (h 4096, 32 heads of 128, 8 KV heads, SwiGLU 14336), one block, a token:
    # forward the inputs of q/k/v (4096) and of the MLP's gate/up (4096), which sequence
    # parallelism splits, and of the output projection (32 x 128) and the down projection
    # (14336), which tensor parallelism splits; backward the output gradients of the output
    # and down projections (4096 each, sequence-split) and of q/k/v (4096 + 2 x 8 x 128) and
    # gate/up (2 x 14336, tensor-split). Each element: read in bf16, written twice in FP8
    # (rows and columns): 4 bytes.
    seq_f, seq_b, tp_f, tp_b = 4096 + 4096, 4096 + 4096, 4096 + 14336, (4096 + 2048) + 2 * 14336
    el = perf.fp8_cast_elements(LLAMA8)
    assert (el["seq_f"], el["seq_b"], el["tp_f"], el["tp_b"], el["routed_f"]) == (seq_f, seq_b, tp_f, tp_b, 0.0)
    fwd, bwd = seq_f + tp_f, seq_b + tp_b
    kw = dict(seq=8192, global_batch=16, micro_batch=1, tp=1, pp=1, dp=8, zero=3)
    bw = H100.mem_bw * H100.mem_bw_fraction
    # 2 micro-batches of 8192 tokens through 32 blocks
    by_hand = 4.0 * (fwd + bwd) * 8192 * 32 * 2 / bw / H100.stack_eff
    f8 = layout_time.step_time(LLAMA8, H100, precision="fp8", recompute=0, **kw)["breakdown"]
    assert float(f8["fp8_cast_s"]) == pytest.approx(by_hand, rel=1e-9)
    # Full recompute runs every forward again: its casts too.
    full = layout_time.step_time(LLAMA8, H100, precision="fp8", recompute=2, **kw)["breakdown"]
    assert float(full["fp8_cast_s"]) == pytest.approx(by_hand * (2 * fwd + bwd) / (fwd + bwd), rel=1e-9)
    # Tensor parallelism over 2 (4 micro-batches a rank). Without sequence parallelism a
    # rank casts the sequence-split tensors whole and half of the rest. With it, a rank
    # casts its half of a sequence-split tensor row-wise (read 2, write 1) and, under the
    # per-tensor recipes, transposes the gathered whole into the column copy (read 1, write
    # 1): 3 / 2 + 2 bytes an element; MXFP8 makes both copies before the gather: 4.0625 / 2.
    tp2 = {**kw, "tp": 2, "dp": 4}
    per_el = by_hand / (4.0 * (fwd + bwd))  # seconds an element a token costs a byte, 2 micro-batches
    without = layout_time.step_time(LLAMA8, H100, precision="fp8", recompute=0, sp=False, **tp2)["breakdown"]
    assert float(without["fp8_cast_s"]) == pytest.approx(2 * per_el * 4.0 * (seq_f + seq_b + (tp_f + tp_b) / 2),
                                                         rel=1e-9)
    with_sp = layout_time.step_time(LLAMA8, H100, precision="fp8", recompute=0, sp=True, **tp2)["breakdown"]
    assert float(with_sp["fp8_cast_s"]) == pytest.approx(
        2 * per_el * ((seq_f + seq_b) * (3.0 / 2 + 2.0) + (tp_f + tp_b) * 4.0 / 2), rel=1e-9)
    # MXFP8 (on a B200: H100's tensor cores take no MX operands) makes both copies before
    # the gather: 4.0625 / 2 bytes an element.
    B200 = dataclasses.replace(hardware.resolve(system="dgx-b200"), gemm_shapes=False)
    b200_el = per_el * (H100.mem_bw * H100.mem_bw_fraction) / (B200.mem_bw * B200.mem_bw_fraction) \
        * H100.stack_eff / B200.stack_eff
    mx = layout_time.step_time(LLAMA8, B200, precision="fp8", fp8_recipe="mxfp8", recompute=0, sp=True, **tp2)
    assert float(mx["breakdown"]["fp8_cast_s"]) == pytest.approx(2 * b200_el * 4.0625 * (fwd + bwd) / 2, rel=1e-9)
    with pytest.raises(MgbenchError, match="h100-sxm has none"):
        layout_time.step_time(LLAMA8, H100, precision="fp8", fp8_recipe="mxfp8", recompute=0, sp=True, **tp2)
    # The dense MLP's recomputed forward casts split as the main term: its input over the
    # sequence split (whole without sequence parallelism), its down projection's over tp.
    w_dense = perf.fp8_cast_elements(LLAMA8)["rerun"]["mlp"]
    assert w_dense == (4096, 14336, 0.0)
    bw = H100.mem_bw * H100.mem_bw_fraction
    base = dict(tokens=8192, tp=2, blocks=32, num_micro=1, recompute=0, sp=False)
    extra = float(perf.fp8_cast_seconds(LLAMA8, H100, modules=("mlp",), **base)
                  - perf.fp8_cast_seconds(LLAMA8, H100, **base))
    assert extra == pytest.approx(4.0 * (4096 + 14336 / 2) * 8192 * 32 / bw)


def test_the_fp8_recipe_sets_what_a_cast_costs_by_hand():
    # Every recipe reads the bf16 tensor (2 bytes) and writes an FP8 copy for each GEMM
    # that consumes it (1 + 1); current scaling (tensorwise, rowwise) reads it once more for
    # its amax; MXFP8 writes an E8M0 scale a 32 elements, blockwise an fp32 scale a 128, for
    # each copy.
    assert perf.FP8_CAST_BYTES == {"delayed": 4.0, "tensorwise": 6.0, "rowwise": 6.0, "mxfp8": 4.0625,
                                   "blockwise": 4.0625}
    kw = dict(seq=8192, global_batch=16, micro_batch=1, tp=1, pp=1, dp=8, zero=3, recompute=0, precision="fp8")
    B200 = hardware.resolve(system="dgx-b200")  # takes every recipe, MXFP8 included
    cast = {r: float(layout_time.step_time(LLAMA8, B200, fp8_recipe=r, **kw)["breakdown"]["fp8_cast_s"])
            for r in perf.FP8_RECIPES}
    # The B200's FP8 GEMMs take any operand layout (hardware.toml fp8_any_layout), so
    # Transformer Engine's per-tensor recipes make no column copy: delayed 3 bytes,
    # tensorwise 5; torchao's rowwise and the block-scaled recipes keep both copies.
    assert cast["tensorwise"] == pytest.approx(5.0 / 3.0 * cast["delayed"], rel=1e-12)
    assert cast["rowwise"] == pytest.approx(6.0 / 3.0 * cast["delayed"], rel=1e-12)
    assert cast["mxfp8"] == pytest.approx(cast["delayed"] * 4.0625 / 3.0, rel=1e-12)
    # On an H100 (TN-only FP8 GEMMs) both copies: tensorwise 6 against delayed 4.
    h100 = {r: float(layout_time.step_time(LLAMA8, H100, fp8_recipe=r, **kw)["breakdown"]["fp8_cast_s"])
            for r in ("delayed", "tensorwise")}
    assert h100["tensorwise"] == pytest.approx(1.5 * h100["delayed"], rel=1e-12)
    assert catalog.accelerator_fp8_any_layout("gb200") and not catalog.accelerator_fp8_any_layout("rtx-5090")
    # Under sequence parallelism a B200 casts its share and gathers the row-wise copy, which
    # serves backward too: no transpose of the gathered tensor (the H100's 3 / tp + 2 bytes).
    sp = dict(tokens=8192, tp=2, blocks=32, num_micro=1, recompute=0, sp=True, recipe="tensorwise")
    el = perf.fp8_cast_elements(LLAMA8)
    by_hand = ((el["seq_f"] + el["seq_b"]) * 5.0 / 2 + (el["tp_f"] + el["tp_b"]) * 5.0 / 2) * 8192 * 32 \
        / (B200.mem_bw * B200.mem_bw_fraction)
    assert float(perf.fp8_cast_seconds(LLAMA8, B200, any_layout=True, **sp)) == pytest.approx(by_hand, rel=1e-12)
    # No recipe given: the stack's (Megatron-LM: Megatron-Core's default, delayed; torchtitan:
    # torchao's, tensorwise), said in the notes.
    from mgbench.planner import stack

    default = layout_time.step_time(LLAMA8, B200, **kw)
    assert float(default["breakdown"]["fp8_cast_s"]) == cast["delayed"]
    assert any("under the delayed recipe" in n for n in default["notes"])
    assert stack.fp8_recipe("megatron-lm") == "delayed" and stack.fp8_recipe("torchtitan") == "tensorwise"
    titan = layout_time.step_time(LLAMA8, stack.apply(H100, "torchtitan"), **kw)
    assert any("under the tensorwise recipe" in n for n in titan["notes"])
    from mgbench.errors import MgbenchError

    with pytest.raises(MgbenchError, match="FP8 recipe 'e4m3'"):
        layout_time.step_time(LLAMA8, H100, fp8_recipe="e4m3", **kw)


def test_fp8_casts_of_mla_and_of_the_routed_experts_by_hand():
    # Qwen3-30B-A3B (h 2048, 32 heads of 128, 4 KV heads, 128 experts of 768, top 8, no
    # shared expert, every block MoE): each routed row casts the experts' input (2048) and
    # the down projection's (768) forward, the gradients of gate/up (2 x 768) and down
    # (2048) backward, at the busiest rank's load.
    shape = catalog.model_shape("qwen3-30b-a3b")
    el = perf.fp8_cast_elements(shape, load=1.1)
    assert (el["seq_f"], el["seq_b"], el["tp_f"], el["tp_b"]) == (2048, 2048, 32 * 128, 32 * 128 + 2 * 4 * 128)
    assert el["routed_f"] == pytest.approx(8 * 1.1 * (2048 + 768))
    assert el["routed_b"] == pytest.approx(8 * 1.1 * (2 * 768 + 2048))
    # Megatron-Core's recompute modules run their forward casts again: "moe" the routed
    # rows' (no shared expert here), where no whole block is recomputed.
    assert el["rerun"] == {"moe": (0.0, 0.0, el["routed_f"]), "mlp": (0.0, 0.0, 0.0), "mla_up_proj": (0.0, 0.0, 0.0)}
    hw, kw = H100, dict(tokens=4096, tp=1, blocks=48, num_micro=1, recompute=0, load=1.1)
    plain = float(perf.fp8_cast_seconds(shape, hw, **kw))
    moe_rc = float(perf.fp8_cast_seconds(shape, hw, modules=("moe",), **kw))
    assert moe_rc - plain == pytest.approx(4.0 * el["routed_f"] * 4096 * 48 / (hw.mem_bw * hw.mem_bw_fraction))
    assert float(perf.fp8_cast_seconds(shape, hw, modules=("moe",), **{**kw, "recompute": 2})) == pytest.approx(
        float(perf.fp8_cast_seconds(shape, hw, **{**kw, "recompute": 2})))  # full recompute reruns it already
    # DeepSeek-V2's two shared experts run as one MLP twice as wide: its input and output
    # gradient cast once (5120 each), its widths twice (2 x 1536 in, 2 x 2 x 1536 out).
    v2 = catalog.model_shape("deepseek-v2")
    e2, w = perf.fp8_cast_elements(v2), v2.moe_layers / v2.layers
    mla = perf._attention_cast_widths(v2)
    assert e2["seq_f"] == pytest.approx(mla["seq_f"] + (1 - w) * 5120 + w * 5120)
    assert e2["tp_f"] == pytest.approx(mla["tp_f"] + (1 - w) * v2.ffn_hidden + w * 2 * 1536)
    # The router's GEMM stays in bf16: the number of experts does not enter, the vocabulary
    # (the output layer, bf16 too) neither.
    assert perf.fp8_cast_elements(dataclasses.replace(shape, experts=64, vocab=1000), load=1.1) == el
    # DeepSeek-V3's MLA (h 7168, 128 heads, q_lora 1536, kv_lora 512 + a 64-wide rotary key,
    # per head 128 + 64 query/key and 128 value dims), linear by linear: forward the down
    # projections' input twice (7168 each), the up projections' inputs (1536, 512), the
    # output projection's (128 x 128); backward the down projections' outputs (1536,
    # 512 + 64), the output projection's (7168), the up projections' (128 x 192,
    # 128 x (128 + 128)).
    w = perf._attention_cast_widths(catalog.model_shape("deepseek-v3"))
    assert w == {"seq_f": 2 * 7168 + 1536 + 512, "seq_b": 1536 + 576 + 7168, "tp_f": 128 * 128,
                 "tp_b": 128 * 192 + 128 * 256}


def test_offload_transfer_over_the_host_link_by_hand():
    kw = dict(seq=4096, global_batch=16, micro_batch=1, tp=1, pp=1, dp=8, zero=3, recompute=2)
    r = layout_time.step_time(LLAMA8, H100, offload=True, **kw)
    shard = float(M.stage_params(LLAMA8, 1, 1)) / 8
    pcie5 = 63.0e9 * 0.87  # hardware.toml links.pcie5, dgx-h100's host_link
    m = 16 / 8
    assert float(r["breakdown"]["offload_s"]) == pytest.approx(2 * m * 4 * shard / pcie5, rel=1e-9)
    assert any("the host's optimizer step priced on one CPU thread" in n for n in r["notes"])
    # A run kept in bf16 throughout (torchtitan's training.dtype bfloat16) copies 2 bytes a
    # weight: half the time.
    half = layout_time.step_time(LLAMA8, H100, offload=True, offload_state_bytes=(2.0, 2.0, 4.0), **kw)
    assert float(half["breakdown"]["offload_s"]) == pytest.approx(2 * m * 2 * shard / pcie5, rel=1e-9)


def test_predict_offloads_the_runs_own_weight_bytes():
    """predict's offload copies follow the run's state_bytes (and the stack's where none
    is given: torchtitan's fp32 shard), not a fixed 4 bytes."""
    from mgbench.planner.predict import predict
    from mgbench.planner.resolve import resolve

    hw = resolve(precision="bf16", system="dgx-h100", stack="torchtitan")
    lay = Layout(num_gpus=8, tp=1, pp=1, zero=3, micro_batch=1, seq_len=4096, global_batch=16, precision="bf16",
                 recompute="full", offload=True)
    own = predict(LLAMA8, hw, lay)["breakdown"]["offload_s"]
    bf16 = predict(LLAMA8, hw, lay, state_bytes=(2.0, 2.0, 4.0))["breakdown"]["offload_s"]
    assert float(bf16) == pytest.approx(float(own) / 2, rel=1e-9)


def test_hsdp_reduces_inside_replicas_and_all_reduces_across():
    d, R, m, params = 32, 4, 2, 1e9
    got = layout_time.dp_comm_s(H100, dense=params, expert=0.0, tp=1, dpc=d, ep=1, replicas=R, zero=3, num_micro=m,
                                precision="bf16")
    gb = 2 * params
    shard = d // R  # 8 ranks: one node
    inside = perf.ring_time(gb, shard, H100.intra_bw, H100.intra_alpha_s, 1.0)
    across = perf.ring_time(gb / shard, R, H100.inter_bw, H100.inter_alpha_s, 2.0)
    assert float(got) == pytest.approx((2 * m + 1) * float(inside) + float(across))


@pytest.mark.parametrize("schedule", ["interleaved_zb", "zbv", "dualpipev"])
def test_zero_bubble_schedules_take_the_registry_bubble(schedule):
    kw = dict(seq=4096, global_batch=32, micro_batch=1, tp=1, pp=4, dp=2, zero=1, recompute=0)
    r = layout_time.step_time(LLAMA8, H100, schedule=schedule, virtual_stages=2, **kw)
    f = theoretical_bubble(4, 16, schedule, 2)
    blocks = float(r["breakdown"]["compute_s"] - r["breakdown"]["head_s"])
    assert float(r["breakdown"]["bubble_s"]) == pytest.approx(blocks * f / (1 - f))


def test_zbv_with_too_few_micro_batches_has_no_bubble_figure():
    assert np.isnan(perf.bubble_fraction(4, 4, "zbv", 2))


# --- commands -------------------------------------------------------------------------------

def _run(*args):
    return CliRunner().invoke(main, list(args))


def test_memory_and_predict_accept_every_new_option():
    r = _run("memory", "--model", "mixtral-8x7b", "--num-gpus", "16", "--ep", "8", "--zero", "3", "--cp", "2",
             "--seq-len", "8192", "--precision", "fp8", "--offload", "--hsdp", "1", "--json")
    assert r.exit_code == 0, r.output
    r = _run("predict", "--model", "llama3-70b", "--system", "dgx-h100", "--num-gpus", "64", "--pp", "4",
             "--zero", "3", "--hsdp", "2", "--schedule", "interleaved_zb", "--virtual-stages", "2",
             "--global-batch", "64", "--precision", "fp8", "--json")
    assert r.exit_code == 0, r.output
    r = _run("memory", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--experts", "8",
             "--top-k", "2", "--num-gpus", "4", "--ep", "4")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args,says", [
    (["memory", "--model", "llama3-8b", "--num-gpus", "2", "--ep", "2"], "--ep 2 shards routed experts"),
    (["memory", "--model", "llama3-8b", "--num-gpus", "8", "--offload"], "--offload is modelled for FSDP2's ZeRO-3"),
    (["memory", "--model", "llama3-8b", "--num-gpus", "8", "--zero", "3", "--hsdp", "3"], "--hsdp 3 must divide"),
    (["memory", "--model", "llama3-8b", "--num-gpus", "8", "--cp", "4", "--seq-len", "4100"], "--cp 4: the sequence"),
    (["memory", "--model", "mixtral-8x7b", "--num-gpus", "8", "--ep", "8", "--zero", "3", "--hsdp", "2"],
     "--hsdp with --ep"),
    (["predict", "--model", "llama3-8b", "--system", "dgx-a100", "--precision", "fp8"], "no FP8 peak for a100"),
    (["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "4", "--pp", "4", "--schedule", "zbv",
      "--global-batch", "4"], "ZB-V's zero bubble (Qi et al. 2023, section 6) needs micro-batches per step >= 2 x pp = 8"),
    (["predict", "--model", "llama3-8b", "--system", "a100-pcie-8", "--num-gpus", "8", "--zero", "3", "--offload"],
     None),
    (["memory", "--params", "8e9", "--num-gpus", "8", "--cp", "2"], "give --model NAME or dims, not --params"),
])
def test_bad_new_options_are_one_line_exit_2(args, says):
    r = _run(*args)
    if says is None:  # a catalog system with a host link prices offload
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output


def test_a_system_without_a_host_link_cannot_price_offload():
    hw = dataclasses.replace(H100, system="nowhere")
    with pytest.raises(Exception, match="host link of 'nowhere'"):
        layout_time.host_link_bw(hw)


# --- plan -----------------------------------------------------------------------------------

def test_plan_searches_expert_parallelism_for_moe_presets():
    res = plan(catalog.model_shape("qwen3-30b-a3b"), PlanOptions(tokens=1e12, systems=["dgx-h100"], max_gpus=512))
    assert res["num_candidates"] >= 1_000_000
    assert res["recommendation"] is not None
    assert {r["ep"] for r in res["ranked"]} - {1}, "no ranked layout uses expert parallelism"


def test_plan_searches_context_parallelism_for_long_sequences():
    res = plan(LLAMA8, PlanOptions(tokens=1e10, seq_len=262144, global_batch_tokens=262144 * 8,
                                   systems=["dgx-h100"], max_gpus=64))
    assert res["recommendation"] is not None and res["recommendation"]["cp"] > 1
    short = plan(LLAMA8, PlanOptions(tokens=1e10, systems=["dgx-h100"], max_gpus=64))
    assert {r["cp"] for r in short["ranked"]} == {1}
    assert any("context parallelism searched from" in x for x in short["reasons"])


def test_plan_fp8_skips_gpus_without_fp8_and_offload_is_considered():
    res = plan(LLAMA8, PlanOptions(tokens=1e11, systems=None, max_gpus=64, precision="fp8", offload=True))
    assert any("dgx-a100 not considered" in x and "FP8" in x for x in res["reasons"])
    assert all(r["gpu"] != "a100-sxm-80gb" for r in res["ranked"])
    with pytest.raises(Exception, match="no FP8 peak"):
        plan(LLAMA8, PlanOptions(tokens=1e11, systems=["dgx-a100"], max_gpus=64, precision="fp8"))


def test_recompute_flops_of_an_moe_model_count_active_experts_only():
    s = 4096
    fwd = 2.0 * (MIXTRAL.num_active_params() - MIXTRAL.padded_vocab * MIXTRAL.hidden * 2 - MIXTRAL.hidden) \
        + 4.0 * MIXTRAL.layers * MIXTRAL.attn_dim * s  # every block's forward, once more
    got = perf.hardware_flops_per_token(MIXTRAL, s, 2) - perf.hardware_flops_per_token(MIXTRAL, s, 0)
    assert float(got) == pytest.approx(fwd, rel=1e-12)


def test_axes_rows_are_predicted_but_neither_scored_nor_in_the_intervals():
    from mgbench.planner import uncertainty, validation

    runs = [r for r in validation.published_runs() if r["role"] == "axes"]
    assert {r.get("precision") for r in runs} >= {"fp8"} and any(r.get("cp", 1) > 1 for r in runs)
    assert any(r.get("ep", 1) > 1 for r in runs)
    for r in runs:
        p = validation.predict_run(r)
        assert np.isfinite(p["predicted"]) and p["predicted"] > 0, r["id"]
    rows, _ = validation.error_table()
    assert "axes" not in {r["role"] for r in rows if r["role"] == "validation"}
    n_cross = sum(r["role"] == "informational" and r["system"] != "dgx-a100" for r in validation.published_runs())
    assert len(uncertainty._residuals()["cross_gpu"]) == n_cross


def test_plan_keeps_the_layouts_each_schedule_can_run():
    """The search filters pipelined rows by the schedule registry's own rules: GPipe takes
    any micro-batch count (it was held to DualPipeV's m >= 2 p), DualPipeV needs m >= 2 p."""
    from mgbench.planner import cost
    from mgbench.planner.search import evaluate_system

    def rows(schedule):
        opts = PlanOptions(tokens=1e10, seq_len=4096, global_batch_tokens=4096 * 8, systems=["dgx-h100"],
                           max_gpus=8, schedule=schedule)
        cols, _ = evaluate_system(LLAMA8, "dgx-h100", opts, cost.Prices())
        return cols["pp"], cols["num_micro_batches"]

    p, m = rows("gpipe")
    assert np.any((p > 1) & (m < 2 * p))
    p, m = rows("dualpipev")
    assert np.any(p > 1) and not np.any((p > 1) & (m < 2 * p))


def test_fp8_on_a_gpu_without_fp8_names_the_catalogs_fp8_gpus():
    from mgbench.errors import MgbenchError

    a100 = hardware.resolve(system="dgx-a100")
    with pytest.raises(MgbenchError) as err:
        layout_time.step_time(LLAMA8, a100, seq=4096, global_batch=8, micro_batch=1, tp=1, pp=1, dp=8, zero=3,
                              recompute=0, precision="fp8")
    listed = str(err.value).split("hardware.toml: ")[1].split(")")[0].split(", ")
    assert set(listed) == {k for k, a in catalog.accelerators().items() if a["tflops"].get("fp8") is not None}
    assert "a100-sxm-80gb" not in listed and "h100-sxm" in listed


def test_fp8_on_a_probed_cpu_profile_is_refused_with_one_line():
    # A probed CPU has no FP8 units: pricing fp8 on it would be a guess.
    from mgbench.errors import MgbenchError
    from mgbench.layout import Layout
    from mgbench.planner.predict import predict
    from mgbench.probe import profile as P
    from tests.unit.test_probe_host_terms import MINI, host_profile

    hw = P.hardware(host_profile(), "fp32", ranks=1)
    layout = Layout(num_gpus=1, micro_batch=4, seq_len=128, precision="fp8")
    with pytest.raises(MgbenchError, match="priced on catalog GPUs only"):
        predict(MINI, hw, layout, host_ops={"ops": 1000.0, "bytes": 2e8})
    assert predict(MINI, hw, Layout(num_gpus=1, micro_batch=4, seq_len=128, precision="fp32"),
                   host_ops={"ops": 1000.0, "bytes": 2e8})["step_time_s"] > 0


# --- pipelines with data-parallel replicas (how the runner reduces them) --------------------

def test_pipeline_fsdp_holds_the_whole_stage_gathered_and_its_fp32_gradients():
    # pp 2 x dp 4, ZeRO-3: torch's pipelining keeps each FSDP stage unsharded through the
    # step (memory.pipeline_fsdp_holds_stage): the stage's 16-bit weights gathered, and
    # its gradients accumulated unsharded in fp32, instead of two layers and a 1 / dp shard.
    stage = float(M.stage_params(LLAMA8, 1, 2))  # 16 blocks + the embedding
    for schedule in ("zbv", "1f1b"):
        got = mem(LLAMA8, seq=4096, pp=2, dp=4, zero=3, num_micro=8, schedule=schedule)
        assert got["gathered_params_bytes"] == pytest.approx(2.0 * stage)
        assert got["grads_bytes"] == pytest.approx(4.0 * stage)
        assert got["params_bytes"] == pytest.approx(2.0 * stage / 4)
    f8 = mem(LLAMA8, seq=4096, pp=2, dp=4, zero=3, num_micro=8, schedule="zbv", precision="fp8")
    assert f8["gathered_params_bytes"] == pytest.approx(1.0 * stage)
    # Without a pipeline ZeRO-3 keeps two layers gathered and a gradient shard.
    flat = mem(LLAMA8, seq=4096, dp=8, zero=3)
    assert flat["gathered_params_bytes"] == pytest.approx(2.0 * 2.0 * LLAMA8.params_per_layer())
    assert flat["grads_bytes"] == pytest.approx(2.0 * float(M.stage_params(LLAMA8, 1, 1)) / 8)


def test_split_backward_ddp_all_reduce_is_exposed_after_the_schedule():
    # zbv's stages are not wrapped in DDP: the runner all-reduces after the schedule
    # (schedules.grad_sync "allreduce_after_schedule"), nothing left to hide it.
    kw = dict(seq=4096, global_batch=32, micro_batch=1, tp=1, pp=4, dp=2, zero=0, recompute=0, virtual_stages=2)
    zb = layout_time.step_time(LLAMA8, H100, schedule="zbv", **kw)["breakdown"]
    assert float(zb["exposed_dp_comm_s"]) == pytest.approx(float(zb["dp_comm_s"]))
    assert float(perf.dp_window_fraction(16, 0, 4, "zbv")) == 0.0
    # 1F1B's DDP reducer hides it behind the last backward: 2/3 of 1 / m of the compute.
    ob = layout_time.step_time(LLAMA8, H100, schedule="1f1b", **kw)["breakdown"]
    hidden = float(ob["compute_s"]) * (2.0 / 3.0) / 16
    assert float(ob["exposed_dp_comm_s"]) == pytest.approx(max(float(ob["dp_comm_s"]) - hidden, 0.0))
    assert float(perf.dp_window_fraction(16, 0, 1, "zbv")) == pytest.approx((2.0 / 3.0) / 16)  # no pipeline


def test_split_backward_fsdp_gathers_once_per_step():
    d, m, params = 8, 4, 1e9
    kw = dict(dense=params, expert=0.0, tp=1, dpc=d, ep=1, replicas=1, zero=3, num_micro=m, precision="bf16")
    gather = float(perf.ring_time(2 * params, d, H100.intra_bw, H100.intra_alpha_s, 1.0))
    zb = layout_time.dp_comm_s(H100, pp=2, schedule="zbv", **kw)
    ob = layout_time.dp_comm_s(H100, pp=2, schedule="1f1b", **kw)
    assert float(zb) == pytest.approx(1 * gather + gather)  # one all-gather, one reduce-scatter
    assert float(ob) == pytest.approx((2 * m) * gather + gather)


def test_the_runners_fp8_recipe_reaches_the_planner_and_back():
    # A runner config's recipe (torchao's tensorwise or rowwise) is the layout's under fp8,
    # and none under bf16 (RunConfig carries a default recipe either way); --trace gives the
    # layout's recipe to the runner and refuses one the runner cannot run.
    from mgbench.config import RunConfig
    from mgbench.errors import MgbenchError
    from mgbench.layout import Layout
    from mgbench.planner.trace import runner_config

    tiny = catalog.model_shape("gpt2-small")
    cfg = RunConfig(model=tiny, strategy="fsdp", nproc=2, precision="fp8", fp8_recipe="rowwise")
    assert Layout.from_config(cfg).fp8_recipe == "rowwise"
    assert Layout.from_config(dataclasses.replace(cfg, precision="bf16")).fp8_recipe is None
    lay = Layout(num_gpus=2, zero=3, precision="fp8", fp8_recipe="rowwise", seq_len=256)
    assert runner_config(tiny, lay).fp8_recipe == "rowwise"
    with pytest.raises(MgbenchError, match="--fp8-recipe mxfp8 is priced without --trace"):
        runner_config(tiny, dataclasses.replace(lay, fp8_recipe="mxfp8"))


def test_a_stack_names_a_known_recipe_and_the_runners_is_its_config_default(monkeypatch):
    from mgbench.config import RunConfig
    from mgbench.errors import MgbenchError
    from mgbench.planner import stack

    # the mgbench stack prices what the runner runs: its config's default, read there
    assert stack.fp8_recipe("mgbench") == RunConfig.__dataclass_fields__["fp8_recipe"].default == "tensorwise"
    assert stack.fp8_recipe("torchtitan", "mxfp8") == "mxfp8"  # --fp8-recipe wins
    broken = {**stack.stacks(), "torchtitan": {**stack.stacks()["torchtitan"], "fp8_recipe": "e5m2"}}
    monkeypatch.setattr(stack, "stacks", lambda: broken)
    with pytest.raises(MgbenchError, match=r"\[stacks.torchtitan\] fp8_recipe must be one of"):
        stack.fp8_recipe("torchtitan")


def test_mxfp8_is_priced_only_where_the_tensor_cores_take_mx_operands():
    # plan leaves an H100 system out with the reason and keeps a B200 one; an accelerator of
    # a --system-file that does not say is refused as not stated, not as lacking.
    res = plan(LLAMA8, PlanOptions(tokens=1e11, max_gpus=8, precision="fp8", fp8_recipe="mxfp8"))
    out = [r for r in res["reasons"] if r.startswith("dgx-h100 not considered")]
    assert out and "h100-sxm has none" in out[0]
    assert {r["system"] for r in res["ranked"]} & {"dgx-b200", "gb200-nvl72"}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "mine.toml"
        f.write_text("[accelerators.mine]\ntflops = { bf16 = 1000, fp8 = 2000 }\nmemory_gb = 96\nmem_bw_tbps = 4.0\n"
                     "[systems.mine-8]\ngpu = 'mine'\ngpus_per_node = 8\nintra_link = 'nvlink4'\n"
                     "inter_link = 'ib-ndr'\nnics_per_node = 8\n")
        catalog.use_system_file(str(f))
        try:
            assert catalog.accelerator_mx_formats("mine") is None and catalog.accelerator_mx_formats("h100-sxm") is False
            with pytest.raises(MgbenchError, match="mine has no mx_formats entry saying it does"):
                layout_time.step_time(LLAMA8, hardware.resolve(system="mine-8"), seq=4096, global_batch=8,
                                      micro_batch=1, tp=1, pp=1, dp=8, zero=0, recompute=0, precision="fp8",
                                      fp8_recipe="mxfp8")
            # Whether its FP8 GEMMs take any layout is not stated either: its casts are priced
            # with the column copy (the larger cost), and the notes say so; a catalog part that
            # states it (B200) or lacks it (H100) gets no such note.
            assert catalog.accelerator_fp8_any_layout("mine") is None
            assert catalog.accelerator_fp8_any_layout("h100-sxm") is False
            kw = dict(seq=4096, global_batch=8, micro_batch=1, tp=1, pp=1, dp=8, zero=0, recompute=0,
                      precision="fp8", fp8_recipe="tensorwise")
            mine = hardware.resolve(system="mine-8")
            r = layout_time.step_time(LLAMA8, mine, **kw)
            assert any("fp8_any_layout" in n and "not stated" in n for n in r["notes"])
            tokens = 4096.0
            want = perf.fp8_cast_seconds(LLAMA8, mine, tokens=tokens, tp=1, blocks=32, num_micro=1, recompute=0,
                                         sp=False, recipe="tensorwise") / mine.stack_eff
            assert float(r["breakdown"]["fp8_cast_s"]) == pytest.approx(float(want), rel=1e-12)
            for system in ("dgx-b200", "dgx-h100"):
                notes = layout_time.step_time(LLAMA8, hardware.resolve(system=system), **kw)["notes"]
                assert not any("fp8_any_layout" in n for n in notes), system
        finally:
            catalog.clear_system_file()
