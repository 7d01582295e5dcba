"""Factories for configs, records and run folders in tests: built through the schema
(RunConfig, Record, RunDir), never as hand-written dicts, so a field renamed or added in
the schema reaches every test."""

from __future__ import annotations

import dataclasses
from typing import Any

from mgbench import store
from mgbench.config import RunConfig, config_id
from mgbench.record import RankFigures, Record
from mgbench.store import RunDir
from mgbench.layout import for_strategy


def make_config(**kw: Any) -> RunConfig:
    """A config as the suite expansion would build it: defaults of the schema, the given
    fields, degrees resolved, and its id computed (unless ``config_id`` is given)."""
    kw.setdefault("device", "cpu")
    cfg = RunConfig(**{k: v for k, v in kw.items() if k != "config_id"})
    if "dp" not in kw and "tp" not in kw and "pp" not in kw:
        dims, problem = for_strategy(cfg.strategy, cfg.nproc, None if cfg.layout == "auto" else cfg.layout)
        assert problem is None, problem
        cfg = dataclasses.replace(cfg, **dims.degrees())
    return dataclasses.replace(cfg, config_id=kw.get("config_id") or config_id(cfg.params()))


def make_record(cfg: RunConfig | None = None, run_id: str = "run", status: str = "ok", **figures: Any) -> Record:
    """An ok record of ``cfg`` with the given figures (step_times_s fills the statistics)."""
    cfg = cfg or make_config()
    times = figures.get("step_times_s")
    if times and "step_time_s" not in figures:
        figures["step_time_s"] = sorted(times)[len(times) // 2]
    if figures.get("step_time_s") and "tokens_per_s" not in figures:
        figures["tokens_per_s"] = cfg.global_batch * cfg.seq_len / figures["step_time_s"]
    return Record(cfg, run_id, status, global_batch=cfg.global_batch, **figures)


def make_rank_figures(rank: int = 0, windows: list[list[float]] | None = None, **kw: Any) -> RankFigures:
    windows = windows or [[0.1, 0.1]]
    base = dict(rank=rank, init_s=0.1, warmup_s=0.1, measured_s=sum(map(sum, windows)), busy_s=sum(map(sum, windows)),
                busy_steps=[t for w in windows for t in w], windows=windows, losses=[1.0], mem_method="test",
                mem_peak_gib=0.5, mem_reserved_peak_gib=None, energy_j=None, window_s=sum(map(sum, windows)),
                energy_method="none", energy_reason="test")
    base.update(kw)
    return RankFigures(**base)


def make_run(root: Any, run_id: str, records: list[Record] = (), **manifest: Any) -> RunDir:
    """A run folder with a manifest and the given records."""
    rd = RunDir.create(root, run_id)
    store.write_manifest(rd, {"run_id": run_id, "machine": {}, **manifest})
    for rec in records:
        store.append_record(rd, rec)
    return rd
