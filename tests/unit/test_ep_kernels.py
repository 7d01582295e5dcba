"""DeepEP-style kernels over AWS EFA (planner/ep_kernels.py, data/published_ep_kernels.toml):
the file's checks fire on broken rows, a published figure is put in the bytes the planner
counts as crossing nodes by hand, a backend's share is its fit rows' mean, and the
planner prices a named backend's exchange across EFA nodes at that share (and nowhere
else)."""

from __future__ import annotations

import dataclasses

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
            "gbps": 20.0, "counts_own_node": True, "split": "fit", "source": "s", "date": "2026"}
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


def test_a_figure_counting_its_own_node_is_put_in_the_bytes_that_cross_by_hand():
    # 2 nodes: half of a token's node visits stay home; 4 nodes: a quarter.
    assert K.network_gbps(row(gbps=20.0)) == pytest.approx(10.0)
    assert K.network_gbps(row(gbps=40.0, nodes=4, ep=32)) == pytest.approx(30.0)
    assert K.network_gbps(row(gbps=20.0, counts_own_node=False)) == pytest.approx(20.0)
    # p5: 32 x 12.5 GB/s EFA v2 a node, 4 NICs a GPU, at efa-v2's bw_eff.
    link = catalog.links()["efa-v2"]
    eff = catalog.links()[link["bw_eff_from"]]["bw_eff"] if "bw_eff_from" in link else link["bw_eff"]
    assert K.catalog_gbps("aws-p5") == pytest.approx(4 * 12.5 * eff)
    assert K.row_share(row(gbps=20.0)) == pytest.approx(10.0 / (4 * 12.5 * eff))


def test_a_backends_share_is_the_mean_of_its_fit_rows(monkeypatch):
    rows = (row(id="a", gbps=20.0), row(id="b", gbps=999.0, split="held_out"), row(id="c", gbps=40.0))
    monkeypatch.setattr(K, "rows", lambda: rows)
    K.backend_share.cache_clear()
    try:
        want = (K.row_share(rows[0]) + K.row_share(rows[2])) / 2
        assert K.backend_share("uccl-ep") == pytest.approx(want)
        assert K.backend_share("nvshmem-libfabric") is None  # no row: the links' rates
        # the held-out row is checked against the share, not fitted to
        assert K.error_pct(rows[1]) == pytest.approx(100 * (want * K.catalog_gbps("aws-p5") / (999.0 / 2) - 1))
        assert "uccl-ep: share" in K.report() and "held_out: 1 rows" in K.report()
    finally:
        K.backend_share.cache_clear()


def test_a_named_backend_slows_only_the_bytes_that_cross_efa_nodes(monkeypatch):
    monkeypatch.setattr(K, "backend_share", lambda backend: {"uccl-ep": 0.25}.get(backend))
    deep = moe.MoeOptions(imbalance=1.0, dispatcher="deepep")
    uccl = dataclasses.replace(deep, backend="uccl-ep")
    kw = dict(tokens=4096, elem_bytes=2.0)
    # By hand: the across bytes at a quarter of the rate; the latency terms unchanged.
    inside, across = moe.rows_sent(QWEN, 32, 8, deep)
    b = 4096 * QWEN.hidden * 2.0
    g, n = moe.ep_geometry(32, 8)
    peer = P5.inter_alpha_s if P5.a2a_peer_s is None else P5.a2a_peer_s
    lat = (g - 1) * P5.intra_alpha_s + (n - 1) * peer
    want = lat + max(b * inside / P5.intra_bw, b * across / (0.25 * P5.inter_bw))
    assert float(moe.a2a_seconds(QWEN, P5, ep=32, opts=uccl, **kw)) == pytest.approx(want)
    assert float(moe.a2a_seconds(QWEN, P5, ep=32, opts=uccl, **kw)) > float(moe.a2a_seconds(QWEN, P5, ep=32, opts=deep, **kw))
    # Inside one node nothing crosses: the backend changes nothing.
    assert float(moe.a2a_seconds(QWEN, P5, ep=8, opts=uccl, **kw)) == float(moe.a2a_seconds(QWEN, P5, ep=8, opts=deep, **kw))
    # Not on EFA (its figures are EFA's), or a backend without a published figure: the links' rates.
    assert float(moe.a2a_seconds(QWEN, H100, ep=32, opts=uccl, **kw)) == float(moe.a2a_seconds(QWEN, H100, ep=32, opts=deep, **kw))
    nvshmem = dataclasses.replace(deep, backend="nvshmem-libfabric")
    assert float(moe.a2a_seconds(QWEN, P5, ep=32, opts=nvshmem, **kw)) == float(moe.a2a_seconds(QWEN, P5, ep=32, opts=deep, **kw))


def test_a_backend_needs_a_deepep_style_dispatcher_and_a_known_name():
    with pytest.raises(MgbenchError, match="give --moe-dispatcher deepep"):
        moe.MoeOptions(backend="uccl-ep")
    with pytest.raises(MgbenchError, match="MoE backend must be one of"):
        moe.MoeOptions(dispatcher="deepep", backend="pplx")
    assert "deepep dispatcher (uccl-ep)" in moe.note(moe.MoeOptions(dispatcher="deepep", backend="uccl-ep"), "1f1b")


def test_the_backend_note_says_the_share_and_its_check_or_that_nothing_changed(monkeypatch):
    rows = (row(id="a", gbps=20.0), row(id="b", gbps=40.0, split="held_out"))
    monkeypatch.setattr(K, "rows", lambda: rows)
    K.backend_share.cache_clear()
    try:
        line = K.backend_note("uccl-ep", True)
        assert f"{K.row_share(rows[0]):.3f} of the network rate" in line and "1 fit kernel" in line
        assert f"mean |error| {abs(K.error_pct(rows[1])):.1f}%" in line
        assert "not priced here" in K.backend_note("uccl-ep", False)
        assert "no published kernel figure" in K.backend_note("nvshmem-libfabric", True)
    finally:
        K.backend_share.cache_clear()
