"""`mgbench plan` prints the `mgbench predict` line of its lead (issue 26, item 4: plan
and predict agree): run as printed, predict gives the lead's throughput (the point
estimate), memory and MFU, for dense and MoE models, FP8, a cloud instance type, an
NVL72 rack and a recipe's own bytes a parameter (--state-bytes); a layout predict is
given otherwise (no sequence parallelism) differs."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from mgbench.cli import main

CASES = [
    ["--model", "llama3-70b", "--tokens", "1.5e13", "--systems", "dgx-b200"],
    ["--model", "llama3-8b", "--tokens", "1e12", "--systems", "aws-p5", "--max-gpus", "16", "--precision", "fp8"],
    ["--model", "qwen3-30b-a3b", "--tokens", "1e12", "--systems", "dgx-h100", "--max-gpus", "64",
     "--moe-dispatcher", "deepep", "--moe-recompute-modules", "moe_act", "--memory-margin", "0.05",
     "--state-bytes", "2,2,12"],
    ["--model", "llama3-70b", "--tokens", "1.5e13", "--systems", "gb200-nvl72", "--max-gpus", "256",
     "--stack", "torchtitan"],
    # Muon: its Newton-Schulz time in the plan's throughput, and in the predict line's (a
    # Llama 4 Maverick, whose dense and MoE layers interleave)
    ["--model", "llama-4-maverick", "--tokens", "1e12", "--systems", "dgx-b200", "--max-gpus", "256",
     "--optimizer", "muon"],
]


def _plan(args):
    r = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])["recommendation"]


@pytest.mark.parametrize("args", CASES, ids=lambda a: a[1])
def test_the_leads_predict_line_gives_its_figures(args):
    lead = _plan(args)
    cmd = shlex.split(lead["predict_command"])
    assert cmd[:2] == ["mgbench", "predict"] and ("--sequence-parallel" in cmd) == (lead["tp"] > 1)
    r = CliRunner().invoke(main, [*cmd[1:], "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["tokens_per_s_per_gpu"] * lead["num_gpus"] == pytest.approx(lead["tokens_per_s_point"], rel=1e-9)
    assert got["memory"]["total_bytes"] == pytest.approx(lead["memory_per_gpu_bytes"], rel=1e-9)
    assert got["mfu"] == pytest.approx(lead["mfu_point"], rel=1e-9)
    if "--optimizer" in args:
        assert "--optimizer muon" in lead["predict_command"] and got["breakdown"]["optimizer_s"] > 0
        # Negative control: the line without Muon is a faster step.
        adamw = [a for a in cmd[1:] if a not in ("--optimizer", "muon")]
        other = json.loads(CliRunner().invoke(main, [*adamw, "--json"]).output)
        assert other["step_time_s"] < got["step_time_s"]
    # Negative control: the same line without sequence parallelism is another layout.
    if lead["tp"] > 1:
        plain = [a for a in cmd[1:] if a != "--sequence-parallel"]
        other = json.loads(CliRunner().invoke(main, [*plain, "--json"]).output)
        assert other["memory"]["total_bytes"] != pytest.approx(lead["memory_per_gpu_bytes"], rel=1e-6)
