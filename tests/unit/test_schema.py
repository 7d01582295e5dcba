"""The declared schema: configs, records, run folders and their migrations."""

import json
import shutil
from pathlib import Path

import pytest

from mgbench import config, store
from mgbench.config import IDENTITY_KEYS, PROCEDURE_KEYS, SWEEP_KEYS, RunConfig
from mgbench.errors import MgbenchError
from mgbench.record import RECORD_FIELDS, SCHEMA_VERSION, Record, config_from_record, identity_of_record
from mgbench.report.compare import compare_runs
from mgbench.suite import expand, parse_suite
from tests.factories import make_config, make_record, make_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def test_every_suite_key_declares_check_help_and_role():
    for name, f in config.FIELDS.items():
        if f.metadata["suite_key"]:
            assert callable(f.metadata["check"]) and f.metadata["help"], name
            assert f.metadata["role"] in (config.WORKLOAD, config.PROCEDURE), name
            assert f.metadata["check"](f.default) is None, f"{name}: its default fails its own check"
    assert set(IDENTITY_KEYS) >= {"model", "strategy", "grad_compression", "dp_mode", "powersgd_rank", "dp", "tp", "pp"}
    assert not set(IDENTITY_KEYS) & {"seed", "inject", "rounds", "measured_steps", "layout"}
    assert set(PROCEDURE_KEYS) <= set(SWEEP_KEYS)


def test_docs_key_table_is_the_schema():
    page = (Path(__file__).resolve().parents[2] / "docs" / "suites.md").read_text()
    assert config.keys_markdown() in page, (
        "docs/suites.md's suite key table drifted: run `python -m tests.unit.test_docs --write`")


def test_run_help_lists_every_key():
    from click.testing import CliRunner

    from mgbench.cli import main

    out = CliRunner().invoke(main, ["run", "--help"], terminal_width=200).output
    for name in SWEEP_KEYS:
        assert f"  {name} = " in out, name


def test_labels_are_unique_within_a_sweep():
    s = parse_suite('name = "x"\n[sweep]\nstrategy = ["ddp", "zero1"]\nnproc = [1, 2]\n'
                    'grad_compression = ["none", "fp16"]\nseed = [0, 1]\n'
                    'model = ["tiny", {layers = 2, hidden = 64, heads = 4, ffn_hidden = 128, vocab = 256},'
                    ' {layers = 2, hidden = 64, heads = 4, ffn_hidden = 128, vocab = 256, kv_heads = 2}]\n')
    configs = expand(s, "cpu", 4)
    labels = [c.label for c in configs]
    assert len(configs) == 48 and len(set(labels)) == len(labels)
    assert any("grad_compression=fp16" in lb and "seed=1" in lb for lb in labels)
    # Keys that do not apply to a config are not in its label (dp_mode is pp+tp+dp's).
    assert not any("dp_mode" in lb or "pp_schedule" in lb for lb in labels)


def test_device_is_named_when_it_varies_and_a_redundant_layout_is_one_config():
    s = parse_suite('name = "x"\n[sweep]\nstrategy = "ddp"\nnproc = 2\ndevice = ["cpu", "cuda"]\n'
                    'layout = ["auto", {dp = 2}]\n')
    configs = expand(s, "cpu", 4)
    assert len(configs) == 2  # layout {dp = 2} is what "auto" resolves to on 2 ddp ranks
    assert sorted(c.label for c in configs) == ["ddp n=2 tiny mb=1 s=128 ga=1 fp32 device=cpu",
                                                "ddp n=2 tiny mb=1 s=128 ga=1 fp32 device=cuda"]
    assert "device=" not in expand(parse_suite('name = "x"\n[sweep]\nstrategy = "ddp"\n'), "cpu", 4)[0].label


def test_keys_that_do_not_apply_are_pinned():
    s = parse_suite('name = "x"\n[sweep]\nstrategy = ["ddp", "pp"]\nnproc = 2\npp_schedule = ["gpipe", "1f1b"]\n'
                    'grad_accum = 2\n')
    configs = [c for c in expand(s, "cpu", 4)]
    assert sorted((c.strategy, c.pp_schedule) for c in configs) == [("ddp", "1f1b"), ("pp", "1f1b"), ("pp", "gpipe")]


def test_config_round_trips_through_the_job_file():
    cfg = make_config(strategy="fsdp", nproc=2, model={"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128,
                                                      "vocab": 256}, label_keys=("seed",))
    back = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.identity() == cfg.identity() and back.label == cfg.label


def test_record_round_trips_and_identity_matches_config():
    cfg = make_config(strategy="ddp", nproc=2, grad_compression="fp16", seed=1, label_keys=("seed",))
    flat = json.loads(json.dumps(make_record(cfg, step_times_s=[0.1, 0.2, 0.3]).to_dict()))
    assert flat["schema_version"] == SCHEMA_VERSION and flat["model_layers"] == cfg.shape.layers
    assert flat["label"].endswith("grad_compression=fp16 seed=1")
    assert identity_of_record(flat) == cfg.identity()
    assert config_from_record(flat) == cfg
    with pytest.raises(TypeError):
        Record(cfg, "r", "ok", not_a_declared_field=1)  # every field is declared once, in Record


def test_a_failure_record_needs_a_failure_status():
    with pytest.raises(ValueError):
        Record.failed(make_config(), "r", "ok", "not a failure")
    rec = Record.failed(make_config(), "r", "timeout", "still running").to_dict()
    assert rec["status"] == "timeout" and rec["step_time_s"] is None and rec["backend"] == "gloo"


def test_every_record_field_has_unit_and_help():
    for name, f in RECORD_FIELDS.items():
        if name in ("run_id", "status"):
            continue
        assert "unit" in f.metadata and f.metadata["help"], name


def test_run_folder_of_schema_v1_still_loads(tmp_path):
    """A run folder written by mgbench before this schema (committed fixture): it loads,
    its records migrate (ac names, labels that name every workload field), compare works."""
    run = tmp_path / "v1-smoke"
    shutil.copytree(FIXTURES / "v1-smoke", run)
    raw = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert {r["schema_version"] for r in raw} == {1}
    recs = store.read_records(run)
    assert len(recs) == 20 and all(r["schema_version"] == SCHEMA_VERSION for r in recs)
    old_labels = {r["label"] for r in raw}
    new_labels = {r["label"] for r in recs}
    assert len(old_labels) < 20 and len(new_labels) == 20  # v1 merged labels of fp16-compressed configs
    assert store.read_manifest(run)["schema_version"] == SCHEMA_VERSION
    # The v1 check compared losses on random tokens only: its verdict is kept, and marked.
    assert all("could not detect a frozen model" in r["check_data"] for r in recs if r.get("correct") is not None)
    rows = compare_runs(str(run), str(run), tmp_path)
    assert len(rows) == 20
    df = store.load([run])
    assert len(df) == 20 and (df["status"] == "ok").sum() == 13


def test_v1_records_load_as_typed_records_with_every_field_declared():
    from mgbench.record import Record

    for flat in store.read_records(FIXTURES / "v1-smoke"):
        back = Record.from_dict(flat).to_dict()
        assert {k: back[k] for k in flat} == flat
        # Figures v1 did not have are unknown; config keys added since take their declared
        # default (the config v1 ran had none of them, so it ran as their default does).
        new = set(back) - set(flat)
        # (A config key that shares a figure's name is stored as record.CONFIG_RENAMED says.)
        from mgbench.record import CONFIG_RENAMED

        assert all(back[CONFIG_RENAMED.get(k, k)] == config.FIELDS[k].default
                   for k in {n for n in config.FIELDS if CONFIG_RENAMED.get(n, n) in new})
        assert all(back[k] is None for k in new - set(config.FIELDS) - set(CONFIG_RENAMED.values()))
    with pytest.raises(MgbenchError, match="undeclared field"):
        Record.from_dict({**flat, "tokens_per_sec": 1.0})


def test_a_v1_run_resumes_with_nothing_left_to_run(tmp_path):
    """Migrated ids are today's ids, so `--resume` of a complete v1 folder runs nothing,
    and its stored sweep (validated by today's checks) expands to the same configs."""
    from mgbench.runner.launch import run_suite
    from mgbench.suite import suite_from_manifest

    shutil.copytree(FIXTURES / "v1-smoke", tmp_path / "v1-smoke")
    suite = suite_from_manifest(store.read_manifest(tmp_path / "v1-smoke"))
    said = []
    run_suite(suite, tmp_path, device_kind="cpu", num_devices=4, progress=said.append, resume="v1-smoke")
    assert said[0] == "resuming v1-smoke: 20 of 20 configs already recorded"
    assert len(store.read_records(tmp_path / "v1-smoke")) == 20  # nothing re-recorded


def test_a_v2_run_folder_loads_and_resumes_with_nothing_left_to_run(tmp_path):
    """A folder written by the previous release (schema 2, committed fixture), whose ids
    hashed every suite key of its day: migrated ids are today's, so resume runs nothing."""
    from mgbench.runner.launch import run_suite
    from mgbench.suite import suite_from_manifest

    shutil.copytree(FIXTURES / "v2-smoke", tmp_path / "v2-smoke")
    raw = [json.loads(line) for line in (tmp_path / "v2-smoke" / "records.jsonl").read_text().splitlines()]
    assert {r["schema_version"] for r in raw} == {2}
    recs = store.read_records(tmp_path / "v2-smoke")
    assert len(recs) == 8 and {r["schema_version"] for r in recs} == {SCHEMA_VERSION}
    assert {r["config_id"] for r in recs}.isdisjoint({r["config_id"] for r in raw})  # ids were recomputed
    suite = suite_from_manifest(store.read_manifest(tmp_path / "v2-smoke"))
    said = []
    run_suite(suite, tmp_path, device_kind="cpu", num_devices=4, progress=said.append, resume="v2-smoke")
    assert said[0] == "resuming v2-smoke: 8 of 8 configs already recorded"
    assert len(store.read_records(tmp_path / "v2-smoke")) == 8


def test_a_key_at_its_default_does_not_change_the_id():
    """So adding a suite key (whose default keeps the old behaviour) leaves old ids valid."""
    p = make_config(strategy="ddp", nproc=2).params()
    assert config.config_id(p) == config.config_id({k: v for k, v in p.items() if k != "offload"})
    assert config.config_id(p) != config.config_id({**p, "offload": True})


def test_v1_every_second_block_checkpointing_is_renamed():
    rec = json.loads((FIXTURES / "v1-smoke" / "records.jsonl").read_text().splitlines()[0])
    rec["activation_checkpointing"] = "selective"
    from mgbench.record import migrate_record

    assert migrate_record(rec)["activation_checkpointing"] == "every_2nd"
    with pytest.raises(MgbenchError, match="renamed 'every_2nd'"):
        parse_suite('name = "x"\n[sweep]\nactivation_checkpointing = "selective"\n')


def test_folder_from_a_newer_mgbench_is_refused(tmp_path):
    run = make_run(tmp_path, "new", [make_record()])
    m = json.loads(run.manifest.read_text())
    run.manifest.write_text(json.dumps({**m, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(MgbenchError, match="newer mgbench"):
        store.read_manifest(run)


def test_launcher_does_not_load_the_rank_side():
    import subprocess
    import sys

    code = "import sys, mgbench.runner.launch, mgbench.cli; print('torch' in sys.modules, 'mgbench.runner.worker' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_no_module_imports_the_worker():
    root = Path(config.__file__).resolve().parent
    offenders = [p for p in root.rglob("*.py") if p.name != "worker.py"
                 and ("runner.worker import" in p.read_text() or "from .worker import" in p.read_text())]
    assert offenders == []


def test_no_run_folder_path_literal_outside_rundir():
    """RunDir owns every path of a run folder: no other module names its files, or joins
    its folder names onto a path."""
    import re

    root = Path(config.__file__).resolve().parent
    files = ("records.jsonl", "manifest.json", "comm.jsonl", "comm_fit.json", "job.sbatch")
    dirs = ("samples", "logs", "progress", "reference", "nodes", "jobs", "plans")
    pattern = re.compile("|".join([re.escape(f'"{f}"') for f in files] + [rf'/\s*"{d}"' for d in dirs]))
    offenders = [(p.name, m.group()) for p in root.rglob("*.py") if p.name != "store.py"
                 for m in pattern.finditer(p.read_text())]
    assert offenders == []


def test_scaling_plot_keeps_configs_that_differ_in_workload_apart():
    from mgbench.report.figures import _series_key

    df = store.load([FIXTURES / "v1-smoke"])
    ok = df[df["status"] == "ok"]
    series = _series_key(ok)
    ddp = set(series[ok["strategy"] == "ddp"])
    assert ddp == {"ddp tiny mb=2 s=32 ga=1 fp32", "ddp tiny mb=2 s=32 ga=1 fp32 grad_compression=fp16"}
    assert series.value_counts().max() == 2  # each line: the same config at 1 and 2 ranks
