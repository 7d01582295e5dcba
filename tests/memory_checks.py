"""Assertions on a record's memory fields, shared by the integration runs (each strategy's
tracked figures are checked in whichever real run already launches it)."""

from __future__ import annotations

from typing import Any

from mgbench.telemetry.memory import TRACKED_CATEGORIES


def assert_tracked_memory(rec: dict[str, Any]) -> None:
    """An ok CPU record: tracked figures present and adding up, per rank too, beside the
    RSS training peak and the init peak."""
    label = rec["label"]
    assert rec["mem_tracked_reason"] is None, (label, rec["mem_tracked_reason"])
    parts = [rec[f"mem_tracked_{c}_bytes"] for c in TRACKED_CATEGORIES]
    assert all(p is not None and p >= 0 for p in parts), label
    assert sum(parts) == rec["mem_tracked_peak_bytes"] > 0, label
    assert rec["mem_tracked_params_bytes"] > 0 and rec["mem_tracked_activations_bytes"] > 0, label
    per_rank = rec["mem_tracked_categories_per_rank"]
    assert len(per_rank) == len(rec["mem_tracked_peak_bytes_per_rank"]) == rec["nproc"], label
    assert max(r["peak"] for r in per_rank) == rec["mem_tracked_peak_bytes"], label
    assert "MemTracker" in rec["mem_tracked_method"] and rec["mem_tracked_s"] > 0, label
    assert rec["mem_method"] in ("cpu_peak_rss_per_rank", "cpu_process_lifetime_peak_rss"), label
    assert rec["mem_init_peak_gib"] > 0 and len(rec["mem_init_peak_gib_per_rank"]) == rec["nproc"], label
