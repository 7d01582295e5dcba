"""The results directory: one folder per run (:class:`RunDir` owns its paths), written
so that nothing is lost: records appended and fsynced, the manifest rewritten atomically.

Every record and manifest carries ``schema_version``; reading goes through the
migrations of :mod:`mgbench.record`, so old run folders keep loading and a folder
written by a newer mgbench is refused with a message.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from . import run_files
from .errors import MgbenchError
from .record import COMM_ROW_VERSION, SCHEMA_VERSION, Record


def new_run_id(suite_name: str) -> str:
    """Sortable, unique, readable: 20261121-093012-smoke-1a2b."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "-", suite_name))[:40]  # a valid run id (check_run_id)
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """``run_id`` if it names one folder directly under the results folder, else an
    error saying why. An id is joined to --results-dir as given: a separator or '..'
    would put the run folder (and everything written into it) elsewhere, and a leading
    '.' would hide it from the listings that find runs."""
    why = _run_id_problem(run_id)
    if why is not None:
        raise MgbenchError(f"run id {run_id!r}: {why}; a run id is one plain folder name under the results folder, "
                           "e.g. exp1 (to use another folder, pass --results-dir)")
    return run_id


def _run_id_problem(run_id: str) -> str | None:
    return ("it is empty" if not run_id else
            "it holds a path separator" if "/" in run_id or "\\" in run_id else
            "it holds '..'" if ".." in run_id else
            "it starts with '.'" if run_id.startswith(".") else
            "it holds a NUL character" if "\0" in run_id else
            f"it is longer than {MAX_RUN_ID_BYTES} bytes" if len(run_id.encode()) > MAX_RUN_ID_BYTES else None)


# A file name holds at most 255 bytes; the report's temporary file (.<id>.html.tmp-<pid>)
# adds about 25 to the id.
MAX_RUN_ID_BYTES = 200


class RunDir:
    """Every path inside one run folder, in one place (asv's ``Results.get_filename``):
    no other module spells a file name of a run folder.

    results/<run_id>/
      manifest.json             run id, times, suite, machine fingerprint (atomic rewrite)
      records.jsonl             one record per config, appended and fsynced as each ends
      samples/<config>.json     raw per-step times per config and rank, and losses
      jobs/<tag>.json           the configs one torchrun job runs (written by the launcher)
      progress/<tag>.json       which config a job runs now, since when, which round
      logs/<tag>.log            a job's torchrun output; logs/<tag>/ its ranks' own files
      logs/fail-<config>-rank<r>.json, logs/<config>.rank<r>.stderr.txt, logs/<config>.traceback.txt
      logs/<config>.command.log, logs/<config>.steps.txt   a command config's output and step events
      nodes/node-<n>.json       each node's fingerprint (multi-node runs)
      reference/<key>.json      cached single-process reference trajectories
      comm.jsonl, comm_fit.json rows and alpha-beta fits of `mgbench comm`
      op_counts.json            each config's traced ops per step (predict --against, the projection)
      job.sbatch                the Slurm batch script of `mgbench slurm`
    """

    def __init__(self, path: "str | Path | RunDir") -> None:
        self.path = path.path if isinstance(path, RunDir) else Path(path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, results_dir: str | Path, run_id: str) -> "RunDir":
        """Make results/<run_id>/ (and results/ if needed); never reuse an existing folder."""
        check_run_id(run_id)
        root = Path(results_dir)
        if root.exists() and not root.is_dir():
            raise MgbenchError(f"results dir {root} exists and is not a folder; pass --results-dir DIR")
        path = root / run_id
        try:
            root.mkdir(parents=True, exist_ok=True)
            path.mkdir()
        except FileExistsError:
            raise MgbenchError(f"run folder {path} already exists; choose another --run-id") from None
        except OSError as e:
            raise MgbenchError(f"cannot create run folder {path}: {e.strerror}; pass a writable --results-dir") from None
        rd = cls(path)
        for sub in (rd.samples_dir, rd.logs_dir, rd.progress_dir, rd.jobs_dir):
            sub.mkdir()
        return rd

    # run level
    @property
    def manifest(self) -> Path:
        return self.path / "manifest.json"

    @property
    def records(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def sbatch(self) -> Path:
        return self.path / "job.sbatch"

    # per config
    @property
    def samples_dir(self) -> Path:
        return self.path / "samples"

    def sample(self, config_id: str) -> Path:
        return self.samples_dir / f"{config_id}.json"

    def relative(self, path: Path) -> str:
        """A path inside the folder as records store it (relative, so folders can move)."""
        return str(path.relative_to(self.path))

    def failure(self, config_id: str, rank: int) -> Path:
        """A rank's own account of why it failed a config (written by the rank)."""
        return self.logs_dir / f"fail-{config_id}-rank{rank}.json"

    def failures(self, config_id: str) -> list[Path]:
        return sorted(self.logs_dir.glob(f"fail-{config_id}-rank*.json"))

    def stderr_tail(self, config_id: str, rank: int) -> Path:
        return self.logs_dir / f"{config_id}.rank{rank}.stderr.txt"

    def command_log(self, config_id: str) -> Path:
        """A command config's full stdout and stderr, as the command wrote them."""
        return self.logs_dir / f"{config_id}.command.log"

    def step_file(self, config_id: str) -> Path:
        """Where a command config's mgbench.step() events go (MGBENCH_STEP_FILE)."""
        return self.logs_dir / f"{config_id}.steps.txt"

    def traceback(self, config_id: str) -> Path:
        return self.logs_dir / f"{config_id}.traceback.txt"

    def reference(self, key: str) -> Path:
        return self.path / "reference" / f"{key}.json"

    # per torchrun job
    @property
    def jobs_dir(self) -> Path:
        return self.path / "jobs"

    def job(self, tag: str) -> Path:
        """The job file a torchrun job's ranks read their configs from."""
        return self.jobs_dir / f"{tag}.json"

    @property
    def progress_dir(self) -> Path:
        return self.path / "progress"

    def progress(self, tag: str) -> Path:
        return self.progress_dir / f"{tag}.json"

    def progress_files(self) -> list[Path]:
        """Every job's progress file (runner/worker.mark_started: the config running now)."""
        return sorted(self.progress_dir.glob("*.json"))

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    def job_log(self, tag: str) -> Path:
        return self.logs_dir / f"{tag}.log"

    def rank_logs(self, tag: str) -> Path:
        """torchrun's --log-dir for a job: each rank's stdout/stderr below it."""
        return self.logs_dir / tag

    def rank_stderrs(self, tag: str) -> dict[int, Path]:
        """The newest stderr file torchrun kept for each rank of a job on one node, by
        local rank (the folder torchrun names; the global rank is written inside it:
        launching.rank_of_stderr)."""
        return {int(f.parent.name): f for f in sorted(self.rank_logs(tag).glob("**/stderr.log"))
                if f.parent.name.isdigit()}

    def slurm_output_pattern(self) -> Path:
        """sbatch's --output pattern (%j: the job id)."""
        return self.logs_dir / "slurm-%j.out"

    def slurm_outputs(self) -> list[Path]:
        return sorted(self.logs_dir.glob("slurm-*.out"))

    # multi-node
    @property
    def nodes_dir(self) -> Path:
        return self.path / "nodes"

    def node(self, node_rank: int) -> Path:
        return self.nodes_dir / f"node-{node_rank}.json"

    def nodes(self) -> list[Path]:
        return sorted(self.nodes_dir.glob("*.json")) if self.nodes_dir.is_dir() else []

    # mgbench comm
    @property
    def comm_rows(self) -> Path:
        return self.path / "comm.jsonl"

    @property
    def comm_fit(self) -> Path:
        return self.path / "comm_fit.json"

    # the planner's op counts of the run's configs (planner/against.py)
    @property
    def op_counts(self) -> Path:
        return self.path / "op_counts.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write to a temporary file, fsync, then rename over: readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk: leave the old file, no half-written temporary
        tmp.unlink(missing_ok=True)
        raise _naming(e, path)


def append_record(run_dir: "RunDir | Path", record: Record) -> None:
    """Append one record line and fsync it, under an exclusive lock."""
    line = json.dumps(record.to_dict(), sort_keys=True, default=str) + "\n"
    path = RunDir(run_dir).records
    try:
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    except OSError as e:
        raise _naming(e, path)


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, naming the file in the error of a failed write."""
    try:
        path.write_text(text)
    except OSError as e:
        raise _naming(e, path)


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` with the file it was writing: a failed write() or fsync() names none, and
    the launcher's message for a full disk says which file could not be written."""
    if e.filename is None:
        e.filename = str(path)
    return e


# --- reading a run folder's files ---------------------------------------------------
# Whatever a file holds (a folder in its place, bytes that are not UTF-8, JSON of
# another shape), reading it ends in one MgbenchError naming the file (and line) and
# what to do: the readers further on (show, status, report, compare) index and compute
# with what these functions return, where a bad value would end in a traceback.

# What reading an absent file raises: no file, or a path through something not a folder.
ABSENT = (FileNotFoundError, NotADirectoryError)


def _read_bytes(path: Path, what: str) -> bytes:
    """The bytes of a run folder's file. An absent file raises one of :data:`ABSENT`
    (each caller says what absence means); any other failure is an error naming the file
    and why (a folder in its place, no permission)."""
    try:
        return path.read_bytes()
    except ABSENT:
        raise
    except OSError as e:
        raise _unreadable(e, path, what) from None


def _unreadable(e: OSError, path: Path, what: str) -> MgbenchError:
    """The error for a file of a run folder the system would not read."""
    if isinstance(e, IsADirectoryError):
        return MgbenchError(f"{path}: a folder where the {what} file belongs; move it aside (the run folder is "
                            "damaged)")
    return MgbenchError(f"{path}: cannot read the {what} file ({e.strerror or e}); make it readable, or move the run "
                        "folder aside")


def _utf8(data: bytes, where: "Path | str", what: str, fix: str = run_files.FILE_FIX) -> str:
    """``data`` as text: mgbench writes its JSON as UTF-8 (ASCII), so other bytes are
    damage, named with where they are."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MgbenchError(f"{where}: the {what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                           f"{fix}") from None


def _json_lines(data: bytes, path: Path, what: str, first: int = 1) -> Iterator[tuple[str, Any]]:
    """("path:line", value) of each non-blank line of a JSON-lines file's bytes (``first``:
    the number of the first line they hold); a line that is not UTF-8 or not JSON is an
    error naming it. Split on newlines alone, so the numbers are those an editor shows."""
    for i, raw in enumerate(data.split(b"\n"), first):
        if not raw.strip():
            continue
        where = f"{path}:{i}"
        try:
            value = json.loads(_utf8(raw, where, what, run_files.LINE_FIX))
        except json.JSONDecodeError as e:
            raise MgbenchError(f"{where}: corrupt {what} ({e.msg}); {run_files.LINE_FIX}") from None
        yield where, value


def read_records(run_dir: "RunDir | Path") -> list[dict[str, Any]]:
    """All records of a run (migrated to this schema version), as flat dicts; a line
    that cannot be read, is not JSON or is not a record is an error naming the file and
    line."""
    return [rec for _, rec in _numbered_records(RunDir(run_dir).records)]


def _numbered_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each record of records.jsonl with where it is ("path:line"); none if the file
    is absent."""
    try:
        data = _read_bytes(path, "records")
    except ABSENT:
        return []
    return [(where, run_files.record_of(value, where)) for where, value in _json_lines(data, path, "record")]


class RecordTail:
    """Reads only the records appended since the last call (whole lines only), so a
    launcher polling several times a second does not re-parse the whole file while
    ranks are being timed on the same cores."""

    def __init__(self, run_dir: "RunDir | Path") -> None:
        self.path = RunDir(run_dir).records
        self.offset = 0
        self.lines = 0  # lines read so far: errors name the line as an editor numbers it

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except ABSENT:
            return []
        except OSError as e:
            raise _unreadable(e, self.path, "records") from None
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self.offset += end
        first = self.lines + 1
        self.lines += data.count(b"\n", 0, end)
        return [run_files.record_of(value, where) for where, value in _json_lines(data[:end], self.path, "record", first)]


def latest_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per config: the last one written (a resumed run re-records the
    configs that were interrupted), in first-seen order."""
    last: dict[str, dict[str, Any]] = {}
    for r in records:
        last[r.get("config_id", id(r))] = r
    return list(last.values())


def recorded_configs(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each config a run has recorded and its latest record's status, but for interrupted
    ones: what a resume leaves alone (runner/launch.py runs the others again)."""
    return {r["config_id"]: r["status"] for r in latest_records(records) if r["status"] != "interrupted"}


def repair_tail(run_dir: "RunDir | Path") -> int:
    """Drop a half-written last line (a writer killed mid-line); returns bytes dropped."""
    path = RunDir(run_dir).records
    try:
        data = _read_bytes(path, "records")
    except ABSENT:
        return 0
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return len(data) - keep


def write_manifest(run_dir: "RunDir | Path", manifest: dict[str, Any]) -> None:
    """Rewrite a run's manifest atomically, stamped with this schema version."""
    write_json_atomic(RunDir(run_dir).manifest, {**manifest, "schema_version": SCHEMA_VERSION})


def read_manifest(run_dir: "RunDir | Path") -> dict[str, Any]:
    """A run's manifest, migrated to this schema version; one that cannot be read, is not
    JSON or is not a manifest is an error naming the file."""
    path = RunDir(run_dir).manifest
    try:
        data = _read_bytes(path, "manifest")
    except ABSENT:  # no file, or run_dir is not a folder
        raise MgbenchError(f"{run_dir} is not an mgbench run folder (no manifest.json)") from None
    try:
        value = json.loads(_utf8(data, path, "manifest"))
    except json.JSONDecodeError as e:
        raise MgbenchError(f"{path}: corrupt manifest ({e.msg}); repair it, or move the run folder aside") from None
    return run_files.manifest_of(value, str(path))


def resolve_run(run: str | Path, results_dir: str | Path = "results") -> Path:
    """A run given as a path to its folder or as a run id under ``results_dir`` (a
    plain folder name: check_run_id)."""
    not_id = _run_id_problem(str(run))  # such a name must not lead out of results_dir
    shown = f"{Path(results_dir)}/"  # as messages name it: "" is the current folder, ./
    candidates = [Path(run)] + ([Path(results_dir) / str(run)] if not_id is None else [])
    for p in candidates:
        if _looked_up(p.is_dir, p, results_dir):
            if not _looked_up(RunDir(p).manifest.exists, p, results_dir):
                raise MgbenchError(f"{p} is not an mgbench run folder (no manifest.json)")
            return p
    if not_id is not None:
        raise MgbenchError(f"run {str(run)!r}: no such folder, and not a run id ({not_id}); "
                           f"give a run folder's path, or a run id under {shown}")
    if not Path(results_dir).is_dir():
        raise MgbenchError(f"run {str(run)!r} not found: the results folder {shown} does not exist; give the folder "
                           "your runs are in with --results-dir (or a run folder's path)")
    raise MgbenchError(
        f"run {str(run)!r} not found as a folder or as a run id under {shown}; "
        f"list them with `ls {shown}` or pass another --results-dir"
    )


def _looked_up(test: Callable[[], bool], path: Path, results_dir: str | Path) -> bool:
    """``test()`` (is_dir, exists) of a path a run given by name leads to; an error naming
    the path where the system refuses to look (a name longer than a file name may be, a
    folder without permission), which pathlib raises instead of answering False."""
    try:
        return test()
    except OSError as e:
        raise MgbenchError(f"run {_shown(str(path))}: cannot look it up ({e.strerror}); give a run folder's path, or a "
                           f"run id under {Path(results_dir)}/") from None


def _shown(name: str, limit: int = 80) -> str:
    """A name as an error message shows it: a name of hundreds of characters cut short,
    saying how long it is, so the message stays one readable line."""
    return name if len(name) <= limit else f"{name[:limit]}... ({len(name)} characters)"


def profiles_dir(results_dir: str | Path = "results") -> Path:
    """Where `mgbench probe` keeps hardware profiles: beside the runs, not a run itself."""
    return Path(results_dir) / "profiles"


def datasets_dir(results_dir: str | Path = "results") -> Path:
    """Where `data = "disk"` configs without a data_path get their generated token
    datasets (mgbench.dataset.cached): beside the runs, shared by them, not a run itself."""
    return Path(results_dir) / "datasets"


def read_progress(path: Path) -> dict[str, Any] | None:
    """A job's progress file (config_id, started, round, rounds), or None while it is
    absent or half-written; one that cannot be read or is not a progress file is an
    error naming it."""
    try:
        data = _read_bytes(path, "progress")
    except ABSENT:
        return None
    try:
        value = json.loads(_utf8(data, path, "progress file"))
    except json.JSONDecodeError:  # half-written: the next poll reads it whole
        return None
    return run_files.progress_of(value, str(path))


def latest_run(results_dir: str | Path = "results") -> Path:
    """The newest run folder: the latest its manifest says it started (a chosen --run-id
    such as "slow" does not sort by time as generated ids do), then the folder name."""
    root = Path(results_dir)
    runs = [p for p in root.glob("*") if _has_manifest(p)] if root.is_dir() else []
    if not runs:
        raise MgbenchError(f"no runs under {root}/; run `mgbench run` first or pass --results-dir")

    def started(p: Path) -> tuple[bool, str, str]:
        try:
            return True, str(read_manifest(p).get("started_at") or ""), p.name
        except MgbenchError:  # a damaged manifest: after every readable run, not a crash of `show`
            return False, "", p.name

    return max(runs, key=started)


def _has_manifest(folder: Path) -> bool:
    """Whether a folder holds a manifest.json (file or not: reading it says what is wrong);
    False where the system will not say (a folder without permission): not a run to pick."""
    try:
        return RunDir(folder).manifest.exists()
    except OSError:
        return False


def load(runs: Iterable[str | Path], results_dir: str | Path = "results") -> "Any":
    """One pandas DataFrame of the records of one or many runs, with run-level columns
    (run_id, hostname, gpu_name) added from each manifest."""
    import pandas as pd

    rows = []
    for run in runs:
        path = resolve_run(run, results_dir)
        manifest = read_manifest(path)
        machine = manifest.get("machine") or {}
        numbered = _numbered_records(RunDir(path).records)
        for where, rec in numbered:
            run_files.check_table_keys(rec, where)
        for rec in latest_records([rec for _, rec in numbered]):
            rows.append(
                {
                    "run_id": manifest.get("run_id", path.name),
                    "hostname": machine.get("hostname"),
                    "gpu_name": machine.get("gpu_name"),
                    **rec,
                }
            )
    return pd.DataFrame(rows)


# --- mgbench comm: rows and fits, read and written in one place ---------------------

def load_comm_rows(run_dir: "str | Path | RunDir") -> list[dict[str, Any]]:
    """Every row of a comm run (none if it has no comm.jsonl), migrated to the current
    version; a corrupt line is an error naming the file and line."""
    path = RunDir(run_dir).comm_rows
    try:
        data = _read_bytes(path, "comm rows")
    except ABSENT:
        return []
    return [run_files.comm_row_of(value, where) for where, value in _json_lines(data, path, "comm row")]


def append_comm_row(run_dir: "str | Path | RunDir", row: dict[str, Any]) -> None:
    """Append one row, stamped with COMM_ROW_VERSION, and fsync it (a sweep killed
    later keeps every size measured so far)."""
    with open(RunDir(run_dir).comm_rows, "a") as f:
        f.write(json.dumps({"schema_version": COMM_ROW_VERSION, **row}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_comm_fits(run_dir: "str | Path | RunDir") -> dict[str, Any]:
    """The alpha-beta fits of a comm run, keyed "collective:dtype:scope" (null where a
    series had too few sizes to fit); empty if the run has none yet. Fits are derived
    from the rows on every run, so they carry no version of their own."""
    path = RunDir(run_dir).comm_fit
    try:
        data = _read_bytes(path, "comm fits")
    except ABSENT:
        return {}
    try:
        value = json.loads(_utf8(data, path, "comm fits file", "repair or delete it"))
    except json.JSONDecodeError as e:
        raise MgbenchError(f"{path}: corrupt comm fits ({e.msg}); repair or delete it") from None
    return run_files.comm_fits_of(value, str(path))
