import random

import pytest

from mgbench import store
from mgbench.errors import MgbenchError
from mgbench.report.compare import Gate, compare_runs, gate_failures, parse_gate


def write_run(root, run_id, factor, seed):
    rng = random.Random(seed)
    run = store.create_run_dir(root, run_id)
    store.write_json_atomic(run / "manifest.json", {"run_id": run_id, "machine": {}})
    for strat in ("single", "ddp"):
        times = [0.1 * factor * (1 + rng.gauss(0, 0.03)) for _ in range(20)]
        med = sorted(times)[10]
        store.append_record(run, {"config_id": f"{strat}-{run_id}", "label": strat, "status": "ok", "strategy": strat,
                                  "nproc": 1, "step_times_s": times, "step_time_s": med, "tokens_per_s": 1000 / med,
                                  "inject": "none" if factor == 1 else "slow", "seed": 0})
    return run


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
    run = store.create_run_dir(tmp_path, "other")
    store.write_json_atomic(run / "manifest.json", {"run_id": "other", "machine": {}})
    store.append_record(run, {"config_id": "x", "status": "ok", "strategy": "fsdp", "nproc": 4})
    with pytest.raises(MgbenchError, match="no config in common"):
        compare_runs("a", "other", tmp_path)
