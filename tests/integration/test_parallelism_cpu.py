"""Tensor, sequence, pipeline and hybrid parallelism on real gloo ranks."""

import pytest

from mgbench import store


# Layouts a 4-rank suite may name that cannot run: each is kept, skipped with its reason,
# and the suite's other rows still run. (The --set below gives these rows the shipped
# suite's strategies and model too.)
MIXED_LAYOUTS = """
[[sweep]]
strategy = "fsdp+tp"
nproc = 4
layout = [{dp = 1, tp = 3}, {dp = 4, tp = 2}]
seq_len = 16
warmup_steps = 1
measured_steps = 2
check_steps = 2
"""
# The shipped suite's model with 4 layers instead of 8 (pp = 4 still gets a layer per
# stage): FSDP over tensor parallelism runs every layer's ops through DTensor, and at 8
# layers the two tensor-parallel rows cost 30 of CI's CPU-seconds more, for nothing the
# layouts do differently.
FOUR_LAYERS = "{layers = 4, hidden = 64, heads = 4, kv_heads = 4, ffn_hidden = 176, vocab = 256}"


@pytest.fixture(scope="module")
def four_rank_run(tmp_path_factory):
    """One 4-rank torchrun job for both tests below: the shipped suite's 4-rank layouts
    that no faster test runs (4 pipeline stages and 3D pp 2 x tp 2; every strategy and
    schedule on 2 ranks: tests/unit/test_check_gloo.py and test_correctness.py; fsdp+tp
    and pp+tp+dp over FSDP/DDP replicas on 4 ranks: the 4-rank unit checks), restricted by
    the same --set a user would give, plus MIXED_LAYOUTS. `mgbench run parallelism` runs
    them all: 9 layouts, about a minute and a half on 2 cores. Correctness only, so the
    timed window is the shortest there is, the check window 2 steps, the model FOUR_LAYERS."""
    from tests.conftest import REPO, run_cli

    cwd = tmp_path_factory.mktemp("par")
    shipped = (REPO / "suites" / "parallelism.toml").read_text()
    assert shipped.count("\n[sweep]\n") == 1
    (cwd / "par.toml").write_text(shipped.replace("\n[sweep]\n", "\n[[sweep]]\n") + MIXED_LAYOUTS)
    p = run_cli("run", "par.toml", "--run-id", "par", "--set", 'strategy=["pp", "pp+tp+dp", "fsdp+tp"]',
                "--set", 'pp_schedule="1f1b"', "--set", "warmup_steps=1", "--set", "measured_steps=2",
                "--set", "check_steps=2", "--set", f"model={FOUR_LAYERS}", "--no-report", "--no-projection", cwd=cwd)
    assert p.returncode == 0, p.stderr + p.stdout
    return store.read_records(cwd / "results" / "par")


@pytest.mark.slow
def test_parallelism_suite_on_4_ranks_is_ok_and_correct(four_rank_run):
    recs = [r for r in four_rank_run if r["seq_len"] == 32]  # the shipped suite's rows
    got = {(r["strategy"], r["dp"], r["tp"], r["pp"]) for r in recs if r["status"] == "ok"}
    assert got == {("pp", 1, 1, 4), ("pp+tp+dp", 1, 2, 2), ("fsdp+tp", 2, 2, 1)}
    from tests.memory_checks import assert_tracked_memory

    for r in recs:
        assert r["status"] == "ok", (r["label"], r.get("error"))
        assert r["correct"] is True, (r["label"], r["correct_reason"])
        assert_tracked_memory(r)
        # 4 micro-batches a step, through torchrun: the record's batch counts every one of
        # them on every data-parallel replica (test_run_cpu reads the smoke suite at 1)
        assert r["grad_accum"] == 4 and r["global_batch"] == r["micro_batch"] * r["grad_accum"] * r["dp"]


def test_impossible_layouts_skip_and_the_rest_runs(four_rank_run):
    recs = {(r["dp"], r["tp"]): r for r in four_rank_run if r["seq_len"] == 16 and r["strategy"] == "fsdp+tp"}
    assert sorted(recs) == [(1, 3), (4, 2)]  # kept in the run, not dropped
    assert recs[(1, 3)]["status"] == "skipped" and "tp=3 does not divide the 4 attention heads" in recs[(1, 3)]["skip_reason"]
    assert recs[(4, 2)]["status"] == "skipped" and "degrees multiply to 8, not 4" in recs[(4, 2)]["skip_reason"]
    # The rest of the suite ran: FSDP over tensor parallelism, 2-D sharded parameters.
    (fsdp_tp,) = [r for r in four_rank_run if r["seq_len"] == 32 and r["strategy"] == "fsdp+tp"]
    assert fsdp_tp["status"] == "ok" and fsdp_tp["correct"] is True and (fsdp_tp["dp"], fsdp_tp["tp"]) == (2, 2)


@pytest.mark.live
def test_measured_pipeline_bubble_matches_theory(cli, tmp_path):
    """2 stages on 2 ranks (one core each, so CPU time is compute time).

    Tolerance: measured idle = theory + time the schedule spends waiting on p2p
    transfers and in its own Python between micro-batches, which the theory leaves
    out; on a 2-core machine we saw +0.00 to +0.07. We allow -0.05 to +0.10.
    """
    (tmp_path / "b.toml").write_text("""name = "bubble"
[sweep]
model = { layers = 8, hidden = 128, heads = 4, ffn_hidden = 352, vocab = 256 }
strategy = "pp"
nproc = 2
micro_batch = 4
grad_accum = [2, 4]
seq_len = 64
pp_schedule = ["gpipe", "1f1b"]
warmup_steps = 2
measured_steps = 6
check_steps = 2
""")
    p = cli("run", "b.toml", "--run-id", "bub")
    assert p.returncode == 0, p.stderr
    recs = store.read_records(tmp_path / "results" / "bub")
    assert len(recs) == 4
    for r in recs:
        assert r["status"] == "ok" and r["correct"] is True
        theory = (2 - 1) / (r["grad_accum"] + 2 - 1)
        assert r["pp_bubble_theoretical"] == pytest.approx(theory)
        if r["pp_bubble_measured"] is None:
            pytest.skip(f"bubble not measurable here: {r['pp_bubble_reason']}")
        assert -0.05 <= r["pp_bubble_measured"] - theory <= 0.10, (r["label"], r["pp_bubble_measured"], theory)


def test_gradient_compression_is_lossy_but_on_track(cli, tmp_path):
    """PowerSGD runs on "mini" (3M parameters: DDP makes several gradient buckets, whose
    concurrent all-reduce chains aborted gloo until PowerSGD on CPU got a single bucket)."""
    (tmp_path / "g.toml").write_text("""name = "gc"
[[sweep]]
model = "tiny"
strategy = ["ddp", "zero1", "fsdp"]
nproc = 2
seq_len = 16
grad_compression = ["none", "fp16"]
warmup_steps = 2
measured_steps = 3
check_steps = 4
track_memory = false
[[sweep]]
model = "mini"
strategy = ["ddp", "zero1"]
nproc = 2
seq_len = 16
grad_compression = ["none", "powersgd"]
warmup_steps = 2
measured_steps = 3
check_steps = 5
track_memory = false
""")
    p = cli("run", "g.toml", "--run-id", "gc", "--no-report", "--no-projection")
    assert p.returncode == 0, p.stderr
    recs = {(r["strategy"], r["model_name"], r["grad_compression"]): r
            for r in store.read_records(tmp_path / "results" / "gc")}
    for strat in ("ddp", "zero1"):
        fp16 = recs[(strat, "tiny", "fp16")]
        assert fp16["status"] == "ok" and fp16["lossy"] is True and fp16["correct"] is True
        assert fp16["loss_tolerance"] == 5e-2 and recs[(strat, "tiny", "none")]["loss_tolerance"] < 1e-5
        psgd, exact = recs[(strat, "mini", "powersgd")], recs[(strat, "mini", "none")]
        assert psgd["status"] == "ok" and psgd["lossy"] is True and psgd["correct"] is True
        # Compression starts at the third step, so the weights move off the exact run's.
        assert psgd["param_delta_rel_diff"] > exact["param_delta_rel_diff"]
    assert "DDP communication hook" in recs[("fsdp", "tiny", "fp16")]["skip_reason"]


@pytest.mark.slow
def test_torch_compile_and_activation_checkpointing_on_cpu(cli, tmp_path):
    (tmp_path / "c.toml").write_text("""name = "compile"
[sweep]
model = "tiny"
strategy = "single"
nproc = 1
seq_len = 32
compile = true
activation_checkpointing = "every_2nd"
warmup_steps = 2
measured_steps = 3
check_steps = 2
track_memory = false
""")
    p = cli("run", "c.toml", "--run-id", "cc", "--no-report", "--no-projection")
    assert p.returncode == 0, p.stderr
    recs = store.read_records(tmp_path / "results" / "cc")
    # One checkpointing mode: each compiled config costs an inductor compile (~8 s here);
    # every_2nd has checkpointed and plain blocks side by side, both compiled.
    assert [(r["status"], r["correct"]) for r in recs] == [("ok", True)]
