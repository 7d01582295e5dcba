"""Published training runs ran, so each one's layout fit in its GPUs' memory: the
planner's memory model (planner/memory.py: what `mgbench memory` prints and `plan` filters
layouts by) against every scored row of the four files of published throughput:
published_moe_runs.toml (moe_validation), accelerator_runs.toml (accelerator_validation;
a run that file shares with the MoE file is counted there, once), published_runs.toml
(validation; its row of a run the MoE file holds, ``same_run``, is counted there) and
generation_pairs.toml (both rows of each pair). Each row is counted with the bytes a
parameter of weights, gradients and optimizer states its recipe keeps (its
``state_bytes`` where its source states them; its stack's otherwise).

A one-sided check, fitted to nothing. A run's peak is at most its GPU's memory, so:
- a row whose count alone (the model's total without the allowance: its tensors and the
  process's fixed CUDA and NCCL costs) exceeds the GPU's memory is an error of the count,
  or of what the row says of its run (a recompute its source does not name, say);
- a row over the GPU's memory only with the allowance (memory.ALLOWANCE_FRACTION, the
  margin `plan` keeps free for fragmentation and workspaces) is a layout `plan` would not
  offer although it ran.

    python -m mgbench.planner.published_fits
"""

from __future__ import annotations

from typing import Any

from .. import catalog
from ..layout import Layout

MOE_FILE, ACCELERATOR_FILE, DENSE_FILE, PAIRS_FILE = ("published_moe_runs.toml", "accelerator_runs.toml",
                                                     "published_runs.toml", "generation_pairs.toml")
FILES = (MOE_FILE, ACCELERATOR_FILE, DENSE_FILE, PAIRS_FILE)


def _ratio(file: str, id_: str, split: str, total: float, allowance: float, device: float) -> dict[str, Any]:
    """One row: its file, id and split, its GPU's memory in GB, and the model's total with
    the allowance (``total``) and without it (``counted``), as fractions of that memory."""
    return {"file": file, "id": id_, "split": split, "device_gb": device / 1e9, "total": total / device,
            "counted": (total - allowance) / device}


def device_bytes(row: dict[str, Any], catalog_bytes: float) -> float:
    """The GPU memory the row's run had: its ``gpu_memory_gb`` where the run's GPU is not
    the catalog system's it is priced on (torchtitan's Grand Teton H100s have 96 GB, the
    catalog's H100 SXM 80), else the catalog's."""
    from ..errors import MgbenchError
    from .hardware import GIB

    given = row.get("gpu_memory_gb")
    if given is None:
        return catalog_bytes
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not given > 0:
        raise MgbenchError(f"{row['id']}: gpu_memory_gb {given!r} is not a positive number (the GPU's memory label)")
    return float(given) * GIB  # a label, as hardware.toml's memory_gb


def moe_ratios(scored: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The scored rows of published_moe_runs.toml that were priced (moe_validation.score:
    a refused layout has no memory), from their scores (``scored``: the file's, cached)."""
    from .moe_validation import SPLITS, file_scores

    scored = list(file_scores()) if scored is None else scored
    return [_ratio(MOE_FILE, r["id"], r["split"], r["memory_gb"] * 1e9, r["allowance_gb"] * 1e9, r["device_gb"] * 1e9)
            for r in scored if r["split"] in SPLITS and r.get("memory_gb") is not None]


def accelerator_ratios() -> list[dict[str, Any]]:
    """The scored rows of accelerator_runs.toml whose run the MoE file does not hold, each
    priced on its own system (the rows of a run both files hold are the MoE file's); not
    its "ratio" rows, whose layouts the file assumes."""
    from .accelerator_validation import SPLITS, moe_row_for, runs, shape_of
    from .predict import memory
    from .resolve import resolve

    from .stack import row_state_bytes

    out = []
    for r in runs():
        # A "ratio" row's layout is the file's assumption (its header), not the run's.
        if r["split"] not in SPLITS or moe_row_for(r) is not None or r["metric"] == "ratio":
            continue
        hw = resolve(precision=r["precision"], system=r["system"], stack=r["stack"])
        m = memory(shape_of(r), Layout.from_published(r), stack=r["stack"], state_bytes=row_state_bytes(r))
        out.append(_ratio(ACCELERATOR_FILE, r["id"], r["split"], m["total_bytes"], m["allowance_bytes"],
                          device_bytes(r, hw.memory_bytes)))
    return out


def _dense_ratio(file: str, run: dict[str, Any], split: str) -> dict[str, Any]:
    """One published run in validation.predict_run's form, with its defaults where it names
    neither ZeRO nor precision (validation.RUN_DEFAULTS), and with its stack's bytes a
    parameter or its own."""
    from ..model_shape import ModelShape
    from . import hardware
    from .predict import memory
    from .validation import RUN_DEFAULTS, stack_of

    from .stack import row_state_bytes

    row = {**RUN_DEFAULTS, **run}
    shape = catalog.model_shape(run["model"]) if "model" in run else ModelShape(**run["shape"])
    hw = hardware.resolve(system=run["system"], precision=row["precision"])
    m = memory(shape, Layout.from_published(row), stack=stack_of(run), state_bytes=row_state_bytes(run))
    return _ratio(file, run["id"], split, m["total_bytes"], m["allowance_bytes"], device_bytes(run, hw.memory_bytes))


def pair_ratios() -> list[dict[str, Any]]:
    """Both rows of every generation pair (generation_pairs.toml: llm-foundry's MPT runs on
    8 A100s and 8 H100s, FSDP, activation checkpointing as each row says), split "pair"."""
    from .validation import generation_pairs

    return [_dense_ratio(PAIRS_FILE, p[side], "pair") for p in generation_pairs() for side in ("a100", "h100")]


def dense_ratios() -> list[dict[str, Any]]:
    """Every row of published_runs.toml (its ``role`` as the split), but a row whose
    ``same_run`` names the MoE file's row of the same run (counted there, with the run's
    own options); MgbenchError where that row does not exist."""
    from ..errors import MgbenchError
    from .moe_validation import runs as moe_runs
    from .validation import published_runs

    moe_ids = {r["id"] for r in moe_runs()}
    out = []
    for run in published_runs():
        if "same_run" in run:
            if run["same_run"] not in moe_ids:
                raise MgbenchError(f"published_runs.toml {run['id']}: same_run {run['same_run']!r} is no row of "
                                   f"{MOE_FILE}")
            continue
        out.append(_dense_ratio(DENSE_FILE, run, run["role"]))
    return out


def ratios(scored: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every file's rows (:func:`moe_ratios` with ``scored``, :func:`accelerator_ratios`,
    :func:`dense_ratios`, :func:`pair_ratios`)."""
    return moe_ratios(scored) + accelerator_ratios() + dense_ratios() + pair_ratios()


def summary(rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rows priced, the ones over their GPU's memory with the allowance (``over_total``:
    `plan` would not offer them) and without it (``over_counted``: the count alone is too
    large), each list largest first; ``files``: the same for each file's rows."""
    rows = ratios() if rows is None else rows

    def one(sel: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rows": len(sel),
                "over_total": sorted((r for r in sel if r["total"] > 1.0), key=lambda r: -r["total"]),
                "over_counted": sorted((r for r in sel if r["counted"] > 1.0), key=lambda r: -r["counted"])}

    out = one(rows)
    out["files"] = {f: one([r for r in rows if r["file"] == f]) for f in FILES if any(r["file"] == f for r in rows)}
    return out


def summary_line(s: dict[str, Any] | None = None, what: str = "Published") -> str:
    """One summary (:func:`summary`, or one file's part of it) in one line; ``what`` names
    the rows ("Published MoE" in the docs' MoE line)."""
    s = summary() if s is None else s
    worst = s["over_counted"][0] if s["over_counted"] else None
    return (f"{what} layouts the memory model says do not fit: {len(s['over_total'])} of {s['rows']} "
            f"with the allowance `plan` keeps free, {len(s['over_counted'])} on the model's count alone"
            + (f" (worst {worst['id']}, {worst['counted']:.2f}x its GPU's memory)" if worst else ""))


def report(rows: list[dict[str, Any]] | None = None) -> str:
    """The rows over their GPU's memory, largest first, file by file, and each file's and
    the whole's :func:`summary_line`."""
    rows = ratios() if rows is None else rows
    s = summary(rows)
    head = f"{'run':<52}  {'split':<11}  {'GPU GB':>6}  {'total':>6}  {'counted':>7}"
    lines = ["Published runs ran, so they fit: the memory model's total (with the allowance plan keeps free) and "
             "count (without it), as multiples of the GPU's memory; the rows over 1"]
    for f, part in s["files"].items():
        lines += ["", f"{f}:", head, "-" * len(head)]
        lines += [f"{r['id']:<52}  {r['split']:<11}  {r['device_gb']:>6.0f}  {r['total']:>5.2f}x  {r['counted']:>6.2f}x"
                  for r in part["over_total"]]
        lines.append(summary_line(part, f"{f}:"))
    lines += ["", summary_line(s, "All published")]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m mgbench.planner.published_fits
    print(report())
