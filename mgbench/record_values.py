"""A flat record's values as its run wrote them.

A record reaches the model either as a line of records.jsonl or as a row of a pandas
table of records (store.load). The table changes two things the dataclasses that rebuild
a config refuse: a value one record left out (a model dim at its neutral value, a key a
newer version added) becomes NaN in every record without it, and an integer column with
such a gap is held as floats, 4 as 4.0. :func:`fields_as_written` undoes both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def value_of(rec: dict[str, Any], key: str) -> Any:
    """``rec[key]``, None where the record has none (absent, or NaN in a table of records)."""
    value = rec.get(key)
    return None if isinstance(value, float) and math.isnan(value) else value


def fields_as_written(cls: type, rec: dict[str, Any], *, prefix: str = "",
                      renamed: dict[str, str] | None = None) -> dict[str, Any]:
    """The fields of dataclass ``cls`` that ``rec`` holds (under ``prefix`` + name, or the
    name ``renamed`` gives), as the run wrote them: NaN read as absent, a field whose type
    does not admit None left to its default where the record has none, and an integral
    float given to an int field as an int."""
    renamed = renamed or {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = prefix + renamed.get(f.name, f.name)
        if key not in rec:
            continue
        value = value_of(rec, key)
        annotation = str(f.type)
        if value is None and "None" not in annotation:
            continue  # absent in this record: the default stands (or the class names what is missing)
        if annotation.startswith("int") and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[f.name] = value
    return out
