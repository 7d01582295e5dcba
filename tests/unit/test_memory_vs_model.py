"""Tracked memory against the analytic model in the report layer: the per-config rows, the
10% verdict, the figure and the report's Memory section."""

from __future__ import annotations

import pandas as pd
import pytest

from mgbench.planner.memory import memory_for_config
from mgbench.report import figures, html
from mgbench.report.memory_vs_model import MODEL_OF_TRACKED, compare_record, compare_records, format_table
from mgbench.telemetry.memory import TRACKED_CATEGORIES
from tests.factories import make_config, make_record


def _tracked(cfg, scale: float = 1.0) -> dict:
    """Record fields of a tracked step whose categories are the model's own prediction x
    ``scale`` (temporaries split over the tracked categories the model folds into them)."""
    pred = memory_for_config(cfg)
    cats = dict.fromkeys(TRACKED_CATEGORIES, 0)
    cats.update(params=pred["params_bytes"], grads=pred["grads_bytes"], optimizer=pred["optimizer_bytes"],
                activations=pred["activations_bytes"], temporaries=pred["temporaries_bytes"] / 2,
                comm=pred["temporaries_bytes"] / 2)
    cats = {k: int(round(v * scale)) for k, v in cats.items()}
    return {**{f"mem_tracked_{k}_bytes": v for k, v in cats.items()},
            "mem_tracked_peak_bytes": sum(cats.values()), "mem_tracked_reason": None}


def _records():
    a, b = make_config(strategy="ddp", nproc=2), make_config(strategy="fsdp", nproc=2, micro_batch=4)
    c = make_config(strategy="single", nproc=1)
    return [make_record(a, step_times_s=[0.1] * 4, **_tracked(a)).to_dict(),
            make_record(b, step_times_s=[0.1] * 4, **_tracked(b, scale=1 / 1.2)).to_dict(),
            make_record(c, step_times_s=[0.1] * 4, mem_tracked_reason="compile = true: ...").to_dict()]


def test_rows_hold_both_sides_per_category_and_the_error_of_the_total():
    agree, off, untracked = compare_records(_records())
    assert agree["error_pct"] == pytest.approx(0.0, abs=1e-6) and agree["agrees"] is True
    for key, cats in MODEL_OF_TRACKED.items():
        assert agree[f"tracked_{key}"] == pytest.approx(agree[f"predicted_{key}"], abs=2)
    # The negative control: tracked 1/1.2 of the prediction, so the model is 20% high.
    assert off["error_pct"] == pytest.approx(20.0, rel=1e-4) and off["agrees"] is False
    assert off["predicted_total_bytes"] == pytest.approx(memory_for_config(make_config(
        strategy="fsdp", nproc=2, micro_batch=4))["total_bytes"])
    assert untracked["reason"] == "not tracked: compile = true: ..." and "error_pct" not in untracked
    table = format_table([agree, off, untracked])
    assert "+20.0" in table and "not tracked" in table


def test_a_failed_config_is_not_compared():
    rec = make_record(make_config(), status="error", error="boom").to_dict()
    assert compare_records([rec]) == []
    assert compare_record(rec)["reason"] == "status error"


def test_figure_and_report_section_show_tracked_beside_predicted():
    df = pd.DataFrame(_records())
    fig, caption = figures.memory_vs_model(df)
    assert len(fig.data) == len(MODEL_OF_TRACKED)  # one stacked trace per model category
    kinds = list(fig.data[0].x[1])
    assert kinds == ["tracked", "predicted", "tracked", "predicted"]  # the untracked config is left out
    assert "(+0%)" in fig.data[0].x[0][0] and "(+20%)" in fig.data[0].x[0][2]
    assert "mgbench memory" in caption
    section = html.memory_section(df, None, "")
    assert "Tracked peak vs the analytic model" in section
    assert "agrees" in section and "off by more than 10%" in section and "not tracked: compile" in section


def test_no_figure_for_runs_without_tracked_memory():
    rec = make_record(make_config(), step_times_s=[0.1] * 4).to_dict()
    assert figures.memory_vs_model(pd.DataFrame([rec])) is None


def test_records_read_through_a_table_give_the_configs_they_were_run_with():
    # A table of records (store.load, what `mgbench report` reads) gives a value one
    # record left out as NaN in the others, and holds an integer column with gaps as
    # floats. A record of a model at vocab_multiple 1 (left out of the record) beside one
    # at 64, and a failed record without a micro_batch, made every config of the table
    # "no prediction: ... vocab_multiple ... got None" (found on results/h200-gpu-quick-2).
    from mgbench.record import config_from_record

    a = make_config(strategy="ddp", nproc=2)
    b = make_config(strategy="fsdp", nproc=2, micro_batch=4, model={**a.model.to_dict(), "vocab_multiple": 64})
    direct = [make_record(c, step_times_s=[0.1] * 4, **_tracked(c)).to_dict() for c in (a, b)]
    assert "model_vocab_multiple" not in direct[0] and direct[1]["model_vocab_multiple"] == 64
    failed = {k: v for k, v in make_record(make_config(), status="error", error="boom").to_dict().items()
              if k != "micro_batch"}
    table = pd.DataFrame([*direct, failed]).to_dict("records")
    assert isinstance(table[0]["micro_batch"], float) and table[0]["model_vocab_multiple"] != 64  # NaN
    for rec, cfg in zip(table, (a, b)):
        got = config_from_record(rec)
        assert got == cfg and isinstance(got.micro_batch, int) and got.model.vocab_multiple == cfg.model.vocab_multiple
    rows = compare_records(table)
    assert [r["reason"] for r in rows] == [None, None] and all(r["agrees"] for r in rows)
    # An image model's record beside a decoder's: each rebuilds its own model (the
    # decoder's row had read the NaN of model_vision as a vision model named nan).
    vit = make_config(workload="vision", model="vit_tiny", image_size=32)
    mixed = pd.DataFrame([direct[0], make_record(vit, step_times_s=[0.1] * 4).to_dict()]).to_dict("records")
    assert config_from_record(mixed[0]) == a and config_from_record(mixed[1]) == vit
