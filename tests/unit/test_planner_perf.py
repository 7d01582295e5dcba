import dataclasses

import pytest

from mgbench import catalog
from mgbench.planner import hardware, layout_time, perf, validation
from mgbench.layout import RECOMPUTE, Layout
from mgbench.planner.predict import predict


def test_ring_all_reduce_alpha_beta_by_hand():
    # 8 ranks, 1 GB, 100 GB/s, 2 us per step: 2*7*2us + 2*7/8 * 1e9/1e11
    t = perf.ring_time(1e9, 8, 100e9, 2e-6, 2.0)
    assert float(t) == pytest.approx(14 * 2e-6 + 1.75 * 0.01)
    assert float(perf.ring_time(1e9, 1, 100e9, 2e-6, 2.0)) == 0.0


def test_link_efficiencies_come_from_reference_measurements():
    links = hardware.links()
    assert links["nvlink4"]["peak_gbps"] * links["nvlink4"]["bw_eff"] == pytest.approx(369, abs=1)
    assert links["nvlink3"]["peak_gbps"] * links["nvlink3"]["bw_eff"] == pytest.approx(231, abs=1)


def test_hardware_flops_with_recompute():
    shape = catalog.model_shape("gpt2-small")
    model = shape.flops_per_token(1024)
    assert float(perf.hardware_flops_per_token(shape, 1024, 0)) == model
    # full: every block's forward again (2 FLOPs a weight, 4 L h s of attention), not the
    # output layer (Megatron-LM's eq. 3 counts it 6 h V with or without recompute).
    blocks_fwd = 2 * shape.layers * shape.params_per_layer() + 4 * shape.layers * shape.attn_dim * 1024
    assert float(perf.hardware_flops_per_token(shape, 1024, 2)) == pytest.approx(model + blocks_fwd)
    # every_2nd: the forward of 6 of the 12 blocks again.
    assert float(perf.hardware_flops_per_token(shape, 1024, 1)) == pytest.approx(model + blocks_fwd / 2)


def test_pipeline_bubble_is_p_minus_1_block_stage_micro_batches():
    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-h100")
    out = layout_time.step_time(shape, hw, seq=4096, global_batch=64, micro_batch=1, tp=1, pp=4, dp=2, zero=1, recompute=2)
    b = out["breakdown"]
    m = 64 / 2
    # The last stage's busy time includes the output layer; fill and drain run block stages only.
    assert float(b["bubble_s"]) == pytest.approx((float(b["compute_s"]) - float(b["head_s"])) * 3 / m)
    inter = layout_time.step_time(shape, hw, seq=4096, global_batch=64, micro_batch=1, tp=1, pp=4, dp=2, zero=1,
                           recompute=2, schedule="interleaved", virtual_stages=2)
    assert float(inter["breakdown"]["bubble_s"]) == pytest.approx(float(b["bubble_s"]) / 2)


def test_output_layer_sits_on_the_last_pipeline_stage_by_hand():
    # llama3-8b, 8 GPUs as pp=8 (4 blocks a stage), 8 micro-batches of 1 x 4096 tokens.
    shape = catalog.model_shape("llama3-8b")
    # GEMMs at the large-GEMM rate whatever their shape (the shape model has its own tests,
    # test_gemm_shapes.py).
    hw = dataclasses.replace(hardware.resolve(system="dgx-h100"), elementwise_passes=0.0, gemm_shapes=False)
    # Without flash attention every block FLOP is a GEMM at one rate (flash attention's
    # own kernel rate is test_flash_attention_runs_at_its_generations_fraction's).
    kw = dict(seq=4096, global_batch=8, micro_batch=1, tp=1, dp=1, zero=0, recompute=0, flash=False)
    out = layout_time.step_time(shape, hw, pp=8, **kw)["breakdown"]
    rate = hw.peak_tflops * 1e12 * hw.compute_eff
    tokens = 8 * 4096
    head = 6 * 4096 * 128256 * tokens / rate  # 6 h V per token, all on the last stage
    blocks = (shape.flops_per_token(4096) - 6 * 4096 * 128256) * tokens * (4 / 32) / rate
    assert float(out["head_s"]) == pytest.approx(head)
    assert float(out["compute_s"]) == pytest.approx(blocks + head)
    assert float(out["bubble_s"]) == pytest.approx(7 * blocks / 8)
    # The even split (the model before this term) would have had every stage at 1/8 of the whole.
    even = (blocks * 8 + head) / 8
    assert float(out["compute_s"]) > even * 1.4  # a 128K vocabulary's head is ~2 blocks of llama3-8b
    # One stage: the same work, no bubble, the head on the only stage.
    one = layout_time.step_time(shape, hw, pp=1, **kw)["breakdown"]
    assert float(one["compute_s"]) == pytest.approx(blocks * 8 + head) and float(one["bubble_s"]) == 0.0


def test_a_lighter_last_stage_makes_room_for_the_output_layer_by_hand():
    # The same llama3-8b pipeline (32 blocks, pp 8, 8 micro-batches) with its last stage set
    # to 1 block (Megatron-LM --decoder-last-pipeline-num-layers 1): the other 7 share 31,
    # ceil(31 / 7) = 5 a stage; the last runs 1 block and the output layer (~2 blocks' work).
    shape = catalog.model_shape("llama3-8b")
    hw = dataclasses.replace(hardware.resolve(system="dgx-h100"), elementwise_passes=0.0, gemm_shapes=False)
    kw = dict(seq=4096, global_batch=8, micro_batch=1, tp=1, dp=1, zero=0, recompute=0, flash=False, pp=8)
    rate = hw.peak_tflops * 1e12 * hw.compute_eff
    tokens = 8 * 4096
    head = 6 * 4096 * 128256 * tokens / rate
    block = (shape.flops_per_token(4096) - 6 * 4096 * 128256) * tokens / 32 / rate  # one block, the step's tokens
    assert head < 4 * block  # the output layer fits in the 4 blocks' room
    out = layout_time.step_time(shape, hw, pp_last_layers=1, **kw)["breakdown"]
    assert float(out["compute_s"]) == pytest.approx(5 * block)  # a 5-block stage sets the pace
    assert float(out["bubble_s"]) == pytest.approx(7 * 5 * block / 8)
    # Too little room: with 4 blocks left on the last stage (ceil(28 / 7) = 4 elsewhere) the
    # output layer is paid in full, as in the even split.
    full = layout_time.step_time(shape, hw, pp_last_layers=4, **kw)["breakdown"]
    assert float(full["compute_s"]) == pytest.approx(4 * block + head)
    # Between: 3 blocks, ceil(29 / 7) = 5 elsewhere, the room is 2 blocks.
    mid = layout_time.step_time(shape, hw, pp_last_layers=3, **kw)["breakdown"]
    assert float(mid["compute_s"]) == pytest.approx(5 * block + max(head - 2 * block, 0.0))
    # Its tensor-parallel all-reduces are the 5-block stage's too: 4 a block and micro-batch.
    assert float(perf.collective_counts(32, 2, 8, 1, 0, 8, 0, pp_last_layers=1)["tp"]) == 4 * 5 * 8
    tp2 = layout_time.step_time(shape, hw, pp_last_layers=1, **{**kw, "tp": 2})["breakdown"]
    tp2_even = layout_time.step_time(shape, hw, **{**kw, "tp": 2})["breakdown"]
    assert float(tp2["tp_comm_s"]) == pytest.approx(float(tp2_even["tp_comm_s"]) * 5 / 4)
    # The first stage, which memory counts, holds the 5 blocks.
    from mgbench.planner import memory as M
    assert float(M.stage_layers(32, 8, 1)[0]) == 5 and float(M.stage_layers(32, 8)[0]) == 4
    assert float(M.stage_layers(32, 1, None)[0]) == 32
    lighter = M.memory_per_gpu(shape, num_micro=8, seq=4096, pp=8, pp_last_layers=1)
    even = M.memory_per_gpu(shape, num_micro=8, seq=4096, pp=8)
    assert lighter["activations_bytes"] == pytest.approx(even["activations_bytes"] * 5 / 4, rel=0.05)


def test_the_balanced_split_chooses_what_the_recipes_chose():
    # perf.balanced_last_layers against the layouts NVIDIA's recipes set by hand (data rows'
    # pp_last_layers_source): DeepSeek-V3 (61 blocks + MTP, a 129K vocabulary) gets 1, 5
    # and 13 blocks on the last of 16, 8 and 4 stages, as Megatron-Bridge's layout map and
    # MLPerf's 'Et*4|(t*4|)*14tmL' give it; Qwen3-235B-A22B (94) 10 of pp 8 where the
    # recipes' account_for_embedding/loss give 11; Llama 3.1 405B (126) 14 of pp 8 and 6
    # of pp 16 where they give 15 and 7 (the recipes count the output layer as one block,
    # the chooser as its FLOPs, a little more).
    import numpy as np

    def last(model, seq, pp):
        return list(perf.balanced_last_layers(catalog.model_shape(model), seq, np.array(pp)))

    assert last("deepseek-v3", 4096, [16, 8, 4]) == [1, 5, 13]
    assert last("qwen3-235b-a22b", 4096, [8]) == [10]
    assert last("llama3-405b", 8192, [8, 16]) == [14, 6]
    # No pipeline, or too many stages to lighten one (36 blocks over 16): not set (NaN).
    assert all(np.isnan(last("gpt-oss-120b", 4096, [1, 16])))


def test_the_balanced_split_counts_recomputation_which_the_output_layer_never_runs():
    # Llama 3 70B (80 blocks) over 8 stages. By hand: the output layer is 6 h V FLOPs a
    # token; a block is (the model's hardware FLOPs - the head) / 80. Without recompute
    # the head weighs more than a block, so 10 blocks + head (10 + h) is slower than 11
    # and the chooser gives the others 11 and the last 80 - 77 = 3; with full recompute
    # every block's forward runs twice and the head weighs less than one (h < 1), so
    # 10 + h beats 11 and the even split (10 on the last) wins: NaN, nothing to lighten.
    import numpy as np

    shape = catalog.model_shape("llama3-70b")
    head = perf.head_flops_per_token(shape)

    def h(rc):
        return head / ((perf.hardware_flops_per_token(shape, 8192, rc) - head) / 80)

    full = RECOMPUTE.index("full")
    assert h(0) > 1.0 > h(full)
    got = perf.balanced_last_layers(shape, 8192, np.array([8, 8]), np.array([0, full]))
    assert got[0] == 3 and np.isnan(got[1])
    assert np.isnan(perf.balanced_last_layers(shape, 8192, np.array([8]), full)[0])  # one code for all


def test_the_balanced_split_stays_within_what_the_layout_rule_allows():
    # 32 blocks and one MTP module over 8 stages: the MTP module rides on the last stage,
    # so a set last stage may hold at most memory.max_last_layers = 3 blocks; the chooser
    # never offers more (it would have offered 4, which predict refuses), and where no
    # allowed split beats the even one it offers none (NaN).
    import dataclasses

    import numpy as np

    from mgbench.planner.memory import max_last_layers

    shape = dataclasses.replace(catalog.model_shape("llama3-8b"), mtp_layers=1)
    assert max_last_layers(32, 8, 1) == 3
    k = perf.balanced_last_layers(shape, 4096, np.array([8]))[0]
    assert np.isnan(k) or k <= 3


def test_the_mtp_module_runs_on_the_last_stage_by_hand():
    # deepseek-v3 (61 blocks + 1 MTP module) over 16 stages of 4 blocks: the MTP module is
    # a mean block of the stage on the last one, beside the output layer; without a
    # pipeline it is part of the one stage's work.
    shape = catalog.model_shape("deepseek-v3")
    hw = hardware.resolve(system="dgx-h100")
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, dp=4, zero=1, recompute=0, ep=4)
    out = layout_time.step_time(shape, hw, pp=16, **kw)["breakdown"]
    mtp = float(out["mtp_last_stage_s"])
    blocks = float(out["compute_s"]) - float(out["head_s"]) - mtp
    # its own FLOPs (test_an_mtp_module_changes_no_other_stage_...): DeepSeek-V3's module is
    # an MoE block with a 2h x h projection besides, heavier than the stage's mean block
    assert blocks / 4 < mtp < 1.25 * blocks / 4
    # A last stage of 1 block leaves 3 blocks' room, which the output layer and the MTP
    # module fill up to what they exceed it by.
    light = layout_time.step_time(shape, hw, pp=16, pp_last_layers=1, **kw)["breakdown"]
    assert float(light["compute_s"]) == pytest.approx(
        blocks + max(float(out["head_s"]) + mtp - 3 * blocks / 4, 0.0))
    one = layout_time.step_time(shape, hw, pp=1, **{**kw, "dp": 64, "ep": 8})["breakdown"]
    assert float(one["mtp_last_stage_s"]) == 0.0
    # The rule counts it too: at pp 8 the last stage may hold 7 blocks + MTP (8 elsewhere).
    from mgbench.planner import memory as M
    assert float(M.max_last_layers(61, 8, 1)) == 7 and float(M.max_last_layers(61, 8)) == 8
    for L in (30, 61, 126):
        for p in (2, 3, 8, 16):
            for mtp in (0, 1, 2):
                best = max(k for k in range(L - p + 2) if k + mtp <= -(-(L - k) // (p - 1)))
                assert float(M.max_last_layers(L, p, mtp)) == best, (L, p, mtp)


def test_stack_efficiency_divides_compute_time():
    from mgbench.planner import stack

    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-a100")
    kw = dict(seq=8192, global_batch=64, micro_batch=1, tp=1, pp=1, dp=64, zero=3, recompute=1)
    base = layout_time.step_time(shape, hw, **kw)["breakdown"]
    tt = layout_time.step_time(shape, stack.apply(hw, "torchtitan"), **kw)["breakdown"]
    assert float(tt["compute_s"]) == pytest.approx(float(base["compute_s"]) / stack.efficiency("torchtitan"))
    assert stack.efficiency("megatron-lm") == 1.0  # the calibration stack, by construction


def test_a_stack_without_measured_runs_is_refused_with_its_reason():
    from mgbench.errors import MgbenchError
    from mgbench.planner import stack

    with pytest.raises(MgbenchError, match="no efficiency yet.*not fitted: mgbench's first GPU runs"):
        stack.efficiency("mgbench")
    with pytest.raises(MgbenchError, match="unknown --stack 'nope'"):
        stack.efficiency("nope")


def test_more_bandwidth_never_hurts_and_compute_scales_with_peak():
    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-h100")
    kw = dict(seq=4096, global_batch=256, micro_batch=1, tp=8, pp=1, dp=8, zero=1, recompute=0)
    base = layout_time.step_time(shape, hw, **kw)
    fast = layout_time.step_time(shape, dataclasses.replace(hw, inter_bw=hw.inter_bw * 10, intra_bw=hw.intra_bw * 10), **kw)
    assert float(fast["step_time_s"]) < float(base["step_time_s"])
    double = layout_time.step_time(shape, dataclasses.replace(hw, peak_tflops=hw.peak_tflops * 2), **kw)
    # GEMMs priced at their shapes keep their fixed cost and operand traffic: less than half
    # the time saved; at the large-GEMM rate alone, exactly half.
    assert float(base["breakdown"]["matmul_s"]) / 2 < float(double["breakdown"]["matmul_s"]) < \
        float(base["breakdown"]["matmul_s"])
    flat = dataclasses.replace(hw, gemm_shapes=False)
    base, double = (layout_time.step_time(shape, dataclasses.replace(flat, peak_tflops=flat.peak_tflops * f), **kw)
                    for f in (1, 2))
    assert float(double["breakdown"]["matmul_s"]) == pytest.approx(float(base["breakdown"]["matmul_s"]) / 2)


def test_predictions_match_published_megatron_runs_within_15_percent():
    rows, mae = validation.error_table()
    scored = [r for r in rows if r["role"] == "validation" and r["stack"] == "megatron-lm"]
    assert len(scored) == 8
    assert mae < 15.0, rows
    assert all(abs(r["error_pct"]) < 15.0 for r in scored)


def test_torchtitan_stack_predicts_its_other_published_runs_within_10_percent():
    rows, _ = validation.error_table()
    scored = [r for r in rows if r["role"] == "validation" and r["stack"] == "torchtitan"]
    assert len(scored) == 5 and all(r["unit"] == "tokens/s/GPU" for r in scored)
    assert all(abs(r["error_pct"]) < 10.0 for r in scored), scored
    assert validation.stack_errors(rows)["torchtitan"] < 10.0


def test_stored_stack_efficiency_is_the_solved_one():
    from mgbench.planner import stack

    assert stack.efficiency("torchtitan") == pytest.approx(validation.solve_stack("torchtitan"), abs=0.001)


def test_stored_defaults_are_the_solved_ones():
    mm, passes = validation.solve_defaults()
    d = hardware.planner_defaults()
    assert d["matmul_eff"] == pytest.approx(mm, abs=0.001)
    assert d["elementwise_passes"] == pytest.approx(passes, abs=0.01)


def test_predict_reports_fit_and_breakdown():
    shape = catalog.model_shape("llama3-8b")
    hw = hardware.resolve(system="dgx-h100")
    res = predict(shape, hw, Layout(num_gpus=8, zero=3, micro_batch=1, seq_len=8192, recompute="full"))
    for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
              "hardware_tflops_per_gpu", "mfu", "memory", "fits", "breakdown"):
        assert k in res
    assert res["fits"] is True
    assert res["tokens_per_s_per_gpu"] == pytest.approx(res["tokens_per_s"] / 8)
    assert res["mfu"] == pytest.approx(res["model_tflops_per_gpu"] / 989.0)
    assert res["hardware_tflops_per_gpu"] > res["model_tflops_per_gpu"]  # recompute counts in HFU only


def test_flash_attention_runs_at_its_generations_fraction():
    # llama3-8b, one GPU, 2 x 8192 tokens, no recompute: attention's scores and values are
    # 12 L h s FLOPs a token, counted halved for the causal mask in the fused kernel.
    shape = catalog.model_shape("llama3-8b")
    kw = dict(seq=8192, global_batch=2, micro_batch=1, tp=1, pp=1, dp=1, zero=0, recompute=0)
    attn_flops = 12 * 32 * 4096 * 8192 * 2 * 8192
    # The A100: its single figure (FlashAttention-2, efficiency.toml attention). The H100:
    # the curve of the default stack's kernel (Megatron-LM with Transformer Engine: cuDNN),
    # at 8K its measured point, 0.527; torchtitan's FlashAttention-2 there, 0.291.
    from mgbench.planner import stack

    cases = (("dgx-a100", None, 0.656), ("dgx-h100", None, 0.527), ("dgx-h100", "torchtitan", 0.291))
    for system, name, frac in cases:
        hw = hardware.resolve(system=system) if name is None else stack.apply(hardware.resolve(system=system), name)
        assert float(perf.attention_fraction(hw, 8192)) == pytest.approx(frac)
        b = layout_time.step_time(shape, hw, **kw)["breakdown"]
        # The kernel's fraction counts FlashAttention's FLOPs: backward 2.5 x forward
        # (it recomputes the scores), 3.5 forward passes where the model's 12 L h s counts 3.
        assert float(b["attention_s"]) == pytest.approx(0.5 * attn_flops * 3.5 / 3 / (hw.peak_tflops * 1e12 * frac))
        gemm = layout_time.step_time(shape, hw, flash=False, **kw)["breakdown"]
        # Without flash attention (or with no recorded fraction) the GEMM term prices them.
        assert float(gemm["attention_s"]) == 0.0
        assert float(gemm["matmul_s"] - b["matmul_s"]) == pytest.approx(attn_flops / (hw.peak_tflops * 1e12 * hw.compute_eff))
        unknown = layout_time.step_time(shape, dataclasses.replace(hw, attn_eff=None, attn_curves=()),
                                        **kw)["breakdown"]
        assert float(unknown["matmul_s"]) == pytest.approx(float(gemm["matmul_s"]))


def test_a100_to_h100_speedup_falls_with_attention_share():
    # With FlashAttention-2 (llm-foundry's stack): the GEMMs gain 989 x 0.803 / (312 x 0.869)
    # = 2.93x, the kernel 0.291 x 989 / (0.656 x 312) = 1.41x at 8K and beyond (the H200's
    # measured curve, held past 8K): the longer the sequence, the smaller the H100's lead (as
    # llm-foundry's same-software A100 and H100 tables show: about 2.3x at 2k, 1.9x at 64k).
    from mgbench.planner import stack

    shape = catalog.model_shape("llama3-8b")
    ratio = {}
    for seq in (2048, 65536):
        kw = dict(seq=seq, global_batch=8 * 65536 // seq, micro_batch=1, tp=1, pp=1, dp=8, zero=3, recompute=2)
        a100 = layout_time.step_time(shape, stack.apply(hardware.resolve(system="dgx-a100"), "llm-foundry"),
                                     **kw)["tokens_per_s_per_gpu"]
        h100 = layout_time.step_time(shape, stack.apply(hardware.resolve(system="dgx-h100"), "llm-foundry"),
                                     **kw)["tokens_per_s_per_gpu"]
        ratio[seq] = float(h100 / a100)
    assert ratio[65536] < ratio[2048] - 0.4
    assert ratio[2048] < 989 * 0.803 / (312 * 0.869)  # never above the GEMMs' own gain


def test_shared_rules_are_stated_once():
    from mgbench.planner import memory

    # every_2nd recomputes blocks 0, 2, 4: ceil(n / 2) of n; full every block.
    assert list(memory.recomputed_blocks([5, 4, 1], 1)) == [3, 2, 1]
    assert float(memory.recomputed_blocks(5, 2)) == 5 and float(memory.recomputed_blocks(5, 0)) == 0
    assert memory.recomputed_share(5, 1) == pytest.approx(3 / 5)
    assert memory.recomputed_share(7, 2) == 1.0 and memory.recomputed_share(7, 0) == 0.0
    # The overlap window: the last micro-batch's backward (2/3 of 1/m) below ZeRO-3, all of it at 3.
    assert float(perf.dp_window_fraction(4, 1)) == pytest.approx(2 / 12)
    assert float(perf.dp_window_fraction(4, 3)) == 1.0
    # An all-reduce fit on 8 ranks: 14 ring steps, 2 x 7/8 of the bytes over each link.
    link = perf.link_from_all_reduce_fit(28e-6, 100e9, 8)
    assert link == pytest.approx({"bw": 175e9, "alpha_s": 2e-6})


def test_an_mtp_module_changes_no_other_stage_and_costs_its_own_flops_on_the_last():
    # Megatron-Core builds the MTP module on the last pipeline stage: a model that gains one
    # leaves every other stage's blocks as they were (their FLOPs, elementwise traffic and
    # GEMM shape losses), and the last stage runs the module's own FLOPs (the model's FLOPs
    # a token less the same model's without it) besides a mean block's elementwise work. By
    # hand, with attention and every GEMM at the large-GEMM rate (no fused-attention
    # fraction, no shape model), 64 x 4096 tokens over dp 2 through pp 4.
    import dataclasses

    base = catalog.model_shape("llama3-8b")
    with_mtp = dataclasses.replace(base, mtp_layers=1)
    hw = dataclasses.replace(hardware.resolve(system="dgx-h100"), gemm_shapes=False, attn_eff=None, attn_curves=())
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=4, dp=2, zero=1, recompute=0)

    def parts(shape):
        b = layout_time.step_time(shape, hw, **kw)["breakdown"]
        return float(b["compute_s"] - b["head_s"] - b["mtp_last_stage_s"]), float(b["mtp_last_stage_s"]), b

    stage, mtp, b = parts(with_mtp)
    stage0, mtp0, _ = parts(base)
    assert stage == pytest.approx(stage0, rel=1e-12) and mtp0 == 0.0
    rate = hw.peak_tflops * 1e12 * hw.compute_eff
    flops = lambda sh: perf.hardware_flops_per_token(sh, 4096, 0) - perf.head_flops_per_token(sh)  # noqa: E731
    tokens = 64 * 4096 / 2
    own_flops = float(flops(with_mtp) - flops(base)) * tokens / rate / hw.stack_eff
    elementwise_block = float(b["elementwise_s"]) / hw.stack_eff / 8  # the stage's 8 blocks
    assert mtp == pytest.approx(own_flops + elementwise_block, rel=1e-9)


def test_the_balanced_split_never_gives_a_last_stage_more_than_the_layout_rule_allows():
    # 11 blocks and 2 MTP modules over 4 stages: the last stage, holding the MTP modules,
    # may hold at most memory.max_last_layers = 1 block (k + 2 <= ceil((11 - k) / 3)); left
    # to the FLOP balance alone the chooser would offer 2 (predict refuses that layout), and
    # no allowed lighter split beats the even one, so it offers none.
    import dataclasses

    import numpy as np

    from mgbench.planner.memory import max_last_layers

    shape = dataclasses.replace(catalog.model_shape("llama3-8b"), layers=11, mtp_layers=2)
    assert float(max_last_layers(11, 4, 2)) == 1
    k = float(perf.balanced_last_layers(shape, 4096, np.array([4]))[0])
    assert np.isnan(k)


def test_an_moe_layer_without_shared_experts_runs_attentions_tensor_parallel_collectives_only():
    # Megatron-Core's MoE layer routes the stage's sequence shard over the expert-parallel
    # group (tensor parallelism with MoE needs sequence parallelism), so with expert TP 1 its
    # MLP runs no tensor-parallel gather or reduce-scatter; attention's two a block stay, and a
    # dense leading block or a shared expert keeps the MLP's two. Hand count, 8 micro-batches
    # of a 12-block stage, no recompute: 4 x 12 x 8 dense.
    qwen = catalog.model_shape("qwen3-235b-a22b")  # 94 MoE blocks, no shared expert
    dsv3 = catalog.model_shape("deepseek-v3")  # 3 dense blocks, then MoE with one shared expert
    assert qwen.shared_experts == 0 and qwen.dense_layers == 0 and dsv3.shared_experts == 1
    dense = float(perf.collective_counts(96, 8, 8, 1, 0, 8, 0)["tp"])
    assert dense == 4 * 12 * 8
    assert float(perf.collective_counts(96, 8, 8, 1, 0, 8, 0, shape=qwen)["tp"]) == 2 * 12 * 8
    assert float(perf.collective_counts(96, 8, 8, 1, 0, 8, 0, shape=dsv3)["tp"]) == dense
    no_shared = dataclasses.replace(dsv3, shared_experts=0)
    # The first stage's 3 dense blocks keep 4 each, its 9 MoE blocks 2.
    assert float(perf.collective_counts(96, 8, 8, 1, 0, 8, 0, shape=no_shared)["tp"]) == (3 * 4 + 9 * 2) * 8
    # Full recompute runs each block's forward collectives again: 2 more a dense block (6 in
    # all), 1 more an MoE block without shared experts (3 in all).
    full = RECOMPUTE.index("full")
    assert float(perf.collective_counts(96, 8, 8, 1, 0, 8, full, shape=qwen)["tp"]) == 3 * 12 * 8
    # and the step prices it: the run's tensor-parallel time is half what a shared expert makes it.
    hw = hardware.resolve("dgx-b200")
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=8, pp=1, dp=8, recompute=0)
    moe_t = perf.compute_terms(qwen, hw, **kw)["tp_comm_s"]
    with_shared = perf.compute_terms(dataclasses.replace(qwen, shared_experts=1), hw, **kw)["tp_comm_s"]
    assert float(moe_t) > 0 and float(moe_t) == pytest.approx(float(with_shared) / 2)
