"""Bad input: one line, exit status 2, no traceback, no damaged results folder."""

import pytest


@pytest.mark.parametrize(
    "args,expected",
    [
        (["run", "no-such-suite"], "suite 'no-such-suite' not found"),
        (["run", "smoke", "--set", "strategy=ddpp"], "did you mean 'ddp'"),
        (["run", "smoke", "--set", "nproc"], "expected KEY=VALUE"),
        (["show", "missing-run"], "run 'missing-run' not found"),
        (["show"], "no runs under results/"),
        # checked before anything is measured or written (the sweep used to run first)
        (["comm", "--link", "nope", "--nproc", "2", "--device", "cpu"], "--link 'nope': known links are"),
        (["run", "smoke", "--dry-run", "--nnodes", "0"], "--nnodes 0: give 1 or more nodes"),
        (["report", "zz", "--results-dir", "nope"], "the results folder nope/ does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, tmp_path, args, expected):
    p = cli(*args)
    assert p.returncode == 2
    assert expected in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_malformed_suite_file(cli, tmp_path):
    (tmp_path / "bad.toml").write_text('name = "bad"\n[sweep]\nnproc = [1,,2]\n')
    p = cli("run", "bad.toml")
    assert p.returncode == 2 and "bad.toml: malformed TOML" in p.stderr and "line 3" in p.stderr
    assert not (tmp_path / "results").exists()


def test_debug_shows_the_traceback(cli):
    p = cli("--debug", "run", "no-such-suite")
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_results_dir_that_is_a_file(cli, tmp_path):
    (tmp_path / "f").write_text("x")
    p = cli("run", "smoke", "--results-dir", "f", "--set", "nproc=1", "--set", "strategy=single")
    assert p.returncode == 2 and "not a folder" in p.stderr


@pytest.mark.parametrize("cmd", [[], ["run"], ["show"], ["report"], ["compare"], ["comm"], ["slurm"], ["status"]])
def test_help_teaches_with_an_example(cli, cmd):
    p = cli(*cmd, "--help")
    assert p.returncode == 0 and "Example" in p.stdout


def test_dry_run_lists_configs_and_writes_nothing(cli, tmp_path):
    p = cli("run", "smoke", "--dry-run")
    assert p.returncode == 0 and "10 configs, 9 runnable" in p.stdout
    assert not (tmp_path / "results").exists()
