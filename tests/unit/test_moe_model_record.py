"""What predict and plan say of a model's published MoE runs (moe_validation.model_record):
how far the planner was off on them and in which direction, from made-up scores checked by
hand, and on the command line for an MoE model and not for a dense one."""

from __future__ import annotations

import json

import pytest

from mgbench.planner import moe_validation as V


def _fake(monkeypatch, scores, graphed):
    rows = [{"id": s["id"], "routing": "force_balanced", "dispatcher": "alltoall", "cuda_graphs": graphed[s["id"]]}
            for s in scores]
    monkeypatch.setattr(V, "file_scores", lambda: tuple(scores))
    monkeypatch.setattr(V, "runs", lambda: rows)


def test_the_record_is_the_signed_mean_and_range_of_the_models_scored_runs(monkeypatch):
    scores = [
        {"id": "a", "model": "m", "split": "fit", "error_pct": 10.0},
        {"id": "b", "model": "m", "split": "held_out", "error_pct": -20.0},
        {"id": "c", "model": "m", "split": "held_out", "error_pct": 40.0},
        {"id": "d", "model": "m", "split": "held_out", "error_pct": None},  # refused: no error
        {"id": "e", "model": "m", "split": "unscored", "error_pct": 99.0},  # unscored: left out
        {"id": "f", "model": "other", "split": "fit", "error_pct": 5.0},
    ]
    _fake(monkeypatch, scores, {"a": True, "b": False, "c": True, "d": False, "e": False, "f": False})
    rec = V.model_record("m", cuda_graphs=True)
    # by hand: (10 - 20 + 40) / 3 = +10; |.|: (10 + 20 + 40) / 3 = 23.3; graphed a and c: +25
    assert (rec["rows"], rec["fit"], rec["held_out"]) == (3, 1, 2)
    assert rec["mean_pct"] == pytest.approx(10.0) and rec["mean_abs_pct"] == pytest.approx(70.0 / 3)
    assert (rec["low_pct"], rec["high_pct"]) == (-20.0, 40.0)
    assert rec["class_rows"] == 2 and rec["class_mean_pct"] == pytest.approx(25.0)
    note = V.model_record_note("m", cuda_graphs=False)
    assert "m in the published MoE runs: 3 scored (1 fit, 2 held out), predicted throughput +10.0% on average" in note
    assert "the 1 with MoE layers eager: -20.0%" in note
    assert V.model_record("nobody") is None
    assert "no published MoE run of it is scored" in V.model_record_note("nobody")


def test_predict_says_it_for_an_moe_model_and_not_for_a_dense_one(cli):
    moe = cli("predict", "--model", "qwen3-30b-a3b", "--system", "dgx-b200", "--num-gpus", "8", "--ep", "8", "--json")
    assert moe.returncode == 0, moe.stderr
    rec = V.model_record("qwen3-30b-a3b", cuda_graphs=False)
    line = [n for n in json.loads(moe.stdout)["notes"] if n.startswith("qwen3-30b-a3b in the published MoE runs")]
    assert len(line) == 1 and f"{rec['rows']} scored" in line[0] and f"{rec['mean_pct']:+.1f}%" in line[0]
    dense = cli("predict", "--model", "llama3-8b", "--system", "dgx-b200", "--num-gpus", "8", "--json")
    assert not any("published MoE runs" in n for n in json.loads(dense.stdout)["notes"])
