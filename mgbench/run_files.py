"""What each file of a run folder must hold for its readers (show, status, report,
compare, the launcher): records, the manifest, progress files, comm rows and fits. Pure
checks on parsed JSON (store.py reads the files and calls them): each returns the value
or raises one MgbenchError naming where it is ("path:line") and what it must be."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from .catalog import is_number
from .config import RunConfig
from .errors import MgbenchError, first_line
from .model_shape import ModelShape
from .record import (COMM_ROW_VERSION, CONFIG_RENAMED, RECORD_FIELDS, SCHEMA_VERSION, migrate_comm_row,
                     migrate_manifest, migrate_record)

# What an error advises for a damaged line, and for a damaged file.
LINE_FIX = "remove or repair that line"
FILE_FIX = "repair it, or move the run folder aside"


def _kind(value: Any) -> str:
    """What a JSON value is, as an error says it."""
    return ("null" if value is None else "true or false" if isinstance(value, bool) else
            "a number" if isinstance(value, (int, float)) else "a string" if isinstance(value, str) else
            "a list" if isinstance(value, list) else "an object")


def _got(value: Any) -> str:
    """A wrong value as an error quotes it: its JSON, cut short."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_version(obj: dict[str, Any], where: str, newest: int, fix: str) -> None:
    """schema_version, where given, is a whole number from 0 (one above ``newest`` is the
    migration's to refuse: it says to upgrade mgbench)."""
    v = obj.get("schema_version", 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MgbenchError(f"{where}: schema_version must be a whole number from 0 to {newest} (this mgbench writes "
                           f"{newest}), got {_got(v)}; {fix}")


def _migrated(migrate: Callable[[dict[str, Any]], dict[str, Any]], obj: dict[str, Any], where: str, fix: str
              ) -> dict[str, Any]:
    """``migrate(obj)``, its errors naming where ``obj`` is: a newer version refused, or an
    old version whose migration (which rebuilds the config of records before schema 3)
    meets a field of the wrong type."""
    try:
        return migrate(obj)
    except MgbenchError as e:
        raise MgbenchError(f"{where}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise MgbenchError(f"{where}: cannot be brought from schema_version {obj.get('schema_version', 0)} to "
                           f"{SCHEMA_VERSION} ({type(e).__name__}: {first_line(str(e))}); {fix}") from None


# What a value must be: (what, as an error says it; its test). Readers compute with
# numbers, so a bool (JSON true) is no number; int fields take any number (JSON has one
# kind). Null passes only a check made with _or_null.
Check = tuple[str, Callable[[Any], bool]]


# Each declared type: (one, many, test).
SCALARS: dict[str, tuple[str, str, Callable[[Any], bool]]] = {
    "float": ("a number", "numbers", is_number),
    "int": ("a number", "numbers", is_number),
    "str": ("a string", "strings", lambda v: isinstance(v, str)),
    "bool": ("true or false", "true or false values", lambda v: isinstance(v, bool)),
    "dict": ("an object", "objects", lambda v: isinstance(v, dict)),
}
NUMBER: Check = SCALARS["float"][0::2]
STRING: Check = SCALARS["str"][0::2]
OBJECT: Check = SCALARS["dict"][0::2]
NAME: Check = ("a string", lambda v: isinstance(v, str) and v != "")  # an id: empty names nothing


def _or_null(check: Check) -> Check:
    what, test = check
    return f"{what} or null", lambda v: v is None or test(v)


def _declared(annotation: str) -> Check | None:
    """The check of a dataclass field declared ``annotation`` ("float | None",
    "list[float] | None", "tuple[str, ...]" (a JSON list) ...), null allowed (a figure
    not measured, a key an old version lacks); None for what is not checked here (Any,
    a model spec)."""
    base = annotation.removesuffix(" | None")
    head = base.split("[")[0]
    if head in SCALARS:
        return _or_null(SCALARS[head][0::2])
    if head not in ("list", "tuple"):
        return None
    item = base[len(head) + 1:-1].removesuffix(", ...")
    nullable = item.endswith(" | None")
    found = SCALARS.get(item.removesuffix(" | None").split("[")[0])
    if found is None:
        return _or_null(("a list", lambda v: isinstance(v, list)))
    _, many, test = found
    return _or_null((f"a list of {many}" + (" (or nulls)" if nullable else ""),
                     lambda v: isinstance(v, list) and all(test(x) or (nullable and x is None) for x in v)))


def _record_checks() -> dict[str, Check]:
    """The check of every key of a flat record that says its type: the config's
    parameters (as Record.to_dict names them), its model's (model_*: the dims of a
    ModelShape, or what names a Hugging Face or vision model) and the declared figures."""
    checks = {k: _or_null(c) for k, c in (("label", STRING), ("model_hf", STRING), ("model_vision", STRING),
                                           ("model_config", OBJECT))}
    for cls, prefix in ((RunConfig, ""), (ModelShape, "model_")):
        for f in dataclasses.fields(cls):
            check = _declared(str(f.type))
            if check is not None:
                checks[prefix + CONFIG_RENAMED.get(f.name, f.name)] = check
    for name, f in RECORD_FIELDS.items():
        check = _declared(str(f.type))
        if check is not None:
            checks[name] = check
    return checks


# Per file: the keys every reader indexes (required), and what the others must be where
# given (what readers index or compute with: `show`, `status`, `report`, `compare`, the
# launcher). The required keys are all that mgbench has always written.
RECORD_KEYS: dict[str, Check] = {"status": NAME, "config_id": NAME}
RECORD_CHECKS = _record_checks()
# The keys `mgbench report` groups and ranks ok configs by: every record mgbench writes
# has them (null where not measured), so one without them was cut by hand.
TABLE_KEYS = ("strategy", "nproc", "tokens_per_s", "tokens_per_s_per_device")
# Verdicts and what they were judged on: mgbench writes them together, and the notes of
# `show` and the report print them together (as numbers), so a verdict without its
# figures was edited.
COMES_WITH = {"input_bound": ("data_wait_s", "data_wait_fraction", "step_time_s"),
              "straggler_ranks": ("per_rank_busy_s", "rank_spread_pct")}
MANIFEST_KEYS: dict[str, Check] = {"run_id": NAME, "machine": OBJECT}
MANIFEST_CHECKS: dict[str, Check] = {
    "suite": ("an object with a name (a string)", lambda v: isinstance(v, dict) and isinstance(v.get("name"), str)),
    "interconnect": OBJECT, "comm": _or_null(OBJECT), "slurm": _or_null(OBJECT),
    **{k: _or_null(STRING) for k in ("status", "kind", "started_at", "finished_at")}}
PROGRESS_KEYS: dict[str, Check] = {"config_id": NAME, "started": ("a number: seconds since the epoch", is_number)}
PROGRESS_CHECKS: dict[str, Check] = {"round": NUMBER, "rounds": NUMBER}
COMM_ROW_KEYS: dict[str, Check] = {"collective": NAME}
COMM_ROW_CHECKS: dict[str, Check] = {
    **dict.fromkeys(("size_bytes", "count", "time_s", "algbw_gbps", "busbw_gbps", "busbw_factor", "wrong", "nproc"),
                    NUMBER),
    **dict.fromkeys(("dtype", "scope", "kind"), STRING)}
FIT_KEYS: dict[str, Check] = {"alpha_s": NUMBER, "bw_gbps": _or_null(NUMBER)}  # null: no bandwidth resolved
FIT_CHECKS: dict[str, Check] = dict.fromkeys(("fit_mean_abs_error_pct", "fit_max_abs_error_pct", "fit_min_bytes",
                                              "num_points"), NUMBER)
# The scopes of fit keys: collectives over all ranks, intra- or inter-node groups; copies on one GPU.
SCOPES = ("all", "intra", "inter", "local")


def _shape(noun: str, required: dict[str, Check]) -> str:
    """"a record must be a JSON object with status (a string) and config_id (a string)"."""
    keys = [f"{k} ({what})" for k, (what, _) in required.items()]
    return f"{noun} must be a JSON object with " + " and ".join(filter(None, [", ".join(keys[:-1]), keys[-1]]))


def _object(value: Any, noun: str, required: dict[str, Check], where: str, fix: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an error saying what it must be."""
    if not isinstance(value, dict):
        raise MgbenchError(f"{where}: {_shape(noun, required)}, got {_kind(value)}; {fix}")
    return value


def _require(obj: dict[str, Any], noun: str, required: dict[str, Check], where: str, fix: str) -> None:
    """Each key of ``required`` is in ``obj`` and passes its check."""
    for key, (_, test) in required.items():
        if key not in obj or not test(obj[key]):
            why = f"this one has no {key}" if key not in obj else f"its {key} is {_got(obj[key])}"
            raise MgbenchError(f"{where}: {_shape(noun, required)}; {why}: {fix}")


def _check_types(obj: dict[str, Any], checks: dict[str, Check], where: str, fix: str) -> None:
    """Each key of ``checks`` that ``obj`` holds passes its check."""
    for key, (what, test) in checks.items():
        if key in obj and not test(obj[key]):
            raise MgbenchError(f"{where}: {key} must be {what}, got {_got(obj[key])}; {fix}")


def record_of(value: Any, where: str) -> dict[str, Any]:
    """A records.jsonl line's value as a record of this schema version, or an error
    naming the line. The version is checked first: a newer record is refused as such,
    whatever its keys."""
    rec = _object(value, "a record", RECORD_KEYS, where, LINE_FIX)
    _check_version(rec, where, SCHEMA_VERSION, LINE_FIX)
    _require(rec, "a record", RECORD_KEYS, where, LINE_FIX)
    rec = _migrated(migrate_record, rec, where, LINE_FIX)
    _check_types(rec, RECORD_CHECKS, where, LINE_FIX)
    for key, needs in COMES_WITH.items():
        missing = [n for n in needs if rec.get(key) and rec.get(n) is None]
        if missing:
            are = "is" if len(missing) == 1 else "are"
            raise MgbenchError(f"{where}: {key} is {_got(rec[key])} but {' and '.join(missing)} {are} null: mgbench "
                               f"measures them together; {LINE_FIX}")
    return rec


def check_table_keys(rec: dict[str, Any], where: str) -> None:
    """An ok record holds :data:`TABLE_KEYS`."""
    missing = [k for k in TABLE_KEYS if k not in rec] if rec["status"] == "ok" else []
    if missing:
        raise MgbenchError(f"{where}: an ok record must have {', '.join(missing)} (null where not measured), as "
                           f"mgbench writes them; {LINE_FIX}")


def manifest_of(value: Any, where: str) -> dict[str, Any]:
    """A manifest.json's value as a manifest of this schema version, or an error naming
    the file. Checked before migrating: the migrations read the suite."""
    manifest = _object(value, "a manifest", MANIFEST_KEYS, where, FILE_FIX)
    _check_version(manifest, where, SCHEMA_VERSION, FILE_FIX)
    _require(manifest, "a manifest", MANIFEST_KEYS, where, FILE_FIX)
    _check_types(manifest, MANIFEST_CHECKS, where, FILE_FIX)
    return _migrated(migrate_manifest, manifest, where, FILE_FIX)


def progress_of(value: Any, where: str) -> dict[str, Any]:
    """A progress file's value (runner/worker.mark_started writes it), or an error naming
    the file."""
    fix = "remove it (the job writes it anew as its next config starts)"
    progress = _object(value, "a progress file", PROGRESS_KEYS, where, fix)
    _require(progress, "a progress file", PROGRESS_KEYS, where, fix)
    _check_types(progress, PROGRESS_CHECKS, where, fix)
    return progress


def comm_row_of(value: Any, where: str) -> dict[str, Any]:
    """A comm.jsonl line's value as a row of this version, or an error naming the line."""
    row = _object(value, "a comm row", COMM_ROW_KEYS, where, LINE_FIX)
    _check_version(row, where, COMM_ROW_VERSION, LINE_FIX)
    _require(row, "a comm row", COMM_ROW_KEYS, where, LINE_FIX)
    row = migrate_comm_row(row, where)
    _check_types(row, COMM_ROW_CHECKS, where, LINE_FIX)
    return row


def comm_fits_of(value: Any, where: str) -> dict[str, Any]:
    """comm_fit.json's value: fits (objects, or null where too few sizes) keyed
    "collective:dtype:scope" (`show` splits the key in three and names its scope), or an
    error naming it."""
    fix = "repair or delete it"
    if not isinstance(value, dict):
        raise MgbenchError(f"{where}: comm fits must be a JSON object of fits keyed collective:dtype:scope, got "
                           f"{_kind(value)}; {fix}")
    for key, fit in value.items():
        parts = key.split(":")
        if len(parts) != 3 or parts[2] not in SCOPES:
            raise MgbenchError(f"{where}: fit key {_got(key)} must be collective:dtype:scope, scope one of "
                               f"{', '.join(SCOPES)}; {fix}")
        if fit is not None:
            _object(fit, f"fit {key}", FIT_KEYS, where, fix)
            _require(fit, f"fit {key}", FIT_KEYS, where, fix)
            _check_types(fit, FIT_CHECKS, f"{where}: fit {key}", fix)
    return value
