"""Muon's own step priced (planner/optimizer.py): its Newton-Schulz FLOPs counted by hand
and against torchtitan's dion Muon as traced (docs/research/mini_kimi_host_trace.md), its
states' copies under CPU offload, and the option's refusals."""
import dataclasses
import json

import pytest
from click.testing import CliRunner

from mgbench import catalog
from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.layout import Layout
from mgbench.planner import hardware, layout_time
from mgbench.planner import optimizer as O
from mgbench.planner.layout_time import host_link_bw

# torchtitan's mini_kimi_k2_llep flavour (deepseek_v3/__init__.py @fda7d765 lines 269-295)
MINI_KIMI = dataclasses.replace(catalog.model_shape("deepseek-v3"), layers=8, hidden=3072, heads=24, kv_heads=24,
                                ffn_hidden=12288, vocab=2048, experts=256, top_k=8, expert_ffn_hidden=2048,
                                shared_experts=1, dense_layers=1, q_lora_rank=None, kv_lora_rank=512,
                                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, mtp_layers=0)


def test_one_matrix_costs_five_iterations_of_its_three_products():
    # 2048 x 3072: A = X X^T 2 m^2 n, A A 2 m^3, B X 2 m^2 n; 5 iterations: 343.6 GFLOP,
    # as the trace counts it from newton_schulz_triton.py (lines 340-377 @fda7d765).
    per = 5 * (2 * 2048 ** 2 * 3072 + 2 * 2048 ** 3 + 2 * 2048 ** 2 * 3072)
    assert per == pytest.approx(343.6e9, rel=1e-3)
    # The routed experts of the mini Kimi K2 are 7 layers x 256 experts x 3 matrices of it:
    # 672 a GPU on 8 GPUs, 230.9 TFLOP each (the trace's count).
    routed = [m for m in O.muon_matrices(MINI_KIMI) if m[2] == 3 * 256 * 7]
    assert [m[:2] for m in routed] == [(3072, 2048)]
    one = dataclasses.replace(MINI_KIMI, layers=2, experts=1, top_k=1, shared_experts=0, dense_layers=1)
    # A model of one MoE layer with one expert: its matrices by hand.
    assert sorted(O.muon_matrices(one)) == sorted([(3072, 24 * 192, 2), (3072, 576, 2), (512, 24 * 256, 2),
                                                   (24 * 128, 3072, 2), (3072, 12288, 3), (3072, 1, 1),
                                                   (3072, 2048, 3)])
    assert O.newton_schulz_flops(one) == pytest.approx(sum(
        c * 5 * (4.0 * min(k, n) ** 2 * max(k, n) + 2.0 * min(k, n) ** 3) for k, n, c in O.muon_matrices(one)))
    experts = 7 * 256 * 3 * per
    assert experts / 8 == pytest.approx(230.9e12, rel=1e-3)
    # The rest (attention, router, dense and shared MLPs) is 4.0 TFLOP a GPU, dealt evenly.
    assert (O.newton_schulz_flops(MINI_KIMI) - experts) / 8 == pytest.approx(3.97e12, rel=0.01)
    # The embedding, output layer and norms take AdamW: no matrix of the vocabulary's width.
    assert all(2048 not in (k, n) or (k, n) == (3072, 2048) for k, n, _ in O.muon_matrices(MINI_KIMI))


def test_adamw_costs_nothing_and_muon_its_share_at_the_gemm_rate():
    hw = hardware.resolve("dgx-b200")
    assert float(O.step_seconds(MINI_KIMI, hw, "adamw", num_gpus=8)) == 0.0
    rate = hw.peak_tflops * 1e12 * hw.compute_eff
    assert float(O.step_seconds(MINI_KIMI, hw, "muon", num_gpus=8)) == pytest.approx(
        O.newton_schulz_flops(MINI_KIMI) / 8 / rate)
    # HSDP replicas each orthogonalise their own copy: 16 GPUs in 2 replicas do 8 GPUs' share each.
    assert float(O.step_seconds(MINI_KIMI, hw, "muon", num_gpus=16, replicas=2)) == pytest.approx(
        float(O.step_seconds(MINI_KIMI, hw, "muon", num_gpus=8)))
    with pytest.raises(MgbenchError, match="--optimizer must be one of adamw, muon"):
        O.step_seconds(MINI_KIMI, hw, "sgd", num_gpus=8)


def test_under_offload_muon_copies_its_states_to_the_gpu_and_back():
    # bf16 throughout (2, 2, 2): gradient and weight in, weight out over FSDP2's pinned
    # buffers (6 bytes); the momentum in and out from dion's pageable host copy (4 bytes).
    pinned, pageable = O.offload_bytes("muon", 4.289e9, (2.0, 2.0, 2.0))
    assert (float(pinned), float(pageable)) == (pytest.approx(6 * 4.289e9), pytest.approx(4 * 4.289e9))
    assert [float(x) for x in O.offload_bytes("adamw", 4.289e9, (2.0, 2.0, 2.0))] == [0.0, 0.0]
    # Told apart: weight 2, gradient 4, momentum 6 bytes: pinned 4 + 2 x 2, pageable 2 x 6.
    pinned, pageable = O.offload_bytes("muon", 1.0, (2.0, 4.0, 6.0))
    assert (float(pinned), float(pageable)) == (8.0, 12.0)
    hw = hardware.resolve("dgx-b200")
    kw = dict(seq=8192, global_batch=48, micro_batch=6, tp=1, pp=1, dp=8, zero=3, recompute=0, ep=8, offload=True,
              offload_state_bytes=(2.0, 2.0, 2.0))
    muon = layout_time.step_time(MINI_KIMI, hw, optimizer="muon", **kw)
    b = muon["breakdown"]
    ns = float(O.step_seconds(MINI_KIMI, hw, "muon", num_gpus=8))
    # The shard: the experts a GPU holds (ep 8) and 1/8 of the rest.
    dense_p, expert_p = layout_time.stage_param_split(MINI_KIMI, 1, 1, 8)
    shard = float(dense_p) / 8 + float(expert_p)
    pageable_bw = 10.0e9  # hardware.toml [host_cpu] pageable_gbps
    assert float(b["optimizer_s"]) == pytest.approx(ns + 6 * shard / host_link_bw(hw) + 4 * shard / pageable_bw,
                                                    rel=1e-6)
    assert any("--optimizer muon with --offload" in n and "pageable rate" in n for n in muon["notes"])
    # Without offload Muon steps on the GPU's own copy: Newton-Schulz alone.
    on_gpu = layout_time.step_time(MINI_KIMI, hw, optimizer="muon", **{**kw, "offload": False})
    assert float(on_gpu["breakdown"]["optimizer_s"]) == pytest.approx(ns)


def test_the_layout_and_the_runner_refuse_what_they_cannot_take():
    with pytest.raises(MgbenchError, match="--optimizer must be one of adamw, muon"):
        Layout(num_gpus=8, optimizer="lion")
    problems = Layout(num_gpus=2, optimizer="muon").runner_problems(2)
    assert any("the runner trains with AdamW" in p for p in problems)


def test_predict_takes_the_optimizer_on_the_command_line():
    base = ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--zero", "3",
            "--micro-batch", "1", "--json"]
    adamw = json.loads(CliRunner().invoke(main, base).output)
    r = CliRunner().invoke(main, base + ["--optimizer", "muon"])
    assert r.exit_code == 0, r.output
    muon = json.loads(r.output)
    assert muon["step_time_s"] > adamw["step_time_s"]
    assert muon["breakdown"]["optimizer_s"] == pytest.approx(muon["step_time_s"] - adamw["step_time_s"], rel=1e-6)
    bad = CliRunner().invoke(main, base + ["--optimizer", "sgd"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_memory_says_muons_states_are_counted_at_adamws_bytes_unless_given():
    base = ["memory", "--model", "llama3-8b", "--num-gpus", "8", "--zero", "1", "--json"]
    muon = json.loads(CliRunner().invoke(main, base + ["--optimizer", "muon"]).output)
    assert any("Muon keeps one momentum buffer" in n and "--state-bytes" in n for n in muon["notes"])
    # The same bytes as AdamW's (nothing guessed), and no such note where the run gives its own.
    adamw = json.loads(CliRunner().invoke(main, base).output)
    assert muon["total_bytes"] == adamw["total_bytes"]
    given = json.loads(CliRunner().invoke(main, base + ["--optimizer", "muon", "--state-bytes", "2,4,8"]).output)
    assert not any("Muon keeps" in n for n in given["notes"]) and given["total_bytes"] < adamw["total_bytes"]
