"""Collectives across nodes as NCCL's rings run them (perf.group_collective_time), and the
all-to-all as MoE's dispatch prices it (moe.alltoall_seconds), against published
multi-node bandwidth (data/published_collectives.toml, planner/collective_validation.py)."""

from __future__ import annotations

import pytest

from mgbench import catalog
from mgbench.planner import collective_validation as V
from mgbench.planner import perf
from mgbench.planner.hardware import resolve


def test_fit_rows_set_their_links_rate():
    # Each fit all-reduce row names the link whose bw_eff it set (its system's inter_link):
    # busbw / (ranks a node x each GPU's share of the node's line rate). (Fit all-to-all rows
    # set no link: test_the_all_to_all_share_solved_on_fit_rows_fails_its_held_out_test.)
    fit = [r for r in V.rows() if r["split"] == "fit" and V.collective_of(r) == "all_reduce"]
    assert {r["sets"] for r in fit} == {"efa-v4", "ib-ndr", "ib-hdr"}
    for r in fit:
        system = catalog.systems()[r["system"]]
        link = catalog.links()[r["sets"]]
        share = link["peak_gbps"] * system["nics_per_node"] / system["gpus_per_node"]
        assert system["inter_link"] == r["sets"]
        assert link["bw_eff"] == pytest.approx(r["busbw_gbps"] / (r["ranks_per_node"] * share), abs=0.001)
        assert r["id"] in link["eff_source"]


def test_held_out_rows_within_their_published_bandwidth():
    # Held out: B200 at 1 and 16 GiB, H100 (p5) at 4 to 32 nodes, H200 (p5en) forced Ring,
    # H100 on RoCE (its link's rate an assumption set before). Mean 4.6%, worst +14.8% at 32
    # nodes (2026-11-27): the published busbw falls there, the ring model's does not.
    # Since 2026-11-28 a ninth, across 20 GB200 NVL72 racks, is a known miss: +61.1% (the
    # ring model lets a rack's 72 NICs carry ring traffic at once; docs/planner.md). The
    # eight rows on 8-GPU nodes keep their bounds; the miss is pinned so that a fix of the model
    # for NVL72 racks shows here (and the docs' figures get updated with it).
    scored = [r for r in V.score() if r["collective"] == "all_reduce"]
    rack = [r for r in scored if r["id"] == "coreweave-gb200-nvl72-20racks"]
    eight = [r for r in scored if r["id"] != "coreweave-gb200-nvl72-20racks"]
    s = V.summary(eight)
    assert s["held_out"]["rows"] == 8 and s["held_out"]["mean_abs_pct"] < 8.0
    assert s["held_out"]["worst"][0] < 20.0
    assert s["fit"]["mean_abs_pct"] < 1.0
    assert len(rack) == 1 and rack[0]["error_pct"] == pytest.approx(61.1, abs=0.1)


def test_a_row_the_model_cannot_place_is_refused(monkeypatch):
    from mgbench.errors import MgbenchError

    good = list(V.rows())
    bad = {**good[0], "ranks_per_node": 9}  # more ranks than the node has GPUs
    with pytest.raises(MgbenchError, match="ranks_per_node 9"):
        V.check([*good, bad])
    wrong = {**next(r for r in good if r["split"] == "fit"), "sets": "ib-ndr", "system": "aws-p6-b200"}
    with pytest.raises(MgbenchError, match="sets ib-ndr"):
        V.check([wrong])


def test_ring_bandwidth_across_nodes_does_not_depend_on_the_node_count():
    # The model's property (a guard, not evidence): g x the per-GPU rate at 4, 8 and 16
    # nodes alike. The published p5 busbw is flat there at 8192 MB (357.0, 355.4, 356.3) but
    # falls 14% at 4096 MB (354.5 to 306.2): the data do not settle it (docs/planner.md).
    by = {r["nodes"]: V.predicted_busbw_gbps(r) for r in V.rows()
          if r["system"] == "aws-p5" and V.collective_of(r) == "all_reduce"}
    assert max(by[4], by[8], by[16]) / min(by[4], by[8], by[16]) < 1.01


def test_the_all_to_alls_peer_cost_does_not_reach_a_ring():
    # efa-v2's a2a_peer_us (78 us, solved on all-to-all rows) is what an all-to-all pays per
    # peer node; a ring's steps keep the link's 10 us. Charged to rings, it priced
    # crazyguitar's own p5 all-reduces of 256 MB or less at 16-32 nodes 2-4x too slow (a
    # review's check): the split is what keeps them.
    import dataclasses

    from mgbench.planner import moe

    hw = resolve(system="aws-p5")
    assert (hw.inter_alpha_s, hw.a2a_peer_s) == (pytest.approx(10e-6), pytest.approx(78e-6))
    plain = dataclasses.replace(hw, a2a_peer_s=None)
    S, n = 64 * 2**20, 256
    assert float(perf.group_collective_time(S, n, n, hw, 2.0)) == float(perf.group_collective_time(S, n, n, plain, 2.0))
    # ... and the all-to-all pays it: 31 peer nodes x (78 - 10) us more
    extra = float(moe.alltoall_seconds(hw, n, S)) - float(moe.alltoall_seconds(plain, n, S))
    assert extra == pytest.approx(31 * 68e-6)


def test_the_old_one_nic_ring_is_far_off_held_out_rows():
    # The flat ring with each rank's bytes on one NIC, as every group was priced before
    # 2026-11-27, at today's link rates, against rows that set no rate: p5 (efa-v2) at 4
    # to 32 nodes and p5en (efa-v3). It misses every one by more than 80%; the ring over the
    # node's NICs by under 16%.
    for r in V.rows():
        if r["split"] != "held_out" or r["system"] not in ("aws-p5", "aws-p5en") or V.collective_of(r) != "all_reduce":
            continue
        hw = resolve(system=r["system"])
        n = r["nodes"] * r["ranks_per_node"]
        old = float(perf.ring_time(r["bytes"], n, hw.inter_bw, hw.inter_alpha_s, 2.0))
        old_busbw = 2 * (n - 1) / n * r["bytes"] / old / 1e9
        assert old_busbw < 0.2 * r["busbw_gbps"], r["id"]
        assert abs(V.predicted_busbw_gbps(r) / r["busbw_gbps"] - 1) < 0.16, r["id"]


def test_links_without_a_measurement_carry_anothers_rate(monkeypatch):
    # Stated once: efa-v2 and efa-v3 name efa-v4 (bw_eff_from) and the catalog resolves it.
    raw = catalog.load("hardware.toml")["links"]
    assert "bw_eff" not in raw["efa-v2"] and raw["efa-v2"]["bw_eff_from"] == "efa-v4"
    links = catalog.links()
    assert links["efa-v2"]["bw_eff"] == links["efa-v3"]["bw_eff"] == links["efa-v4"]["bw_eff"]
    # A link carried from one that has no rate of its own is refused, not read as missing.
    from mgbench.errors import MgbenchError

    monkeypatch.setitem(catalog._USER["links"], "my-link", {"peak_gbps": 50.0, "bw_eff_from": "efa-v2"})
    with pytest.raises(MgbenchError, match="my-link's bw_eff_from names 'efa-v2'"):
        catalog.links()


def test_inside_a_node_it_is_the_ring_on_the_nodes_links():
    hw = resolve(system="dgx-h100")
    for n in (2, 4, 8):
        assert float(perf.group_collective_time(1e9, n, n, hw, 2.0)) == \
            pytest.approx(float(perf.ring_time(1e9, n, hw.intra_bw, hw.intra_alpha_s, 2.0)))
    assert float(perf.group_collective_time(1e9, 1, 8, hw, 2.0)) == 0.0


def test_by_hand_across_nodes():
    hw = resolve(system="dgx-h100")  # 8 GPUs and 8 NDR NICs a node
    a_in, a_out = hw.intra_alpha_s, hw.inter_alpha_s
    # One rank a node (4 ranks 8 apart over 4 nodes): the ring on one NIC a rank.
    one = float(perf.group_collective_time(1e9, 4, 32, hw, 2.0))
    assert one == pytest.approx(2 * 3 * a_out + 2 * 3 / 4 * 1e9 / hw.inter_bw)
    # 16 ranks over 8 nodes, 2 on each (an expert-data-parallel group at EP 4): each NIC
    # carries half the ring's bytes, each rank's node links the other half; the longer,
    # plus 7 steps across nodes and 8 inside them.
    two = float(perf.group_collective_time(1e9, 16, 64, hw, 1.0))
    inter, intra = 15 / 16 * 1e9 / (2 * hw.inter_bw), 15 / 16 * 1e9 / 2 / hw.intra_bw
    assert two == pytest.approx(7 * a_out + 8 * a_in + max(inter, intra)) and inter > intra
    # Every GPU of 4 nodes: an eighth of the ring's bytes on each NIC; 2 x 3 steps across
    # nodes and 2 x 28 inside them.
    eight = float(perf.group_collective_time(1e9, 32, 32, hw, 2.0))
    assert eight == pytest.approx(2 * 3 * a_out + 2 * 28 * a_in + max(2 * 31 / 32 * 1e9 / (8 * hw.inter_bw),
                                                                     2 * 31 / 32 * 1e9 * 7 / 8 / hw.intra_bw))


def test_an_all_to_all_row_is_priced_as_moes_dispatch_by_hand():
    # 8 p6-b300 nodes, 64 ranks, 8 GiB a rank: 56/64 of it leaves the node over the GPU's
    # two 400 Gb/s EFA v4 NICs at their all-reduce fraction (2 x 50 x 0.943 = 94.3 GB/s),
    # 7/64 goes over NVLink 5 (the slower of the two sets the time), both at NCCL's
    # all-to-all share of the links' rates (0.97), plus 7 NVLink and 7 network latencies;
    # bus bandwidth = algbw x 63/64.
    from mgbench.planner import moe

    row = next(r for r in V.rows() if r["id"] == "awslabs-p6-b300-8n-alltoall-peak")
    hw = resolve(system="aws-p6-b300")
    assert hw.inter_bw == pytest.approx(94.3e9) and moe.nccl_all_to_all_share() == 0.97
    S = 8 * 2**30 / 0.97
    t = 7 * hw.intra_alpha_s + 7 * hw.inter_alpha_s + max(S * 7 / 64 / hw.intra_bw, S * 56 / 64 / hw.inter_bw)
    assert V.predicted_busbw_gbps(row) == pytest.approx(63 / 64 * 8 * 2**30 / t / 1e9, rel=1e-9)
    assert V.predicted_busbw_gbps(row) == pytest.approx(102.8, abs=0.1)  # published 103.2


def test_moe_dispatch_and_the_benchmark_all_to_all_are_one_price():
    # An alltoall-dispatcher dispatch of top-1 rows at load 1 moves what alltoall_perf moves
    # for the same bytes a rank: moe.a2a_seconds and moe.alltoall_seconds must agree.
    import dataclasses

    from mgbench.planner import moe

    hw = resolve(system="aws-p6-b300")
    shape = dataclasses.replace(catalog.model_shape("deepseek-v3"), top_k=1)
    opts = moe.MoeOptions(dispatcher="alltoall", imbalance=1.0)
    assert opts.load == 1.0
    for ranks in (8, 32, 64, 256):
        tokens = 4096.0
        nbytes = tokens * shape.hidden * 2.0
        assert float(moe.a2a_seconds(shape, hw, tokens=tokens, ep=ranks, elem_bytes=2.0, opts=opts)) == \
            pytest.approx(float(moe.alltoall_seconds(hw, ranks, nbytes)), rel=1e-12)


def test_all_to_all_rows_and_their_misses_are_pinned():
    # 33 alltoall_perf figures. awslabs' 12 (p6-b300 at 4 to 32 nodes, p5 at 4 and 8) and
    # NVIDIA's GTC25 bars (6) are held out; the 15 of crazyguitar's p5 sweep and Oracle's OCI
    # tables alternate fit / held out, and the 8 fit ones set NCCL's all-to-all share (0.97)
    # and efa-v2's all-to-all cost per peer node (78 us). Still missed: the fan-out on EFA v4 (p6-b300 at 16 and 32
    # nodes +15% and +26% at the peak: the model has a latency per node, nothing per peer
    # rank), 64 MiB on p6-b300 (+7% to +24%), and the GTC25 InfiniBand bars across 4 nodes
    # (+21% and +25%). Pinned so that a change to the all-to-all's price shows here
    # (docs/planner.md, "An all-to-all share from fit rows").
    scored = [r for r in V.score() if r["collective"] == "all_to_all"]
    assert len(scored) == 33
    s = V.summary(scored)
    assert (s["fit"]["rows"], s["held_out"]["rows"]) == (8, 25)
    assert s["held_out"]["mean_abs_pct"] == pytest.approx(10.1, abs=0.1)
    assert s["held_out"]["worst"] == (pytest.approx(26.0, abs=0.1), "awslabs-p6-b300-32n-alltoall-peak")
    assert s["fit"]["mean_abs_pct"] == pytest.approx(6.1, abs=0.1)
    assert s["fit"]["worst"] == (pytest.approx(24.2, abs=0.1), "crazyguitar-p5-32n-alltoall-64mib")
    assert sum(r["error_pct"] > 0 for r in scored) == 27
    err = {r["id"]: r["error_pct"] for r in scored}
    assert err["nvidia-gtc25-dgx-h100-32gpu-alltoall"] == pytest.approx(20.7, abs=0.1)  # against 48 GB/s
    assert err["nvidia-gtc25-h100-8gpu-alltoall"] == pytest.approx(11.8, abs=0.1)  # NVLink 4, against 320
    assert err["crazyguitar-p5-32n-alltoall-64mib"] == pytest.approx(-24.2, abs=0.1)  # 31 x 78 us too much there


def test_the_all_to_all_share_and_efa_v2_peer_cost_are_the_solved_ones():
    # The rule fixed before the first solve: a share of the links' rates for NCCL's
    # all-to-all, solved on the fit rows, is adopted only if the held-out rows' error falls.
    # First solved with efa-v2's all-to-all at the link's assumed 10 us: 0.72 (the p5 rows at
    # 64 MiB pulled it down), held out 14.7% -> 16.6%, not adopted. efa-v2's cost per peer
    # node solved on the same fit rows (its own rule; adopted, first as the link's latency,
    # then, after a review, as the all-to-all's alone), the share solves to 0.97 and passes
    # (12.9% -> 10.1%); the peer cost re-solved at that share is 78 us and the share stays
    # 0.97. The stored values are these solves' (a change to the rows or the model that moves
    # either shows here).
    from mgbench.errors import MgbenchError
    from mgbench.planner import moe

    got = V.solve_all_to_all_share()
    assert got["share"] == moe.nccl_all_to_all_share() == 0.97
    assert got["held_out_pct"] == pytest.approx(10.1, abs=0.1)
    assert got["held_out_pct"] < got["held_out_pct_at_1"] == pytest.approx(12.9, abs=0.1)
    peer = V.solve_a2a_peer("efa-v2")
    assert peer["a2a_peer_us"] == peer["stored_a2a_peer_us"] == 78.0
    assert peer["fit_pct"] == pytest.approx(10.1, abs=0.1) and peer["held_out_pct"] == pytest.approx(6.9, abs=0.1)
    # what the solve fixed: at the link's 10 us the fit p5 rows are 51.7% off, held out 11.7%
    assert peer["fit_pct_at_latency"] == pytest.approx(51.7, abs=0.1)
    assert peer["held_out_pct_at_latency"] == pytest.approx(11.7, abs=0.1)
    assert len(peer["fit_rows"]) == 4 and len(peer["held_out_rows"]) == 8
    assert catalog.load("hardware.toml")["links"]["efa-v2"]["a2a_peer_us"] == 78.0  # put back
    with pytest.raises(MgbenchError, match="no fit all_to_all row runs across nodes on ib-ndr"):
        V.solve_a2a_peer("ib-ndr")
    with pytest.raises(MgbenchError, match="no link 'ib-nope'"):
        V.solve_a2a_peer("ib-nope")


def test_the_peer_solve_puts_the_catalog_back_when_it_fails(monkeypatch):
    raw = catalog.load("hardware.toml")["links"]["efa-v2"]
    stored = raw["a2a_peer_us"]
    calls = []

    def boom(row, share=None):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("pricing failed")
        return 1.0

    monkeypatch.setattr(V, "predicted_busbw_gbps", boom)
    with pytest.raises(RuntimeError, match="pricing failed"):
        V.solve_a2a_peer("efa-v2")
    assert raw["a2a_peer_us"] == stored


def test_a_share_outside_zero_to_one_is_refused(monkeypatch):
    from mgbench.errors import MgbenchError
    from mgbench.planner import moe

    table = catalog.load("hardware.toml")["planner"]["all_to_all"]
    for bad in (0.0, 1.5, -0.2, True):
        monkeypatch.setitem(table, "nccl_share", bad)
        with pytest.raises(MgbenchError, match="nccl_share must be a fraction"):
            moe.nccl_all_to_all_share()


def test_an_all_to_all_row_inside_one_node_may_use_part_of_it():
    # 32 of an NVL72 domain's 72 GPUs is one NVLink group (moe.ep_geometry: g 32, N 1); across
    # nodes the model prices whole nodes, so part of each is refused (next test)
    row = next(r for r in V.rows() if r["id"] == "nvidia-gtc25-gb200-nvl72-32gpu-alltoall")
    assert V.check([row]) == [row]
    assert V.predicted_busbw_gbps(row) == pytest.approx(661.8, abs=0.1)


def test_an_all_to_all_row_the_model_cannot_place_is_refused():
    from mgbench.errors import MgbenchError

    row = next(r for r in V.rows() if V.collective_of(r) == "all_to_all")
    with pytest.raises(MgbenchError, match="across nodes runs every GPU of its nodes, not 4 of 8"):
        V.check([{**row, "ranks_per_node": 4}])
    with pytest.raises(MgbenchError, match="collective 'broadcast'"):
        V.check([{**row, "collective": "broadcast"}])


def test_the_all_to_all_note_counts_the_published_figures_as_priced(monkeypatch):
    # Read from the scores, not written down: with the first row priced at half the
    # published rate the note counts 26 too fast, and its span reaches that row's -50%.
    V._all_to_all_scores.cache_clear()
    line = V.a2a_record_note("alltoall", 8)
    assert "faster than 27 of the 33" in line and "-3.2% to +11.8% inside one node" in line
    assert "-24.2% to +26.0% across nodes" in line and "mean |error| 9.2%" in line
    assert V.a2a_record_note("deepep", 8) is None and V.a2a_record_note("alltoall", 1) is None
    first = next(r for r in V.rows() if V.collective_of(r) == "all_to_all")
    real = V.predicted_busbw_gbps
    monkeypatch.setattr(V, "predicted_busbw_gbps",
                        lambda r: 0.5 * r["busbw_gbps"] if r["id"] == first["id"] else real(r))
    V._all_to_all_scores.cache_clear()
    try:
        broken = V.a2a_record_note("alltoall", 8)
        assert "faster than 26 of the 33" in broken and "-50.0% to +26.0% across nodes" in broken
    finally:
        V._all_to_all_scores.cache_clear()


def test_a_fit_all_to_all_row_must_say_it_sets_the_all_to_all_share():
    from mgbench.errors import MgbenchError

    row = next(r for r in V.rows() if V.collective_of(r) == "all_to_all")
    with pytest.raises(MgbenchError, match='sets the all-to-all share'):
        V.check([{**row, "split": "fit", "sets": row["system"]}])
    assert V.check([{**row, "split": "fit", "sets": "all_to_all"}])
