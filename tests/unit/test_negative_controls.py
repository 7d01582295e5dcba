"""Negative controls (inject = bug:...) run their check window only and read "checked":
the verdict is the record, said as caught or NOT CAUGHT wherever records are shown, and
records of schema 3 (which timed these configs and read "ok") are read back as checked.
End to end through `mgbench run`: tests/integration/test_modern.py and test_hf_vision_cpu.py."""

import json
import shutil
from pathlib import Path

import pandas as pd

from mgbench import store
from mgbench.record import SCHEMA_VERSION, control_verdict
from mgbench.report.html import warnings
from mgbench.runner.launch import describe
from mgbench.show import TABLE_COLUMNS, TIMED_COLUMNS, render, table_rows
from tests.factories import make_config, make_record, make_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
COLUMN = {k: i for i, (k, _) in enumerate(TABLE_COLUMNS)}


def _control(correct, inject="bug:grad_sum", **figures):
    cfg = make_config(strategy="ddp", nproc=2, inject=inject)
    return make_record(cfg, status="checked", correct=correct, **figures).to_dict()


def test_a_caught_bug_reads_caught_and_a_missed_one_not_caught():
    caught = _control(False, check_mismatches=["grad_norm"], correct_reason="grad_norm differs")
    missed = _control(True, check_mismatches=[], correct_reason=None)
    unjudged = _control(None, correct_reason="the single-process reference does not fit on one device")
    assert control_verdict(caught) == "bug:grad_sum caught: grad_norm differ from the reference"
    assert control_verdict(missed).startswith("bug:grad_sum NOT CAUGHT")
    assert control_verdict(unjudged) == "bug:grad_sum not judged: the single-process reference does not fit on one device"
    # The progress line: not timed, and the verdict.
    assert describe(caught) == "checked (negative control, not timed): bug:grad_sum caught: grad_norm differ from the reference"
    assert "NOT CAUGHT" in describe(missed)


def test_show_and_the_report_warn_only_about_a_missed_bug(tmp_path):
    caught = _control(False, check_mismatches=["grad_norm"], correct_reason="grad_norm differs")
    missed = _control(True, "bug:no_grad_sync", check_mismatches=[], correct_reason=None)
    cfg = make_config(strategy="ddp", nproc=2)
    run = make_run(tmp_path, "r", [make_record(cfg, step_times_s=[0.1, 0.1, 0.1], correct=True)],
                   suite={"name": "controls"}, status="complete")
    for rec in (caught, missed):
        with open(run.records, "a") as f:
            f.write(json.dumps(rec) + "\n")
    text = render(run.path)
    assert "negative control: bug:grad_sum caught" in text and "negative control: bug:no_grad_sync NOT CAUGHT" in text
    assert "checked: None" not in text  # no error or skip reason is looked for
    # The table: the verdict in the correct column, no timing cells (none were measured).
    rows = {row[-1]: row for row in table_rows(store.read_records(run.path)) if row[COLUMN["status"]] == "checked"}
    assert set(rows) == {"caught", "NOT CAUGHT"}
    assert all(rows["caught"][COLUMN[k]] == "-" for k in TIMED_COLUMNS)
    got = warnings(pd.DataFrame([caught, missed]))
    assert len(got) == 1 and "NOT CAUGHT" in got[0]  # a caught bug is the expected outcome: no warning


def test_a_schema_3_folder_reads_its_negative_control_as_checked(tmp_path):
    """Committed fixture written by mgbench at schema 3: a clean ddp config and its
    bug:grad_sum control, both "ok" and timed there."""
    run = tmp_path / "v3-controls"
    shutil.copytree(FIXTURES / "v3-controls", run)
    raw = {r["inject"]: r for r in map(json.loads, (run / "records.jsonl").read_text().splitlines())}
    assert {r["schema_version"] for r in raw.values()} == {3} and {r["status"] for r in raw.values()} == {"ok"}
    recs = {r["inject"]: r for r in store.read_records(run)}
    assert {r["schema_version"] for r in recs.values()} == {SCHEMA_VERSION}
    assert recs["none"]["status"] == "ok" and recs["bug:grad_sum"]["status"] == "checked"
    assert recs["bug:grad_sum"]["correct"] is False
    # Nothing dropped: the figures written then are kept, out of the views that read ok
    # and out of the table, which shows the verdict only.
    assert recs["bug:grad_sum"]["step_time_s"] == raw["bug:grad_sum"]["step_time_s"]
    (row,) = [row for row in table_rows(list(recs.values())) if row[COLUMN["status"]] == "checked"]
    assert row[-1] == "caught" and row[COLUMN["step_time_s"]] == "-"
    df = store.load([run])
    assert list(df[df["status"] == "ok"]["inject"]) == ["none"]


def test_a_negative_control_runs_once_whatever_the_rounds(tmp_path):
    """rounds = 2 (the worker's loop, in process on a world-1 gloo group): the clean config
    is measured in two rounds, its negative control checked once and never timed."""
    import torch

    from mgbench.process_group import gloo_group
    from mgbench.runner.worker import run_configs
    from mgbench.telemetry.energy import EnergyMeter

    common = dict(strategy="single", nproc=1, rounds=2, warmup_steps=1, measured_steps=2, check_steps=2, seq_len=16,
                  track_memory=False)
    clean, control = make_config(**common), make_config(**common, inject="bug:freeze")
    run = make_run(tmp_path, "r")
    with gloo_group():
        run_configs([clean, control], torch.device("cpu"), EnergyMeter("cpu", 0, 0), run, "r")
    recs = {r["inject"]: r for r in store.read_records(run.path)}
    assert len(store.read_records(run.path)) == 2  # one record each
    assert recs["none"]["status"] == "ok" and len(recs["none"]["repeat_medians_s"]) == 2  # both rounds
    ctl = recs["bug:freeze"]
    assert ctl["status"] == "checked" and ctl["correct"] is False and "params" in ctl["check_mismatches"]
    assert ctl["step_time_s"] is None and ctl["tokens_per_s"] is None
