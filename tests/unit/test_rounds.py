"""Interleaved rounds: the order configs are measured in, and how rounds add up."""

import dataclasses

import pytest

from mgbench.runner import worker
from tests.factories import make_config, make_rank_figures, make_record


def cfg(cid: str, rounds: int):
    return make_config(seq_len=8, warmup_steps=1, measured_steps=2, check_steps=0, rounds=rounds, config_id=cid)


def test_round_k_of_every_config_before_round_k_plus_1(monkeypatch, tmp_path):
    calls, finished, appended = [], [], []

    def fake_round(c, device, meter, run_dir, round_no, rounds):
        assert rounds == 3
        calls.append((c.config_id, round_no == c.rounds))
        return {"round": len([x for x in calls if x[0] == c.config_id])}

    monkeypatch.setattr(worker, "measure_round", fake_round)
    monkeypatch.setattr(worker, "merge_rounds", lambda parts: [p["round"] for p in parts])
    monkeypatch.setattr(worker, "finish_config",
                        lambda c, mine, *a: finished.append((c.config_id, mine)) or make_record(c))
    monkeypatch.setattr(worker.dist, "barrier", lambda: None)
    monkeypatch.setattr(worker.store, "append_record", lambda run_dir, rec: appended.append(rec))
    worker.run_configs([cfg("a", 3), cfg("b", 1), cfg("c", 2)], None, None, tmp_path, "r")
    assert calls == [("a", False), ("b", True), ("c", False), ("a", False), ("c", True), ("a", True)]
    # Each config is finished (record written) right after its own last round, with all its rounds.
    assert finished == [("b", [1]), ("c", [1, 2]), ("a", [1, 2, 3])]
    assert len(appended) == 3


def part(windows, measured_s, energy, mem, breakdown=None):
    return make_rank_figures(windows=windows, init_s=1.0, warmup_s=2.0, measured_s=measured_s, busy_s=measured_s / 2,
                             breakdown=breakdown, losses=[5.0, 4.0], mem_peak_gib=mem, energy_j=energy,
                             window_s=measured_s, energy_method="rapl", energy_reason=None)


def test_merge_rounds_adds_samples_time_and_energy():
    a = part([[0.1, 0.2]], 0.3, 3.0, 1.5)
    b = part([[0.3, 0.4]], 0.7, 7.0, 2.0, breakdown={"window_s": 1.0})
    m = worker.merge_rounds([a, b])
    assert m.windows == [[0.1, 0.2], [0.3, 0.4]]
    assert m.busy_steps == [0.1, 0.2, 0.3, 0.4]
    assert m.measured_s == pytest.approx(1.0) and m.window_s == pytest.approx(1.0)
    assert m.energy_j == pytest.approx(10.0)
    assert m.mem_peak_gib == 2.0
    assert m.init_s == 1.0 and m.losses == [5.0, 4.0]  # the first round's build and losses
    assert m.breakdown == {"window_s": 1.0}  # profiled once, in the last round
    # One round without an energy reading makes the sum unknown, with the reason kept.
    c = dataclasses.replace(part([[0.5, 0.5]], 1.0, None, 1.0), energy_reason="counter read failed")
    m2 = worker.merge_rounds([a, c])
    assert m2.energy_j is None and m2.energy_reason == "counter read failed"
    assert worker.merge_rounds([a]) is a


def test_rounds_is_a_suite_key_with_its_bounds(tmp_path):
    from mgbench.errors import MgbenchError
    from mgbench.suite import expand, load_suite

    p = tmp_path / "s.toml"
    p.write_text('name = "r"\n[sweep]\nmodel = "tiny"\nrounds = 3\n')
    assert [c.rounds for c in expand(load_suite(p), "cpu", 1)] == [3]
    p.write_text('name = "r"\n[sweep]\nmodel = "tiny"\nrounds = 0\n')
    with pytest.raises(MgbenchError, match="rounds"):
        expand(load_suite(p), "cpu", 1)


def test_step_idle_fraction_ignores_a_stolen_step():
    # Four steps of 0.1 s wall, 0.06 s busy (40% idle); one step where the VM took the
    # core for 0.5 s: the window totals would read 1 - 0.3 / 1.0 = 70% idle.
    fig = make_rank_figures(windows=[[0.1, 0.1, 0.6, 0.1, 0.1]], busy_steps=[0.06] * 5, busy_s=0.3, measured_s=1.0)
    assert worker.step_idle_fraction(fig) == pytest.approx(0.4)
    # Lists that do not line up fall back to the window totals.
    assert worker.step_idle_fraction(dataclasses.replace(fig, busy_steps=[0.06])) == pytest.approx(0.7)


def test_straggler_rule_on_synthetic_busy_times(monkeypatch):
    """A rank is a straggler when its median busy time per step exceeds the least busy
    rank's by STRAGGLER_FACTOR: 5% noise is not, a rank 1.5x busier is; one slow step
    (a page fault) does not make a rank a straggler."""
    monkeypatch.setattr(worker, "cores_shared", lambda: None)
    cpu = type("D", (), {"type": "cpu"})()
    even = [make_rank_figures(r, busy_steps=[0.10 * (1 + 0.05 * r)] * 6) for r in range(2)]
    assert worker.rank_spread(None, even, cpu)["straggler_ranks"] == []
    lagging = even + [make_rank_figures(2, busy_steps=[0.15] * 6)]
    out = worker.rank_spread(None, lagging, cpu)
    assert out["straggler_ranks"] == [2] and out["rank_spread_pct"] == pytest.approx(50)
    spike = even + [make_rank_figures(2, busy_steps=[0.10] * 5 + [1.0])]
    assert worker.rank_spread(None, spike, cpu)["straggler_ranks"] == []
