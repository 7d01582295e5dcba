"""Command-line input checks found by an audit: each bad value is one line on stderr and
exit status 2 before anything is measured or written; a good value beside it still
passes. In-process (CliRunner): nothing here starts a torchrun job."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mgbench import cluster
from mgbench.errors import MgbenchError
from mgbench.cli import main
from mgbench.collectives import NAMES as COLLECTIVE_NAMES
from tests.factories import make_run


def _run(args, **kw):
    return CliRunner().invoke(main, args, **kw)


def _one_line_exit_2(r, *words):
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgbench: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "Traceback" not in r.output


@pytest.fixture
def no_sweep(monkeypatch):
    """comm's sweep replaced by a failure: a check that lets a bad value through to the
    measuring fails the test at once instead of running the sweep."""
    import mgbench.comm.run as comm_run

    def refuse(*a, **k):
        raise AssertionError("the sweep started")

    monkeypatch.setattr(comm_run, "run_comm", refuse)


# --- comm ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,words", [
    (["--link", "nope"], ["--link 'nope'", "known links are", "nvlink4"]),
    (["--link", "nope", "--json"], ["--link 'nope'", "known links are"]),
    (["--nnodes", "0"], ["--nnodes 0", "1 or more"]),
    (["--nnodes", "-1"], ["--nnodes -1", "1 or more"]),
    (["--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "n0:29500", "--run-id", "c"],
     ["--node-rank 5", "0 to 1"]),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "n0:", "--run-id", "c"], ["--rdzv-endpoint 'n0:'"]),
])
def test_comm_refuses_bad_options_before_the_sweep(tmp_path, monkeypatch, no_sweep, extra, words):
    monkeypatch.chdir(tmp_path)
    r = _run(["comm", "--nproc", "2", "--device", "cpu", "--results-dir", "RC", *extra])
    _one_line_exit_2(r, *words)
    assert r.stdout == ""  # no progress banner before the error, no JSON of a run
    assert not (tmp_path / "RC").exists()


def test_comm_good_link_reaches_the_sweep(tmp_path, monkeypatch, no_sweep):
    monkeypatch.chdir(tmp_path)
    r = _run(["comm", "--nproc", "2", "--device", "cpu", "--link", "nvlink4", "--results-dir", "RC"])
    assert isinstance(r.exception, AssertionError) and "the sweep started" in str(r.exception)


def test_comm_unknown_dtype_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _run(["comm", "--nproc", "2", "--device", "cpu", "--dtype", "int7", "--results-dir", "RC"])
    _one_line_exit_2(r, "unknown dtype 'int7'", "float32, bfloat16, float16")
    assert not (tmp_path / "RC").exists()


def test_comm_dtype_names_match_the_worker():
    from mgbench.comm import run, worker

    assert tuple(worker.DTYPES) == run.DTYPES


def test_comm_help_shows_the_collectives_whole():
    out = _run(["comm", "--help"], terminal_width=80).output
    words = out.replace(",", " ").replace(".", " ").replace(")", " ").split()
    assert all(name in words for name in COLLECTIVE_NAMES), out


# --- slurm -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["abc", "1:2:3:4", "1-", "-5", "2h", "1-2-3"])
def test_slurm_refuses_a_bad_time(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    r = _run(["slurm", "smoke", "--nodes", "2", "--gpus-per-node", "8", "--time", bad, "--results-dir", "RS"])
    _one_line_exit_2(r, f"--time {bad!r}", "HH:MM:SS")
    assert not (tmp_path / "RS").exists()


@pytest.mark.parametrize("good", ["30", "30:00", "02:00:00", "1-12", "1-12:30", "1-12:30:00", "UNLIMITED",
                                  "infinite", "-1"])
def test_slurm_time_formats_are_accepted(tmp_path, good):
    assert cluster.check_time(good) == good
    assert f"#SBATCH --time={good}\n" in cluster.sbatch_script(tmp_path, "s", 2, 8, "cuda", time_limit=good)


def test_a_silent_failed_sbatch_gives_its_exit_status(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 3\n")  # refuses without a word on stderr
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(MgbenchError, match="sbatch refused the job: exit status 3"):
        cluster.submit(script)


def test_a_failed_submit_says_what_it_left(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    r = _run(["slurm", "smoke", "--nodes", "2", "--gpus-per-node", "8", "--run-id", "sl1", "--results-dir", "RS",
              "--submit"])
    # The folder is kept as a written (not submitted) run, its script usable by hand
    # (test_cli_first_use.test_a_failed_sbatch_leaves_the_run_written_not_submitted);
    # the error line says so and how to free the run id.
    _one_line_exit_2(r, "Batch job submission failed", "nothing was queued", "sbatch RS/sl1/job.sbatch",
                     "rm -r RS/sl1")
    assert "run sl1: written" in _run(["status", "--results-dir", "RS"]).output


# --- run -------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,words", [
    (["--nnodes", "0"], ["--nnodes 0"]),
    (["--node-rank", "-1"], ["--node-rank -1"]),
    (["--nproc-per-node", "0"], ["--nproc-per-node 0"]),
    (["--nnodes", "2", "--run-id", "x", "--rdzv-endpoint", "nocolon:"], ["--rdzv-endpoint 'nocolon:'", "HOST:PORT"]),
    (["--nnodes", "2", "--run-id", "x", "--rdzv-endpoint", "h:²"], ["'h:²'", "1 to 65535"]),  # was a ValueError
    (["--nnodes", "2", "--run-id", "x", "--rdzv-endpoint", "::1:29500"], ["IPv6 host must be in brackets"]),
    (["--nnodes", "2", "--run-id", "x", "--rdzv-endpoint", "[::1"], ["closing bracket"]),
    (["--nnodes", "2", "--run-id", "x", "--rdzv-endpoint", "host:notaport"], ["'host:notaport'", "1 to 65535"]),
    (["--nnodes", "2", "--run-id", "x", "--rdzv-endpoint", "host:70000"], ["'host:70000'", "1 to 65535"]),
])
def test_run_refuses_bad_cluster_options(tmp_path, monkeypatch, extra, words):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(_run(["run", "smoke", "--dry-run", *extra]), *words)


@pytest.mark.parametrize("endpoint", ["node0:29500", "node0", "[fe80::1]:29500", "[::1]", "10.0.0.1:29400"])
def test_run_takes_good_cluster_options(tmp_path, monkeypatch, endpoint):
    # torchrun takes a host without a port (its default 29400) and a bracketed IPv6 host.
    monkeypatch.chdir(tmp_path)
    r = _run(["run", "smoke", "--dry-run", "--nnodes", "2", "--node-rank", "1", "--run-id", "x",
              "--rdzv-endpoint", endpoint, "--nproc-per-node", "2"])
    assert r.exit_code == 0, r.output


def test_resume_of_a_complete_run_under_json_is_json(tmp_path):
    root = tmp_path / "results"
    make_run(root, "done", status="complete", suite={"name": "smoke"})
    r = _run(["run", "--resume", "done", "--results-dir", str(root), "--json"])
    assert r.exit_code == 0  # nothing to do is not an error
    out = json.loads(r.stdout)
    assert out["run_id"] == "done" and out["status"] == "complete" and out["resumed"] is False


@pytest.mark.parametrize("text", ["", 'name = "x"\n', 'name = "x"\n[cpu]\nseq_len = 16\n'])
def test_a_suite_without_a_sweep_is_refused(tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(text)
    _one_line_exit_2(_run(["run", "s.toml", "--dry-run"]), "s.toml: no [sweep] table")
    (tmp_path / "ok.toml").write_text(text + '[sweep]\nstrategy = "ddp"\nnproc = 2\n')
    assert _run(["run", "ok.toml", "--dry-run"]).exit_code == 0


@pytest.mark.parametrize("as_json", [False, True])
def test_a_dry_run_with_nothing_runnable_exits_2(tmp_path, monkeypatch, as_json):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imp.toml").write_text('name = "imp"\n[sweep]\nstrategy = "tp"\nnproc = 3\nlayout = {tp = 2}\n')
    r = _run(["run", "imp.toml", "--dry-run", "--device", "cpu"] + (["--json"] if as_json else []))
    _one_line_exit_2(r, "nothing to run: every one of the 1 configs is skipped")
    if as_json:
        assert r.stdout == ""
    else:
        assert "[skipped: " in r.stdout  # the listing still says why each is skipped


def test_set_with_malformed_toml_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(_run(["run", "smoke", "--dry-run", "--set", "nproc=[1,"]), "--set 'nproc=[1,'", "malformed TOML")
    for bad in ('precision="bf16', "layout={tp=2"):  # an unclosed string, an unclosed table
        _one_line_exit_2(_run(["run", "smoke", "--dry-run", "--set", bad]), f"--set {bad!r}", "malformed TOML")
    ok = _run(["run", "smoke", "--dry-run", "--set", "strategy=fsdp", "--set", "nproc=[1,2]"])
    assert ok.exit_code == 0, ok.output  # a bare word is still a string


def test_run_names_the_built_in_suites(tmp_path, monkeypatch):
    from mgbench.suite import builtin_suites

    monkeypatch.chdir(tmp_path)
    names = builtin_suites()
    assert {"default", "smoke"} <= set(names)
    r = _run(["run", "nope"])
    _one_line_exit_2(r, "suite 'nope' not found", ", ".join(names))
    help_text = " ".join(_run(["run", "--help"]).output.split())
    assert f"Built-in suites (SUITE by name): {', '.join(names)}." in help_text


# --- report, compare, run lookup -------------------------------------------------------

def test_report_refuses_an_unknown_metric(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "results", "r1", status="complete")
    _one_line_exit_2(_run(["report", "r1", "--metric", "nope"]), "--metric 'nope'", "tokens_per_s")


@pytest.mark.parametrize("extra", [["--plan-spot"], ["--plan-top", "3"], ["--plan-model", "llama3-8b"],
                                   ["--plan-price", "b200=5"]])
def test_report_plan_options_need_model_and_tokens(tmp_path, monkeypatch, extra):
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "results", "r1", status="complete")
    _one_line_exit_2(_run(["report", "r1", *extra]), extra[0], "--plan-model and --plan-tokens")


def test_report_plan_options_beside_a_saved_plan_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(_run(["report", "r1", "--plan", "p.json", "--plan-spot"]), "either --plan p.json", "or --plan-spot")


def test_compare_refuses_a_negative_threshold(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(_run(["compare", "a", "b", "--threshold", "-5"]), "--threshold", "x>=0")
    r = _run(["compare", "a", "b", "--threshold", "0"])  # accepted: it is the runs that are missing
    assert r.exit_code == 2 and "threshold" not in r.stderr and "run 'a' not found" in r.stderr


@pytest.mark.parametrize("cmd", [["show", "zz"], ["status", "zz"], ["report", "zz"], ["compare", "zz", "yy"],
                                 ["run", "--resume", "zz"]])
def test_a_missing_run_names_the_results_folder_searched(tmp_path, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other").mkdir()
    r = _run([*cmd, "--results-dir", "other"])
    _one_line_exit_2(r, "run 'zz' not found", "under other/", "`ls other/`")
    assert "ls results/" not in r.stderr
    missing = _run([*cmd, "--results-dir", "nope"])
    _one_line_exit_2(missing, "run 'zz' not found: the results folder nope/ does not exist")


def test_data_make_help_keeps_the_example_lines():
    out = _run(["data", "make", "--help"]).output
    assert "--set data=disk \\\n" in out and "data=disk           --set" not in out


@pytest.mark.parametrize("endpoint, says", [
    (":29500", "no host"), ("[]:29500", "no host"), ("[::1]x29500", "text after the bracketed host"),
    ("[::1:29500", "closing bracket"), ("[::1]:29500", None), ("n0", None)])
def test_every_branch_of_the_endpoint_check(endpoint, says):
    # A re-read found the no-host and after-the-bracket branches never fired in a test, and an
    # empty bracket ([]:1) called a missing closing bracket.
    from mgbench.launching import _endpoint_problem

    got = _endpoint_problem(endpoint)
    assert (got is None) if says is None else (got is not None and says in got), (endpoint, got)


@pytest.mark.parametrize("flag", ["--moe-node-limit", "--moe-device-limit"])
def test_a_node_or_device_limit_below_one_is_one_line(flag):
    from click.testing import CliRunner

    from mgbench.cli import main

    r = CliRunner().invoke(main, ["predict", "--model", "deepseek-v3", "--system", "dgx-h100", "--num-gpus", "64",
                                  "--ep", "64", flag, "0"])
    assert r.exit_code == 2 and f"({flag}) must be a positive integer, got 0" in r.output, r.output
