"""DeepEP-style kernels over AWS EFA (planner/ep_kernels.py, data/published_ep_kernels.toml):
the file's checks fire on broken rows, a published figure is put in the bytes the planner
counts as crossing nodes by hand, a backend's share is its fit rows' mean, and the
planner prices a named backend's exchange across EFA nodes at that share (and nowhere
else)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.planner import ep_kernels as K
from mgbench.planner import hardware, moe

QWEN = catalog.model_shape("qwen3-30b-a3b")
P5 = hardware.resolve(system="aws-p5")
H100 = hardware.resolve(system="dgx-h100")


def row(**kw):
    base = {"id": "r", "backend": "uccl-ep", "system": "aws-p5", "nodes": 2, "ep": 16, "phase": "dispatch",
            "gbps": 20.0, "counts_own_node": True, "tokens": 4096, "hidden": 7168, "top_k": 8, "experts": 256,
            "dispatch_dtype": "bf16", "split": "fit", "source": "s", "date": "2026"}
    return {**base, **kw}


def test_the_files_rows_pass_their_checks():
    assert K.check(list(K.rows())) == list(K.rows())


@pytest.mark.parametrize("broken, words", [
    ({"backend": "deepep-ib"}, "backend 'deepep-ib'"),
    ({"phase": "both"}, "phase 'both'"),
    ({"system": "dgx-h100"}, "does not talk over EFA"),
    ({"system": "nowhere"}, "no catalog system"),
    ({"ep": 8, "nodes": 1}, "whole nodes, two or more"),
    ({"ep": 12}, "whole nodes"),
    ({"split": "held_out"}, "rule makes the uccl-ep row number 1 fit"),
    ({"split": "test"}, "split 'test'"),
    ({"gbps": 0}, "not a positive number"),
    ({"gbps": -5.0}, "not a positive number"),
    ({"gbps": "50"}, "not a positive number"),
    ({"counts_own_node": "false"}, "not true or false"),
    ({"nodes": 2.5, "ep": 20}, "nodes must be whole numbers"),
    ({"nodes": "2"}, "nodes must be whole numbers"),
    ({"dispatch_dtype": "fp4"}, "dispatch_dtype 'fp4'"),
    ({"gbps": True}, "not a positive number"),
    ({"tokens": 0}, "tokens must be whole numbers of 1 or more"),
])
def test_a_broken_row_is_refused_naming_it(broken, words):
    with pytest.raises(MgbenchError, match="published_ep_kernels.toml") as e:
        K.check([row(**broken)])
    assert words in str(e.value)


def test_rows_alternate_within_each_backend_fit_first():
    ok = [row(id="a"), row(id="b", split="held_out"), row(id="c", backend="nvshmem-libfabric"),
          row(id="d")]
    assert K.check(ok) == ok
    with pytest.raises(MgbenchError, match="d: split 'held_out', but the rule makes the uccl-ep row number 3 fit"):
        K.check([row(id="a"), row(id="b", split="held_out"), row(id="d", split="held_out"),
                 row(id="e", split="held_out")])
    with pytest.raises(MgbenchError, match="missing gbps"):
        K.check([{k: v for k, v in row().items() if k != "gbps"}])
    with pytest.raises(MgbenchError, match="a: the id is used twice"):
        K.check([row(id="a"), row(id="a", split="held_out")])


def test_a_figure_counting_its_own_node_is_put_in_the_bytes_that_cross_by_hand():
    # 2 nodes: half of a token's node visits stay home; 4 nodes: a quarter.
    assert K.network_gbps(row(gbps=20.0)) == pytest.approx(10.0)
    assert K.network_gbps(row(gbps=40.0, nodes=4, ep=32)) == pytest.approx(30.0)
    assert K.network_gbps(row(gbps=20.0, counts_own_node=False)) == pytest.approx(20.0)
    # p5: 32 x 12.5 GB/s EFA v2 a node, 4 NICs a GPU, at efa-v2's bw_eff.
    link = catalog.links()["efa-v2"]
    eff = catalog.links()[link["bw_eff_from"]]["bw_eff"] if "bw_eff_from" in link else link["bw_eff"]
    assert K.catalog_gbps("aws-p5") == pytest.approx(4 * 12.5 * eff)


def test_a_rows_kernel_time_and_share_net_of_the_planners_latency_by_hand():
    # 2 nodes, 256 experts, top-8 within min(2, 4) = 2 nodes: a token misses a node's 128
    # experts with chance C(128, 8) / C(256, 8), so reaches 2 (1 - that) nodes, its own
    # counted; BF16, 4096 tokens of 7168.
    miss = math.comb(128, 8) / math.comb(256, 8)
    t = 4096 * 2 * (1 - miss) * 7168 * 2 / 20e9
    assert K.kernel_seconds(row(gbps=20.0)) == pytest.approx(t)
    # FP8 dispatch counts 1 + 4/128 bytes an element; combine is BF16 whatever the dispatch.
    assert K.kernel_seconds(row(dispatch_dtype="fp8")) == pytest.approx(t * (1 + 4 / 128) / 2)
    assert K.kernel_seconds(row(dispatch_dtype="fp8", phase="combine")) == pytest.approx(t)
    # A benchmark that counts only the other nodes: (N - 1) / N of those visits.
    assert K.kernel_seconds(row(counts_own_node=False)) == pytest.approx(t / 2)
    # Above 4 nodes the benchmark's 4 chosen nodes are all reached (its group choice by each
    # node's best score), not the 3.6 an even draw among their experts gives.
    t8 = 4096 * 4 * 7168 * 2 / 20e9
    assert K.kernel_seconds(row(nodes=8, ep=64)) == pytest.approx(t8)
    assert K.kernel_seconds(row(nodes=4, ep=32)) < K.kernel_seconds(row(nodes=8, ep=64))
    # p5's latency the planner adds: 7 peer GPUs at NVLink's, 1 peer node at efa-v2's a2a_peer_us.
    lat = 7 * P5.intra_alpha_s + 1 * P5.a2a_peer_s
    assert K.latency_seconds(row()) == pytest.approx(lat)
    assert K.row_share(row(gbps=20.0)) == pytest.approx(10.0 * t / ((t - lat) * K.catalog_gbps("aws-p5")))
    # A time below the latency cannot be a rate: refused, naming the row.
    with pytest.raises(MgbenchError, match="r: its kernel time"):
        K.row_share(row(gbps=1e6))


def test_a_backends_share_is_the_mean_of_its_fit_rows_and_repeats_are_told_apart(monkeypatch):
    rows = (row(id="a", gbps=20.0), row(id="b", gbps=999.0, split="held_out"), row(id="c", gbps=40.0, nodes=4, ep=32),
            row(id="d", gbps=30.0, nodes=3, ep=24, split="held_out"))
    monkeypatch.setattr(K, "rows", lambda: rows)
    K.backend_share.cache_clear()
    try:
        want = (K.row_share(rows[0]) + K.row_share(rows[2])) / 2
        assert K.backend_share("uccl-ep") == pytest.approx(want)
        assert K.backend_share("nvshmem-libfabric") is None  # no row: the links' rates
        # the held-out row is checked against the share, not fitted to: the planner's time
        # (latency + the bytes across at the share) against the published one
        t = K.kernel_seconds(rows[1])
        pred = K.latency_seconds(rows[1]) + K.network_gbps(rows[1]) * 1e9 * t / (want * K.catalog_gbps("aws-p5") * 1e9)
        assert K.error_pct(rows[1]) == pytest.approx(100 * (t / pred - 1))
        s = K.summary("uccl-ep")
        assert s["fit"]["rows"] == 2 and s["held_out"]["rows"] == 2
        # "b" repeats fit row "a"'s configuration; "d" (3 nodes) is one no fit row holds
        assert s["held_out_new"]["rows"] == 1 and s["held_out_new"]["mean"] == pytest.approx(abs(K.error_pct(rows[3])))
        text = K.report()
        assert "uccl-ep: share" in text and "held out, configurations no fit row holds: 1 rows" in text
    finally:
        K.backend_share.cache_clear()


def test_a_named_backend_slows_only_the_bytes_that_cross_efa_nodes(monkeypatch):
    monkeypatch.setattr(K, "backend_share", lambda backend: {"uccl-ep": 0.25}.get(backend))
    deep = moe.MoeOptions(imbalance=1.0, dispatcher="deepep")
    uccl = dataclasses.replace(deep, backend="uccl-ep")
    # The share a run is priced at: its backend's over EFA; 1 off EFA (its figures are
    # EFA's), for DeepEP's own kernels, or a backend with no figure.
    assert K.priced_share(P5, uccl) == 0.25
    assert K.priced_share(H100, uccl) == 1.0 and K.priced_share(P5, deep) == 1.0
    assert K.priced_share(P5, dataclasses.replace(deep, backend="nvshmem-libfabric")) == 1.0
    kw = dict(tokens=4096, elem_bytes=2.0)
    # By hand: the across bytes at a quarter of the rate; the latency terms unchanged.
    inside, across = moe.rows_sent(QWEN, 32, 8, deep)
    b = 4096 * QWEN.hidden * 2.0
    g, n = moe.ep_geometry(32, 8)
    peer = P5.inter_alpha_s if P5.a2a_peer_s is None else P5.a2a_peer_s
    lat = (g - 1) * P5.intra_alpha_s + (n - 1) * peer
    want = lat + max(b * inside / P5.intra_bw, b * across / (0.25 * P5.inter_bw))
    assert float(moe.a2a_seconds(QWEN, P5, ep=32, opts=uccl, across_share=0.25, **kw)) == pytest.approx(want)
    assert float(moe.a2a_seconds(QWEN, P5, ep=32, opts=uccl, across_share=0.25, **kw)) > \
        float(moe.a2a_seconds(QWEN, P5, ep=32, opts=deep, **kw))
    # Inside one node nothing crosses: the share changes nothing.
    assert float(moe.a2a_seconds(QWEN, P5, ep=8, opts=uccl, across_share=0.25, **kw)) == \
        float(moe.a2a_seconds(QWEN, P5, ep=8, opts=deep, **kw))
    # (predict's step with the backend is slower across EFA nodes: tests/integration/test_moe_options_cli.py)


def test_a_backend_needs_a_deepep_style_dispatcher_and_a_known_name():
    with pytest.raises(MgbenchError, match="give --moe-dispatcher deepep"):
        moe.MoeOptions(backend="uccl-ep")
    with pytest.raises(MgbenchError, match="give --moe-dispatcher deepep"):
        moe.MoeOptions(dispatcher="hybridep", backend="uccl-ep")
    with pytest.raises(MgbenchError, match="MoE backend must be one of"):
        moe.MoeOptions(dispatcher="deepep", backend="pplx")
    assert "deepep dispatcher (uccl-ep)" in moe.note(moe.MoeOptions(dispatcher="deepep", backend="uccl-ep"), "1f1b")


def test_the_backend_note_says_the_share_and_its_check_or_that_nothing_changed(monkeypatch):
    rows = (row(id="a", gbps=20.0), row(id="b", gbps=40.0, nodes=3, ep=24, split="held_out"))
    monkeypatch.setattr(K, "rows", lambda: rows)
    K.backend_share.cache_clear()
    try:
        line = K.backend_note("uccl-ep", True)
        assert f"{K.row_share(rows[0]):.3f} of the network rate" in line and "1 fit kernel" in line
        assert f"mean |error| {abs(K.error_pct(rows[1])):.1f}%" in line
        assert "does not cross EFA nodes" in K.backend_note("uccl-ep", False)
        assert "fabric is not known" in K.backend_note("uccl-ep", None)
        assert "no published kernel figure" in K.backend_note("nvshmem-libfabric", True)
        # DeepEP across EFA without a backend is told its kernels do not run there; elsewhere, nothing.
        assert "with no --moe-backend" in K.backend_note(None, True, "deepep")
        assert K.backend_note(None, False, "deepep") is None and K.backend_note(None, True, "alltoall") is None
    finally:
        K.backend_share.cache_clear()


def test_splits_alternate_from_the_first_a_file_names():
    from mgbench.planner.splits import alternating

    assert [alternating(j) for j in range(3)] == ["fit", "held_out", "fit"]
    assert [alternating(j, "held_out") for j in range(3)] == ["held_out", "fit", "held_out"]
    with pytest.raises(ValueError, match="first must be one of"):
        alternating(0, "test")
