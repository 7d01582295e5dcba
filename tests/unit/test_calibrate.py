import numpy as np
import pytest

from mgbench.errors import MgbenchError
from mgbench.planner import calibrate
from tests.factories import make_config, make_record

def record(strategy, n, step):
    """A flat record as the store reads it back, built through the schema."""
    cfg = make_config(strategy=strategy, nproc=n, seq_len=64, micro_batch=2)
    return make_record(cfg, step_time_s=step, device_name="cpu: test").to_dict()


def synthetic(F=2e10, call=1e-3, alpha=2e-3):
    recs = []
    for strat in ("single", "ddp", "zero1", "fsdp", "fsdp_grad_op"):
        for n in (1, 2, 4):
            if strat == "single" and n > 1:
                continue
            f = calibrate.features(record(strat, n, 1.0))
            t = f["compute"] / F + f["comm_calls"] * call + f["comm_steps"] * alpha
            recs.append(record(strat, n, t))
    return recs


def test_fit_recovers_known_parameters_exactly():
    fit = calibrate.fit_records(synthetic())
    assert fit["achieved_flops_per_s"] == pytest.approx(2e10, rel=1e-6)
    assert fit["seconds_per_collective_call"] == pytest.approx(1e-3, rel=1e-6)
    assert fit["alpha_s_per_step"] == pytest.approx(2e-3, rel=1e-6)
    assert fit["fit_mean_abs_error_pct"] < 1e-6
    assert fit["loo_mean_abs_error_pct"] < 1e-6
    assert fit["compute_eff"] is None  # a CPU has no catalog peak


def test_leave_one_out_is_honest_about_noise():
    rng = np.random.default_rng(0)
    recs = synthetic()
    for r in recs:
        r["step_time_s"] *= 1 + rng.normal(0, 0.05)
    fit = calibrate.fit_records(recs)
    assert fit["loo_mean_abs_error_pct"] > fit["fit_mean_abs_error_pct"] > 0
    assert len(fit["rows"]) == len(recs)


def test_cpu_ranks_share_the_host():
    one, four = calibrate.features(record("ddp", 1, 1)), calibrate.features(record("ddp", 4, 1))
    assert four["compute"] == 4 * one["compute"]


def test_too_few_records():
    with pytest.raises(MgbenchError, match="at least 3"):
        calibrate.fit_records(synthetic()[:2])


def test_cpu_fit_cannot_be_applied_to_a_gpu():
    with pytest.raises(MgbenchError, match="no catalog peak"):
        calibrate.hardware_overrides(calibrate.fit_records(synthetic()))


def test_a_held_out_config_no_term_explains_is_null_with_reason():
    # single-GPU has no comm terms; the two DDP configs alone are fitted by comm terms only
    # (their step time falls as compute doubles), so the held-out single config gets ~0 s.
    recs = [record("single", 1, 1.0), record("ddp", 2, 0.5), record("ddp", 4, 0.3)]
    fit = calibrate.fit_records(recs)
    single = next(r for r in fit["rows"] if "single" in r["label"])
    assert single["loo_predicted_s"] is None and single["loo_error_pct"] is None
    assert "no time" in single["loo_null_reason"]
    assert fit["loo_predicted_configs"] == 2
    others = [r for r in fit["rows"] if r is not single]
    assert fit["loo_mean_abs_error_pct"] == pytest.approx(np.mean([abs(r["loo_error_pct"]) for r in others]))
    recs[2]["step_time_s"] = 3.0  # now compute is attributed, barely: still not a prediction
    assert next(r for r in calibrate.fit_records(recs)["rows"] if "single" in r["label"])["loo_predicted_s"] is None


# --- issue 15 defect 9: one compute rate per (precision, compile) group ----------------

def grouped_record(strategy, n, step, precision="fp32", compile=False, ac="none", peak=None, device="cpu"):
    cfg = make_config(strategy=strategy, nproc=n, seq_len=64, micro_batch=2, precision=precision, compile=compile,
                      activation_checkpointing=ac, device=device)
    return make_record(cfg, step_time_s=step, device_name="NVIDIA H100 80GB HBM3" if device == "cuda" else "cpu: t",
                       peak_tflops=peak).to_dict()


RATES = {("fp32", False): 1e10, ("bf16", False): 4e10, ("bf16", True): 6e10}


def grouped_synthetic(call=1e-3, alpha=2e-3, device="cpu", peaks=None):
    recs = []
    for (precision, compiled), F in RATES.items():
        for strat, n in (("single", 1), ("ddp", 2), ("fsdp", 2), ("zero1", 4)):
            peak = (peaks or {}).get(precision)
            f = calibrate.features(grouped_record(strat, n, 1.0, precision, compiled, device=device))
            t = f["compute"] / F + f["comm_calls"] * call + f["comm_steps"] * alpha
            recs.append(grouped_record(strat, n, t, precision, compiled, peak=peak, device=device))
    return recs


def test_each_precision_and_compile_group_gets_its_own_compute_rate():
    """Before: one F across fp32, bf16 and compiled bf16 fitted none of them (a residual
    of tens of percent); now each group's rate is recovered exactly."""
    fit = calibrate.fit_records(grouped_synthetic())
    got = {(g["precision"], g["compile"]): g for g in fit["compute_groups"]}
    assert set(got) == set(RATES)
    for key, F in RATES.items():
        assert got[key]["achieved_flops_per_s"] == pytest.approx(F, rel=1e-6)
        assert got[key]["num_configs"] == 4
    assert fit["seconds_per_collective_call"] == pytest.approx(1e-3, rel=1e-6)
    assert fit["fit_mean_abs_error_pct"] < 1e-6 and fit["loo_mean_abs_error_pct"] < 1e-6
    assert fit["achieved_flops_per_s"] is None  # no single rate describes three groups


def test_a_config_alone_in_its_group_gets_no_leave_one_out_prediction():
    recs = grouped_synthetic()[:5]  # four fp32 configs and one bf16
    fit = calibrate.fit_records(recs)
    lone = next(r for r in fit["rows"] if "bf16" in r["label"])
    assert lone["loo_predicted_s"] is None and "no other config is bf16 eager" in lone["loo_null_reason"]
    assert fit["loo_predicted_configs"] == 4


def test_predict_takes_the_efficiency_of_its_precision_preferring_compiled():
    peaks = {"fp32": 67.0, "bf16": 989.0}
    fit = calibrate.fit_records(grouped_synthetic(device="cuda", peaks=peaks))
    assert fit["accelerator"] == "h100-sxm"
    bf16 = calibrate.hardware_overrides(fit, "bf16")["hardware"]["compute_eff"]
    assert bf16 == pytest.approx(6e10 / 989e12, rel=1e-6)  # the compiled group
    assert calibrate.hardware_overrides(fit, "fp32")["hardware"]["compute_eff"] == pytest.approx(1e10 / 67e12,
                                                                                                 rel=1e-6)
    with pytest.raises(MgbenchError, match="mixes bf16 eager, bf16 compiled, fp32 eager"):
        calibrate.hardware_overrides(fit)
    with pytest.raises(MgbenchError, match="measured bf16, fp32, not fp16"):
        calibrate.hardware_overrides(fit, "fp16")


def test_every_checkpointing_mode_of_the_runner_is_fitted():
    """Before: the fit knew none / selective / full and raised KeyError on every_2nd, the
    runner's mode since the rename."""
    from mgbench.config import CHECKPOINTING

    base = calibrate.features(grouped_record("ddp", 2, 1.0))["compute"]
    got = {ac: calibrate.features(grouped_record("ddp", 2, 1.0, ac=ac))["compute"] / base for ac in CHECKPOINTING}
    shape = make_config(seq_len=64).shape
    layers, model = shape.layers, shape.flops_per_token(64)
    # The blocks' forward is recomputed, never the output head (perf's one rule; the fit
    # used to add a third of everything, head included).
    head = 6 * (shape.hidden * shape.padded_vocab + shape.hidden)  # the head and the final norm
    assert got["none"] == 1.0 and got["full"] == pytest.approx(1 + (model - head) / 3 / model)
    assert got["every_2nd"] == pytest.approx(1 + (-(-layers // 2) / layers) * (model - head) / 3 / model)
    fit = calibrate.fit_records([grouped_record(s, n, t, ac="every_2nd")
                                 for s, n, t in (("single", 1, 1.0), ("ddp", 2, 0.6), ("fsdp", 2, 0.7))])
    assert fit["num_configs"] == 3
