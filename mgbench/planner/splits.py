"""The two parts of every validation file (data/published_*.toml): "fit" rows may set a
constant, "held_out" rows only check one. Their files' rules alternate the two in file
order (:func:`alternating`), each file saying which comes first."""

from __future__ import annotations

SPLITS = ("fit", "held_out")


def alternating(turn: int, first: str = "fit") -> str:
    """The split of the ``turn``-th row (from 0) of rows that alternate, ``first`` first."""
    if first not in SPLITS:
        raise ValueError(f"first must be one of {SPLITS}, got {first!r}")
    return first if turn % 2 == 0 else SPLITS[1 - SPLITS.index(first)]
