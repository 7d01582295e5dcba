"""One-line errors that pointed the wrong way (an audit of 2026-11-29): each now names what
is wrong, exits 2 and shows no traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mgbench.cli import main
from tests.factories import make_config, make_record, make_run


def fails_saying(args, says, cwd=None):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    return r


@pytest.mark.parametrize("given", ["m/config.json", "config.json", "hf:m/config.json"])
def test_a_config_path_given_as_a_model_points_to_hf(given):
    path = given.removeprefix("hf:")
    fails_saying(["memory", "--model", given], f"a Hugging Face config is read with --hf {path}")


def test_an_unknown_preset_names_the_command_line_dims():
    fails_saying(["memory", "--model", "llama3-8x"], "--layers --hidden --heads --vocab on the command line")


def test_a_suite_that_is_a_folder_or_not_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s").mkdir()
    fails_saying(["run", "s", "--dry-run"], "is a folder: give a .toml file in it")
    (tmp_path / "b.toml").write_bytes(b"\xff\xfe name")
    fails_saying(["run", "b.toml", "--dry-run"], "cannot read it as a TOML file")


def test_data_paths_that_are_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    fails_saying(["data", "make", "afile/sub", "--tokens", "1000", "--vocab", "256"], "afile is a file, not a folder")
    fails_saying(["run", "smoke", "--set", "strategy=ddp", "--set", "nproc=1", "--set", "data=disk", "--set",
                  "data_path=afile", "--no-report", "--no-projection"], "afile is a file, not a dataset folder")
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_compare_says_a_comm_sweep_is_not_a_training_run(tmp_path):
    make_run(tmp_path, "c1", [], kind="comm")
    make_run(tmp_path, "r1", [make_record(make_config(strategy="ddp", nproc=2), "r1", step_times_s=[0.1] * 5)])
    for pair in (["c1", "c1"], ["r1", "c1"]):
        fails_saying(["compare", *pair, "--results-dir", str(tmp_path)], "c1 is a `mgbench comm` sweep")


def test_readers_take_a_manifest_without_a_suite_and_a_window_without_power(tmp_path, monkeypatch):
    """show and report indexed manifest["suite"]; the energy figure formatted a null power."""
    import pandas as pd

    from mgbench.report import figures

    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "results", "n", [make_record(make_config(strategy="ddp", nproc=2), "n", step_times_s=[0.1] * 5)],
             machine={"cpu_model": "cpu"}, status="complete")
    shown = CliRunner().invoke(main, ["show", "n"])
    assert shown.exit_code == 0 and "suite -" in shown.output.splitlines()[0], shown.output
    assert CliRunner().invoke(main, ["report", "n", "-o", "n.html"]).exit_code == 0
    df = pd.DataFrame([{"status": "ok", "config_id": "a", "label": "a", "energy_per_token_j": 0.5, "power_w": None}])
    assert figures.energy(df) is not None


def test_run_refuses_a_report_place_it_could_not_use_before_the_sweep(tmp_path, monkeypatch):
    """A --reports-dir that is a file, or a run id too long for the report's file name, ended in
    a traceback after the whole sweep."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")
    fails_saying(["run", "smoke", "--set", "strategy=ddp", "--set", "nproc=1", "--no-projection", "--reports-dir", "f"],
                 "--reports-dir f is a file")
    fails_saying(["run", "smoke", "--no-projection", "--run-id", "x" * 201], "it is longer than 200 bytes")
    assert not (tmp_path / "results").exists()


def test_report_refuses_two_runs_with_one_id(tmp_path, monkeypatch):
    """Two folders holding run id exp1 merged in the report (its scaling plot took the max of
    both at each device count)."""
    monkeypatch.chdir(tmp_path)
    for root in ("A", "B"):
        make_run(tmp_path / root, "exp1", [make_record(make_config(strategy="ddp", nproc=2), "exp1",
                                                       step_times_s=[0.1] * 5)],
                 machine={"cpu_model": "cpu"}, suite={"name": "s"}, status="complete")
    fails_saying(["report", "A/exp1", "B/exp1", "-o", "r.html"], "hold the same run id (exp1)")
    assert not (tmp_path / "r.html").exists()
    assert CliRunner().invoke(main, ["report", "A/exp1", "-o", "r.html"]).exit_code == 0


def test_an_empty_results_dir_is_the_current_folder_in_messages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fails_saying(["show", "x", "--results-dir", ""], "as a run id under ./; list them with `ls ./`")


def test_a_model_type_that_is_no_string_is_named(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": 5, "num_hidden_layers": 2}')
    fails_saying(["memory", "--hf", str(cfg)], "model_type must be a string (e.g. \"llama\"), got 5")
    cfg.write_text('{"num_hidden_layers": 2}')
    fails_saying(["memory", "--hf", str(cfg)], "the Hugging Face config has no model_type")
