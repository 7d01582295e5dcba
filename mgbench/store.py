"""The results directory: one folder per run, written so that nothing is lost.

results/<run_id>/
  manifest.json   run id, times, suite text + hash, machine fingerprint (atomic rewrite)
  records.jsonl   one flat JSON object per config, appended and fsynced as each ends
  samples/        raw per-step times per config and rank
  logs/           each torchrun job's output

Every record carries ``schema_version``; :func:`migrate_record` brings older records up
to date on load, so old run folders keep loading.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Iterable

from .errors import MgbenchError

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "timeout", "error", "skipped", "interrupted")


def new_run_id(suite_name: str) -> str:
    """Sortable, unique, readable: 20261121-093012-smoke-1a2b."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", suite_name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def create_run_dir(results_dir: str | Path, run_id: str) -> Path:
    """Make results/<run_id>/ (and results/ if needed); never reuse an existing folder."""
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
    for sub in ("samples", "logs", "progress"):
        (path / sub).mkdir()
    return path


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write to a temporary file, fsync, then rename over: readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one record line and fsync it, under an exclusive lock."""
    record = {"schema_version": SCHEMA_VERSION, **record}
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    with open(run_dir / "records.jsonl", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def migrate_record(record: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version up to SCHEMA_VERSION."""
    version = record.get("schema_version", 0)
    if version > SCHEMA_VERSION:
        raise MgbenchError(
            f"record schema_version {version} is newer than this mgbench ({SCHEMA_VERSION}); upgrade mgbench"
        )
    # Version 0 (no field): records written before versioning; same fields.
    record["schema_version"] = SCHEMA_VERSION
    return record


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """All records of a run; a corrupt line is an error naming the file and line."""
    path = run_dir / "records.jsonl"
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise MgbenchError(
                    f"{path}:{i}: corrupt record ({e.msg}); remove or repair that line"
                ) from None
            out.append(migrate_record(rec))
    return out


class RecordTail:
    """Reads only the records appended since the last call (whole lines only), so a
    launcher polling several times a second does not re-parse the whole file while
    ranks are being timed on the same cores."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "records.jsonl"
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self.offset += end
        return [migrate_record(json.loads(line)) for line in data[:end].splitlines() if line.strip()]


def latest_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per config: the last one written (a resumed run re-records the
    configs that were interrupted), in first-seen order."""
    last: dict[str, dict[str, Any]] = {}
    for r in records:
        last[r.get("config_id", id(r))] = r
    return list(last.values())


def repair_tail(run_dir: Path) -> int:
    """Drop a half-written last line (a writer killed mid-line); returns bytes dropped."""
    path = run_dir / "records.jsonl"
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return len(data) - keep


def read_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise MgbenchError(f"{run_dir} is not an mgbench run folder (no manifest.json)") from None
    except json.JSONDecodeError as e:
        raise MgbenchError(f"{path}: corrupt manifest ({e.msg})") from None


def resolve_run(run: str | Path, results_dir: str | Path = "results") -> Path:
    """A run given as a path to its folder or as a run id under ``results_dir``."""
    candidates = [Path(run), Path(results_dir) / str(run)]
    for p in candidates:
        if p.is_dir():
            if not (p / "manifest.json").exists():
                raise MgbenchError(f"{p} is not an mgbench run folder (no manifest.json)")
            return p
    raise MgbenchError(
        f"run {str(run)!r} not found as a folder or as a run id under {results_dir}/; "
        "list runs with `ls results/` or pass --results-dir"
    )


def latest_run(results_dir: str | Path = "results") -> Path:
    """The newest run folder (run ids sort by time)."""
    root = Path(results_dir)
    runs = sorted(p for p in root.glob("*") if (p / "manifest.json").exists()) if root.is_dir() else []
    if not runs:
        raise MgbenchError(f"no runs under {root}/; run `mgbench run` first or pass --results-dir")
    return runs[-1]


def load(runs: Iterable[str | Path], results_dir: str | Path = "results") -> "Any":
    """One pandas DataFrame of the records of one or many runs, with run-level columns
    (run_id, hostname, gpu_name) added from each manifest."""
    import pandas as pd

    rows = []
    for run in runs:
        path = resolve_run(run, results_dir)
        manifest = read_manifest(path)
        machine = manifest.get("machine", {})
        for rec in latest_records(read_records(path)):
            rows.append(
                {
                    "run_id": manifest.get("run_id", path.name),
                    "hostname": machine.get("hostname"),
                    "gpu_name": machine.get("gpu_name"),
                    **rec,
                }
            )
    return pd.DataFrame(rows)
