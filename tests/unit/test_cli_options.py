"""Options declared once: plan's options are PlanOptions' fields, and an option that
several commands take has one help text and one default everywhere."""

import dataclasses
import json
import typing
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mgbench import cli_options
from mgbench.cli import main
from mgbench.planner import search
from mgbench.planner.search import PlanOptions

PLAN = main.commands["plan"]
REPORT = main.commands["report"]


def _params(cmd: click.Command) -> dict[str, click.Parameter]:
    """A command's options by long flag."""
    return {o: p for p in cmd.params for o in p.opts if o.startswith("--")}


def _cli_fields():
    return [f for f in dataclasses.fields(PlanOptions) if "set_by" not in f.metadata]


def _flag(name: str, prefix: str = "") -> str:
    return f"--{prefix}{name.replace('_', '-')}"


def _other_value(f: dataclasses.Field):
    """A value for field f other than its default, as (command-line words, expected field value)."""
    tp = cli_options._unwrap_optional(typing.get_type_hints(PlanOptions)[f.name])
    default = None if f.default is dataclasses.MISSING else f.default
    if tp is bool:
        return [], True
    if "choices" in f.metadata:
        v = next(c for c in f.metadata["choices"] if c != default)
        return [v], v
    if typing.get_origin(tp) is list:
        return ["dgx-h100,dgx-a100"], ["dgx-h100", "dgx-a100"]
    if tp is int:
        v = (default or 6) + 1
        return [str(v)], v
    if tp is str:  # free text (e.g. --own SYSTEM:COUNT): passed through as given
        return ["dgx-h100:8"], "dgx-h100:8"
    v = (default or 1.5) * 2 + 0.25
    return [repr(v)], v


def test_every_planoptions_field_is_a_plan_option():
    params = _params(PLAN)
    for f in dataclasses.fields(PlanOptions):
        if "set_by" in f.metadata:
            # Filled from another option (e.g. --calibrate RUN): that option must exist.
            assert f.metadata["set_by"] in params, f.name
            continue
        assert _flag(f.name) in params, f"PlanOptions.{f.name} has no plan option"
        p = params[_flag(f.name)]
        assert p.help and f.metadata["help"] in p.help, f"PlanOptions.{f.name} needs help in its metadata"
        if f.default is dataclasses.MISSING:
            assert p.required
        else:
            assert p.default == f.default


def test_the_four_cost_options_that_were_missing_are_settable():
    params = _params(PLAN)
    for flag in ("--restart-minutes", "--checkpoint-write-minutes", "--preemption-rate", "--overlap", "--precision"):
        assert flag in params


def test_setting_each_plan_option_reaches_planoptions(monkeypatch):
    captured = {}

    def fake_plan(shape, opts, prices=None, progress=None):
        captured["opts"] = opts
        return {"fake": True}

    monkeypatch.setattr(search, "plan", fake_plan)
    args, expected = ["plan", "--model", "llama3-8b", "--json"], {}
    for f in _cli_fields():
        words, value = _other_value(f)
        args += [_flag(f.name), *words]
        expected[f.name] = value
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"fake": True}
    opts = captured["opts"]
    defaults = PlanOptions(tokens=1.0)
    for name, value in expected.items():
        assert getattr(opts, name) == (pytest.approx(value) if isinstance(value, float) else value), name
        if name != "tokens":
            assert getattr(opts, name) != getattr(defaults, name), name


def test_plan_defaults_are_planoptions_defaults(monkeypatch):
    captured = {}
    monkeypatch.setattr(search, "plan", lambda shape, opts, prices=None, progress=None: captured.setdefault("opts", opts) and {})
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e12", "--json"])
    assert r.exit_code == 0, r.output
    assert captured["opts"] == PlanOptions(tokens=1e12)


def test_seq_len_and_precision_defaults_agree_in_plan_predict_memory():
    for flag in ("--seq-len", "--precision"):
        defaults = {name: _params(main.commands[name])[flag].default for name in ("plan", "predict", "memory")}
        assert len(set(defaults.values())) == 1, (flag, defaults)
    assert _params(PLAN)["--seq-len"].default == PlanOptions.__dataclass_fields__["seq_len"].default


def test_top_default_agrees_in_plan_and_report():
    assert _params(PLAN)["--top"].default == _params(REPORT)["--plan-top"].default == PlanOptions(tokens=1).top


def test_report_takes_every_plan_option_with_plans_defaults():
    plan_params, report_params = _params(PLAN), _params(REPORT)
    for f in _cli_fields():
        p, q = plan_params[_flag(f.name)], report_params[_flag(f.name, "plan-")]
        assert (p.help, p.type.name) == (q.help, q.type.name)
        if f.default is not dataclasses.MISSING:
            assert p.default == q.default
    for flag in ("--model", "--price", "--prices"):
        assert report_params["--plan-" + flag[2:]].help == plan_params[flag].help


def test_report_plan_section_uses_the_plan_options(monkeypatch, tmp_path):
    import mgbench.report.html as html
    from mgbench import store

    captured = {}
    monkeypatch.setattr(store, "resolve_run", lambda run, results_dir: tmp_path / run)
    monkeypatch.setattr(search, "plan", lambda shape, opts, prices=None, progress=None: captured.update(opts=opts, prices=prices) or {})
    monkeypatch.setattr(html, "build", lambda paths, out, *a, **k: Path(out))
    r = CliRunner().invoke(main, ["report", "RUN", "--plan-model", "llama3-8b", "--plan-tokens", "1e12",
                                  "--plan-spot", "--plan-top", "3", "--plan-price", "b200=9"])
    assert r.exit_code == 0, r.output
    assert captured["opts"] == PlanOptions(tokens=1e12, spot=True, top=3)
    assert captured["prices"].lookup("dgx-b200", "b200")[0] == 9.0
    r = CliRunner().invoke(main, ["report", "RUN", "--plan-tokens", "1e12"])
    assert r.exit_code == 2 and "go together" in r.output


@pytest.mark.parametrize("extra,words", [
    (["--plan-tokens", "nan"], "--plan-tokens must be a finite number"),
    (["--plan-tokens", "1e12", "--plan-global-batch-tokens", "100"],
     "--plan-global-batch-tokens 100 is less than one sequence (--plan-seq-len 4096)"),
    (["--plan-tokens", "1e12", "--plan-virtual-stages", "2"], "applies to a named --plan-schedule"),
])
def test_report_plan_errors_name_the_plan_flags_report_takes(tmp_path, monkeypatch, extra, words):
    """plan's refusals name its own flags (--tokens); under report the user typed --plan-tokens."""
    from mgbench import store

    monkeypatch.setattr(store, "resolve_run", lambda run, results_dir: tmp_path / run)
    r = CliRunner().invoke(main, ["report", "RUN", "--plan-model", "llama3-8b", *extra])
    assert r.exit_code == 2 and words in r.output, r.output
    assert " --tokens" not in r.output and " --schedule" not in r.output


def test_prefixed_flags_rewrites_whole_flags_only():
    from mgbench.cli_options import opt, prefixed_flags

    opts = [opt("--seq"), opt("--seq-len"), opt("--top")]
    assert prefixed_flags("--seq-len 4 and --seq 2, not --topology or x--top", "plan", opts) == \
        "--plan-seq-len 4 and --plan-seq 2, not --topology or x--top"


def _all_commands():
    return {name: cmd for name, cmd in main.commands.items()}


# Options that share a flag but not a meaning: run's --timeout is per config, comm's per
# sweep; show's --json is one of two formats; predict's --overlap is unset by default so
# a --calibrate fit can supply it (its help still names plan's default).
DIFFERENT_DEFAULTS = {"--timeout", "--overlap"}
DIFFERENT_MEANING = {("run", "--timeout"), ("comm", "--timeout"), ("show", "--json"),
                     # probe: a profile file, not report's HTML; the dtypes and model whose GEMMs it times
                     ("probe", "--output"), ("probe", "--dtype"), ("probe", "--model"),
                     # plan: --schedule also takes "searched" (its default: it tries the schedules),
                     # so --virtual-stages applies only to a schedule it is given by name
                     ("plan", "--schedule"), ("plan", "--virtual-stages")}


def test_a_shared_option_has_one_help_and_one_default():
    seen: dict[str, tuple[str, click.Parameter]] = {}
    for name, cmd in _all_commands().items():
        for flag, p in _params(cmd).items():
            if (name, flag) in DIFFERENT_MEANING or flag == "--help":
                continue
            if flag not in seen:
                seen[flag] = (name, p)
                continue
            first, q = seen[flag]
            assert p.help == q.help, f"{flag}: help differs between {first} and {name}"
            assert getattr(p.type, "choices", None) == getattr(q.type, "choices", None), flag
            if flag not in DIFFERENT_DEFAULTS and not p.required and not q.required:
                assert p.default == q.default, f"{flag}: default differs between {first} and {name}"


def test_device_and_cluster_options_are_the_shared_declarations():
    for name in ("run", "comm", "slurm"):
        params = _params(main.commands[name])
        assert params["--device"].help == cli_options.DEVICE.settings["help"]
        assert params["--results-dir"].help == cli_options.RESULTS_DIR.settings["help"]
        assert params["--run-id"].help == cli_options.RUN_ID.settings["help"]
    for name in ("run", "comm"):
        params = _params(main.commands[name])
        for o in cli_options.CLUSTER:
            assert params[o.flag].help == o.settings["help"]
    assert _params(main.commands["run"])["--nproc-per-node"].help == cli_options.NPROC_PER_NODE.settings["help"]


def test_choices_come_from_the_planner_constants():
    from mgbench.layout import RECOMPUTE
    from mgbench.planner.memory import SCHEDULES, STATE_BYTES

    for name in ("memory", "predict"):
        params = _params(main.commands[name])
        assert tuple(params["--recompute"].type.choices) == RECOMPUTE
        assert tuple(params["--schedule"].type.choices) == SCHEDULES
        assert tuple(params["--precision"].type.choices) == tuple(STATE_BYTES)


def test_help_is_declared_once():
    with pytest.raises(ValueError, match="declared once"):
        cli_options.MODEL.but(help="another text")


def test_importing_the_cli_does_not_load_the_planner():
    # plan's options are made on first use: `mgbench status` and each node's `mgbench run`
    # should not load numpy (via the planner) just to parse their own options.
    import subprocess
    import sys

    code = "import sys, mgbench.cli; print('numpy' in sys.modules, 'mgbench.planner.search' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
