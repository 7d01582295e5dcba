"""What `mgbench plan` and `predict` do with numbers outside what they can price (one
line, exit status 2, before anything is priced; search.Bound), and the purchase figures
a first user checked by hand: typos in a price, partial cloud instances, an NVL72
rack's GPU counts, buy versus rent under --own, and the front's labels."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mgbench.cli import main
from mgbench.planner import search

PLAN = ["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "dgx-h100", "--max-gpus", "16"]
PREDICT = ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8"]


def _run(args):
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("extra,words", [
    (["--tokens", "nan"], "--tokens must be a finite number, positive, got nan"),
    (["--tokens", "inf"], "--tokens must be a finite number"),
    (["--seq-len", "0"], "--seq-len must be from 1 to 16,777,216, got 0"),
    (["--checkpoint-minutes", "0"], "--checkpoint-minutes must be positive"),
    (["--checkpoint-minutes", "-10"], "--checkpoint-minutes must be positive"),
    (["--failure-rate", "-1"], "--failure-rate must be 0 or more"),
    (["--spot", "--preemption-rate", "-1"], "--preemption-rate must be 0 or more"),
    (["--restart-minutes", "-30"], "--restart-minutes must be 0 or more"),
    (["--power-fraction", "5"], "--power-fraction must be above 0 and at most 1, got 5.0"),
    (["--overlap", "2"], "--overlap must be from 0 to 1"),
    (["--max-gpus", "0"], "--max-gpus must be from 1 to 131,072"),
    (["--max-gpus", "99999999999999999999"], "--max-gpus must be from 1 to 131,072, got 99999999999999999999"),
    (["--deadline-days", "-5"], "--deadline-days must be positive"),
    (["--budget-usd", "-1"], "--budget-usd must be positive"),
    (["--top", "0"], "--top must be 1 or more"),
    (["--global-batch-tokens", "1000"], "--global-batch-tokens 1000 is less than one sequence (--seq-len 4096)"),
    (["--price", "h100sxm=2"], "'h100sxm' is no accelerator or system of the catalog; did you mean h100-sxm"),
    (["--max-gpus", "10000000"], "--max-gpus must be from 1 to 131,072, got 10000000"),  # was a 38 GiB allocation
    (["--global-batch-tokens", "99999999999999999999"], "--global-batch-tokens must be from 1 to"),  # was a hang
    (["--own", "dgx-h100:²"], "the GPU count after the colon"),  # isdigit() but not int(): was a ValueError
    (["--own", "dgx-h100:0"], "the GPU count after the colon must be a whole number from 1 to 131,072"),
    (["--own", "dgx-h100"], "the GPU count after the colon"),
    (["--own", "nope:64"], "'nope' is not a catalog system"),
])
def test_a_plan_option_outside_its_bounds_is_one_line_and_exit_2(extra, words):
    r = _run([*PLAN, *extra])
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("extra,words", [
    (["--global-batch", "-8"], "global batch -8 is not a positive multiple of micro-batch 1 x dp 8"),
    (["--global-batch", "0"], "global batch 0 is not a positive multiple"),
    (["--global-batch", "12"], "give --global-batch 8 or a multiple of it"),
    (["--overlap", "-1"], "--overlap must be from 0 to 1"),
    (["--seq-len", "0"], "--seq-len must be from 1 to 16,777,216"),
    # Numbers past what int64 products hold were an OverflowError traceback.
    (["--num-gpus", "99999999999999999999"], "--num-gpus must be at most 1,048,576"),
    (["--micro-batch", "99999999999999999999"], "--micro-batch must be at most 65,536"),
    (["--global-batch", str(2 ** 36 + 8)], "--global-batch must be at most 68,719,476,736"),
    (["--tp", str(2 ** 20 + 1)], "--tp must be at most 1,048,576"),
    (["--pp", str(2 ** 20 + 1)], "--pp must be at most 1,048,576"),
    (["--cp", str(2 ** 20 + 1)], "--cp must be at most 1,048,576"),
    (["--virtual-stages", str(2 ** 20 + 1)], "--virtual-stages must be at most 1,048,576"),
    (["--zero", "3", "--hsdp", str(2 ** 20 + 1)], "--hsdp must be at most 1,048,576"),
    (["--seq-len", "99999999999999999999"], "--seq-len must be from 1 to 16,777,216"),
    # The field is replicas; the flag the user gave is --hsdp.
    (["--zero", "3", "--hsdp", "0"], "--hsdp must be >= 1, got 0"),
    (["--moe-imbalance", "0.5"], "--moe-imbalance) is the busiest rank's load over the mean"),
    (["--pp", "4", "--schedule", "interleaved", "--virtual-stages", "2"],
     "needs --global-batch / (micro-batch x dp), the micro-batches per step (1), to be a multiple of pp (4)"),
    (["--pp", "4", "--schedule", "dualpipev", "--global-batch", "4"],
     "raise --global-batch so that --global-batch / (micro-batch x dp) >= 8"),
    # Priced before as 1 (1f1b) or 2 (zbv) chunks a rank while the option said another.
    (["--pp", "4", "--virtual-stages", "2", "--global-batch", "64"],
     "--virtual-stages 2: --schedule 1f1b holds a fixed number of chunks a rank (1)"),
    (["--pp", "4", "--schedule", "zbv", "--virtual-stages", "3", "--global-batch", "64"],
     "--virtual-stages 3: --schedule zbv holds a fixed number of chunks a rank (2)"),
])
def test_a_predict_layout_that_cannot_run_is_one_line_and_exit_2(extra, words):
    r = _run([*PREDICT, *extra])
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    assert "grad_accum" not in r.output  # a runner key predict has no option for


def test_memory_refuses_virtual_stages_its_schedule_ignores():
    r = _run(["memory", "--model", "llama3-8b", "--num-gpus", "8", "--pp", "4", "--virtual-stages", "2"])
    assert r.exit_code == 2 and "--schedule 1f1b holds a fixed number of chunks" in r.output, r.output


def test_bounds_by_hand():
    assert search.POSITIVE.problem("--x", 0) == "--x must be positive, got 0"
    assert search.POSITIVE.problem("--x", 1e-9) is None
    assert search.NON_NEGATIVE.problem("--x", 0) is None
    assert search.FRACTION.problem("--x", 1.0) is None and search.FRACTION.problem("--x", 1.01) is not None
    assert search.AT_LEAST_ONE.problem("--x", None) is None  # not given
    assert "finite" in search.FRACTION.problem("--x", float("nan"))
    # Every number PlanOptions takes as a count, a rate or a fraction has its bounds.
    bounded = {f.name for f in search.dataclasses.fields(search.PlanOptions) if "bounds" in f.metadata}
    assert {"tokens", "seq_len", "global_batch_tokens", "max_gpus", "checkpoint_minutes", "failure_rate",
            "power_fraction", "overlap", "top", "deadline_days", "budget_usd"} <= bounded


def test_a_price_file_naming_nothing_is_refused(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("[on_demand.h100sxm]\nusd = 2\n")
    r = _run([*PLAN, "--prices", str(f)])
    assert r.exit_code == 2 and "[on_demand.h100sxm]: 'h100sxm' is no accelerator or system" in r.output
    f.write_text("[on_demand.h100-sxm]\nusd = 2\n")  # negative control: the right name prices the plan
    out = json.loads(_run([*PLAN, "--prices", str(f), "--json"]).output)
    assert out["recommendation"]["price_usd_per_gpu_hour"] == 2


def test_a_cloud_instance_type_bills_whole_instances():
    out = json.loads(_run(["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "aws-p5", "--max-gpus",
                           "16", "--top", "50", "--json"]).output)
    rows = {r["num_gpus"]: r for r in out["ranked"]}
    four, eight = rows[4], rows[8]
    assert four["billed_gpus"] == 8 and eight["billed_gpus"] == 8
    hours = four["days"] * 24
    assert four["gpu_hours"] == pytest.approx(8 * hours)  # pays for the whole p5.48xlarge
    assert four["cost_usd"] == pytest.approx(8 * hours * four["price_usd_per_gpu_hour"])
    # Negative control: a system sold by the GPU-hour bills the GPUs used.
    dgx = json.loads(_run(["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "dgx-h100", "--max-gpus",
                           "16", "--top", "50", "--json"]).output)
    r4 = next(r for r in dgx["ranked"] if r["num_gpus"] == 4)
    assert r4["billed_gpus"] == 4 and r4["gpu_hours"] == pytest.approx(4 * r4["days"] * 24)
    assert "4 (bills 8)" in _run(["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "aws-p5",
                                  "--max-gpus", "16", "--top", "50"]).output


def test_an_nvl72_rack_is_planned_at_the_counts_its_runs_use():
    assert list(search.gpu_counts(8, 32)) == [1, 2, 4, 8, 16, 24, 32]  # unchanged for 8-GPU nodes
    counts = list(search.gpu_counts(72, 300))
    assert counts == [1, 2, 4, 8, 16, 32, 64, 72, 128, 144, 192, 216, 256, 288]
    out = json.loads(_run(["plan", "--model", "llama3-70b", "--tokens", "1.5e13", "--systems", "gb200-nvl72",
                           "--max-gpus", "512", "--json"]).output)
    assert out["recommendation"] is not None and out["recommendation"]["num_gpus"] % 64 == 0


def test_buy_versus_rent_under_own_compares_with_the_rent():
    out = json.loads(_run(["plan", "--model", "llama3-8b", "--tokens", "1e11", "--own", "dgx-h100:16",
                           "--json"]).output)
    o = next(x for x in out["ownership"] if x["system"] == "dgx-h100")
    plain = json.loads(_run(["plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "dgx-h100",
                             "--max-gpus", "16", "--json"]).output)
    # The rent is the catalog's on-demand price, not the owned GPU-hour's energy plan prices with.
    assert o["rent"]["on_demand"] == pytest.approx(plain["recommendation"]["price_usd_per_gpu_hour"])
    assert out["recommendation"]["price_usd_per_gpu_hour"] < o["rent"]["on_demand"]


def test_the_front_names_each_options_system_and_an_unpriced_rival_is_named():
    r = _run(["plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "mi355x-8,mi300x-8,azure-nd-mi300x-v5",
              "--max-gpus", "64"])
    assert r.exit_code == 0, r.output
    front = next(line for line in r.output.splitlines() if line.startswith("time/cost Pareto front"))
    assert all("(" in part for part in front.split(": ", 1)[1].split("; "))
    assert "mi355x planned without a price (pass --price mi355x=USD" in r.output


@pytest.mark.parametrize("args,words", [
    (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "p5"], "did you mean aws-p5"),
    (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "nd-mi300x-v5"],
     "did you mean azure-nd-mi300x-v5"),
    (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "DGX-H100"], "did you mean dgx-h100"),
    (["plan", "--model", "Llama3-8B", "--tokens", "1e12"], "did you mean llama3-8b"),
    (["predict", "--model", "llama3-8b", "--gpu", "h100"], "did you mean h100-pcie or h100-nvl or h100-sxm"),
])
def test_a_mistyped_catalog_name_gets_the_names_it_may_mean(args, words):
    r = _run(args)
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    bad = next(a for a in args if a in ("p5", "nd-mi300x-v5", "DGX-H100", "Llama3-8B", "h100"))
    other = _run(["zzzz" if a == bad else a for a in args])  # nothing close: no guess, the names listed
    assert other.exit_code == 2 and "did you mean" not in other.output and "'zzzz'" in other.output


def test_a_batch_with_a_large_odd_factor_is_named_with_the_batches_that_open_the_counts():
    assert [search.largest_prime_factor(n) for n in (1, 2, 1024, 1220, 1210, 1000, 97)] == [1, 2, 2, 61, 11, 5, 97]
    note = search.batch_note(search.PlanOptions(tokens=1e12, global_batch_tokens=5_000_000))
    assert note.startswith("the step's 1220 sequences") and "factor 61" in note
    assert "1152 sequences (--global-batch-tokens 4718592) or 1280 sequences" in note  # 2^7 x 9 and 2^8 x 5
    assert search.batch_note(search.PlanOptions(tokens=1e12)) is None  # 1024 sequences: no note
    # 2,816 = 256 x 11: micro-batch x dp up to 256 divides it, no note; 2,900 = 4 x 25 x 29 gets
    # neighbours whose odd part is 7 or less, never itself or another with its factor.
    for seqs, want in ((2816, None), (11 * 1024, None), (2900, "2880 sequences")):
        got = search.batch_note(search.PlanOptions(tokens=1e12, seq_len=1, global_batch_tokens=seqs))
        assert (got is None) if want is None else (want in got and f"{seqs} " not in got.split("shut out;")[1]), \
            (seqs, got)
    r = _run([*PLAN, "--global-batch-tokens", "5000000"])
    assert r.exit_code == 0 and "have the factor 61" in r.output
