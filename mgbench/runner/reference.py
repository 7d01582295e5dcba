"""The single-process reference a config is checked against.

Same seed, same initial weights, same global batch per step, same precision (fp8: the
float8 weights cast from the precision the strategy casts them from, strategies/fp8.py); one
process, no wrapper, the global batch taken as micro-batches with gradient
accumulation (mathematically the same mean loss as data parallelism, and no more
memory than one rank of it). Cached per run folder, so each distinct reference is
computed once per run.

:func:`reference_check` is the reference of the check window (learnable data; loss,
gradient norm and parameter fingerprint), compared by
:func:`mgbench.runner.check.compare_check`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ..config import REFERENCE_KEYS, RunConfig
from ..store import RunDir, write_json_atomic
from ..strategies.apply import prepare_reference
from ..strategies.fp8 import weights_cast_from_gathered
from . import check
from .training import batches_for


def check_key(cfg: RunConfig, device: torch.device) -> str:
    """Cache key of a check-window reference: what its figures depend on, as the config
    schema declares it (REFERENCE_KEYS: not the strategy, layout or injected bug, so every
    config of one workload shares it), plus the global batch and the window itself, and
    for fp8 the one thing a strategy changes in it: whether the float8 weights are cast
    from bf16 (rowwise under FSDP2, strategies/fp8.py)."""
    params = cfg.params()
    fields = {k: params[k] for k in REFERENCE_KEYS}
    fields.update(kind="check", data=check.CHECK_DATA, lr=check.CHECK_LR, global_batch=cfg.global_batch,
                  steps=cfg.check_steps)
    if weights_cast_from_gathered(cfg):  # only where it applies: other fp8 configs keep one reference per recipe
        fields["fp8_weights_from"] = "bf16"
    return "check-" + hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def reference_check(cfg: RunConfig, device: torch.device, run_dir: "str | Path | RunDir",
                    reverse_micro_batches: bool = False) -> dict[str, Any]:
    """The check-window figures of the single-process reference (losses, grad_norm,
    param_norm, param_delta_norm), cached per run folder.

    Runs in this process only (no collective), so rank 0 may call it while the others
    wait. ``reverse_micro_batches`` accumulates each step's micro-batches in reverse
    order: a reference that differs only in reduction order, for measuring tolerances
    (never cached).
    """
    path = RunDir(run_dir).reference(check_key(cfg, device))
    if path.exists() and not reverse_micro_batches:
        return json.loads(path.read_text())["figures"]
    if cfg.check_steps == 0:
        return {"losses": [], "grad_norm": None, "param_norm": None, "param_delta_norm": None}
    prep = prepare_reference(cfg, device)
    check.set_lr(prep, check.CHECK_LR)
    batches = batches_for(cfg, range(cfg.check_steps), 0, 1, device, learnable=True,
                          grad_accum=cfg.global_batch // cfg.micro_batch)
    if reverse_micro_batches:
        batches = [list(reversed(b)) for b in batches]
    figures = check.check_window(prep, batches, device, cfg.precision)
    if not reverse_micro_batches:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"key": check_key(cfg, device), "global_batch": cfg.global_batch, "figures": figures})
    return figures
