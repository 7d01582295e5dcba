"""Expert tensor parallelism (Layout.etp, `--etp`): each routed expert split over etp
ranks, as Megatron-Core's expert_tensor_parallel_size does; its weights, the expert
data-parallel group, the gathered input rows and the all-gather / reduce-scatter around
the experts, checked by hand; the layouts it refuses; the published runs that state it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.layout import Layout
from mgbench.planner import layout_time, perf
from mgbench.planner import memory as M
from mgbench.planner import moe_validation as V
from mgbench.planner.hardware import resolve as resolve_system
from mgbench.planner.predict import memory, predict, validate
from mgbench.planner.resolve import resolve

# Grok-1 314B as dgxc-benchmarking's NeMo script builds it: Mixtral's shape, 64 layers,
# hidden 6144, 48 heads, 8 query groups, 8 experts of width 32768, top-2.
GROK = V.shape_of(next(r for r in V.runs() if r["id"] == "dgxc-25.05-gb200-grok1-314b-bf16-128"))


def _layout(**kw):
    base = dict(num_gpus=128, tp=4, pp=1, ep=8, zero=1, micro_batch=1, seq_len=8192, global_batch=256,
                precision="bf16", recompute="none", sequence_parallel=True)
    return Layout(**{**base, **kw})


def test_the_experts_weights_split_over_ep_x_etp_by_hand():
    # One expert a layer: 3 x 6144 x 32768 weights; 8 experts over ep 8, then 4 ways by etp.
    per_expert = 3 * 6144 * 32768
    assert GROK.expert_params() == per_expert
    _, whole = M.stage_param_split(GROK, 4, 1, 8)
    _, split = M.stage_param_split(GROK, 4, 1, 8, etp=4)
    assert whole == pytest.approx(64 * 8 * per_expert / 8)
    assert split == pytest.approx(whole / 4)


def test_memory_holds_a_quarter_of_the_experts_and_shards_them_over_fewer_ranks():
    hw = resolve(precision="bf16", system="gb200-nvl72")
    one, four = (M.memory_per_gpu(GROK, num_micro=8, **_layout(etp=x).model_kwargs()) for x in (1, 4))
    _, expert = M.stage_param_split(GROK, 4, 1, 8, etp=4)
    # bf16 weights and gradients (2 + 4 bytes at the default stack's grads) a weight held; the
    # optimizer's 12 over the expert data-parallel group: 128 / (8 x 4) = 4 ranks at etp 4,
    # 128 / 8 = 16 at etp 1.
    assert four["params_bytes"] < one["params_bytes"]
    dense, _ = M.stage_param_split(GROK, 4, 1, 8)
    assert four["optimizer_bytes"] == pytest.approx(12 * dense / 32 + 12 * expert / 4)
    # The published Grok-1 layout fits a GB200 with it and not without it.
    assert four["total_bytes"] < hw.memory_bytes < one["total_bytes"]


def test_the_gathered_input_rows_are_etp_fold():
    tokens, h, fe = 2048.0, GROK.hidden, GROK.moe_ffn_hidden
    one = M.moe_mlp_extra(GROK, tokens, 4, "bf16", sp=True)
    four = M.moe_mlp_extra(GROK, tokens, 4, "bf16", sp=True, etp=4)
    # Each routed row's first-GEMM input (2 bytes x h) four times; the expert's width is
    # etp x the rows at 1 / etp of it: unchanged. Top-2, split over tp 4 by sequence parallelism.
    assert four - one == pytest.approx(tokens * 2 * (2 * h * 4 - 2 * h) / 4)
    assert fe % 4 == 0


def test_the_gather_and_reduce_scatter_by_hand():
    hw = resolve(precision="bf16", system="gb200-nvl72")
    tokens, load, layers, m = 2048.0, 1.1, 64, 8
    got = layout_time.etp_comm_s(GROK, hw, tokens=tokens, etp=4, load=load, act_bytes=2.0, moe_layers=layers,
                                 num_micro=m, moe_rerun_share=0.0)
    rows = tokens * 2 * load  # top-2
    gathered = rows * 4 * 6144 * 2.0
    one = perf.group_collective_time(gathered, 4, 4, hw, 1.0)
    assert float(got) == pytest.approx(4 * float(one) * layers * m)
    # by the ring: 3 steps of a quarter of the gathered rows each, on the NVLink domain
    assert float(one) == pytest.approx(3 * hw.intra_alpha_s + 0.75 * gathered / hw.intra_bw)
    assert float(layout_time.etp_comm_s(GROK, hw, tokens=tokens, etp=1, load=load, act_bytes=2.0,
                                        moe_layers=layers, num_micro=m, moe_rerun_share=0.0)) == 0.0
    # a recomputed MoE layer gathers and scatters its forward again
    again = layout_time.etp_comm_s(GROK, hw, tokens=tokens, etp=4, load=load, act_bytes=2.0, moe_layers=layers,
                                   num_micro=m, moe_rerun_share=1.0)
    assert float(again) == pytest.approx(float(got) * 6 / 4)


def test_predict_adds_the_etp_traffic_to_the_exposed_ep_comm():
    hw = resolve(precision="bf16", system="gb200-nvl72")
    one, four = (predict(GROK, hw, _layout(etp=x)) for x in (1, 4))
    b1, b4 = one["breakdown"], four["breakdown"]
    assert b1["etp_comm_s"] == 0.0 and b4["etp_comm_s"] > 0.0
    assert b4["ep_comm_s"] == pytest.approx(b1["ep_comm_s"] + b4["etp_comm_s"])
    # the expert gradients' data-parallel traffic: a quarter of the weights over a quarter
    # of the ranks
    assert b4["dp_comm_s"] < b1["dp_comm_s"]
    assert four["memory"]["total_bytes"] < one["memory"]["total_bytes"]


@pytest.mark.parametrize("kw, said", [
    (dict(etp=3), "--ep 8 x --etp 3 must divide the 128 ranks"),
    (dict(ep=8, etp=32), "--ep 8 x --etp 32 must divide the 128 ranks"),
    (dict(etp=0), "--etp must be >= 1"),
])
def test_a_layout_the_expert_groups_cannot_tile_is_refused(kw, said):
    with pytest.raises(MgbenchError, match=said.replace("-", r"\-").replace("+", r"\+")):
        validate(_layout(**kw), GROK)


def test_etp_on_a_dense_model_is_refused_on_the_command_line():
    r = CliRunner().invoke(main, ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8",
                                  "--tp", "4", "--etp", "4"])
    assert r.exit_code == 2 and "--etp 4 splits routed experts" in r.output and "Traceback" not in r.output


def test_the_command_line_prices_it_and_says_so():
    args = ["predict", "--model", "mixtral-8x7b", "--system", "gb200-nvl72", "--num-gpus", "64", "--tp", "4",
            "--ep", "8", "--sequence-parallel", "--global-batch", "128", "--zero", "1"]
    one = json.loads(CliRunner().invoke(main, args + ["--json"]).output)
    four = json.loads(CliRunner().invoke(main, args + ["--etp", "4", "--json"]).output)
    assert four["memory"]["layout"]["etp"] == 4 and one["memory"]["layout"]["etp"] == 1
    assert four["breakdown"]["etp_comm_s"] > 0 == one["breakdown"]["etp_comm_s"]
    text = CliRunner().invoke(main, args + ["--etp", "4"]).output
    assert " etp=4" in text
    mem = CliRunner().invoke(main, ["memory", "--model", "mixtral-8x7b", *args[5:], "--etp", "4", "--json"])
    assert mem.exit_code == 0 and json.loads(mem.output)["layout"]["etp"] == 4


def test_the_runner_does_not_run_it():
    lay = Layout(num_gpus=4, tp=2, ep=2, etp=2, seq_len=64, micro_batch=1)
    assert any("etp=2" in p and "not run" in p for p in lay.runner_problems(4))


def test_the_published_rows_that_state_it_carry_it():
    rows = [r for r in V.runs() if r.get("etp", 1) > 1]
    assert {r["id"] for r in rows} == {f"dgxc-25.05-gb200-grok1-314b-{p}-{n}" for p in ("bf16", "fp8")
                                       for n in (128, 256, 512)} | {f"dgxc-25.05-h100-llama4-maverick-{p}-512"
                                                                    for p in ("bf16", "fp8")}
    assert all(Layout.from_published(r).etp == 4 for r in rows)
    # priced as they ran, each fits its GPU (the published-layout check, test_published_fits.py)
    assert all(V.score(r)["fits"] for r in rows)
    # and rows differing in etp alone are two configurations, not a re-measurement
    assert V.configuration(rows[0]) != V.configuration({**rows[0], "etp": 1})


def test_an_ep_group_strided_by_etp_crosses_nodes_sooner():
    # Megatron-Core lays the expert tensor-parallel ranks innermost: with ep 8 and etp 4 on
    # 8-GPU nodes an ep group holds 2 ranks a node over 4 nodes, so of a token's 2 rows
    # (top-2 over 8 ranks) 2 x 1/8 stay in the node and 2 x 6/8 cross it; with etp 1 all 8
    # ranks share one node.
    from mgbench.planner import moe

    hw = resolve_system("dgx-h100")
    assert float(moe.ep_ranks_per_node(8, 4)) == 2.0 and float(moe.ep_ranks_per_node(8, 16)) == 1.0
    inside, across = moe.rows_sent(GROK, 8, moe.ep_ranks_per_node(8, 4), moe.MoeOptions())
    assert (float(inside), float(across)) == pytest.approx((2 * 1 / 8, 2 * 6 / 8))
    kw = dict(tokens=2048.0, ep=8, elem_bytes=2.0, opts=moe.MoeOptions())
    one = float(moe.a2a_seconds(GROK, hw, **kw))
    four = float(moe.a2a_seconds(GROK, hw, **kw, etp=4))
    assert four > 3 * one  # the network, not NVLink, now carries most of it


def test_deepep_with_etp_is_refused_not_priced_in_the_gather_form():
    hw = resolve(precision="bf16", system="dgx-h100")
    from mgbench.planner import moe

    with pytest.raises(MgbenchError, match="--etp with --moe-dispatcher deepep is not priced"):
        predict(GROK, hw, _layout(num_gpus=512, global_batch=1024, etp=4), moe=moe.MoeOptions(dispatcher="deepep"))
