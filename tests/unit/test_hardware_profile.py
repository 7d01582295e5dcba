"""One hardware profile type (mgbench/hardware_profile.py) for the catalog's accelerators
(data/efficiency.toml) and for what `mgbench probe` writes: every figure says whether it
was measured, carried from a sibling or assumed, and the planner reads it."""

import statistics

import pytest

from mgbench import catalog
from mgbench import hardware_profile as H
from mgbench.errors import MgbenchError
from mgbench.planner import hardware


def test_a_figure_says_where_it_came_from_or_refuses():
    H.Figure(value=0.8, unit="x", kind="measured", source="s")
    H.Figure(value=None, unit="x", kind="assumed", reason="nothing measured it")
    for bad in (dict(value=None, kind="measured"),  # unknown without a reason
                dict(value=0.8, kind="measured"),  # measured without a source
                dict(value=0.8, kind="carried", reason="same die"),  # carried without the sibling
                dict(value=0.8, kind="assumed"),  # an assumption that says nothing
                dict(value=0.8, kind="guessed", source="s"),  # not a kind
                dict(value=float("nan"), kind="measured", source="s")):
        with pytest.raises(MgbenchError):
            H.Figure(unit="x", **bad)


@pytest.mark.parametrize("acc", sorted(catalog.accelerators()))
def test_every_catalog_accelerator_has_a_profile_that_round_trips(acc):
    p = H.catalog_profile(acc)
    assert p.evidence in H.EVIDENCE
    assert H.HardwareProfile.from_dict(p.to_dict()) == p
    ent = H.efficiency_entries()[acc]
    for name in ("gemm_best", "gemm_best_fp8", "gemm_small", "mem_bw", "attention", "host_link"):
        spec = ent[name]
        assert spec["kind"] in H.EVIDENCE, (acc, name)
        if spec["kind"] == "measured" and not spec.get("null_reason") and "sweep" not in spec:
            assert spec.get("source") and spec.get("date"), (acc, name)
        if spec["kind"] == "carried":
            assert spec["from"] in catalog.accelerators() and spec["from"] != acc and spec["reason"], (acc, name)
    # A fraction of the datasheet peak: GeForce boost clocks may pass it a little, no more.
    if p.gemm_best.value is not None:
        assert 0.3 < p.gemm_best.value < 1.2
    assert 0.5 < p.mem_bw.value / p.mem_bw_peak.value <= 1.0
    assert p.gemm_fixed.value > 0


def test_efficiency_data_names_only_catalog_accelerators():
    assert set(H.efficiency_entries()) == set(catalog.accelerators())


def test_measured_and_carried_fractions_by_hand():
    # MI300X: 668.4 TFLOP/s measured (MAMF) over the catalog's 1,307.4, not the table's 1,300.
    assert H.catalog_profile("mi300x").gemm_best.value == pytest.approx(668.4 / 1307.4)
    # H100 NVL: carried from the H100 PCIe (496 of 756), kind and sibling kept.
    nvl = H.catalog_profile("h100-nvl")
    assert nvl.gemm_best.value == pytest.approx(496.0 / 756.0)
    assert (nvl.gemm_best.kind, nvl.gemm_best.carried_from, nvl.evidence) == ("carried", "h100-pcie", "carried")
    # Memory: the A100 40 GB carries the 80 GB's measured fraction (1.70 / 2.039) to its 1.555 TB/s.
    assert H.catalog_profile("a100-sxm-40gb").mem_bw.value == pytest.approx(1.70 / 2.039 * 1.555)
    # A memory nothing measured: the median of the measured fractions (the stated rule).
    acc = catalog.accelerators()
    measured = [float(e["mem_bw"]["tbps"]) / acc[k]["mem_bw_tbps"] for k, e in H.efficiency_entries().items()
                if e["mem_bw"]["kind"] == "measured"]
    assert H.catalog_profile("rtx-4090").mem_bw.value == pytest.approx(statistics.median(measured) * 1.008)
    # No bf16 peak in the catalog: no fraction, and the evidence says assumed.
    pro = H.catalog_profile("rtx-pro-6000")
    assert pro.gemm_best.value is None and "no bf16 peak" in pro.gemm_best.reason and pro.evidence == "assumed"


@pytest.mark.parametrize("figure", ["gemm_best", "gemm_best_fp8", "mem_bw", "gemm_small", "attention", "host_link"])
def test_a_carried_circle_is_refused(monkeypatch, figure):
    ent = {k: dict(v) for k, v in H.efficiency_entries().items()}
    ent["h100-nvl"][figure] = {"kind": "carried", "from": "h100-pcie", "reason": "r"}
    ent["h100-pcie"][figure] = {"kind": "carried", "from": "h100-nvl", "reason": "r"}
    monkeypatch.setattr(H, "efficiency_entries", lambda: ent)
    with pytest.raises(MgbenchError, match=f"{figure} is carried in a circle: h100-nvl -> h100-pcie -> h100-nvl"):
        H.catalog_profile.__wrapped__("h100-nvl")  # past the cache: built afresh from the patched entries


def test_shape_model_is_read_off_the_sweeps_by_its_rule():
    sm = H.shape_model()
    # p: the candidate with the smallest worst skinny-row error.
    assert sm["worst_skinny_error"][sm["p"]] == min(sm["worst_skinny_error"].values())
    assert all(abs(e) <= sm["worst_skinny_error"][sm["p"]] for es in sm["skinny_errors"].values() for e in es)
    # t0 by hand for one sweep: the median over its small rows of measured - norm time.
    sweep = next(s for s in catalog.load("efficiency.toml")["gemm_sweep"] if s["id"] == "azure-nd-a100-v4")
    best, bw, p = 256.5e12, 1.70e12, sm["p"]
    small = [(r["m"], r["n"], r["k"], r["tflops"]) for r in sweep["rows"] if 2 * r["m"] * r["n"] * r["k"] < 2e10]
    t0s = []
    for m, n, k, tf in small:
        f = 2.0 * m * n * k
        b = 2.0 * (m * k + k * n) + 2.0 * m * n
        t0s.append(f / (tf * 1e12) - ((f / best) ** p + (b / bw) ** p) ** (1 / p))
    assert sm["fixed_s"]["azure-nd-a100-v4"] == pytest.approx(statistics.median(t0s))
    assert 1e-6 < sm["fixed_s"]["azure-nd-a100-v4"] < 2e-5


def test_a_sweep_with_a_broken_skinny_row_moves_the_rule(monkeypatch):
    real = catalog.load("efficiency.toml")
    broken = dict(real)
    broken["gemm_sweep"] = [dict(s, rows=[dict(r, tflops=r["tflops"] / 3) if r.get("skinny") else r for r in s["rows"]])
                            for s in real["gemm_sweep"]]
    monkeypatch.setattr(H, "_data", lambda: broken)
    H.shape_model.cache_clear()
    try:
        # Three times slower skinny GEMMs: only p = 1 (no overlap) comes near them.
        assert H.shape_model()["p"] < 1.5
    finally:
        H.shape_model.cache_clear()


def test_compute_efficiency_scales_the_calibrated_value_by_measured_fractions():
    d = hardware.planner_defaults()
    a100 = H.catalog_profile(d["calibrated_gpu"]).gemm_best.value
    assert hardware.compute_efficiency("mi300x") == pytest.approx(d["matmul_eff"] * (668.4 / 1307.4) / a100)
    assert hardware.compute_efficiency(d["calibrated_gpu"]) == pytest.approx(d["matmul_eff"])
    # An accelerator efficiency.toml does not know (a --system-file's): the A100's, assumed.
    assert hardware.compute_efficiency("my-own-gpu") == pytest.approx(d["matmul_eff"])
    assert hardware.efficiency_fields("my-own-gpu")["evidence"] == "assumed"


def test_resolved_hardware_carries_the_profile():
    hw = hardware.resolve(system="dgx-h100")
    p = H.catalog_profile("h100-sxm")
    assert hw.evidence == "measured" and hw.gemm_shapes
    assert hw.mem_bw_fraction == pytest.approx(2.97 / 3.35)
    assert hw.gemm_fixed_s == pytest.approx(H.shape_model()["fixed_s"]["azure-nd-h100-v5"])
    assert hw.attn_eff == p.attention.value == 0.339
    assert hw.fp8_gemm_ratio == pytest.approx((1402.6 / 1979) / (794.5 / 989))
    assert hardware.resolve(system="h100-nvl-8").evidence == "carried"
    assert "gemm_best carried from h100-pcie" in hardware.resolve(system="h100-nvl-8").evidence_detail


@pytest.mark.parametrize("name", ["gemm_best", "gemm_best_fp8", "mem_bw", "gemm_small", "attention", "host_link"])
def test_a_carried_figure_that_names_no_sibling_is_refused(monkeypatch, name):
    # Every figure follows _holder, which refuses one line instead of a KeyError later.
    ent = {k: dict(v) for k, v in H.efficiency_entries().items()}
    ent["h100-nvl"][name] = {"kind": "carried", "reason": "r"}  # no from, no value, no null_reason
    monkeypatch.setattr(H, "efficiency_entries", lambda: ent)
    with pytest.raises(MgbenchError, match=f"h100-nvl.{name} is carried but names no sibling"):
        H.catalog_profile.__wrapped__("h100-nvl")


@pytest.mark.parametrize("name", ["gemm_best", "gemm_best_fp8", "gemm_small", "attention", "host_link"])
def test_an_assumed_figure_without_a_value_is_refused_but_mem_bw(monkeypatch, name):
    # Only mem_bw's reader prices an assumption with no value (the median measured
    # fraction); any other figure stated "assumed" with nothing to price is one line.
    ent = {k: dict(v) for k, v in H.efficiency_entries().items()}
    ent["h100-nvl"][name] = {"kind": "assumed", "reason": "r"}
    monkeypatch.setattr(H, "efficiency_entries", lambda: ent)
    with pytest.raises(MgbenchError, match=f"h100-nvl.{name} is assumed but names no sibling"):
        H.catalog_profile.__wrapped__("h100-nvl")
