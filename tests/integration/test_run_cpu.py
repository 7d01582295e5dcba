"""Real torchrun jobs on gloo CPU ranks, through the real CLI."""

import json

import pytest

from mgbench import store

STRATEGIES = ["ddp", "zero1", "fsdp", "fsdp_grad_op"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """README's console examples, run as a user types them in a fresh checkout
    (tests/unit/test_docs.py run_examples: each must exit 0), and the run its `mgbench run
    smoke` makes, which the tests below read: the shipped smoke suite on 1 and 2 ranks, with
    its report and projection. One run serves both (there were two, README's and one of
    this module's own, until CI's time reached 5:55). One micro-batch a step, as shipped:
    accumulation (no_sync, loss weights) is checked for every strategy at 2 micro-batches
    by the check harness (tests/unit/test_check_gloo.py, runner/tolerance.py check_config)
    and at 4 on the 4-rank layouts. Four ranks run through torchrun in
    test_parallelism_cpu.py and test_modern.py (FSDP, HSDP, DDP replicas), and in process in
    test_check_gloo.py; here they would cost 28 of CI's CPU-seconds (a third torchrun job)
    for the same data-parallel code at another size."""
    from tests.unit.test_docs import ROOT, run_examples

    cwd = tmp_path_factory.mktemp("readme")
    done = run_examples(ROOT / "README.md", cwd)
    p = next(p for command, p in done if command.split("\n")[0].strip() == "mgbench run smoke")
    return cwd, store.latest_run(cwd / "results"), p


def test_readme_runs_the_smoke_suite(smoke_run):
    # the fixture ran every README example (each exit 0); the run is the smoke suite's
    _, run_dir, p = smoke_run
    assert store.read_manifest(run_dir)["suite"]["name"] == "smoke"
    assert f"results: results/{run_dir.name}\n" in p.stdout and f"report: reports/{run_dir.name}.html" in p.stdout


def test_every_strategy_runs_and_matches_the_reference(smoke_run):
    _, run_dir, _ = smoke_run
    recs = store.read_records(run_dir)
    ok = [r for r in recs if r["status"] == "ok"]
    got = {(r["strategy"], r["nproc"], r["grad_accum"]) for r in ok}
    for s in STRATEGIES:
        for n in (1, 2):
            assert (s, n, 1) in got
    assert ("single", 1, 1) in got
    for r in ok:
        assert r["correct"] is True, (r["label"], r["correct_reason"])
        assert r["loss_max_rel_diff"] <= r["loss_tolerance"] < 1e-5  # fp32: 10x the measured spread
        assert len(r["check_losses"]) == len(r["check_losses_ref"]) == 3
        # Learnable data: the check window's loss falls (by 0.4-1.5% over 3 steps at the
        # check's lr for these batches; a frozen model's loss moves 0.1-0.4% batch to batch).
        assert r["check_losses"][-1] < r["check_losses"][0], r["check_losses"]
        for q in ("grad_norm", "param_norm", "param_delta_norm"):
            assert r[q] > 0 and r[f"{q}_ref"] > 0


def test_tracked_memory_in_every_record(smoke_run):
    from tests.memory_checks import assert_tracked_memory

    _, run_dir, _ = smoke_run
    ok = [r for r in store.read_records(run_dir) if r["status"] == "ok"]
    for r in ok:
        assert_tracked_memory(r)
        if r["strategy"] in ("ddp", "zero1"):  # DDP's gradient buckets: every fp32 gradient once
            assert r["mem_tracked_comm_bytes"] == 4 * r["num_params"]
        if r["strategy"].startswith("fsdp"):
            assert "FSDPMemTracker" in r["mem_tracked_method"]
    # Sharding shows: FSDP on 2 ranks holds half of the parameters and optimizer states.
    by = {(r["strategy"], r["nproc"], r["grad_accum"]): r for r in ok}
    full, half = by[("single", 1, 1)], by[("fsdp", 2, 1)]
    assert half["mem_tracked_params_bytes"] == full["mem_tracked_params_bytes"] / 2
    assert half["mem_tracked_peak_bytes"] < full["mem_tracked_peak_bytes"]


def test_tracked_memory_agrees_with_the_model(smoke_run):
    """Issue 14: tracked peak vs `mgbench memory` for the same config, within 10% for
    every config of a real CPU run. The table is printed (pytest -s) per config."""
    from mgbench.report.memory_vs_model import AGREEMENT_PCT, compare_records, format_table

    _, run_dir, _ = smoke_run
    rows = compare_records(store.read_records(run_dir))
    print("\n" + format_table(rows))
    assert rows and all(r["reason"] is None for r in rows), [r["reason"] for r in rows]
    off = [(r["label"], round(r["error_pct"], 1)) for r in rows if not r["agrees"]]
    assert not off, f"predicted total off the tracked peak by more than {AGREEMENT_PCT:g}%: {off}"


def test_skips_are_recorded_not_dropped(smoke_run):
    _, run_dir, _ = smoke_run
    skipped = [r for r in store.read_records(run_dir) if r["status"] == "skipped"]
    assert {(r["strategy"], r["nproc"]) for r in skipped} == {("single", 2)}
    assert all("one process" in r["skip_reason"] for r in skipped)


def test_metrics_are_consistent(smoke_run):
    _, run_dir, _ = smoke_run
    for r in store.read_records(run_dir):
        if r["status"] != "ok":
            continue
        n = r["nproc"]
        assert r["global_batch"] == r["micro_batch"] * r["grad_accum"] * n
        assert len(r["step_times_s"]) == r["num_steps_measured"] == 6  # the smoke suite's measured_steps
        assert r["step_time_s"] == sorted(r["step_times_s"])[2] / 2 + sorted(r["step_times_s"])[3] / 2  # the median
        assert r["tokens_per_s"] == pytest.approx(r["global_batch"] * r["seq_len"] / r["step_time_s"])
        assert r["tokens_per_s_per_device"] == pytest.approx(r["tokens_per_s"] / n)
        assert r["model_tflops_per_device"] == pytest.approx(
            r["flops_per_token"] * r["tokens_per_s_per_device"] / 1e12)
        assert r["step_time_p10_s"] <= r["step_time_s"] <= r["step_time_p90_s"]
        assert r["mfu_pct"] is None and "no peak FLOPS" in r["mfu_reason"]
        assert r["mem_method"] in ("cpu_peak_rss_per_rank", "cpu_process_lifetime_peak_rss")
        assert len(r["mem_peak_gib_per_rank"]) == n and r["mem_peak_gib"] > 0
        assert r["energy_method"] in ("rapl", "none")
        if r["energy_method"] == "none":
            assert r["energy_j"] is None and r["energy_reason"]
        # The check window stood in for the first warm-up steps (its losses are check_losses).
        assert len(r["losses"]) == r["warmup_steps"] - min(r["check_steps"], r["warmup_steps"]) + r["measured_steps"]
        assert r["loss_first"] == r["losses"][0] and r["loss_last"] == r["losses"][-1]
        assert r["init_s"] > 0 and r["measured_s"] > 0
        samples = json.loads((run_dir / r["samples_file"]).read_text())
        assert len(samples["per_rank_step_times_s"]) == n
        # The recorded step time of each step is the slowest rank's.
        per_rank = [w[0] for w in samples["per_rank_step_times_s"]]
        assert r["step_times_s"] == [max(col) for col in zip(*per_rank)]


def test_manifest_and_folder_layout(smoke_run):
    _, run_dir, _ = smoke_run
    m = store.read_manifest(run_dir)
    assert m["status"] == "complete" and m["run_id"] == run_dir.name
    assert m["suite"]["name"] == "smoke" and len(m["suite"]["sha256"]) == 64
    assert "[sweep]" in m["suite"]["text"]
    for key in ("hostname", "cpu_model", "cpu_cores", "ram_gib", "torch", "gpu_count", "interconnect"):
        assert key in m["machine"]
    assert m["counts"]["ok"] + m["counts"]["skipped"] == m["num_configs"]
    # One torchrun job per world size (no failures, so no relaunches), each rank's
    # output also in its own file.
    assert sorted(p.name for p in (run_dir / "logs").glob("*.log")) == [
        "group-0-n1-a0.log", "group-1-n2-a0.log"]
    assert len(list((run_dir / "logs" / "group-1-n2-a0").glob("**/stderr.log"))) == 2


def test_progress_is_shown(smoke_run):
    _, _, p = smoke_run
    assert "[1/" in p.stdout and "ETA" in p.stdout
    assert "launching torchrun: 2 cpu rank(s)" in p.stdout


def test_show_table_json_csv(smoke_run, cli):
    cwd, run_dir, _ = smoke_run
    from tests.conftest import run_cli

    table = run_cli("show", run_dir.name, cwd=cwd)
    assert table.returncode == 0 and "fsdp_grad_op" in table.stdout and "tok/s" in table.stdout
    js = json.loads(run_cli("show", str(run_dir), "--json", cwd=cwd).stdout)
    assert len(js["records"]) == js["manifest"]["num_configs"]
    csv = run_cli("show", "--csv", cwd=cwd).stdout.splitlines()
    assert csv[0].count(",") > 20 and len(csv) == 1 + js["manifest"]["num_configs"]


def test_calibration_on_the_measured_run(smoke_run):
    cwd, run_dir, _ = smoke_run
    from tests.conftest import run_cli

    p = run_cli("predict", "--calibrate", run_dir.name, "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    fit = json.loads(p.stdout)
    ok = [r for r in store.read_records(run_dir) if r["status"] == "ok"]
    assert {r["config_id"] for r in fit["rows"]} == {r["config_id"] for r in ok}
    # Whether the fit attributes time to compute depends on this VM's noise (the least-
    # squares compute term can come out non-positive, then null): tests/unit/test_calibrate.py
    # checks the fit recovers known parameters; here, the plumbing.
    assert fit["achieved_flops_per_s"] is None or fit["achieved_flops_per_s"] > 0
    for r in fit["rows"]:  # a prediction, or null with its reason
        assert (r["loo_predicted_s"] > 0) if r["loo_null_reason"] is None else r["loo_predicted_s"] is None
    table = run_cli("predict", "--calibrate", run_dir.name, cwd=cwd)
    assert "leave-one-out" in table.stdout


def test_run_writes_a_self_contained_report(smoke_run):
    cwd, run_dir, p = smoke_run
    report = cwd / "reports" / f"{run_dir.name}.html"
    assert f"report: reports/{run_dir.name}.html" in p.stdout
    html = report.read_text()
    assert 'src="http' not in html and "src='http" not in html  # works from file:// offline
    assert html.count("Plotly.newPlot") >= 4  # throughput, efficiency, step times, memory
    assert html.count("plotly.js v") <= 2 and report.stat().st_size < 10 * 2**20
    for section in ("Summary", "Scaling", "Time breakdown", "Memory", "Energy", "Communication", "Projection"):
        assert f">{section}</h2>" in html
    assert html.rindex("<h2>") == html.index(">Projection</h2>") - len("<h2")  # the closing section
    assert "Projection: tiny" in p.stdout and "dgx-h100" in p.stdout  # and `run` closes with it too
    assert "energy not measured" in html  # no RAPL here: said, not plotted


def test_report_renders_in_headless_chromium(smoke_run):
    from tests import report_check

    if report_check.chromium() is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium; install it to run this test)")
    cwd, run_dir, _ = smoke_run
    res = report_check.check(cwd / "reports" / f"{run_dir.name}.html")
    assert res["errors"] == []
    assert len(res["figures"]) >= 4
    for fig in res["figures"]:
        assert fig["with_data"] >= 1, fig


def test_probe_profile_predicts_the_measured_run(smoke_run):
    cwd, run_dir, _ = smoke_run
    from tests.conftest import run_cli

    # One rank only (--max-ranks 1): without a collective fit only single-rank configs are
    # priced here, so the concurrent 2- and 4-rank probes would be paid for nothing.
    p = run_cli("probe", "--model", "tiny", "--layer-tokens", "64", "--no-comm", "--max-ranks", "1", "-o",
                "probe.json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    assert "profile: probe.json" in p.stdout and "GEMM float32" in p.stdout
    # Each phase numbered out of the phases this probe runs: 1 rank count and the framework.
    assert "[1/2, 0:" in p.stderr and "[2/2, " in p.stderr and "[3/" not in p.stderr, p.stderr
    prof = json.loads((cwd / "probe.json").read_text())
    assert prof["device"] == "cpu" and prof["gemm"][0]["typical_tflops"] > 0
    assert {g["ranks"] for g in prof["gemm"]} == {h["ranks"] for h in prof["host_ops"]} == {1}  # --max-ranks 1
    assert {r["strategy"] for r in prof["framework"]["rows"]} >= {"single", "ddp", "zero1", "fsdp"}
    assert prof["comm"]["null_reason"].startswith("skipped")
    # Probed at one rank (2 threads here) with no collective fit, only single-rank configs
    # can be priced; the rest say why (no GEMMs at their thread count, or no collective fit).
    res = json.loads(run_cli("predict", "--hardware", "probe.json", "--against", run_dir.name, "--json", cwd=cwd).stdout)
    ok = [r for r in store.read_records(run_dir) if r["status"] == "ok"]
    assert len(res["rows"]) == len(ok)
    for r in res["rows"]:
        if r["nproc"] == 1:
            assert r["predicted_s"] > 0 and r["error_pct"] == pytest.approx(
                100 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"])
        else:
            assert r["predicted_s"] is None and ("no collective fit" in r["reason"] or "--max-ranks" in r["reason"])
    assert res["num_predicted"] == sum(r["nproc"] == 1 for r in ok)
    # Same machine: the comparison becomes the profile's validation, which sets the
    # intervals of predictions made with it.
    assert res["recorded_in_profile"] is True
    val = json.loads((cwd / "probe.json").read_text())["validation"]
    assert val["run"] == run_dir.name and val["max_abs_error_pct"] == pytest.approx(res["max_abs_error_pct"])
    one = json.loads(run_cli("predict", "--hardware", "probe.json", "--model", "tiny", "--num-gpus", "1",
                             "--seq-len", "64", "--precision", "fp32", "--json", cwd=cwd).stdout)
    assert one["regime"] == "probed"
    lo, hi = one["step_time_s_interval"]
    # An error of 100% or more widens the interval down to 0 s, never below it.
    assert lo == pytest.approx(one["step_time_s"] * (1 - min(val["max_abs_error_pct"] / 100, 1.0)))
    assert hi == pytest.approx(one["step_time_s"] * (1 + val["max_abs_error_pct"] / 100))
    bad = run_cli("predict", "--against", run_dir.name, cwd=cwd)
    assert bad.returncode == 2 and "needs --hardware" in bad.stderr
