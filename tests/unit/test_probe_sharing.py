"""How the probed CPU prediction accounts for ranks sharing the cores: rows probed with
n processes at once, collective latency at n ranks, the framework's residual per step
(one rank, and the strategies' tiny steps at n ranks), and the probe's merge of
concurrent processes (hand calculations, no timing)."""

import pytest

from mgbench.config import RunConfig
from mgbench.planner.against import collective_latency, fixed_cost, modelled_collectives, modelled_latency_s
from mgbench.probe import profile as P
from mgbench.probe.concurrent import median_merge

from tests.factories import make_config
from tests.unit.test_probe_profile import make_profile


def _gemm(threads, ranks, typical):
    return {"dtype": "float32", "threads": threads, "ranks": ranks, "typical_tflops": typical,
            "best_tflops": 2 * typical, "shapes": []}


def concurrent_profile(**over):
    """GEMMs probed at 1 rank x 2 threads, and at 2 and 4 ranks x 1 thread with that
    many processes at once (their figures already hold the sharing)."""
    return make_profile(gemm=[_gemm(2, 1, 0.16), _gemm(1, 2, 0.08), _gemm(1, 4, 0.03)], **over)


def test_rows_probed_at_the_runs_rank_count_are_used_as_measured():
    # 4 ranks on 2 cores: the row timed with 4 processes at once, not 1-thread x c/(n t)
    hw4 = P.hardware(concurrent_profile(), "fp32", ranks=4)
    assert hw4.peak_tflops * hw4.compute_eff == pytest.approx(0.03)
    hw2 = P.hardware(concurrent_profile(), "fp32", ranks=2)
    assert hw2.peak_tflops * hw2.compute_eff == pytest.approx(0.08)


def test_gemms_probed_only_with_more_processes_than_the_run_are_an_error_not_a_crash():
    # 1 thread per rank at 2 ranks, but the 1-thread GEMMs were timed only 4 processes at
    # once: no row to scale from (it once failed an assert after the thread check passed)
    from mgbench.errors import MgbenchError

    with pytest.raises(MgbenchError, match="no float32 GEMMs at 1 thread.*at most 2 process.*1 x 4"):
        P.hardware(make_profile(gemm=[_gemm(2, 1, 0.16), _gemm(1, 4, 0.03)]), "fp32", ranks=2)


def test_an_unprobed_rank_count_scales_the_nearest_concurrent_row_by_the_lost_share():
    # 8 ranks x 1 thread on 2 cores: the 4-process row (share 2/4) scaled to share 2/8
    hw8 = P.hardware(concurrent_profile(), "fp32", ranks=8)
    assert hw8.peak_tflops * hw8.compute_eff == pytest.approx(0.03 * (2 / 8) / (2 / 4))
    # a profile without concurrent rows (m = 1) keeps the old arithmetic: 1-thread x 2/4
    old = P.hardware(make_profile(), "fp32", ranks=4)
    assert old.peak_tflops * old.compute_eff == pytest.approx(0.1 * 0.5)


def test_collective_latency_is_taken_at_the_configs_rank_count():
    fit = lambda n, a: {"nproc": n, "all_reduce": {"alpha_s": a, "bw_gbps": 1.0, "fit_mean_abs_error_pct": 5.0}}
    prof = make_profile(comm_at=[fit(2, 400e-6), fit(4, 5e-3)])
    assert P.collective_latency_s(prof, 2) == pytest.approx(400e-6)
    assert P.collective_latency_s(prof, 4) == pytest.approx(5e-3)
    # a rank count never probed: the profile's main fit (2 ranks), as for bandwidth
    assert P.collective_latency_s(prof, 8) == pytest.approx(400e-6)
    assert P.comm_link(prof, 4)["alpha_s"] == pytest.approx(5e-3 / 6)


def test_collectives_beyond_the_layout_terms_pay_their_latency():
    fit = {"nproc": 4, "all_reduce": {"alpha_s": 5e-3, "bw_gbps": 1.0, "fit_mean_abs_error_pct": 5.0}}
    prof = make_profile(comm_at=[fit])
    fsdp = _mini("fsdp", 4)
    assert modelled_collectives(fsdp) == 3  # ZeRO-3, one micro-batch: 2 m + 1
    # FSDP's 15 traced collectives (3 per wrapped module): 12 beyond the terms, 5 ms each
    assert collective_latency(fsdp, 15.0, prof) == pytest.approx(12 * 5e-3)
    assert collective_latency(_mini("ddp", 4), 1.0, prof) == 0.0  # the one all-reduce is the layout's own
    assert collective_latency(_mini("fsdp", 1), 15.0, prof) == 0.0  # one rank: nothing to wait for


def test_framework_residual_scales_with_blocks_and_the_share_of_the_cores():
    prof = make_profile(framework={"threads": 2, "rows": [
        {"strategy": "fsdp", "step_s": 0.026, "ops": 1610, "layers": 4, "residual_s": 0.018}]})
    assert P.framework_residual_s(prof, "fsdp", 4, 1) == pytest.approx(0.018)
    assert P.framework_residual_s(prof, "fsdp", 9, 2) == pytest.approx(0.018 * 10 / 5)  # 1 core each
    assert P.framework_residual_s(prof, "fsdp", 4, 4) == pytest.approx(0.018 / 0.5)  # half a core each
    assert P.framework_residual_s(prof, "tp", 4, 1) is None  # not probed: not priced
    assert P.framework_residual_s(make_profile(), "fsdp", 4, 1) is None  # older profile


def test_concurrent_results_merge_to_their_median():
    a = {"gemm": [{"typical_tflops": 0.1, "dtype": "float32", "shapes": [{"m": 8, "tflops_median": 1.0}]}], "ops": 3}
    b = {"gemm": [{"typical_tflops": 0.3, "dtype": "float32", "shapes": [{"m": 8, "tflops_median": 3.0}]}], "ops": 3}
    c = {"gemm": [{"typical_tflops": 0.2, "dtype": "float32", "shapes": [{"m": 8, "tflops_median": 2.0}]}], "ops": 3}
    m = median_merge([a, b, c])
    assert m["gemm"][0]["typical_tflops"] == pytest.approx(0.2)
    assert m["gemm"][0]["shapes"][0] == {"m": 8, "tflops_median": 2.0}
    assert m["gemm"][0]["dtype"] == "float32" and m["ops"] == 3
    # A count every process shares keeps its type (the median of [2, 2] would be 2.0).
    assert type(median_merge([{"ranks": 2}, {"ranks": 2}])["ranks"]) is int


def _mini(strategy, nproc, **over):
    """The mini model's config with the strategy's degrees on ``nproc`` ranks, as a suite builds it."""
    return make_config(model="mini", strategy=strategy, nproc=nproc, micro_batch=4, seq_len=128, precision="fp32",
                       **over)


def _fit(n, alpha, bw=1.0):
    return {"nproc": n, "all_reduce": {"alpha_s": alpha, "bw_gbps": bw, "fit_mean_abs_error_pct": 5.0}}


def test_a_failed_fit_at_the_rank_count_falls_back_to_the_main_fit():
    # The 4-rank all-reduce run gave no bandwidth (a fit the noise defeated): the
    # profile's main (2-rank) fit prices 4 ranks rather than no prediction at all.
    prof = make_profile(comm_at=[_fit(2, 400e-6), _fit(4, 30e-3, bw=None)])
    assert P.collective_latency_s(prof, 4) == pytest.approx(400e-6)
    assert P.comm_link(prof, 4)["bw"] == pytest.approx(2.0e9)  # make_profile's main fit: 2 GB/s on 2 ranks


def _framework(*rows):
    return {"threads": 2, "rows": [dict(zip(("strategy", "ranks", "residual_s", "collectives"), r), layers=4, ops=1600,
                                        step_s=0.1) for r in rows]}


def test_a_framework_row_probed_at_the_rank_count_is_used_as_measured():
    prof = make_profile(framework=_framework(("fsdp", 1, 0.018, 0.0), ("fsdp", 4, 0.130, 15.0)))
    # 4 ranks: the row timed with 4 ranks in one gloo group, not the 1-rank row / share
    assert P.framework_residual_s(prof, "fsdp", 4, 4) == pytest.approx(0.130)
    assert P.framework_residual_s(prof, "fsdp", 9, 4) == pytest.approx(0.130 * 10 / 5)
    # 2 ranks, not probed there: the 1-rank row at 1 core each, as before
    assert P.framework_residual_s(prof, "fsdp", 4, 2) == pytest.approx(0.018)
    assert P.framework_row(prof, "fsdp", 2)["ranks"] == 1


def test_the_n_rank_tiny_step_prices_what_the_layout_terms_do_not():
    prof = make_profile(comm_at=[_fit(2, 1e-3), _fit(4, 5e-3)],
                        framework=_framework(("fsdp", 1, 0.018, 0.0), ("fsdp", 4, 0.130, 15.0),
                                             ("ddp", 1, 0.005, 1.0), ("ddp", 4, 0.020, 1.0)))
    fsdp = _mini("fsdp", 4)
    # its residual, less the 3 gathers/reductions (at alpha / 2) the layout terms price
    assert modelled_latency_s(fsdp, 5e-3) == pytest.approx(3 * 5e-3 / 2)
    assert fixed_cost(fsdp, 15.0, prof)[0] == pytest.approx(0.130 - 3 * 5e-3 / 2)
    # two collectives more than the tiny step issued: each pays the latency
    assert fixed_cost(fsdp, 17.0, prof)[0] == pytest.approx(0.130 - 3 * 5e-3 / 2 + 2 * 5e-3)
    assert fixed_cost(_mini("ddp", 4), 1.0, prof)[0] == pytest.approx(0.020 - 5e-3)
    # no row at 2 ranks: the one-rank residual (1 core each) + 12 collectives beyond the terms
    assert fixed_cost(_mini("fsdp", 2), 15.0, prof)[0] == pytest.approx(0.018 + 12 * 1e-3)
    assert modelled_latency_s(_mini("fsdp", 4, grad_accum=2), 1.0) == pytest.approx(2.5)
    assert modelled_latency_s(_mini("fsdp", 1), 1.0) == 0.0


def test_collective_counts_follow_the_planners_zero3_gathers_in_pipelines():
    # A split-backward pipeline over FSDP keeps its stages gathered for the step: the layout
    # terms charge one gather a step (perf.zero3_gathers), and the latency subtracted for
    # them must be the same one, not 2 m (against.py once restated 2 m + 1).
    base = dict(model="mini", strategy="pp+tp+dp", nproc=4, pp=2, dp=2, tp=1, dp_mode="fsdp", grad_accum=4,
                micro_batch=1, seq_len=128, precision="fp32", device="cpu")
    zbv = RunConfig(**base, pp_schedule="zbv")
    one_f = RunConfig(**base, pp_schedule="1f1b")
    sends = 2 * (4 + 2 - 1)
    assert modelled_collectives(zbv) == 1 + 1 + sends  # one gather, one reduce-scatter
    assert modelled_collectives(one_f) == 2 * 4 + 1 + sends
    assert modelled_latency_s(zbv, 1.0) == pytest.approx(2 / 2)


def test_the_tiny_step_and_a_run_config_count_data_parallel_ranks_alike():
    # tiny_config resolves the strategy's degrees as a suite does: FSDP on 4 ranks is dp 4,
    # so its modelled gathers are subtracted (a dp of 1 would subtract none).
    from mgbench.probe.framework import tiny_config

    tiny = tiny_config("fsdp", 2, 4)
    assert (tiny.dp, tiny.tp, tiny.pp) == (4, 1, 1)
    assert modelled_latency_s(tiny, 1.0) == pytest.approx(3 / 2)
    assert tiny_config("single", 2).dp == 1


def test_the_collective_counts_are_the_step_time_models():
    # against.py counts what the step model prices: its tp all-reduces (4 a layer and
    # micro-batch, 6 with full recompute), its pipeline sends, its dp gradient collective.
    from mgbench.planner import perf

    tp = _mini("tp", 2, grad_accum=2)
    c = perf.collective_counts(tp.shape.layers, 2, 1, 1, 0, 2, 0)
    assert float(c["tp"]) == 4 * tp.shape.layers * 2 and float(c["pp"]) == float(c["dp"]) == 0.0
    assert modelled_collectives(tp) == 4 * tp.shape.layers * 2
    full = _mini("tp", 2, grad_accum=2, activation_checkpointing="full")
    assert modelled_collectives(full) == 6 * tp.shape.layers * 2
    assert float(perf.collective_counts(4, 1, 2, 2, 0, 3, 0)["pp"]) == 2 * (3 + 2 - 1)


UNTIMED = "the probe measured no framework cost for single"


def _untimed_profile():
    """A probed CPU profile whose framework rows lack "single" (the probe timed only ddp)."""
    from tests.unit.test_probe_host_terms import host_profile

    return host_profile(framework=_framework(("ddp", 1, 0.005, 1.0)))


def test_a_strategy_the_probe_never_timed_is_noted_not_priced_silently():
    prof = _untimed_profile()
    seconds, note = fixed_cost(_mini("single", 1), 0.0, prof)
    assert seconds == 0.0 and UNTIMED in note
    assert fixed_cost(_mini("ddp", 1), 0.0, prof) == (pytest.approx(0.005), None)  # timed: priced, no note


def test_predict_and_against_both_say_the_strategy_was_never_timed(tmp_path):
    from click.testing import CliRunner

    from mgbench import store
    from mgbench.cli import main
    from mgbench.planner.against import against_run
    from mgbench.probe.profile import write_profile

    from tests.factories import make_record

    prof = _untimed_profile()
    path = write_profile(prof, tmp_path / "probe.json")
    out = CliRunner().invoke(main, ["predict", "--hardware", str(path), "--model", "tiny", "--num-gpus", "1",
                                    "--micro-batch", "2", "--seq-len", "64", "--precision", "fp32"])
    assert out.exit_code == 0, out.output
    assert f"note: {UNTIMED}" in out.output

    run = store.RunDir(tmp_path / "run1")
    run.path.mkdir()
    store.write_manifest(run, {"run_id": "run1", "machine": {"hostname": "box"}})
    store.append_record(run, make_record(make_config(model="tiny", strategy="single", micro_batch=2, seq_len=64,
                                                     precision="fp32"), "run1", step_time_s=0.05))
    res = against_run(prof, "run1", str(tmp_path))
    assert res["rows"][0]["predicted_s"] is not None and UNTIMED in res["rows"][0]["note"]


def test_a_tiny_step_the_strategy_cannot_run_is_refused():
    from mgbench.probe.framework import tiny_config

    assert tiny_config("ddp", 2, 2).dp == 2
    with pytest.raises(ValueError, match="runs one process, not 2"):
        tiny_config("single", 2, 2)
