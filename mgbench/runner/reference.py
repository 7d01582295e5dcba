"""The single-process reference loss trajectory a config is checked against.

Same seed, same initial weights, same global batch per step, same precision; one
process, no wrapper, the global batch taken as micro-batches with gradient
accumulation (mathematically the same mean loss as data parallelism, and no more
memory than one rank of it). Cached per run folder, so each distinct reference is
computed once per run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ..store import write_json_atomic
from ..strategies.apply import prepare_reference
from .training import rank_batches, train_step

# Relative tolerance on each checked step's loss. fp32: only the order of floating
# point reductions differs between layouts (observed differences ~1e-7 on CPU), 1e-4
# leaves room for longer runs without hiding real bugs, which move the loss by >1e-2.
# bf16 / fp16 round every matmul, and sharded layouts round in a different order.
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
# Compressed gradients change the update on purpose (lossy): the check then only asks
# that training stays on the reference's track, within 5%, and the record says lossy.
LOSSY_TOLERANCE = 5e-2


def reference_key(cfg: Any) -> str:
    fields = {
        "model": cfg.model, "seq_len": cfg.seq_len, "micro_batch": cfg.micro_batch,
        "global_batch": cfg.global_batch, "seed": cfg.seed, "precision": cfg.precision,
        "steps": cfg.check_steps, "device": cfg.device,
    }
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def reference_losses(cfg: Any, device: torch.device, run_dir: Path) -> list[float]:
    """Losses of the first ``cfg.check_steps`` steps of the single-process reference."""
    path = run_dir / "reference" / f"{reference_key(cfg)}.json"
    if path.exists():
        return json.loads(path.read_text())["losses"]
    prep = prepare_reference(cfg, device)
    micro_per_step = cfg.global_batch // cfg.micro_batch
    batches = rank_batches(
        cfg.seed, range(cfg.check_steps), 0, cfg.micro_batch, micro_per_step, 1,
        cfg.seq_len, cfg.shape.vocab, device,
    )
    losses = [float(train_step(prep, b, device, cfg.precision)) for b in batches]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"key": reference_key(cfg), "losses": losses, "global_batch": cfg.global_batch})
    return losses


def compare(losses: list[float], ref: list[float], precision: str, lossy: bool = False) -> dict[str, Any]:
    """loss_max_rel_diff over the checked steps and whether it is within tolerance."""
    tol = max(LOSS_TOLERANCE[precision], LOSSY_TOLERANCE) if lossy else LOSS_TOLERANCE[precision]
    n = min(len(losses), len(ref))
    if n == 0:
        return {"loss_max_rel_diff": None, "loss_tolerance": tol, "correct": None,
                "correct_reason": "check_steps = 0: no loss check"}
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], ref[:n])]
    worst = max(diffs)
    ok = worst <= tol
    return {
        "loss_max_rel_diff": worst,
        "loss_tolerance": tol,
        "lossy": lossy,
        "loss_ref": ref[:n],
        "correct": ok,
        "correct_reason": None if ok else f"loss differs from the single-process reference by {worst:.2e} (> {tol:g})",
    }
