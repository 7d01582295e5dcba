"""Pipelines whose data-parallel replicas are wrapped in DDP (dp_mode = "ddp", the
schedules that keep DDP's reducer: schedules.GRAD_SYNC["ddp_reducer"]) pass the
correctness check on 4 gloo ranks (pp 2 x dp 2) where torch's DDP reducer used to stop the
second step: every schedule whose stage runs all its forwards before its first backward
(GPipe at any grad_accum, 1F1B at grad_accum == pp, interleaved 1F1B). The reduction
skipped on one of them must still be caught.

All cases run in one spawned set of 4 ranks (start-up paid once), 2 check steps; the
references are computed here, single-process.
"""

import pytest
import torch

from mgbench.errors import first_line
from mgbench.runner.check import compare_check
from mgbench.runner.reference import reference_check
from mgbench.runner.tolerance import check_config, run_checks, run_on_gloo_ranks
from mgbench.strategies.schedules import grad_sync

FOUR_LAYERS = dict(layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=176, vocab=256)
# (schedule, grad_accum, inject): the layouts that crashed, and a negative control on one.
CASES = [("gpipe", 2, "none"), ("gpipe", 4, "none"), ("1f1b", 2, "none"), ("interleaved", 2, "none"),
         ("gpipe", 2, "bug:no_grad_sync")]


def _config(schedule, grad_accum, inject):
    extra = dict(model=FOUR_LAYERS, virtual_stages=2) if schedule == "interleaved" else {}
    return check_config("pp+tp+dp", nproc=4, pp=2, dp=2, tp=1, dp_mode="ddp", pp_schedule=schedule,
                        grad_accum=grad_accum, inject=inject, check_steps=2, **extra)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cfgs = [_config(*case) for case in CASES]
    per_rank = run_on_gloo_ranks(run_checks, 4, cfgs)
    run_dir = tmp_path_factory.mktemp("run")
    out = {}
    for case, cfg, *rs in zip(CASES, cfgs, *per_rank):
        assert all(r == rs[0] for r in rs), case  # every rank returns the gathered figures
        out[case] = compare_check(rs[0], reference_check(cfg, torch.device("cpu"), run_dir), cfg.precision)
    return out


@pytest.mark.parametrize("schedule,grad_accum", [(s, g) for s, g, i in CASES if i == "none"])
def test_ddp_replicas_of_pipeline_stages_match_the_reference(results, schedule, grad_accum):
    # Still DDP's reducer (the stages stay wrapped), not mgbench's all-reduce.
    assert grad_sync(schedule, "ddp") == "ddp_reducer"
    got = results[(schedule, grad_accum, "none")]
    assert got["correct"] is True, got["correct_reason"]


def test_skipped_reduction_of_ddp_pipeline_stages_is_caught(results):
    got = results[("gpipe", 2, "bug:no_grad_sync")]
    assert got["correct"] is False and "grad_norm" in got["check_mismatches"], got["correct_reason"]


def test_failure_line_is_the_first_non_empty_line_of_the_message():
    # torch's internal asserts start their message with a newline: the failure file and
    # the launcher's line showed "RuntimeError: " and nothing else.
    exc = RuntimeError("\n  params_.size() == rebuilt_param_indices_.size() INTERNAL ASSERT FAILED\nmore")
    assert first_line(str(exc)) == "params_.size() == rebuilt_param_indices_.size() INTERNAL ASSERT FAILED"
    assert first_line("plain") == "plain"
    assert first_line("") == "" and first_line("\n \n") == ""
