import random

import pytest

from mgbench import stats
from mgbench.errors import MgbenchError
from mgbench.report.compare import Gate, compare_runs, gate_failures, parse_gate, significance
from tests.factories import make_config, make_record, make_run


def write_run(root, run_id, factor, seed):
    rng = random.Random(seed)
    recs = []
    for strat in ("single", "ddp"):
        times = [0.1 * factor * (1 + rng.gauss(0, 0.03)) for _ in range(20)]
        # fault injection is measurement procedure, not identity: configs still match
        cfg = make_config(strategy=strat, inject="none" if factor == 1 else "slow@rank=0,factor=1.3")
        recs.append(make_record(cfg, run_id, step_times_s=times))
    return make_run(root, run_id, recs)


def test_verdicts(tmp_path):
    write_run(tmp_path, "a", 1.0, 1)
    write_run(tmp_path, "b", 1.0, 2)
    write_run(tmp_path, "slow", 1.3, 3)
    same = compare_runs("a", "b", tmp_path)
    assert [r["verdict"] for r in same] == ["~", "~"]
    slow = compare_runs("a", "slow", tmp_path)
    assert [r["verdict"] for r in slow] == ["worse", "worse"]
    assert all(r["p_value"] < 0.001 and r["change_pct"] == pytest.approx(-23, abs=3) for r in slow)
    # Significant but under the threshold: ~
    assert all(r["verdict"] == "~" for r in compare_runs("a", "slow", tmp_path, threshold_pct=50))
    fails = gate_failures(slow, [Gate("tokens_per_s", -5.0)])
    assert len(fails) == 2 and "breaks the gate tokens_per_s:-5%" in fails[0]
    assert gate_failures(slow, [Gate("tokens_per_s", -40.0)]) == []
    step = compare_runs("a", "slow", tmp_path, metric="step_time_s")
    assert gate_failures(step, [Gate("step_time_s", -5.0)])  # longer steps are worse too


def test_gate_syntax():
    assert parse_gate("tokens_per_s:-5%") == Gate("tokens_per_s", -5.0)
    with pytest.raises(MgbenchError, match="METRIC:-N%"):
        parse_gate("tokens_per_s:-5")


def test_runs_of_different_suites(tmp_path):
    write_run(tmp_path, "a", 1.0, 1)
    make_run(tmp_path, "other", [make_record(make_config(strategy="fsdp", nproc=4))])
    with pytest.raises(MgbenchError, match="no config in common"):
        compare_runs("a", "other", tmp_path)


def drifting_record(rng, factor, windows=10, steps=4):
    """Steps that share their window's machine speed (drawn 20% wide), as on a noisy VM."""
    meds, times = [], []
    for _ in range(windows):
        speed = 1 + rng.uniform(-0.2, 0.2)
        w = [0.1 * factor * speed * (1 + rng.gauss(0, 0.01)) for _ in range(steps)]
        times += w
        meds.append(sorted(w)[steps // 2])
    med = sorted(times)[len(times) // 2]
    return {"step_times_s": times, "repeat_medians_s": meds, "tokens_per_s": 1000 / med}


def test_window_medians_tame_correlated_noise():
    """With drift shared by the steps of a window, a test on steps calls identical configs
    different far more often than 5% of the time; on window medians it stays near 5%, and
    a 30% slowdown is still found."""
    rng = random.Random(7)
    trials = 200
    step_false = window_false = found = 0
    for _ in range(trials):
        a, b, slow = drifting_record(rng, 1.0), drifting_record(rng, 1.0), drifting_record(rng, 1.3)
        step_false += stats.mann_whitney_u(a["step_times_s"], b["step_times_s"])[1] < 0.05
        p, basis = significance(a, b)
        assert basis == "window medians (10 vs 10)"
        window_false += p < 0.05
        found += significance(a, slow)[0] < 0.05
    assert step_false / trials > 0.2
    assert window_false / trials < 0.1
    assert found / trials > 0.95


def test_few_windows_fall_back_to_steps():
    rng = random.Random(1)
    a, b = drifting_record(rng, 1.0, windows=3, steps=10), drifting_record(rng, 1.0, windows=3, steps=10)
    p, basis = significance(a, b)
    assert basis.startswith("steps (fewer than 5 windows")
    assert p == stats.mann_whitney_u(a["step_times_s"], b["step_times_s"])[1]


def test_too_few_steps_to_test_leave_the_threshold_to_decide_and_the_gate_bites(tmp_path):
    """A run of 4 measured steps (smoke's, until 2026-11-27) cannot be tested: p was
    reported as 1.0, so a 54% slowdown read as noise and passed a --fail-on gate."""
    cfg = make_config(strategy="ddp", nproc=2)
    make_run(tmp_path, "a", [make_record(cfg, "a", step_times_s=[0.10, 0.11, 0.10, 0.12])])
    make_run(tmp_path, "b", [make_record(cfg, "b", step_times_s=[0.23, 0.22, 0.24, 0.23])])
    row = compare_runs("a", "b", tmp_path, metric="tokens_per_s")[0]
    assert row["p_value"] is None and row["p_basis"].startswith("no test: 4 vs 4 measured steps")
    assert row["verdict"] == "worse" and row["change_pct"] < -50
    assert "(no test)" in gate_failures([row], [Gate("tokens_per_s", -5.0)])[0]
    # Within the threshold, no verdict either way (negative control).
    make_run(tmp_path, "c", [make_record(cfg, "c", step_times_s=[0.105, 0.11, 0.10, 0.115])])
    near = compare_runs("a", "c", tmp_path, metric="tokens_per_s")[0]
    assert near["verdict"] == "~" and gate_failures([near], [Gate("tokens_per_s", -5.0)]) == []


def test_peak_memory_has_no_test_and_the_threshold_decides(tmp_path):
    for run_id, gib in (("a", 2.0), ("b", 2.1), ("c", 2.6)):
        make_run(tmp_path, run_id, [make_record(make_config(strategy="ddp", nproc=2), run_id, mem_peak_gib=gib,
                                                step_times_s=[0.1] * 20)])
    small = compare_runs("a", "b", tmp_path, metric="mem_peak_gib")[0]
    assert small["p_value"] is None and small["verdict"] == "~" and small["p_basis"].startswith("no test")
    big = compare_runs("a", "c", tmp_path, metric="mem_peak_gib")[0]
    assert big["verdict"] == "worse" and big["change_pct"] == pytest.approx(30.0)
    assert "(no test)" in gate_failures([big], [Gate("mem_peak_gib", -5.0)])[0]


@pytest.mark.parametrize("field,base,new", [
    ("grad_compression", "none", "fp16"),
    ("dp_mode", "ddp", "fsdp"),
    ("model", "tiny", {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 256}),
    ("model", {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 256},
     {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 256, "kv_heads": 2}),
])
def test_configs_differing_in_any_workload_field_stay_apart(tmp_path, field, base, new):
    """The bug this schema fixed: ddp with and without gradient compression were merged
    into one row, so a 2x slowdown of the uncompressed config was invisible."""
    from mgbench.catalog import model_shape
    from mgbench.model_shape import ModelShape

    def cfg(value):
        if field == "model":
            value = model_shape(value) if isinstance(value, str) else ModelShape.from_dict({"name": "custom", **value})
        extra = {"strategy": "pp+tp+dp", "nproc": 4, "dp": 2, "tp": 1, "pp": 2} if field == "dp_mode" else \
            {"strategy": "ddp", "nproc": 2}
        return make_config(**extra, **{field: value})

    a, b = cfg(base), cfg(new)
    assert a.label != b.label
    make_run(tmp_path, "base", [make_record(a, step_times_s=[0.1] * 20), make_record(b, step_times_s=[0.1] * 20)])
    make_run(tmp_path, "new", [make_record(a, step_times_s=[0.2] * 20), make_record(b, step_times_s=[0.1] * 20)])
    rows = {r["label"]: r for r in compare_runs("base", "new", tmp_path, metric="step_time_s")}
    assert len(rows) == 2
    assert rows[a.label]["change_pct"] == pytest.approx(100.0) and rows[b.label]["change_pct"] == pytest.approx(0.0)


def test_configs_of_one_workload_swept_over_seeds_and_faults_are_not_merged(tmp_path):
    """Seed and inject are procedure keys (two runs that differ there still compare), but
    inside a run they tell configs apart: a clean config must never be compared with a
    fault-injected one of the same workload."""
    def run(run_id, slow_seed1):
        recs = []
        for seed in (0, 1):
            for inject in ("none", "bug:freeze"):
                t = 0.2 if (seed == 1 and slow_seed1 and inject == "none") else 0.1
                recs.append(make_record(make_config(strategy="ddp", nproc=2, seed=seed, inject=inject), run_id,
                                        step_times_s=[t] * 10))
        return make_run(tmp_path, run_id, recs)

    run("a", False)
    run("b", True)
    rows = compare_runs("a", "b", tmp_path, metric="step_time_s")
    assert len(rows) == 4
    changed = [r for r in rows if r["change_pct"]]
    assert len(changed) == 1 and changed[0]["change_pct"] == pytest.approx(100.0)
    # A longer window in the new run is not a separating key: configs still match.
    make_run(tmp_path, "c", [make_record(make_config(strategy="ddp", nproc=2, measured_steps=30), "c",
                                         step_times_s=[0.1] * 30)])
    make_run(tmp_path, "d", [make_record(make_config(strategy="ddp", nproc=2), "d", step_times_s=[0.1] * 10)])
    assert len(compare_runs("c", "d", tmp_path)) == 1


def test_a_config_that_turns_wrong_or_a_control_that_stops_catching_fails_the_comparison(tmp_path, cli):
    """Correctness regressions fail `compare` (exit 1) whatever the metric and the gates."""
    times = [0.1] * 10
    clean = make_config(strategy="ddp", nproc=2)
    control = make_config(strategy="ddp", nproc=2, inject="bug:grad_sum")
    make_run(tmp_path / "results", "base", [
        make_record(clean, "base", step_times_s=times, correct=True),
        make_record(control, "base", status="checked", correct=False, check_mismatches=["grad_norm"])])
    make_run(tmp_path / "results", "same", [
        make_record(clean, "same", step_times_s=times, correct=True),
        make_record(control, "same", status="checked", correct=False, check_mismatches=["grad_norm"])])
    make_run(tmp_path / "results", "broken", [
        make_record(clean, "broken", step_times_s=times, correct=False, correct_reason="grad_norm differs by 1.0"),
        make_record(control, "broken", status="checked", correct=True, check_mismatches=[])])
    rows = {r["new_status"]: r for r in compare_runs("base", "broken", tmp_path / "results")}
    assert rows["ok"]["correct_change"] == ("matched the single-process reference and now differs: "
                                            "grad_norm differs by 1.0")
    assert rows["checked"]["correct_change"].startswith("bug:grad_sum was caught and now is NOT CAUGHT")
    assert all(r["correct_change"] is None for r in compare_runs("base", "same", tmp_path / "results"))
    assert all(r["correct_change"] is None for r in compare_runs("broken", "base", tmp_path / "results"))  # fixed
    p = cli("compare", "base", "broken")
    assert p.returncode == 1 and p.stdout.count("CORRECTNESS REGRESSED: ") == 2, p.stdout + p.stderr
    assert cli("compare", "base", "same").returncode == 0


@pytest.mark.parametrize("new_status", ["oom", "error", "timeout", "interrupted"])
def test_a_gate_fails_when_a_config_stops_producing_the_metric(tmp_path, new_status):
    """A --fail-on gate passed (exit 0) when a config went from ok to oom, error, timeout or
    interrupted in NEW, or was not in NEW at all (an interrupted run of 2 of 9 configs):
    the gated metric vanished, which is no improvement. Configs BASE alone has are listed."""
    times = [0.1] * 10
    one, two = make_config(strategy="ddp", nproc=2), make_config(strategy="single", nproc=1)
    make_run(tmp_path, "base", [make_record(one, "base", step_times_s=times), make_record(two, "base", step_times_s=times)])
    make_run(tmp_path, "new", [make_record(one, "new", status=new_status)])
    rows = {r["config_id"]: r for r in compare_runs("base", "new", tmp_path)}
    assert {r["verdict"] for r in rows.values()} == {f"ok -> {new_status}", "ok -> missing"}
    fails = gate_failures(list(rows.values()), [Gate("tokens_per_s", -5.0)])
    assert len(fails) == 2 and all("measured in BASE and not in NEW" in f for f in fails)
    assert any(f"(ok -> {new_status})" in f for f in fails) and any("(ok -> missing)" in f for f in fails)
    # The other way round (a config now measured that was not) breaks no gate.
    back = compare_runs("new", "base", tmp_path)
    assert gate_failures(back, [Gate("tokens_per_s", -5.0)]) == []


def test_a_base_of_zero_has_no_relative_change_and_stays_valid_json(tmp_path):
    cfg = make_config(strategy="ddp", nproc=2)
    make_run(tmp_path, "z", [make_record(cfg, "z", step_times_s=[0.1] * 10, energy_per_token_j=0.0)])
    make_run(tmp_path, "y", [make_record(cfg, "y", step_times_s=[0.1] * 10, energy_per_token_j=0.5)])
    row = compare_runs("z", "y", tmp_path, metric="energy_per_token_j")[0]
    assert row["change_pct"] is None and row["verdict"] == "n/a: base is 0"
    import json
    json.loads(json.dumps(row, allow_nan=False))  # no Infinity
