import json

import pytest

from mgbench import store
from mgbench.errors import MgbenchError
from mgbench.record import SCHEMA_VERSION, Record
from tests import factories
from tests.factories import make_config, make_record


def make_run(tmp_path, run_id="r1"):
    return factories.make_run(tmp_path / "results", run_id, machine={"hostname": "h", "gpu_name": None})


def test_append_and_read_back(tmp_path):
    run = make_run(tmp_path)
    store.append_record(run, make_record(make_config(config_id="a"), tokens_per_s=10.0))
    store.append_record(run, Record.skipped(make_config(config_id="b", skip_reason="no GPU"), "r1"))
    recs = store.read_records(run)
    assert [r["config_id"] for r in recs] == ["a", "b"]
    assert all(r["schema_version"] == SCHEMA_VERSION for r in recs)
    assert recs[1]["status"] == "skipped" and recs[1]["skip_reason"] == "no GPU"


def test_loader_builds_one_dataframe_from_many_runs(tmp_path):
    for rid in ("r1", "r2"):
        run = make_run(tmp_path, rid)
        store.append_record(run, make_record(make_config(config_id="a"), rid, tokens_per_s=5.0))
    df = store.load(["r1", tmp_path / "results" / "r2"], results_dir=tmp_path / "results")
    assert list(df["run_id"]) == ["r1", "r2"]
    assert list(df["tokens_per_s"]) == [5.0, 5.0]
    assert set(df["hostname"]) == {"h"}


def test_old_records_without_schema_version_still_load(tmp_path):
    run = make_run(tmp_path)
    run.records.write_text(json.dumps({"config_id": "old", "status": "ok"}) + "\n")
    assert store.read_records(run)[0]["schema_version"] == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path):
    run = make_run(tmp_path)
    run.records.write_text(json.dumps({"schema_version": 99, "status": "ok"}) + "\n")
    with pytest.raises(MgbenchError, match="newer"):
        store.read_records(run)


def test_corrupt_line_names_file_and_line(tmp_path):
    run = make_run(tmp_path)
    store.append_record(run, make_record(make_config(config_id="a")))
    with open(run.records, "a") as f:
        f.write('{"config_id": "b", "sta\n')
    with pytest.raises(MgbenchError, match=r"records.jsonl:2: corrupt record"):
        store.read_records(run)


def test_resolve_run_errors(tmp_path):
    with pytest.raises(MgbenchError, match="not found"):
        store.resolve_run("nope", tmp_path)
    (tmp_path / "foreign").mkdir()
    with pytest.raises(MgbenchError, match="not an mgbench run folder"):
        store.resolve_run(tmp_path / "foreign", tmp_path)
    with pytest.raises(MgbenchError, match="no runs"):
        store.latest_run(tmp_path / "empty")


def test_run_folders_are_never_reused(tmp_path):
    make_run(tmp_path)
    with pytest.raises(MgbenchError, match="already exists"):
        store.RunDir.create(tmp_path / "results", "r1")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    store.write_json_atomic(tmp_path / "m.json", {"a": 1})
    store.write_json_atomic(tmp_path / "m.json", {"a": 2})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_record_tail_reads_only_new_whole_lines(tmp_path):
    run = make_run(tmp_path)
    tail = store.RecordTail(run)
    assert tail.new() == []
    store.append_record(run, make_record(make_config(config_id="a")))
    assert [r["config_id"] for r in tail.new()] == ["a"]
    assert tail.new() == []
    with open(run.records, "a") as f:
        f.write('{"config_id": "b", "status": "ok"')  # a writer mid-line
    assert tail.new() == []
    with open(run.records, "a") as f:
        f.write("}\n")
    assert [r["config_id"] for r in tail.new()] == ["b"]
