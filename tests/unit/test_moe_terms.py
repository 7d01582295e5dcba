"""The MoE terms of the step model (planner/moe.py, layout_time.step_time; issue 26):
expert-parallel traffic split inside and across nodes, node-limited routing, FP8
dispatch, what DualPipe and Megatron-Core's EP overlap hide, load imbalance and capacity,
the recompute modules, and MLA in the planner's memory, each against a hand calculation
and each with the broken input that makes it fire."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.planner import hardware, layout_time, moe, perf
from mgbench.planner import memory as M

DSV3 = catalog.model_shape("deepseek-v3")
MIXTRAL = catalog.model_shape("mixtral-8x7b")
H100 = hardware.resolve(system="dgx-h100")
H800 = hardware.resolve(system="hgx-h800")
BALANCED = moe.MoeOptions(imbalance=1.0)


def none_of(pool, bin_size, k):
    """Chance that k experts drawn from ``pool`` miss a bin of ``bin_size``, by counting."""
    return math.comb(pool - bin_size, k) / math.comb(pool, k)


# --- traffic by scope ---------------------------------------------------------------------

def test_all_to_all_rows_split_inside_and_across_nodes_by_hand():
    # DeepSeek-V3's 8 of 256 experts over ep 64 consecutive ranks of 8-GPU nodes: a row per
    # expert, 7 of 64 ranks share the sender's node, 56 are elsewhere.
    inside, across = moe.rows_sent(DSV3, 64, 8, BALANCED)
    assert float(inside) == pytest.approx(8 * 7 / 64) and float(across) == pytest.approx(8 * 56 / 64)
    # ep inside one node: nothing crosses; ep 1: nothing moves.
    inside, across = moe.rows_sent(DSV3, 8, 8, BALANCED)
    assert (float(inside), float(across)) == (pytest.approx(8 * 7 / 8), 0.0)
    assert [float(x) for x in moe.rows_sent(DSV3, 1, 8, BALANCED)] == [0.0, 0.0]
    # One GB200 NVL72 domain holds an ep group of 64: all of it on NVLink.
    assert float(moe.rows_sent(DSV3, 64, 72, BALANCED)[1]) == 0.0


def test_node_limited_routing_cuts_the_rows_that_cross_nodes_by_hand():
    dedup = moe.MoeOptions(imbalance=1.0, dispatcher="deepep")
    # One row per destination node: D_n (N - 1) / N across. Unlimited: 8 nodes of 32 experts.
    free = 8 * (1 - none_of(256, 32, 8)) * 7 / 8
    # At most 4 nodes (DeepSeek-V3 section 3.2.2): the 8 experts among the 4 nodes' 128.
    limited = 4 * (1 - none_of(128, 32, 8)) * 7 / 8
    assert float(moe.rows_sent(DSV3, 64, 8, dedup)[1]) == pytest.approx(free)
    assert float(moe.rows_sent(DSV3, 64, 8, dataclasses.replace(dedup, node_limit=4))[1]) == pytest.approx(limited)
    assert limited == pytest.approx(3.175, abs=1e-3) and free == pytest.approx(4.633, abs=1e-3)
    # Inside: each GPU reached, less the one the row enters its node by: D_g (g - 1) / g.
    d_g = 32 * (1 - none_of(128, 4, 8))
    assert float(moe.rows_sent(DSV3, 64, 8, dataclasses.replace(dedup, node_limit=4))[0]) == pytest.approx(d_g * 7 / 8)
    # The control: the all-to-all dispatcher sends a row per expert, and a row crosses
    # whenever its expert is elsewhere, limited or not.
    a2a = moe.rows_sent(DSV3, 64, 8, BALANCED)
    assert [float(x) for x in moe.rows_sent(DSV3, 64, 8, dataclasses.replace(BALANCED, node_limit=4))] == \
        [float(x) for x in a2a]


def test_device_limited_routing_by_hand():
    # DeepSeek-V2: 160 experts over 8 GPUs of one node (20 each), 6 a token on at most 3 GPUs.
    v2 = catalog.model_shape("deepseek-v2")
    opts = moe.MoeOptions(imbalance=1.0, dispatcher="deepep", device_limit=3)
    d_g = 3 * (1 - none_of(60, 20, 6))
    assert float(moe.rows_sent(v2, 8, 8, opts)[0]) == pytest.approx(d_g * 7 / 8)
    assert float(moe.rows_sent(v2, 8, 8, opts)[0]) < float(moe.rows_sent(v2, 8, 8, dataclasses.replace(opts, device_limit=None))[0])


def test_round_robin_routing_reaches_the_fewest_gpus_and_nodes_by_hand():
    # torchtitan's moe_force_load_balance and AutoModel's fake balanced gate give token t
    # the experts t k .. t k + k - 1 mod E.
    rr = moe.MoeOptions(dispatcher="deepep", round_robin=True)
    assert rr.load == 1.0  # exactly balanced, whatever the default imbalance
    assert "round-robin routing" in moe.note(rr, "1f1b") and "x the mean" not in moe.note(rr, "1f1b")
    capped = dataclasses.replace(rr, capacity_factor=0.5)
    assert capped.load == 0.5 and "capacity factor 0.5" in moe.note(capped, "1f1b")
    qwen = catalog.model_shape("qwen3-30b-a3b")
    # 128 experts, top 8, ep 8: 16 experts a GPU, so the 8 sit on one GPU of one node.
    assert [float(x) for x in moe.distinct_reached(qwen, 8, 8, round_robin=True)] == [1.0, 1.0]
    # DeepSeek-V3 at ep 64 on 8-GPU nodes: 4 experts a GPU, 32 a node: two GPUs, one node.
    assert [float(x) for x in moe.distinct_reached(DSV3, 64, 8, round_robin=True)] == [1.0, 2.0]
    # Kimi K2: 384 experts over ep 32 (12 a GPU, 96 a node): starts 0, 8, 16 repeat every
    # 24 experts, touching 1, 2 and 1 GPUs: 4/3 on average, one node.
    kimi = catalog.model_shape("kimi-k2")
    d_n, d_g = moe.distinct_reached(kimi, 32, 8, round_robin=True)
    assert (float(d_n), float(d_g)) == (1.0, pytest.approx(4.0 / 3.0))
    # Broadcast over layouts, as plan's search prices them.
    d_n, d_g = moe.distinct_reached(DSV3, np.array([8, 16, 64]), 8, round_robin=True)
    assert d_g.tolist() == [1.0, 1.0, 2.0] and d_n.tolist() == [1.0, 1.0, 1.0]
    # DeepEP sends one row a node and a GPU: at ep 64 one row across (7/8 of tokens leave
    # the node), one forwarded inside, where random experts send 4.6 across.
    inside, across = moe.rows_sent(DSV3, 64, 8, rr)
    assert (float(inside), float(across)) == (pytest.approx(2 * 7 / 8), pytest.approx(7 / 8))
    assert float(moe.rows_sent(DSV3, 64, 8, dataclasses.replace(rr, round_robin=False))[1]) == pytest.approx(4.633, abs=1e-3)
    # The control: the all-to-all dispatcher sends a row per expert wherever it sits.
    a2a = dataclasses.replace(rr, dispatcher="alltoall")
    assert [float(x) for x in moe.rows_sent(DSV3, 64, 8, a2a)] == \
        [float(x) for x in moe.rows_sent(DSV3, 64, 8, dataclasses.replace(a2a, round_robin=False))]


def test_a_run_of_experts_that_wraps_past_the_last_one_counts_each_block_once():
    # DeepSeek-V2: 160 experts, top 6 (6 does not divide 160, so a run can wrap from expert
    # 159 to 0): on one node there is one node to reach, on one GPU one GPU.
    v2 = catalog.model_shape("deepseek-v2")
    d_n, d_g = moe.distinct_reached(v2, 8, 8, round_robin=True)
    assert float(d_n) == 1.0 and 1.0 <= float(d_g) <= 8.0
    assert [float(x) for x in moe.distinct_reached(v2, 1, 8, round_robin=True)] == [1.0, 1.0]
    # by brute force over the tokens for ep 16 on 8-GPU nodes (10 experts a GPU, 80 a node)
    E, k = 160, 6
    starts = sorted({(t * k) % E for t in range(E)})
    gpus = [len({((s + j) % E) // 10 for j in range(k)}) for s in starts]
    nodes = [len({((s + j) % E) // 80 for j in range(k)}) for s in starts]
    d_n, d_g = moe.distinct_reached(v2, 16, 8, round_robin=True)
    assert float(d_g) == pytest.approx(sum(gpus) / len(gpus)) and float(d_n) == pytest.approx(sum(nodes) / len(nodes))


def test_the_validation_rows_that_route_round_robin_send_less():
    from mgbench.planner import moe_validation as V

    row = next(r for r in V.runs() if r["id"] == "torchtitan-b200-qwen3-30b-a3b-deepep-8gpu")
    assert row["routing"] == "round_robin" and moe.options_of(row).round_robin
    assert not moe.options_of({**row, "routing": "force_balanced"}).round_robin
    rr = float(V.predict_row(row)["breakdown"]["ep_a2a_s"])
    random = float(V.predict_row(row, dataclasses.replace(moe.options_of(row), round_robin=False))["breakdown"]["ep_a2a_s"])
    # one GPU a token instead of 5.3: DeepEP's rows inside the node fall 5.3x (the
    # latencies, one a peer, stay)
    assert random / 5.4 < rr < random / 4.5


def test_round_robin_routing_refuses_a_router_limit_or_an_imbalance():
    # 1.1 given is refused too: it is the assumed default's value, but given, not assumed.
    for bad, says in ((dict(node_limit=4), "node_limit"), (dict(device_limit=3), "device_limit"),
                      (dict(imbalance=1.3), "exactly balanced"), (dict(imbalance=moe.DEFAULT_IMBALANCE), "exactly balanced")):
        with pytest.raises(MgbenchError, match=says):
            moe.MoeOptions(round_robin=True, **bad)


def test_a_recomputed_moe_layer_launches_its_forward_again_by_hand():
    # Full recompute runs each MoE layer's forward again: half of a pass's per-layer
    # launches (router, permutation and dispatch ops each have one backward op) and a
    # third of its per-expert ones (one GEMM a linear forward, two backward).
    n, n_local = moe.host_launches(DSV3, ep=64, moe_layers=10, num_micro=4)
    n_rc, n_local_rc = moe.host_launches(DSV3, ep=64, moe_layers=10, num_micro=4, rerun=1.0)
    assert (float(n), float(n_local)) == (40.0, 40.0 * 4)
    assert (float(n_rc), float(n_local_rc)) == (pytest.approx(60.0), pytest.approx(40.0 * 4 * 4 / 3))
    c = moe.host_constants()
    opts = moe.MoeOptions(dispatcher="deepep")
    got = moe.host_seconds(DSV3, ep=64, moe_layers=10, num_micro=4, opts=opts, rerun=1.0)
    assert float(got) == pytest.approx((60 * c["per_layer_ms"]["deepep"] + 40 * 4 * 4 / 3 * c["per_local_expert_ms"]) * 1e-3)
    # and a step with full recompute pays it where one without does not
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=1, dp=8, zero=1, ep=8, moe=opts)
    qwen = catalog.model_shape("qwen3-30b-a3b")
    b200 = hardware.resolve(system="dgx-b200")
    plain = layout_time.step_time(qwen, b200, recompute=M.RECOMPUTE.index("none"), **kw)["breakdown"]
    full = layout_time.step_time(qwen, b200, recompute=M.RECOMPUTE.index("full"), **kw)["breakdown"]
    assert float(full["moe_rerun_share"]) == 1.0 and float(plain["moe_rerun_share"]) == 0.0
    assert float(full["moe_host_s"]) > float(plain["moe_host_s"])


def test_one_all_to_all_by_hand_and_fp8_dispatch():
    tokens = 4096
    opts = moe.MoeOptions(imbalance=1.0, dispatcher="deepep", node_limit=4, fp8_dispatch=True)
    inside, across = (float(x) for x in moe.rows_sent(DSV3, 64, 8, opts))
    row = tokens * DSV3.hidden
    latency = 7 * H800.intra_alpha_s + 7 * H800.inter_alpha_s

    def by_hand(nbytes):
        return latency + max(row * nbytes * inside / H800.intra_bw, row * nbytes * across / H800.inter_bw)

    d = moe.a2a_seconds(DSV3, H800, tokens=tokens, ep=64, elem_bytes=moe.dispatch_bytes(opts, 2.0), opts=opts)
    assert float(d) == pytest.approx(by_hand(1 + 4 / 128))  # FP8 and a 1 x 128 tile's fp32 scale
    c = moe.a2a_seconds(DSV3, H800, tokens=tokens, ep=64, elem_bytes=2.0, opts=opts)
    assert float(c) == pytest.approx(by_hand(2.0))  # combine in BF16
    # The network bounds it here: 3.2 rows a token on 42.5 GB/s against 6.4 on 164.
    assert row * across / H800.inter_bw > row * inside / H800.intra_bw
    # The busiest receiver's load stretches the wire time, not the latency.
    heavy = moe.a2a_seconds(DSV3, H800, tokens=tokens, ep=64, elem_bytes=2.0, opts=dataclasses.replace(opts, imbalance=1.5))
    assert float(heavy) - latency == pytest.approx(1.5 * (float(c) - latency))


def test_catalog_links_agree_with_deepeps_published_h800_bandwidths():
    # The all-to-all runs at the catalog's links: on an H800 node they give what DeepEP's
    # normal kernels reach there (docs/legacy.md), within 7% inside and 27% across (whose
    # "logical" bytes count some that stay in the node: 58 GB/s at EP 32 on a 50 GB/s NIC).
    intra = moe.DEEPEP_H800["intranode"]
    for figure in (intra["dispatch_gbps"], intra["combine_gbps"]):
        assert abs(H800.intra_bw / 1e9 / figure - 1) < 0.08
    for row in moe.DEEPEP_H800["internode"]:
        for figure in (row["dispatch_gbps"], row["combine_gbps"]):
            assert abs(H800.inter_bw / 1e9 / figure - 1) < 0.3
    # ... and the check fires on a link the catalog had wrong (the H100's NVLink on an H800).
    assert abs(H100.intra_bw / 1e9 / intra["dispatch_gbps"] - 1) > 0.5


# --- what the schedule hides --------------------------------------------------------------

def test_dualpipe_hides_the_paired_passes_all_to_all_by_hand():
    opts = moe.MoeOptions()
    a2a, blocks, p, m = 6.0, 20.0, 16, 120
    u = (p - 1) / m  # warm-up forwards and cool-down backwards have no partner
    got = moe.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule="dualpipev", virtual_stages=1, opts=opts)
    # The paired passes' all-to-all fits under their compute: only the SMs it holds cost.
    assert float(got) == pytest.approx(u * a2a + 20 / 132 * (1 - u) * a2a)
    # Not enough compute to hide it behind: what sticks out is exposed.
    short = moe.exposed_a2a(a2a, 2.0, pp=p, num_micro=m, schedule="dualpipev", virtual_stages=1, opts=opts)
    assert float(short) == pytest.approx(u * a2a + (1 - u) * (a2a - 2.0))
    # 1F1B without EP overlap hides none of it; with Megatron-Core's overlap it hides as DualPipe.
    assert float(moe.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule="1f1b", virtual_stages=1, opts=opts)) == a2a
    on = dataclasses.replace(opts, a2a_overlap=True)
    assert float(moe.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule="1f1b", virtual_stages=1, opts=on)) == \
        pytest.approx(float(got))
    # Interleaving: Megatron-LM's warm-up of 2 (p - 1) + (v - 1) p chunk passes of v m.
    v = 4
    ui = (2 * (p - 1) + (v - 1) * p) / (v * m)
    assert float(moe.unpaired_share(p, m, "interleaved", v)) == pytest.approx(ui)
    assert float(moe.unpaired_share(1, m, "1f1b")) == pytest.approx(1 / m)


def test_megatron_overlap_pairs_each_all_to_all_with_one_part_of_a_layer_by_hand():
    # model_chunk_schedule_plan.run (core_v0.17.1), layers chained: combine-backward beside
    # attention forward (and the previous layer's attention weight gradients),
    # dispatch-forward beside the experts' backward, dispatch-backward beside the experts'
    # forward, combine-forward beside attention's input gradients. Attention 0.3 s (0.1
    # forward, 0.1 input and 0.1 weight gradients), experts 6 s (2 each), 1 s each
    # all-to-all. The sum form hides all 4 s behind 6.3 s; the graph leaves out what
    # attention cannot cover: combine-backward 1 - 0.1 and combine-forward 1 - 0.1, a period
    # of 8 s against 6.3 s of compute.
    split = moe.LayerSplit
    assert float(moe.layer_schedule_exposed(split(0.3, 6.0), 2.0, 2.0)) == pytest.approx(1.7)
    # Compute under every part: nothing waits. Communication over every part: all of it less
    # the compute, as the sum form.
    assert float(moe.layer_schedule_exposed(split(3.0, 3.0), 2.0, 2.0)) == pytest.approx(0.0)
    assert float(moe.layer_schedule_exposed(split(3.0, 3.0), 8.0, 8.0)) == pytest.approx(16.0 - 6.0)
    # Across layers: the next layer's combine-backward waits for attention's input gradients
    # only, so it runs beside its weight gradients (2 s) and forward (2 s): attention 6 s,
    # experts 0.3 s, dispatch-direction 6 s (3 a pass). Only dispatch-forward's 3 s beside
    # the experts' 0.2 s of backward shows: 2.8 s (a barrier at each layer's end: 3.8 s).
    assert float(moe.layer_schedule_exposed(split(6.0, 0.3), 6.0, 0.0)) == pytest.approx(2.8)
    # Dispatch-backward waits for the experts' input gradients only: attention 12 s, experts
    # 3 s (1 a part), combine-direction 8 s (4 a pass). Dispatch-backward runs beside the
    # experts' weight gradients and forward (2 s): 2 s exposed. With the weight gradients in
    # each backward (delay_wgrad_compute off) it waits for them: 3 s.
    assert float(moe.layer_schedule_exposed(split(12.0, 3.0), 0.0, 8.0)) == pytest.approx(2.0)
    assert float(moe.layer_schedule_exposed(split(12.0, 3.0, wgrad_delayed=False), 0.0, 8.0)) == pytest.approx(3.0)
    # The unpermutation runs on the communication stream: beside ample compute it costs the
    # compute stream nothing (the period is the compute's 12 s, its 2 s among the 14 counted).
    assert float(moe.layer_schedule_exposed(split(6.0, 6.0, on_comm=2.0), 0.0, 0.0)) == pytest.approx(-2.0)
    # The steady period is reached: 4 chained layers give what 32 do.
    rng = np.random.default_rng(0)
    a, x, k, d, c = rng.uniform(0.1, 5.0, size=(5, 200))
    got = moe.layer_schedule_exposed(split(a, x, on_comm=k), d, c)
    old = moe.STEADY_LAYERS
    try:
        moe.STEADY_LAYERS = 32
        assert np.allclose(got, moe.layer_schedule_exposed(split(a, x, on_comm=k), d, c))
    finally:
        moe.STEADY_LAYERS = old
    # The step's form: unpaired passes exposed, paired ones by the graph, at least the SM share;
    # DualPipe keeps the sum (no pairing read), as do callers that give no split.
    opts = moe.MoeOptions(a2a_overlap=True)
    a2a, blocks, p, m = 4.0, 6.3, 4, 32
    u = float(moe.unpaired_share(p, m, "1f1b"))
    got = moe.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule="1f1b", virtual_stages=1, opts=opts,
                          split=split(0.3, 6.0), dispatch=2.0)
    assert float(got) == pytest.approx(u * a2a + (1 - u) * 1.7)
    summed = moe.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule="1f1b", virtual_stages=1, opts=opts)
    assert float(summed) == pytest.approx(u * a2a + 20 / 132 * (1 - u) * a2a)
    dual = moe.exposed_a2a(a2a, blocks, pp=p, num_micro=m, schedule="dualpipev", virtual_stages=1, opts=opts,
                           split=split(0.3, 6.0), dispatch=2.0)
    assert float(dual) == pytest.approx(float(summed))


def test_step_model_gives_the_overlap_its_layer_split(monkeypatch):
    # Through layout_time (DeepSeek-V3 with EP 32 over 4 B200 nodes, where an all-to-all
    # pass is longer than attention's parts): the step passes its MoE layers' compute by node
    # and the dispatch-direction seconds, and the graph exposes more than the sum form would
    # on the same numbers; --moe-wgrad-in-backward reaches the graph.
    b200 = hardware.resolve(system="dgx-b200")
    kw = dict(seq=4096, global_batch=1024, micro_batch=1, tp=1, pp=1, dp=128, zero=1, recompute=0, ep=32)
    opts = moe.MoeOptions(a2a_overlap=True)
    seen = []
    real = moe.exposed_a2a

    def spy(a2a, blocks, **k):
        seen.append((a2a, blocks, k))
        return real(a2a, blocks, **k)

    monkeypatch.setattr(moe, "exposed_a2a", spy)
    b = layout_time.step_time(DSV3, b200, schedule="1f1b", moe=opts, **kw)["breakdown"]
    a2a, blocks, k = seen[-1]
    split = k["split"]
    assert float(a2a) == pytest.approx(float(b["ep_a2a_s"]))
    # DeepSeek-V3's 3 dense layers of 61 stay out of the split; the rest is all there.
    parts = float(split.attention + split.experts + split.on_comm)
    assert 0.9 * float(blocks) < parts < float(blocks)
    assert 0 < float(k["dispatch"]) < float(a2a)
    summed = real(a2a, blocks, pp=k["pp"], num_micro=k["num_micro"], schedule="1f1b", virtual_stages=1, opts=opts)
    exposed = float(b["ep_comm_s"])
    assert float(summed) * 1.02 < exposed < float(a2a)
    assert split.wgrad_delayed
    later = dataclasses.replace(opts, wgrad_in_backward=True)
    layout_time.step_time(DSV3, b200, schedule="1f1b", moe=later, **kw)
    assert not seen[-1][2]["split"].wgrad_delayed
    # Without the overlap the option prices nothing: refused, not ignored.
    with pytest.raises(MgbenchError, match="--moe-a2a-overlap"):
        moe.MoeOptions(wgrad_in_backward=True)
    d, c = moe.a2a_directions(DSV3, H800, tokens=4096, ep=64, act_bytes=2.0, opts=opts, moe_layers=1, num_micro=1,
                              moe_rerun_share=0.0)
    assert float(d) == pytest.approx(float(c))  # BF16 both ways: no FP8 dispatch
    fp8 = dataclasses.replace(opts, fp8_dispatch=True)
    d8, c8 = moe.a2a_directions(DSV3, H800, tokens=4096, ep=64, act_bytes=2.0, opts=fp8, moe_layers=1, num_micro=1,
                                moe_rerun_share=0.0)
    assert float(d8) < 0.6 * float(c8) and float(c8) == pytest.approx(float(c))


def test_dualpipe_step_exposes_less_all_to_all_than_1f1b():
    kw = dict(seq=4096, global_batch=15360, micro_batch=1, tp=1, pp=16, dp=128, zero=1, recompute=0, ep=64,
              precision="fp8")
    opts = moe.MoeOptions(dispatcher="deepep", node_limit=4, fp8_dispatch=True)
    dual = layout_time.step_time(DSV3, H800, schedule="dualpipev", moe=opts, **kw)["breakdown"]
    plain = layout_time.step_time(DSV3, H800, schedule="1f1b", moe=opts, **kw)["breakdown"]
    assert float(plain["ep_comm_s"]) == pytest.approx(float(plain["ep_a2a_s"]))
    assert float(dual["ep_a2a_s"]) == pytest.approx(float(plain["ep_a2a_s"]))
    assert float(dual["ep_comm_s"]) < 0.35 * float(dual["ep_a2a_s"])
    # Node-limited routing with DeepEP's kernels moves fewer bytes than the all-to-all dispatcher.
    megatron = layout_time.step_time(DSV3, H800, schedule="1f1b", moe=moe.MoeOptions(), **kw)["breakdown"]
    assert float(plain["ep_a2a_s"]) < 0.6 * float(megatron["ep_a2a_s"])


def test_step_options_are_the_ones_given():
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=1, dp=16, zero=1, recompute=0, ep=16)
    default = layout_time.step_time(MIXTRAL, H100, **kw)["breakdown"]
    balanced = layout_time.step_time(MIXTRAL, H100, moe=moe.MoeOptions(imbalance=1.0), **kw)["breakdown"]
    assert float(default["moe_imbalance_s"]) > 0 and float(balanced["moe_imbalance_s"]) == 0


def test_without_expert_parallelism_no_rank_is_busier():
    # At ep 1 every rank runs all experts on its own tokens: tokens x top_k rows whatever the
    # router picks, so a learned router's imbalance prices nothing (step and memory); at ep 2
    # the same imbalance does (the negative control), and a capacity factor keeps its load.
    assert moe.rank_load(moe.MoeOptions(imbalance=1.3), 1) == 1.0
    assert moe.rank_load(moe.MoeOptions(imbalance=1.3), 8) == 1.3
    assert list(moe.rank_load(moe.MoeOptions(), np.array([1, 2, 8]))) == [1.0, moe.DEFAULT_IMBALANCE, moe.DEFAULT_IMBALANCE]
    # a capacity factor drops rows over it: at ep 8 it caps the busiest rank, at ep 1 it
    # cannot raise a rank's rows over tokens x top_k
    assert moe.rank_load(moe.MoeOptions(imbalance=1.3, capacity_factor=1.1), 8) == 1.1
    assert moe.rank_load(moe.MoeOptions(imbalance=1.3, capacity_factor=1.1), 1) == 1.0
    # dropping, not padding: a factor above the imbalance leaves the imbalance (padding to
    # capacity would price 1.25)
    assert moe.rank_load(moe.MoeOptions(imbalance=1.05, capacity_factor=1.25), 8) == 1.05
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=1, dp=16, zero=1, recompute=0)
    for ep, same in ((1, True), (2, False)):
        heavy = layout_time.step_time(MIXTRAL, H100, moe=moe.MoeOptions(imbalance=1.5), ep=ep, **kw)
        flat = layout_time.step_time(MIXTRAL, H100, moe=BALANCED, ep=ep, **kw)
        assert (float(heavy["step_time_s"]) == pytest.approx(float(flat["step_time_s"]))) is same
        mem = dict(seq=4096, micro_batch=1, num_micro=4, tp=1, pp=1, dp=16, zero=1, ep=ep)
        assert (float(M.memory_per_gpu(MIXTRAL, moe=moe.MoeOptions(imbalance=1.5), **mem)["total_bytes"])
                == pytest.approx(float(M.memory_per_gpu(MIXTRAL, moe=BALANCED, **mem)["total_bytes"]))) is same


# --- compute the MoE layers add -----------------------------------------------------------

def test_imbalance_prices_the_busiest_ranks_extra_expert_rows():
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=1, dp=16, zero=1, recompute=0, ep=16)
    b = layout_time.step_time(MIXTRAL, H100, moe=moe.MoeOptions(imbalance=1.3), **kw)["breakdown"]
    assert float(b["moe_imbalance_s"]) == pytest.approx(0.3 * float(b["expert_gemm_s"]) / H100.stack_eff)
    # A capacity factor caps the busiest rank (tokens over it are dropped).
    capped = layout_time.step_time(MIXTRAL, H100, moe=moe.MoeOptions(imbalance=1.3, capacity_factor=1.1),
                                   **kw)["breakdown"]
    assert float(capped["moe_imbalance_s"]) == pytest.approx(0.1 * float(b["expert_gemm_s"]) / H100.stack_eff)
    # Under fp8 the extra rows run at the FP8 rate: the peaks' ratio over the H100's measured
    # FP8 best-GEMM fraction relative to its bf16 one (1402.6 / 1979 over 794.5 / 989).
    f8 = layout_time.step_time(MIXTRAL, H100, precision="fp8", moe=moe.MoeOptions(imbalance=1.3), **kw)["breakdown"]
    fp8_rate = (989 / 1979) / ((1402.6 / 1979) / (794.5 / 989))
    assert float(f8["moe_imbalance_s"]) == pytest.approx(0.3 * float(f8["expert_gemm_s"]) * fp8_rate / H100.stack_eff)


def test_the_expert_gemms_are_priced_at_the_layouts_ep():
    # perf.shaped_gemms gives each of the rank's experts ep x tokens x top_k / experts rows:
    # the step passes the layout's ep, so ep 64 prices 4 experts of 8192 rows, not 256 of 128.
    kw = dict(seq=4096, global_batch=15360, micro_batch=1, tp=1, pp=16, dp=128, recompute=0)
    step = layout_time.step_time(DSV3, H100, zero=1, ep=64, **kw)["breakdown"]
    terms = perf.compute_terms(DSV3, H100, ep=64, **kw)
    assert float(step["expert_gemm_s"]) == pytest.approx(float(terms["expert_gemm_s"]))
    assert float(terms["expert_gemm_s"]) < 0.7 * float(perf.compute_terms(DSV3, H100, ep=1, **kw)["expert_gemm_s"])


def test_without_gemm_shapes_the_expert_share_comes_from_the_flops():
    flat = dataclasses.replace(H100, gemm_shapes=False)
    kw = dict(seq=4096, global_batch=64, micro_batch=1, tp=1, pp=1, dp=16, zero=1, recompute=0, ep=16)
    b = layout_time.step_time(MIXTRAL, flat, moe=moe.MoeOptions(imbalance=1.5), **kw)["breakdown"]
    share = 32 * 2 * MIXTRAL.expert_params() / (MIXTRAL.num_matmul_params() - MIXTRAL.num_head_matmul_params())
    assert float(b["moe_imbalance_s"]) == pytest.approx(0.5 * share * float(b["linear_s"]) / flat.stack_eff)


def test_an_moe_blocks_activation_traffic_by_hand():
    # gpt-oss-120b: 4 routed rows of width 2880 a token, where the dense count (perf's
    # elementwise term) has one MLP of ffn_hidden 2880. Per token, bf16, balanced: the
    # dispatched row (2 h) and the SwiGLU's input and output (2 x 2 + 2) x F_e, 4 of them,
    # the router's bf16 logits and fp32 probabilities (6 x 128), less the dense MLP's
    # 4 x 2 x 2880: 4 x (5760 + 17280) + 768 - 23040 = 69,888 bytes.
    gpt = catalog.model_shape("gpt-oss-120b")
    kw = dict(seq=4096, global_batch=64, micro_batch=4, tp=1, pp=1, dp=8, zero=1, recompute=0, ep=8)
    b = layout_time.step_time(gpt, H100, moe=BALANCED, **kw)["breakdown"]
    bw = H100.mem_bw * H100.mem_bw_fraction
    # 36 MoE layers, 64 / (4 x 8) = 2 micro-batches of 4 x 4096 tokens each.
    by_hand = H100.elementwise_passes * 69888 * 4 * 4096 * 36 * 2 / bw / H100.stack_eff
    assert float(b["moe_traffic_s"]) == pytest.approx(by_hand)
    # Sequence-parallel tensor parallelism splits the tokens, and so the rows: half a
    # rank's traffic at tp 2 (16 GPUs, the same 8 data-parallel ranks); without sequence
    # parallelism every rank routes every token and only the dense MLP it is counted
    # against is split.
    tp2 = layout_time.step_time(gpt, H100, moe=BALANCED, sp=True, **{**kw, "tp": 2})["breakdown"]
    assert float(tp2["moe_traffic_s"]) == pytest.approx(by_hand / 2)
    no_sp = layout_time.step_time(gpt, H100, moe=BALANCED, **{**kw, "tp": 2})["breakdown"]
    assert float(no_sp["moe_traffic_s"]) == pytest.approx(by_hand * (69888 + 23040 / 2) / 69888 / 1)
    # Full recompute runs the activations again (a third more, as the dense ones), and the
    # busiest rank's load scales the routed rows.
    rc = layout_time.step_time(gpt, H100, moe=BALANCED, **{**kw, "recompute": 2})["breakdown"]
    assert float(rc["moe_traffic_s"]) == pytest.approx(by_hand * 4 / 3)
    heavy = layout_time.step_time(gpt, H100, moe=moe.MoeOptions(imbalance=1.5), **kw)["breakdown"]
    assert float(heavy["moe_traffic_s"]) == pytest.approx(by_hand * (69888 + 0.5 * 92160) / 69888)
    # A dense model has none.
    dense = layout_time.step_time(catalog.model_shape("llama3-8b"), H100, **{**kw, "ep": 1})["breakdown"]
    assert float(dense["moe_traffic_s"]) == 0.0


def test_recompute_modules_flops_by_hand():
    # mla_up_proj: the q and kv up-projections' forward again, in every block and the MTP's.
    q_up, kv_up = 1536 * 128 * 192, 512 * 128 * (128 + 128)
    assert moe.recompute_flops_per_token(DSV3, ("mla_up_proj",), 1.0) == pytest.approx(2 * (q_up + kv_up) * 62)
    # mlp: the 3 dense blocks' SwiGLU.
    assert moe.recompute_flops_per_token(DSV3, ("mlp",), 1.0) == pytest.approx(2 * 3 * 7168 * 18432 * 3)
    # Elementwise modules cost no matmul.
    assert moe.recompute_flops_per_token(DSV3, ("moe_act", "layernorm"), 1.0) == 0.0
    # The "moe" module runs the layer's all-to-all pair again too.
    assert float(moe.moe_rerun_share(DSV3, ("moe",), 0.0)) == 1.0


def test_bad_moe_options_are_refused_in_one_line():
    for bad, says in ((dict(dispatcher="nccl"), "dispatcher"), (dict(imbalance=0.9), ">= 1"),
                      (dict(capacity_factor=0.0), "capacity"), (dict(node_limit=0), "node_limit"),
                      (dict(recompute_modules=("attention",)), "recompute modules")):
        with pytest.raises(MgbenchError, match=says):
            moe.MoeOptions(**bad)


# --- memory: MLA and the MoE block ----------------------------------------------------------

def test_mla_activations_at_their_own_widths_by_hand():
    e, a = 2.0, 128
    # q and k at 128 + 64 a head, kv's up-projection (128 + 128) whole, the output at 128.
    heads = e * a * (2 * 192 + 128 + 2 * 128)
    # c_kv with the rotary key, its normalised value and output; the query latent's three.
    latents = e * (512 + 64) + 2 * e * 512 + 8 + 3 * e * 1536 + 8
    assert M.mla_attention_bytes(DSV3, e) == (pytest.approx(heads), pytest.approx(latents))
    gqa_like = dataclasses.replace(DSV3, kv_lora_rank=None, q_lora_rank=None, qk_nope_head_dim=None,
                                   qk_rope_head_dim=None, v_head_dim=None, head_dim=192)
    mla = float(M.layer_activations(DSV3, 1, 1, False, "bf16"))
    gqa = float(M.layer_activations(gqa_like, 1, 1, False, "bf16"))
    # DeepSeek-V3's per-head count equals the GQA stand-in's (768 a elements either way):
    # what MLA adds is its latents.
    assert mla - gqa == pytest.approx(latents)
    # Under tensor parallelism the heads split, the replicated latents do not.
    tp2 = float(M.layer_activations(DSV3, 1, 2, True, "bf16"))
    gqa2 = float(M.layer_activations(gqa_like, 1, 2, True, "bf16"))
    assert tp2 - gqa2 == pytest.approx(latents)
    # Megatron-Core's mla_up_proj recompute keeps only the attention output of the heads.
    up = float(M.layer_activations(DSV3, 1, 1, False, "bf16", mla_up_proj=True))
    assert mla - up == pytest.approx(heads - e * a * 128)


def test_runner_mla_blocks_count_the_same_on_cuda():
    # The runner's MLA block on CUDA saves what layer_activations counts (tp 1): nothing extra.
    dense_block = 0
    assert M._runner_block_extra(DSV3, dense_block, 2.0, 1, 1, "cuda") == pytest.approx(0.0)
    # On CPU it pads v to qk for SDPA: (4 qk + v) a against (2 qk + nope + 2 v) a.
    small = catalog.model_shape("deepseek-v2")
    pad = 2.0 * 128 * ((4 * 192 + 128) - (2 * 192 + 128 + 2 * 128))
    assert M._runner_block_extra(small, dense_block, 2.0, 1, 1, "cpu") == pytest.approx(pad)


def test_memory_reads_the_moe_options_given():
    kw = dict(seq=4096, micro_batch=1, num_micro=8, tp=1, pp=16, dp=128, zero=1, ep=64, schedule="dualpipev")
    base = M.memory_per_gpu(DSV3, **kw)["activations_bytes"]
    lean = M.memory_per_gpu(DSV3, moe=moe.MoeOptions(recompute_modules=("mla_up_proj", "moe_act")),
                            **kw)["activations_bytes"]
    assert float(lean) < 0.8 * float(base)


def test_tensor_parallel_ranks_split_the_routed_rows_they_keep():
    # Sequence parallelism gives each of t ranks s / t tokens, which it routes and
    # dispatches itself (MoE parallel folding): the routed rows an MoE block keeps, the
    # router's scores, the shared experts' split widths and the dense MLP the count is
    # taken against are all a 1 / t share, so the block's extra bytes halve at tp 2.
    one = M.moe_mlp_extra(MIXTRAL, 4096, 1, "bf16")
    two = M.moe_mlp_extra(MIXTRAL, 4096, 2, "bf16")
    assert float(two) == pytest.approx(float(one) / 2)
    # Without sequence parallelism each rank routes all the tokens: only the dense MLP the
    # count is taken against (8 x 14336 a token) is split.
    whole = M.moe_mlp_extra(MIXTRAL, 1, 2, "bf16", sp=False)
    assert float(whole) == pytest.approx(2 * (2 * 4096 + 6 * 14336) + 6 * 8 - 8 * 14336 / 2)
    # By hand, mixtral-8x7b (top 2 of 8 experts of 14336 on hidden 4096), one token, tp 1:
    # 2 x (2 x 4096 + 6 x 14336) routed + 6 x 8 router - 4 x 2 x 14336 dense.
    assert float(M.moe_mlp_extra(MIXTRAL, 1, 1, "bf16")) == pytest.approx(
        2 * (2 * 4096 + 6 * 14336) + 6 * 8 - 8 * 14336)


def test_expert_states_shard_over_the_folded_expert_data_parallel_group():
    # tp 2, dp 16, ep 32 (Megatron-Bridge's Qwen3-235B on H100s): the ep group of 32 takes
    # tp x dp = 32 ranks, so each expert has one copy and ZeRO-1 cannot shard its states.
    q = catalog.model_shape("qwen3-235b-a22b")
    kw = dict(seq=4096, micro_batch=1, num_micro=128, tp=2, pp=8, dp=16, zero=1, sp=True)
    _, expert = M.stage_param_split(q, 2, 8, 32)
    dense, _ = M.stage_param_split(q, 2, 8, 32)
    opt = float(M.memory_per_gpu(q, ep=32, **kw)["optimizer_bytes"])
    assert opt == pytest.approx(12 * float(dense) / 16 + 12 * float(expert) / 1)
    # ep 16 of the 32 ranks: two copies of each expert, the states halved.
    _, expert16 = M.stage_param_split(q, 2, 8, 16)
    opt16 = float(M.memory_per_gpu(q, ep=16, **kw)["optimizer_bytes"])
    assert opt16 == pytest.approx(12 * float(dense) / 16 + 12 * float(expert16) / 2)
    assert np.isfinite(opt)


def test_an_imbalance_given_is_the_users_and_one_not_given_is_said_to_be_assumed():
    assumed, given = moe.MoeOptions(), moe.MoeOptions(imbalance=moe.DEFAULT_IMBALANCE)
    assert assumed.imbalance is None and assumed.load == given.load == moe.DEFAULT_IMBALANCE
    said = "(an assumption: moe.DEFAULT_IMBALANCE"
    assert said in moe.note(assumed, "1f1b") and said not in moe.note(given, "1f1b")
