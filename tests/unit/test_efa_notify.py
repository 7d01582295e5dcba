"""The host wait of a forward DeepEP-style dispatch across AWS EFA nodes through a CPU
proxy (planner/moe.py efa_notify_seconds, stacks.toml [moe_host] efa_proxy_notify_ms):
where it applies and where not, its count by hand, its stored value is the one solved from
the fit rows only, and it fires on a step (and on the held-out rows it applies to)."""

from __future__ import annotations

import dataclasses

import pytest

from mgbench import catalog
from mgbench.planner import ep_kernels, hardware, moe
from mgbench.planner import moe_validation as V

UCCL = moe.MoeOptions(dispatcher="deepep", backend="uccl-ep")


def launches(opts=UCCL, ep=32, gpus_per_node=8, across_efa=True, rerun=0.0):
    return float(moe.efa_notify_launches(ep=ep, gpus_per_node=gpus_per_node, across_efa=across_efa, moe_layers=8,
                                         num_micro=16, opts=opts, rerun=rerun))


def test_each_forward_dispatch_across_efa_through_a_proxy_counts_and_nothing_else_does():
    # 8 MoE layers x 16 micro-batches; a recomputed forward dispatches again.
    assert launches() == 128.0
    assert launches(rerun=1.0) == 256.0
    assert launches(opts=moe.MoeOptions(dispatcher="deepep", backend="nvshmem-libfabric")) == 128.0
    # GPU-initiated (DeepEP v2 over NCCL GIN), no backend, the all-to-all, EP inside a node, off EFA: none.
    assert launches(opts=moe.MoeOptions(dispatcher="deepep", backend="deepep-v2-nccl-gin")) == 0.0
    assert launches(opts=moe.MoeOptions(dispatcher="deepep")) == 0.0
    assert launches(opts=moe.MoeOptions()) == 0.0
    assert launches(ep=8) == 0.0
    assert launches(across_efa=False) == 0.0


def test_the_systems_fabric_decides():
    assert ep_kernels.talks_over_efa(hardware.resolve(system="aws-p6-b200"))
    assert not ep_kernels.talks_over_efa(hardware.resolve(system="dgx-b200"))


def test_the_stored_value_is_the_one_solved_from_fit_rows_only():
    solved = V.solve_efa_notify()
    assert solved is not None
    assert moe.host_constants()["efa_proxy_notify_ms"] == pytest.approx(solved["efa_proxy_notify_ms"])
    held = {r["id"] for r in V.runs() if r["split"] != "fit"}
    assert solved["rows"] and not held & set(solved["rows"])


def test_the_solve_answers_a_known_constant(monkeypatch):
    # Rows built so that each published step is its term-free step plus 2.5 ms a dispatch's
    # wait: the solve must find 2.5 with no error left.
    rows = V.efa_notify_rows("fit") + V.efa_notify_rows("held_out")[:3]
    terms = {r["id"]: V.efa_notify_terms(r) for r in rows}
    built = [{**r, "published": r["global_batch"] * r["seq"] / (r["num_gpus"] * (terms[r["id"]][0]
                                                                                  + 2.5 * terms[r["id"]][1]))}
             for r in rows]
    monkeypatch.setattr(V, "efa_notify_terms", lambda r: terms[r["id"]])
    got = V.solve_efa_notify(built)
    assert got["efa_proxy_notify_ms"] == pytest.approx(2.5) and got["mean_abs_pct"] == pytest.approx(0.0, abs=1e-9)


def test_the_step_pays_it_by_hand():
    row = next(r for r in V.runs() if r["id"] == "aws-p6-b200-kimi-k2-32n-ep32-nvshmem-mb4")
    res = V.predict_row(row)
    b = res["breakdown"]
    c = moe.host_constants()["efa_proxy_notify_ms"]
    assert c > 0
    # Kimi-K2 on PP 8: the first stage's 8 blocks, counted as MoE ones as the host term counts them (the
    # least of a stage's blocks and the model's MoE layers), 256 / (4 x 4) = 16
    # micro-batches, full recompute (each forward dispatch twice); stretched by the bubble as the host term.
    moe_layers = min(8, catalog.model_shape("kimi-k2").moe_layers)
    by_hand = moe_layers * 16 * 2 * c * 1e-3 / (1.0 - float(b["bubble_fraction"]))
    assert float(b["moe_efa_notify_s"]) == pytest.approx(by_hand)
    # The same run with DeepEP v2 over NCCL GIN (GPU-initiated) pays nothing for it.
    v2 = dataclasses.replace(moe.options_of(row), backend="deepep-v2-nccl-gin")
    assert float(V.predict_row(row, v2)["breakdown"]["moe_efa_notify_s"]) == 0.0


def test_the_term_lowers_the_error_on_the_held_out_rows_it_applies_to():
    # The rule's test of adoption (docs/planner.md, 2026-11-28): solved on one fit row, the 48
    # held-out rows it applies to went from 73.1% to 30.9% mean |error|.
    s = V.efa_notify_summary()["held_out"]
    assert s["rows"] >= 40 and s["with"] < 0.6 * s["without"]


def test_the_backend_note_says_the_wait_for_proxy_backends_only():
    note = ep_kernels.backend_note("uccl-ep", True)
    assert f"{moe.host_constants()['efa_proxy_notify_ms']:g} ms more host wait a forward dispatch" in note
    assert "the one fit row through a CPU proxy" in note  # no fit row runs UCCL-EP itself
    assert ep_kernels.proxy_note("deepep-v2-nccl-gin") == ""


@pytest.mark.parametrize("bad", [-1.0, "3 ms", True, None])
def test_a_wait_that_is_not_a_number_of_ms_is_refused(monkeypatch, bad):
    from tests.unit.test_moe_host import _refused_with_host_table

    def set_wait(host):
        host = {k: v for k, v in host.items() if k != "efa_proxy_notify_ms"}
        return host if bad is None else {**host, "efa_proxy_notify_ms": bad}

    _refused_with_host_table(monkeypatch, set_wait, "efa_proxy_notify_ms must be a number of ms")


def test_rows_across_efa_set_no_host_launch_constant():
    fit_across = [r for r in V.runs() if r["split"] == "fit" and hardware.ep_crosses_efa(r["system"], r["ep"])]
    assert fit_across  # the nineteenth session's fit rows across EFA
    assert not {r["id"] for r in fit_across} & {r["id"] for r in V.host_fit_rows()}


def test_predicts_step_line_shows_the_wait():
    from click.testing import CliRunner
    from mgbench.cli import main

    args = ["predict", "--model", "kimi-k2", "--system", "aws-p6-b200", "--num-gpus", "256", "--tp", "8", "--pp", "8",
            "--ep", "32", "--seq-len", "4096", "--global-batch", "256", "--micro-batch", "4", "--recompute", "full",
            "--moe-dispatcher", "deepep"]
    with_proxy = CliRunner().invoke(main, args + ["--moe-backend", "nvshmem-libfabric"])
    assert with_proxy.exit_code == 0, with_proxy.output
    assert "EFA proxy notify wait" in with_proxy.output
    gda = CliRunner().invoke(main, args + ["--moe-backend", "deepep-v2-nccl-gin"])
    assert gda.exit_code == 0 and "EFA proxy notify wait" not in gda.output
