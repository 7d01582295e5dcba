"""Published MoE runs ran, so each one's layout fit in its GPUs' memory: the planner's
memory model (planner/memory.py: what `mgbench memory` prints and `plan` filters layouts
by) against every scored row of data/published_moe_runs.toml, with the bytes a parameter
of weights, gradients and optimizer states the row's recipe keeps (its ``state_bytes``,
where its source states them; its stack's otherwise: moe_validation.state_bytes_of).

A one-sided check, fitted to nothing. A run's peak is at most its GPU's memory, so:
- a row whose counted tensors alone (the model's total without the allowance) exceed the
  GPU's memory is an error of the count, or of what the row says of its run (a recompute
  its source does not name, say);
- a row over the GPU's memory only with the allowance (memory.ALLOWANCE_FRACTION, the
  margin `plan` keeps free for fragmentation and workspaces) is a layout `plan` would not
  offer although it ran.

    python -m mgbench.planner.moe_fits
"""

from __future__ import annotations

from typing import Any

from .moe_validation import SPLITS, file_scores


def ratios(scored: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each scored row that was priced (moe_validation.score: a refused layout has no
    memory): its id and split, its GPU's memory in GB, and the model's total with the
    allowance (``total``) and without it (``counted``), as fractions of that memory."""
    scored = list(file_scores()) if scored is None else scored
    out = []
    for r in scored:
        if r["split"] not in SPLITS or r.get("memory_gb") is None:
            continue
        out.append({"id": r["id"], "split": r["split"], "device_gb": r["device_gb"],
                    "total": r["memory_gb"] / r["device_gb"],
                    "counted": (r["memory_gb"] - r["allowance_gb"]) / r["device_gb"]})
    return out


def summary(rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rows priced, the ones over their GPU's memory with the allowance (``over_total``:
    `plan` would not offer them) and without it (``over_counted``: the count alone is too
    large), each list largest first."""
    rows = ratios() if rows is None else rows
    return {"rows": len(rows),
            "over_total": sorted((r for r in rows if r["total"] > 1.0), key=lambda r: -r["total"]),
            "over_counted": sorted((r for r in rows if r["counted"] > 1.0), key=lambda r: -r["counted"])}


def summary_line(s: dict[str, Any] | None = None) -> str:
    """The check in one line (the report's last; docs/planner.md)."""
    s = summary() if s is None else s
    worst = s["over_counted"][0] if s["over_counted"] else None
    return (f"Published MoE layouts the memory model says do not fit: {len(s['over_total'])} of {s['rows']} with the "
            f"allowance `plan` keeps free, {len(s['over_counted'])} on the counted tensors alone"
            + (f" (worst {worst['id']}, {worst['counted']:.2f}x its GPU's memory)" if worst else ""))


def report(rows: list[dict[str, Any]] | None = None) -> str:
    """The rows over their GPU's memory, largest first, and :func:`summary_line`."""
    rows = ratios() if rows is None else rows
    s = summary(rows)
    head = f"{'run':<52}  {'split':<8}  {'GPU GB':>6}  {'total':>6}  {'counted':>7}"
    lines = ["Published MoE runs ran, so they fit: the memory model's total (with the allowance plan keeps free) and "
             "counted tensors (without it), as multiples of the GPU's memory; the rows over 1",
             head, "-" * len(head)]
    for r in s["over_total"]:
        lines.append(f"{r['id']:<52}  {r['split']:<8}  {r['device_gb']:>6.0f}  {r['total']:>5.2f}x  {r['counted']:>6.2f}x")
    lines.append(summary_line(s))
    return "\n".join(lines)


if __name__ == "__main__":  # python -m mgbench.planner.moe_fits
    print(report())
