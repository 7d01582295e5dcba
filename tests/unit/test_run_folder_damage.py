"""A damaged run folder (an audit of the readers of results/, 2026-11-29): bytes that are
not UTF-8, a folder or an unreadable file where a file belongs, a name too long to look
up, JSON of another shape, a value of the wrong type. Each is one line naming the file
(and line) and what to do, exit status 2, never a traceback from show, status, report or
compare; a damaged sibling folder does not stop `show` from finding the newest run; and
what mgbench writes reads as before."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgbench import store
from mgbench.cli import main
from mgbench.errors import MgbenchError
from tests.factories import make_config, make_record, make_run


def _invoke(root: Path, args: list[str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, [*args, "--results-dir", str(root)])


def _one_line_exit_2(root: Path, args: list[str], *words: str) -> str:
    r = _invoke(root, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and all(w in r.output for w in words), r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    return r.output


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """results/ holding run "b": one ok config, as the launcher writes it."""
    results = tmp_path / "results"
    cfg = make_config(strategy="ddp", nproc=2)
    make_run(results, "b", [make_record(cfg, "b", step_times_s=[0.1, 0.11, 0.1, 0.12, 0.1, 0.1])],
             status="complete", suite={"name": "smoke"}, started_at="2026-11-29T10:00:00")
    return results


DELETE = object()  # a value of _edit_record: the key is taken out


def _edit_record(root: Path, run: str = "b", **changes) -> None:  # type: ignore[no-untyped-def]
    """Rewrite the first record of ``run`` with ``changes``."""
    path = store.RunDir(root / run).records
    rec = json.loads(path.read_text().splitlines()[0])
    rec.update({k: v for k, v in changes.items() if v is not DELETE})
    for k in [k for k, v in changes.items() if v is DELETE]:
        del rec[k]
    path.write_text(json.dumps(rec) + "\n")


def _edit_manifest(root: Path, run: str = "b", **changes) -> None:  # type: ignore[no-untyped-def]
    path = store.RunDir(root / run).manifest
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_valid_run_folder_reads_as_before(root):
    """The negative control of every test below: show, status, report and compare of an
    undamaged folder."""
    for args in (["show", "b"], ["show", "b", "--json"], ["show", "b", "--csv"], ["status", "b"], ["show"],
                 ["compare", "b", "b"], ["report", "b", "-o", str(root / "r.html")]):
        r = _invoke(root, args)
        assert r.exit_code == 0, (args, r.output, r.exception)
    recs = store.read_records(root / "b")
    assert [r["config_id"] for r in recs] == [make_config(strategy="ddp", nproc=2).config_id]
    assert store.read_manifest(root / "b")["run_id"] == "b"


# --- A: I/O and decoding -------------------------------------------------------------

def test_a_record_line_that_is_not_utf8_names_its_line(root):
    with open(store.RunDir(root / "b").records, "ab") as f:
        f.write(b"\xff\n")
    _one_line_exit_2(root, ["show", "b"], "records.jsonl:2:", "not UTF-8", "remove or repair that line")


def test_a_manifest_that_is_not_utf8_is_named(root):
    store.RunDir(root / "b").manifest.write_bytes(b'{"run_id": "b\xff"}')
    _one_line_exit_2(root, ["show", "b"], "manifest.json:", "not UTF-8")
    _one_line_exit_2(root, ["status", "b"], "manifest.json:", "not UTF-8")


@pytest.mark.parametrize("name", ["records.jsonl", "manifest.json"])
def test_a_folder_where_a_file_belongs_is_named(root, name):
    path = root / "b" / name
    path.unlink()
    path.mkdir()
    _one_line_exit_2(root, ["show", "b"], f"b/{name}: a folder where the", "move it aside")


@pytest.mark.parametrize("name", ["records.jsonl", "manifest.json", "comm.jsonl", "comm_fit.json"])
def test_a_file_that_cannot_be_read_is_named(root, name, monkeypatch):
    # As root, chmod 000 does not stop a read: the refusal is made here, as the system
    # would make it for another user.
    path = root / "b" / name
    if not path.exists():
        path.write_text("{}\n")
    real = Path.read_bytes

    def refuse(self):  # type: ignore[no-untyped-def]
        if self.name == name:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    read = {"records.jsonl": store.read_records, "manifest.json": store.read_manifest,
            "comm.jsonl": store.load_comm_rows, "comm_fit.json": store.load_comm_fits}[name]
    with pytest.raises(MgbenchError, match=rf"b/{name}: cannot read the .* file \(Permission denied\); make it "
                                           "readable"):
        read(root / "b")
    if name in ("records.jsonl", "manifest.json"):
        _one_line_exit_2(root, ["show", "b"], f"b/{name}: cannot read", "Permission denied")


def test_a_run_name_too_long_to_look_up_is_named(root):
    out = _one_line_exit_2(root, ["show", "a" * 300], "File name too long", "give a run folder's path")
    assert "(300 characters)" in out and "a" * 300 not in out  # cut short: one readable line
    _one_line_exit_2(root, ["compare", "b", "a" * 300], "File name too long")


@pytest.mark.parametrize("junk", [b"\xff", b"null", b"[]", b"{}", "folder"])
def test_the_newest_run_skips_a_damaged_sibling(root, junk):
    (root / "junk").mkdir()
    manifest = root / "junk" / "manifest.json"
    manifest.mkdir() if junk == "folder" else manifest.write_bytes(junk)
    assert store.latest_run(root).name == "b"
    for args in (["show"], ["status"]):
        r = _invoke(root, args)
        assert r.exit_code == 0 and "run b" in r.output, (args, r.output, r.exception)


def test_a_damaged_folder_sorts_after_every_readable_run(root):
    # A run whose manifest gives no start time ties with a damaged one on time: the
    # readable run wins, whatever the names.
    path = store.RunDir(root / "b").manifest
    manifest = json.loads(path.read_text())
    del manifest["started_at"]
    path.write_text(json.dumps(manifest))
    (root / "zz").mkdir()
    (root / "zz" / "manifest.json").write_text("[]")
    assert store.latest_run(root).name == "b"
    assert _invoke(root, ["show"]).exit_code == 0
    (root / "b").rename(root / "a")  # only damaged runs left to pick: the newest, and what is wrong with it
    (root / "a" / "manifest.json").write_text("null")
    _one_line_exit_2(root, ["show"], "zz/manifest.json: a manifest must be a JSON object")


def test_a_record_tail_names_the_line_of_a_damaged_record(root):
    run = store.RunDir(root / "b")
    tail = store.RecordTail(run)
    assert len(tail.new()) == 1
    with open(run.records, "a") as f:
        f.write("\n[1]\n")
    with pytest.raises(MgbenchError, match=r"records\.jsonl:3: a record must be a JSON object"):
        tail.new()


# --- B: the shape of what the files hold ---------------------------------------------

@pytest.mark.parametrize("line,got", [("[1]", "got a list"), ("null", "got null"), ("42", "got a number"),
                                      ('"x"', "got a string")])
def test_a_record_line_that_is_no_object_names_its_line(root, line, got):
    with open(store.RunDir(root / "b").records, "a") as f:
        f.write(line + "\n")
    for args in (["show", "b"], ["status", "b"], ["compare", "b", "b"]):
        _one_line_exit_2(root, args, "records.jsonl:2: a record must be a JSON object with status", got)


@pytest.mark.parametrize("key", ["status", "config_id"])
def test_a_record_without_status_or_config_id_names_its_line(root, key):
    _edit_record(root, **{key: DELETE})
    _one_line_exit_2(root, ["show", "b"], "records.jsonl:1: a record must be a JSON object with status (a string) "
                     "and config_id (a string)", f"this one has no {key}")
    _edit_record(root, **{key: 5})
    _one_line_exit_2(root, ["status", "b"], f"its {key} is 5")


def test_a_figure_of_the_wrong_type_is_named(root):
    _edit_record(root, tokens_per_s="fast")
    for args in (["show", "b"], ["compare", "b", "b"], ["report", "b", "-o", str(root / "r.html")]):
        _one_line_exit_2(root, args, 'records.jsonl:1: tokens_per_s must be a number or null, got "fast"')
    _edit_record(root, tokens_per_s=1.5, step_times_s=[0.1, "x"])
    _one_line_exit_2(root, ["compare", "b", "b"], "step_times_s must be a list of numbers or null")
    _edit_record(root, step_times_s=[0.1, 0.1], nproc="2")
    _one_line_exit_2(root, ["show", "b"], 'nproc must be a number or null, got "2"')


def test_an_ok_record_without_the_keys_the_report_groups_by_is_named(root):
    _edit_record(root, strategy=DELETE, nproc=DELETE)
    _one_line_exit_2(root, ["report", "b", "-o", str(root / "r.html")],
                     "records.jsonl:1: an ok record must have strategy, nproc (null where not measured)")
    assert _invoke(root, ["show", "b"]).exit_code == 0  # the table needs neither


def test_a_verdict_without_its_figures_is_named(root):
    _edit_record(root, input_bound=True, data_wait_s=None)
    _one_line_exit_2(root, ["show", "b"], "input_bound is true but data_wait_s", "measures them together")
    _edit_record(root, input_bound=None, straggler_ranks=[1], per_rank_busy_s=None)
    _one_line_exit_2(root, ["show", "b"], "straggler_ranks is [1] but per_rank_busy_s")


def test_a_damaged_old_record_is_named_not_a_migration_traceback(root):
    # Schema 1 records are rebuilt into their config on reading (today's ids): a dim of
    # the wrong type there is the line's problem.
    _edit_record(root, schema_version=1, model_layers="two")
    with pytest.raises(MgbenchError, match=r"records\.jsonl:1: "):
        store.read_records(root / "b")


@pytest.mark.parametrize("manifest,words", [
    ({}, "this one has no run_id"),
    ([], "a manifest must be a JSON object with run_id (a string) and machine (an object), got a list"),
    ({"run_id": "b"}, "this one has no machine"),
    ({"run_id": "b", "machine": None}, "its machine is null"),
    ({"run_id": "b", "machine": {}, "suite": []}, "suite must be an object with a name"),
    ({"run_id": "b", "machine": {}, "suite": {"name": "s"}, "status": 3}, "status must be a string or null"),
])
def test_a_manifest_of_another_shape_is_named(root, manifest, words):
    store.RunDir(root / "b").manifest.write_text(json.dumps(manifest))
    _one_line_exit_2(root, ["show", "b"], "manifest.json: ", words)


@pytest.mark.parametrize("version", [-1, "3", None, 2.0, True])
def test_a_schema_version_that_is_no_version_is_not_called_newer(root, version):
    _edit_manifest(root, schema_version=version)
    out = _one_line_exit_2(root, ["show", "b"], "manifest.json: schema_version must be a whole number from 0 to")
    assert "newer" not in out
    _edit_manifest(root, schema_version=5)
    _edit_record(root, schema_version=version)
    _one_line_exit_2(root, ["show", "b"], "records.jsonl:1: schema_version must be a whole number")


def test_a_newer_schema_version_is_still_refused_as_newer(root):
    _edit_manifest(root, schema_version=99)
    _one_line_exit_2(root, ["show", "b"], "manifest.json: the manifest has schema_version 99, newer than this "
                     "mgbench reads")


SHAPE = "a progress file must be a JSON object with config_id (a string) and started"


@pytest.mark.parametrize("progress,words", [
    ([1], f"{SHAPE} (a number: seconds since the epoch), got a list"),
    ({"config_id": "q"}, f"{SHAPE} (a number: seconds since the epoch); this one has no started"),
    ({"config_id": "q", "started": "now"}, f'{SHAPE} (a number: seconds since the epoch); its started is "now"'),
    ({"config_id": "q", "started": 1.0, "rounds": "2"}, 'rounds must be a number, got "2"'),
])
def test_a_progress_file_of_another_shape_is_named(root, progress, words):
    _edit_manifest(root, status="running", pid=1)
    store.RunDir(root / "b").records.unlink()  # nothing recorded yet: the progress file says what runs
    store.RunDir(root / "b").progress("group-0").write_text(json.dumps(progress))
    _one_line_exit_2(root, ["status", "b"], "progress/group-0.json: ", words)


def test_a_valid_progress_file_shows_what_runs(root):
    _edit_manifest(root, status="running", pid=1, machine={"hostname": "another-node"})
    store.RunDir(root / "b").records.unlink()
    store.RunDir(root / "b").progress("group-0").write_text(json.dumps({"config_id": "q", "started": 1.0}))
    r = _invoke(root, ["status", "b"])
    assert r.exit_code == 0 and "running now: q" in r.output, r.output
    store.RunDir(root / "b").progress("group-1").write_text('{"config_id": "q", "sta')  # half-written: not yet
    assert store.read_progress(store.RunDir(root / "b").progress("group-1")) is None


def _comm_run(root: Path) -> store.RunDir:
    rd = make_run(root, "c", kind="comm", status="complete", comm={"nproc": 2, "device": "cpu"},
                  interconnect={"summary": "loopback"}, suite={"name": "comm"})
    row = {"collective": "all_reduce", "dtype": "float32", "scope": "all", "size_bytes": 4096, "count": 1024,
           "time_s": 5e-4, "algbw_gbps": 0.008, "busbw_gbps": 0.008, "wrong": 0, "nproc": 2}
    rd.comm_rows.write_text(json.dumps(row) + "\n")
    rd.comm_fit.write_text(json.dumps({"all_reduce:float32:all": None}))
    return rd


def test_a_comm_row_of_another_shape_is_named(root):
    rd = _comm_run(root)
    assert _invoke(root, ["show", "c"]).exit_code == 0  # negative control
    with open(rd.comm_rows, "a") as f:
        f.write("[1]\n")
    _one_line_exit_2(root, ["show", "c"], "comm.jsonl:2: a comm row must be a JSON object with collective", "got a list")
    store.RunDir(root / "b").comm_rows.write_text("[1]\n")  # the report reads any run's comm rows
    _one_line_exit_2(root, ["report", "b", "-o", str(root / "r.html")], "b/comm.jsonl:1: a comm row")
    rd.comm_rows.write_text(json.dumps({"collective": "all_reduce", "time_s": "fast"}) + "\n")
    _one_line_exit_2(root, ["show", "c"], 'comm.jsonl:1: time_s must be a number, got "fast"')
    rd.comm_rows.write_text(json.dumps({"collective": "all_reduce", "schema_version": "2"}) + "\n")
    _one_line_exit_2(root, ["show", "c"], "comm.jsonl:1: schema_version must be a whole number")


@pytest.mark.parametrize("fits,words", [
    ([], "comm fits must be a JSON object"),
    ({"all_reduce": None}, 'fit key "all_reduce" must be collective:dtype:scope'),
    ({"all_reduce:float32:all": [1]}, "fit all_reduce:float32:all must be a JSON object with alpha_s"),
    ({"all_reduce:float32:all": {"alpha_s": None, "bw_gbps": 1.0}}, "its alpha_s is null"),
])
def test_comm_fits_of_another_shape_are_named(root, fits, words):
    rd = _comm_run(root)
    rd.comm_fit.write_text(json.dumps(fits))
    _one_line_exit_2(root, ["show", "c"], "comm_fit.json: ", words)
