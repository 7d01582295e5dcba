"""Bad input to predict, plan and memory that used to end in a Python traceback or an
unclear message (an audit of the commands, 2026-11-29): each is one line naming what is
wrong and how to fix it, exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
CPU_PROFILE = ROOT / "results" / "profiles" / "vm-cpu-20261122T110505.json"


def _one_line_exit_2(args: list[str], words: str) -> str:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and words in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    return r.output


def test_a_folder_given_as_the_hardware_profile(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    out = _one_line_exit_2(["predict", "--model", "gpt2-small", "--hardware", str(tmp_path)],
                           "a folder; give the profile's .json file")
    assert "a.json" in out  # what the folder holds, to pick from


def test_a_hardware_profile_that_cannot_be_read(tmp_path):
    long = tmp_path / ("x" * 300 + ".json")  # longer than a file name may be: an OSError, not a traceback
    _one_line_exit_2(["predict", "--model", "gpt2-small", "--hardware", str(long)], "cannot be read")


@pytest.mark.parametrize("degrees,gpus", [(["--tp", "4", "--zero", "3"], "2"), (["--tp", "3"], "8")])
def test_a_probed_layout_whose_degrees_do_not_divide_the_ranks(degrees, gpus):
    # The runner's trace divided by a data-parallel degree of 0 (ZeroDivisionError), or
    # named fsdp+tp for a layout that cannot exist: now the catalog path's own line.
    assert CPU_PROFILE.exists()
    _one_line_exit_2(["predict", "--model", "gpt2-small", "--precision", "fp32", "--hardware", str(CPU_PROFILE),
                      "--num-gpus", gpus, *degrees], "does not divide the")


def test_a_system_file_with_one_problem_says_it_on_one_line(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    _one_line_exit_2(["predict", "--model", "llama3-8b", "--system-file", str(empty)],
                     "must define at least one system")


def test_a_missing_results_folder_is_named(tmp_path):
    gone = tmp_path / "nope"
    _one_line_exit_2(["predict", "--model", "llama3-8b", "--calibrate", "x", "--results-dir", str(gone)],
                     f"the results folder {gone}/ does not exist")
    tmp_path.joinpath("runs").mkdir()
    _one_line_exit_2(["predict", "--model", "llama3-8b", "--calibrate", "x", "--results-dir",
                      str(tmp_path / "runs")], f"list them with `ls {tmp_path / 'runs'}/`")


def test_a_zero_price_plans_without_dividing_by_it():
    # A GPU priced at 0 (one the user already has) made the cost flip a ZeroDivisionError.
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e12", "--max-gpus", "64",
                                  "--price", "h100-sxm=0", "--json"])
    assert r.exit_code == 0, r.output
    flips = json.loads(r.output)["flips"]
    assert flips["runner_up"]["gpu"] != "h100-sxm" and flips["price_flip_pct"] is None
    assert flips["why"] == ["h100-sxm is priced at 0: no price change flips the order on cost"]
