"""Measure the tolerances of the correctness check (``python -m mgbench.runner.tolerance``).

For each precision, the check-window figures (loss per step, step-1 gradient norm,
weight norm and weight-change norm) of the single-process reference are compared with
computations that differ from it only in the order of floating-point reductions:

- ``reversed``: the same process accumulating each step's micro-batches in reverse order;
- ``ddp2``: 2 gloo ranks, gradients summed by an all-reduce instead of accumulated locally;
- ``tp2``: 2 gloo ranks of tensor parallelism: every row-parallel matmul summed as two
  partial sums (in the autocast precision) by an all-reduce;
- ``ddp2_rowwise`` (fp8 only): ``ddp2`` with rowwise float8 scaling, against the rowwise
  reference (each reference and its reversed variant per reference key).

The largest relative difference per quantity over models, seeds and variants is the
spread; check.TOLERANCES is set at check.TOLERANCE_MULTIPLE times it, with a floor (see
the comment there). The script also runs the other strategies (not part of the spread)
to show where they fall against the tolerances, and the learnability margin of the data:
how far the loss falls over the window against a frozen model on the same batches.

Also home of the small torch.multiprocessing harness (:func:`run_on_gloo_ranks`) and the
plain config object (:func:`check_config`) that the tests use.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import catalog
from ..config import RunConfig
from ..layout import for_strategy

def check_config(strategy: str = "single", model: str | dict[str, Any] = "tiny", **kw: Any) -> RunConfig:
    """A RunConfig for the check on CPU: small window defaults (micro-batch 2, 2 micro-
    batches, seq 16, 3 check steps), the given fields, and the strategy's degrees on
    ``nproc`` ranks (single: 1; others: 2) unless dp/tp/pp are given."""
    kw.setdefault("nproc", 1 if strategy == "single" else 2)
    degrees = {k: kw.pop(k) for k in ("dp", "tp", "pp") if k in kw}
    base = dict(micro_batch=2, grad_accum=2, seq_len=16, check_steps=3, device="cpu")
    cfg = RunConfig(strategy=strategy, model=model, **{**base, **kw})
    if not degrees:
        dims, problem = for_strategy(strategy, cfg.nproc, None)
        if problem:
            raise ValueError(problem)
        degrees = dims.degrees()
    return dataclasses.replace(cfg, **degrees)


def _rank_entry(rank: int, world: int, folder: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import resource

    import torch.distributed as dist

    from ..process_group import gloo_group

    torch.set_num_threads(1)  # one core per rank on small machines
    with gloo_group(world, rank, dist.FileStore(os.path.join(folder, "store"), world)):
        result = fn(*args)  # fn's models are gone when it returns: see gloo_group
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.path.join(folder, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump((result, usage.ru_utime + usage.ru_stime), f)


# What every rank imports, loaded once in the fork server instead of once per rank:
# torch alone is ~2 CPU-s to import on a 2-core VM, and torch._dynamo (DDP imports it
# when it builds its reducer) another ~1.5.
RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed.fsdp", "mgbench.runner.check"]
# CPU seconds of every rank run_on_gloo_ranks has run in this process so far: the fork
# server, not this process, reaps them, so this process's own resource usage leaves them out
# (tests/conftest.py adds them to each test's CPU).
RANKS_CPU_S = [0.0]


def run_on_gloo_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Run ``fn(*args)`` on ``world`` CPU processes joined in a gloo process group;
    returns each rank's result (an exception on any rank is raised here). ``fn`` must be
    importable (a module-level function) and its result picklable.

    The processes are forked from a fork server that has imported RANK_PRELOAD (started
    on first use and kept by this process): a clean single-threaded parent, unlike this
    process (its OpenMP pool and any threads are not fork-safe), that pays torch's import
    once instead of in every rank of every call. The ranks therefore see the environment
    variables this process had when the server started, not later changes."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)
    with tempfile.TemporaryDirectory(prefix="mgbench-gloo-") as folder:
        mp.start_processes(_rank_entry, args=(world, folder, fn, args), nprocs=world, join=True,
                           start_method="forkserver")
        out = []
        for r in range(world):
            with open(os.path.join(folder, f"rank{r}.pkl"), "rb") as f:
                result, cpu_s = pickle.load(f)
            out.append(result)
            RANKS_CPU_S[0] += cpu_s
    return out


def run_checks(cfgs: list[Any]) -> list[dict[str, Any]]:
    """run_check of each config in turn on this rank (the rank function of the harness)."""
    from .check import run_check

    return [run_check(c, torch.device("cpu")) for c in cfgs]


def _variants(model: str, precision: str, seed: int, steps: int) -> dict[str, Any]:
    """Config of each 2-rank computation, all with the reference's global batch of 8
    sequences in micro-batches of 2 (4 micro-batches: with only 2, accumulating them in
    reverse order would be exact, a + b = b + a)."""
    common = dict(model=model, precision=precision, seed=seed, check_steps=steps, micro_batch=2,
                  seq_len=64 if model == "mini" else 16)
    out = {
        "ddp2": check_config("ddp", grad_accum=2, **common),
        "tp2": check_config("tp", grad_accum=4, **common),
        # Not reduction order alone: shown against the tolerance, not part of the spread.
        "zero1": check_config("zero1", grad_accum=2, **common),
        "fsdp": check_config("fsdp", grad_accum=2, **common),
        "fsdp_grad_op": check_config("fsdp_grad_op", grad_accum=2, **common),
        "tp_sp": check_config("tp_sp", grad_accum=4, **common),
        "pp_1f1b": check_config("pp", grad_accum=4, pp_schedule="1f1b", **common),
        "pp_gpipe": check_config("pp", grad_accum=4, pp_schedule="gpipe", **common),
    }
    if precision == "fp8":
        # fp8 runs with data and tensor parallelism (pipelines of float8 linears are
        # skipped by the suite, suite.py). Each recipe is compared with its own reference
        # (keyed by reference.check_key: rowwise under FSDP2 with float8 weights cast from
        # bf16, strategies/fp8.py). Tensor parallelism's row-parallel partial sums are
        # rounded in bf16 before the all-reduce, and the next float8 cast amplifies that:
        # a reduction-order effect like bf16's tp2, so tp2 joins the spread.
        out = {k: v for k, v in out.items() if k in ("ddp2", "tp2", "zero1", "fsdp", "fsdp_grad_op", "tp_sp")}
        out["ddp2_rowwise"] = check_config("ddp", grad_accum=2, fp8_recipe="rowwise", **common)
        out["tp2_rowwise"] = check_config("tp", grad_accum=4, fp8_recipe="rowwise", **common)
        out["fsdp_rowwise"] = check_config("fsdp", grad_accum=2, fp8_recipe="rowwise", **common)
        out["tp_sp_rowwise"] = check_config("tp_sp", grad_accum=4, fp8_recipe="rowwise", **common)
        return out
    if catalog.model_shape(model).layers >= 4:
        out["pp_interleaved"] = check_config("pp", grad_accum=4, pp_schedule="interleaved", virtual_stages=2,
                                             **common)
    return out


SPREAD_VARIANTS = ("reversed", "ddp2", "tp2", "ddp2_rowwise", "tp2_rowwise")


def diffs(mine: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    from .check import QUANTITIES, rel_diff

    out = {"loss": max(rel_diff(a, b) or 0.0 for a, b in zip(mine["losses"], ref["losses"]))}
    for q in QUANTITIES[1:]:
        out[q] = rel_diff(mine[q], ref[q]) or 0.0
    return out


def measure(models: list[str], seeds: list[int], precisions: list[str], steps: int) -> list[dict[str, Any]]:
    """One row per (model, precision, seed, variant): relative differences from the reference."""
    from .reference import check_key, reference_check

    jobs: list[tuple[str, str, int, str, Any]] = []
    for model in models:
        for precision in precisions:
            for seed in seeds:
                for name, cfg in _variants(model, precision, seed, steps).items():
                    jobs.append((model, precision, seed, name, cfg))
    t0 = time.perf_counter()
    results = run_on_gloo_ranks(run_checks, 2, [j[4] for j in jobs])[0]
    print(f"# {len(jobs)} two-rank check windows in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # One reference per distinct reference key (fp8: per recipe and weight cast), and
        # the reversed-order variant of each.
        refs: dict[str, dict[str, Any]] = {}
        for (model, precision, seed, name, cfg), got in zip(jobs, results):
            key = check_key(cfg, torch.device("cpu"))
            if key not in refs:
                refs[key] = reference_check(cfg, torch.device("cpu"), Path(tmp))
                rev = reference_check(cfg, torch.device("cpu"), Path(tmp), reverse_micro_batches=True)
                rows.append(dict(model=model, precision=precision, seed=seed, variant="reversed",
                                 **diffs(rev, refs[key])))
            rows.append(dict(model=model, precision=precision, seed=seed, variant=name, **diffs(got, refs[key])))
    return rows


def learnability(models: list[str], seeds: list[int], steps: int) -> list[dict[str, Any]]:
    """Loss fall over the window at the benchmark's lr and at CHECK_LR, against a frozen
    model on the same batches and against the frozen model's batch-to-batch spread."""
    from ..strategies.pieces import OPTIMIZER_KW
    from . import check

    rows = []
    for model in models:
        for seed in seeds:
            cfg = check_config("single", model=model, seed=seed, check_steps=steps, micro_batch=4, grad_accum=2,
                               seq_len=128 if model == "mini" else 32)
            frozen = _single_losses(cfg, 0.0)
            spread = (max(frozen) - min(frozen)) / frozen[0]
            for lr in (OPTIMIZER_KW["lr"], check.CHECK_LR):
                trained = _single_losses(cfg, lr)
                rows.append(dict(model=model, seed=seed, lr=lr, fall=(trained[0] - trained[-1]) / trained[0],
                                 frozen_spread=spread, gap_vs_frozen=(frozen[-1] - trained[-1]) / frozen[-1]))
    return rows


def _single_losses(cfg: Any, lr: float) -> list[float]:
    from ..strategies.apply import prepare_reference
    from ..workloads.synthetic import learnable_batch
    from . import check
    from .training import rank_batches

    device = torch.device("cpu")
    prep = prepare_reference(cfg, device)
    check.set_lr(prep, lr)
    batches = rank_batches(cfg.seed, range(cfg.check_steps), 0, cfg.micro_batch, cfg.grad_accum, 1, cfg.seq_len,
                           cfg.shape.vocab, device, source=learnable_batch)
    return check.check_window(prep, batches, device, cfg.precision)["losses"]


def main(argv: list[str] | None = None) -> None:
    from . import check

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The smoke and default CPU suites' models.
    ap.add_argument("--models", nargs="+", default=["tiny", "mini"], choices=list(catalog.model_presets()))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    ap.add_argument("--steps", type=int, default=3, help="check-window steps (the suites' check_steps)")
    ap.add_argument("--json", type=Path, help="also write every measured row to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    print("## learnability (single process, frozen = same batches at lr 0)")
    for r in learnability(args.models, args.seeds, args.steps):
        print(f"{r['model']:5s} seed={r['seed']} lr={r['lr']:g}: loss falls {r['fall']:.2%} over {args.steps} steps; "
              f"frozen model's spread {r['frozen_spread']:.2%}; gap to frozen at the last step {r['gap_vs_frozen']:.2%}")

    rows = measure(args.models, args.seeds, args.precisions, args.steps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n## relative difference from the single-process reference (max over models and seeds)")
    print(f"{'precision':9s} {'variant':13s} " + " ".join(f"{q:>16s}" for q in check.QUANTITIES))
    for precision in args.precisions:
        variants = dict.fromkeys(r["variant"] for r in rows)
        for v in variants:
            sel = [r for r in rows if r["precision"] == precision and r["variant"] == v]
            if not sel:
                continue
            mark = "*" if v in SPREAD_VARIANTS else " "
            print(f"{precision:9s} {v + mark:13s} " + " ".join(f"{max(r[q] for r in sel):16.2e}" for q in check.QUANTITIES))
        spread = {q: max(r[q] for r in rows if r["precision"] == precision and r["variant"] in SPREAD_VARIANTS)
                  for q in check.QUANTITIES}
        print(f"{precision:9s} {'spread':13s} " + " ".join(f"{spread[q]:16.2e}" for q in check.QUANTITIES))
        print(f"{precision:9s} {'x' + format(check.TOLERANCE_MULTIPLE, 'g'):13s} "
              + " ".join(f"{spread[q] * check.TOLERANCE_MULTIPLE:16.2e}" for q in check.QUANTITIES))
        print(f"{precision:9s} {'tolerance':13s} " + " ".join(f"{check.TOLERANCES[precision][q]:16.2e}" for q in check.QUANTITIES))
    print("(* reduction-order variants: the spread is their maximum)")
    print("\n# for mgbench/runner/check.py:\nMEASURED_SPREAD = {")
    for precision in args.precisions:
        spread = {q: max(r[q] for r in rows if r["precision"] == precision and r["variant"] in SPREAD_VARIANTS)
                  for q in check.QUANTITIES}
        print(f'    "{precision}": {{' + ", ".join(f'"{q}": {v:.2e}' for q, v in spread.items()) + "},")
    print("}")


if __name__ == "__main__":
    main()
