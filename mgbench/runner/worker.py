"""Rank entry point, started by torchrun: runs every config of one job file.

One torchrun job per world size runs many configs, so process start-up and process
group initialisation are paid once per group. Rank 0 appends one record per config to
records.jsonl (fsynced) as soon as the config ends.

    python -m torch.distributed.run --standalone --nproc-per-node N \
        -m mgbench.runner.worker --job RUN_DIR/jobs/group-0-nN-a0.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import os
import time
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import stats, store
from ..catalog import mfu_precision, peak_precision, peak_tflops
from ..config import RunConfig
from ..errors import first_line
from ..faults import bug_of
from ..record import RankFigures, Record, backend_of, batch_of
from ..store import RunDir
from ..workloads import moe, throughput, vision
from ..strategies.apply import prepare
from ..strategies.pieces import compile_counts
from ..strategies.context_parallel import cp_fields
from ..strategies.fp8 import fp8_fields
from ..strategies.schedules import bubble_unknown_reason, grad_sync_of, memory_tracker_problem, theoretical_bubble
from ..telemetry.clock import StepClock
from ..telemetry.energy import EnergyMeter, fill_window, power_figures
from ..telemetry.memory import read_peak, reset_peak, track_step
from ..telemetry.machine import cpu_model
from . import reference
from .check import check_prepared, compare_check, run_check
from .data_loading import data_fields, measured_host_waits, measured_waits, step_feed
from .inject import Injector
from ..telemetry.tf32 import fp32_matmul_mode
from .training import StepHooks, batches_for, train_step

# Exit status of a rank that failed a config on purpose (after writing its failure
# file): the launcher tells it apart from a rank that died without a word.
FAILED_CONFIG_EXIT = 3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_model() or 'unknown'}"


def measure(cfg: RunConfig, device: torch.device, meter: EnergyMeter, profile: bool = True,
            check: bool = True, track: bool = True) -> RankFigures:
    """Build, warm up and time one config (one round of it) on this rank; returns this
    rank's raw figures. ``profile``: run the profiled window when the config asks for
    one; ``check``: run the correctness window first, on learnable data before anything
    is timed, so the throughput figures do not see it; ``track``: run one more step
    under torch's memory tracker once everything else is done (see track_memory)."""
    inject = Injector(cfg.inject, dist.get_rank(), device)
    check = check and cfg.check_steps > 0
    new_peak_window(device)  # (a negative control, an injected bug, never gets here: see check_only)
    compiles = compile_counts(cfg)  # compile = true: from a fresh compiler state, counted
    t0 = time.perf_counter()
    prep = prepare(cfg, device)  # seeded: identical initial weights on every rank and in the reference
    total_steps = cfg.warmup_steps + cfg.repeats * cfg.measured_steps
    # Random tokens are built here, before timing; a dataset on disk is read step by step.
    feed = step_feed(cfg, prep.dp_rank, prep.dp_size, device, total_steps)
    sync(device)
    init_s = time.perf_counter() - t0
    # Two peak windows: building holds the whole model on every rank before it is placed
    # and sharded; training holds only this rank's part. One window would report the
    # unsharded model as every FSDP / TP / pipeline config's training peak.
    init_peak = read_peak(device)["mem_peak_gib"]
    mem_method = new_peak_window(device)  # the unsharded model's freed blocks are not training's

    losses: list[torch.Tensor] = []
    first = 0
    checked = None
    if check:
        # The check window stands in for the first warm-up steps (same model, untimed,
        # its own data and lr), so checking costs no more steps than it must.
        checked = check_prepared(cfg, prep, device, StepHooks(before_step=[inject.before_step],
                                                              after_step=[inject.after_step]))
        # A DataLoader needs a warm-up read of its own, so its workers start before timing.
        first = max(0, min(cfg.check_steps, cfg.warmup_steps - feed.warmup_reads))
        # The window held a copy of the initial weights (for their change): a new peak
        # window, so the recorded peak is the training steps', not the check's.
        new_peak_window(device)
    t0 = time.perf_counter()  # warm-up time: the steps after the check window
    for step in range(first, cfg.warmup_steps):
        inject.before_step(step)
        losses.append(train_step(prep, feed.step(step), device, cfg.precision))
        inject.after_step()
    sync(device)
    warmup_s = time.perf_counter() - t0

    windows: list[list[float]] = []
    busy_steps: list[float] = []  # main-thread CPU time of each measured step
    measured_s = 0.0
    busy_s = 0.0
    dist.barrier()  # ranks enter the window together
    if prep.moe_layers:
        moe.start_log(prep.moe_layers)  # MoE routing figures of the timed steps
    meter.start()
    for r in range(cfg.repeats):
        clock = StepClock(device)
        sync(device)
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        clock.mark()
        for i in range(cfg.measured_steps):
            step = cfg.warmup_steps + r * cfg.measured_steps + i
            inject.before_step(step)
            c0 = time.thread_time()
            losses.append(train_step(prep, feed.step(step), device, cfg.precision))
            inject.after_step()
            busy_steps.append(time.thread_time() - c0)
            clock.mark()
        sync(device)
        busy_s += time.thread_time() - cpu0
        measured_s += time.perf_counter() - t0
        windows.append(clock.step_times())
    # Compiles from the build to the end of the timed steps (check window and warm-up included).
    compiled = compiles.read() if compiles is not None else None
    routing = moe.stop_log(prep.moe_layers) if prep.moe_layers else None
    # NVML's energy counter moves in ~100 ms steps: a window shorter than the meter's
    # minimum gets untimed steps added inside it (step times above are untouched).
    timed = cfg.repeats * cfg.measured_steps
    def untimed(first: int, count: int) -> None:
        for k in range(first, first + count):
            train_step(prep, feed.replay[k % len(feed.replay)], device, cfg.precision)
        sync(device)  # the next round reads the pace from the wall clock

    extra = fill_window(meter, timed, device, untimed)  # the timed loop and each round end synchronised
    energy = meter.stop(steps=timed + extra)
    moe_figures = moe.log_fields(routing, timed) if routing is not None else None  # a collective: after the window
    mem = read_peak(device)
    breakdown = profile_window(cfg, prep, feed.replay, device) if cfg.profile and profile else None
    tracked = (track_memory(cfg, prep, feed.replay, device) if cfg.track_memory else
               {"mem_tracked_reason": "track_memory = false for this config"}) if track else {}

    # Global loss per step: the loss-holding ranks' losses, weighted so the sum over all
    # ranks is the mean over data-parallel replicas (equal micro-batch sizes).
    loss_t = torch.stack(losses).float() * prep.loss_weight
    dist.all_reduce(loss_t)
    loss_values = loss_t.tolist()
    timed_steps = range(cfg.warmup_steps, total_steps)
    data = {"data_waits": measured_waits(feed, timed_steps), "data_host_waits": measured_host_waits(feed, timed_steps),
            "data_method": feed.method, "data_wait_method": feed.wait_method}
    feed.close()
    del prep, feed
    return RankFigures(rank=dist.get_rank(), init_s=init_s, warmup_s=warmup_s, measured_s=measured_s, busy_s=busy_s,
                       busy_steps=busy_steps, windows=windows, losses=loss_values, mem_method=mem_method,
                       mem_init_peak_gib=init_peak, breakdown=breakdown, check=checked, moe=moe_figures,
                       compile_counts=compiled, **data, **mem, **tracked, **energy)


def new_peak_window(device: torch.device) -> str:
    """Free what the previous phase left (and, on CUDA, the cached blocks it reserved), then
    start a new peak window; returns the method of the matching read."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return reset_peak(device)


def track_memory(cfg: RunConfig, prep: Any, batches: list, device: torch.device) -> dict[str, Any]:
    """One more training step under torch's memory tracker: this rank's tracked peak and
    its split by category (:func:`mgbench.telemetry.memory.track_step`).

    The tracker hooks every op in Python (a step takes 2-9x as long under it), so it
    runs after the timed, energy and profiled windows, never inside them: throughput,
    energy and breakdown figures are those of untracked steps. After the warm-up the
    optimizer states exist, so the step is a steady-state one. Not in the correctness
    window: that window holds a copy of the initial weights and runs on a fresh model
    whose first step creates the optimizer states, neither of which a training step has.
    Last, because a step that fails under the tracker leaves the model mid-step."""
    if cfg.pipelined and (why := memory_tracker_problem(cfg.pp_schedule)):
        return {"mem_tracked_reason": why}  # every rank alike: none starts a step the others would wait on
    dist.barrier()
    t0 = time.perf_counter()
    out = track_step(lambda: train_step(prep, batches[-1], device, cfg.precision), prep.modules, prep.optimizer,
                     device, prep.schedule)
    return {**out, "mem_tracked_s": time.perf_counter() - t0}


def profile_window(cfg: RunConfig, prep: Any, batches: list, device: torch.device) -> dict[str, float]:
    """Profile ``profile_steps`` more steps (after the timed window, so profiling never
    slows the throughput figures) and split them into compute / comm / idle per step."""
    from torch.profiler import ProfilerActivity, profile

    from ..telemetry.breakdown import from_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = [batches[i % len(batches)] for i in range(cfg.profile_steps)]
    dist.barrier()
    with profile(activities=acts) as prof:
        sync(device)
        t0 = time.perf_counter()
        for micro in steps:
            train_step(prep, micro, device, cfg.precision)
        sync(device)
        t1 = time.perf_counter()
    # The profiler's clock is microseconds on its own epoch: locate the window by the
    # outermost events instead of mixing clocks.
    evs = prof.events()
    lo = min(e.time_range.start for e in evs)
    hi = lo + (t1 - t0) * 1e6
    out = from_profile(prof, None, (lo, hi), device.type == "cuda")
    return {k: v / cfg.profile_steps for k, v in out.items()}


def summarize_config(cfg: RunConfig, per_rank: list[RankFigures], device: torch.device) -> dict[str, Any]:
    """Turn every rank's raw figures into the record's fields."""
    world = len(per_rank)
    # A step ends when its slowest rank ends: step time = max over ranks, per step.
    windows = [[max(ts) for ts in zip(*ws)] for ws in zip(*(r.windows for r in per_rank))]
    step_times = [t for w in windows for t in w]
    n_steps = len(step_times)
    flat = [[t for w in r.windows for t in w] for r in per_rank]
    s = stats.summarize(step_times)
    units = throughput(cfg, s["median"], world)  # tokens and FLOPs per token, or images for vision
    tokens_per_step = units["tokens_per_step"]
    name = device_name(device)
    model_tflops = units["model_tflops_per_device"]
    r0 = per_rank[0]

    # Energy: each GPU rank reads its own device; on CPU only local rank 0 reads the
    # package counter. Unknown if any rank that should have read it could not.
    readers = [r for r in per_rank if r.energy_method != "none"] if device.type == "cpu" else per_rank
    energies = [r.energy_j for r in readers]
    energy_j = sum(energies) if readers and all(e is not None for e in energies) else None
    # The tokens of the steps inside the energy window (None: the workload counts images).
    measured_tokens = tokens_per_step * (r0.energy_steps or n_steps) if tokens_per_step else None
    mems = [r.mem_peak_gib for r in per_rank]
    return {
        **stats.step_time_fields(step_times),
        "step_times_s": step_times,
        "num_steps_measured": n_steps,
        "repeat_medians_s": [stats.summarize(w)["median"] for w in windows],
        "per_rank_step_time_median_s": [stats.summarize(f)["median"] for f in flat],
        "global_batch": cfg.global_batch,
        **units,
        "samples_per_s": cfg.global_batch / s["median"],
        **mfu_fields(cfg.precision, name, device, model_tflops, vision.fp32_mode(cfg)),
        "device_name": name,
        "mem_peak_gib": None if any(m is None for m in mems) else max(mems),
        "mem_peak_gib_per_rank": mems,
        "mem_reserved_peak_gib": max((r.mem_reserved_peak_gib or 0.0) for r in per_rank) if device.type == "cuda" else None,
        "mem_method": r0.mem_method,
        **memory_fields(per_rank),
        "init_s": max(r.init_s for r in per_rank),
        "warmup_s": max(r.warmup_s for r in per_rank),
        "measured_s": max(r.measured_s for r in per_rank),
        "energy_j": energy_j,
        # Per device only on GPUs: on CPU one RAPL reader counts the whole package.
        **power_figures(energy_j, r0.window_s, len(readers) if device.type == "cuda" else None, measured_tokens),
        "energy_window_s": r0.window_s,
        "num_energy_steps": r0.energy_steps,
        "energy_min_window_s": max((r.energy_min_window_s for r in readers if r.energy_method != "none"
                                    and r.energy_min_window_s is not None), default=None),
        "energy_update_interval_s": max((r.energy_update_interval_s for r in readers
                                         if r.energy_update_interval_s is not None), default=None),
        "energy_device_match": ([r.energy_device_match for r in per_rank]
                                if any(r.energy_device_match for r in per_rank) else None),
        "energy_method": readers[0].energy_method if readers else "none",
        "energy_reason": None if energy_j is not None else (r0.energy_reason or "no rank could read energy"),
        "losses": r0.losses,
        "loss_first": r0.losses[0] if r0.losses else None,
        "loss_last": r0.losses[-1] if r0.losses else None,
        **pipeline_bubble(cfg, per_rank, device),
        **pipeline_grad_sync(cfg),
        **rank_spread(cfg, per_rank, device),
        **breakdown_fields(per_rank),
        **fp8_fields(cfg.precision, device.type),
        **offload_fields(cfg, device),
        **cp_fields(cfg, device),
        **(r0.moe or {}),
        **data_fields(cfg, [r.data_waits for r in per_rank], [r.data_method for r in per_rank], s["median"],
                      [r.data_host_waits for r in per_rank], [r.data_wait_method for r in per_rank]),
        **compile_fields(cfg, per_rank),
    }


COMPILE_COUNTS = ("num_recompiles", "num_graph_breaks")


def compile_fields(cfg: RunConfig, per_rank: list[RankFigures]) -> dict[str, Any]:
    """A compiled config's recompiles and graph breaks (pieces.CompileCounts): the most of
    any rank, each of which compiles its own blocks. Null with the reason when compile is
    off or a rank could not count them."""
    if not cfg.compile:
        return {**dict.fromkeys(COMPILE_COUNTS), "compile_counts_reason": "compile = false: nothing was compiled"}
    counts = [r.compile_counts or {} for r in per_rank]
    out: dict[str, Any] = {}
    for k in COMPILE_COUNTS:
        values = [c.get(k) for c in counts]
        out[k] = None if None in values else max(values)
    reasons = [c.get("compile_counts_reason") or ("not counted" if not c else None) for c in counts]
    out["compile_counts_reason"] = next((f"rank {i}: {w}" for i, w in enumerate(reasons) if w), None)
    return out


def offload_fields(cfg: RunConfig, device: torch.device) -> dict[str, Any]:
    """What CPU offload did (offload = true): on CPU ranks the parameters, gradients and
    optimizer state already live in host memory, so CPUOffloadPolicy copies nothing and
    the run measures no transfer: said here rather than implied by the figures."""
    if not cfg.offload:
        return {}
    reason = None
    if device.type == "cpu":
        reason = ("offload on CPU ranks is a no-op in effect: parameters, gradients and optimizer state are already "
                  "in host memory, so no host-device copy was made or timed")
    return {"offload_reason": reason}


def memory_fields(per_rank: list[RankFigures]) -> dict[str, Any]:
    """Init peaks and tracked figures as record fields. Over ranks: the max (the rank
    that must fit); the categories are those of the rank with the largest tracked
    peak, at that peak, so they add up to it. Tracked figures are null, with the first
    failing rank's reason, unless every rank has them."""
    inits = [r.mem_init_peak_gib for r in per_rank]
    out: dict[str, Any] = {
        "mem_init_peak_gib": None if any(m is None for m in inits) else max(inits),  # type: ignore[type-var]
        "mem_init_peak_gib_per_rank": inits,
        "mem_tracked_s": max((r.mem_tracked_s for r in per_rank if r.mem_tracked_s is not None), default=None),
    }
    missing = next((r for r in per_rank if r.mem_tracked is None), None)
    if missing is not None:
        reason = missing.mem_tracked_reason or "not tracked in this run"
        return {**out, "mem_tracked_reason": f"rank {missing.rank}: {reason}" if len(per_rank) > 1 else reason}
    tracked = [r.mem_tracked for r in per_rank]
    busiest = max(tracked, key=lambda t: t["peak"])  # type: ignore[index]
    out.update({f"mem_tracked_{k}_bytes": v for k, v in busiest.items() if k != "peak"})  # type: ignore[union-attr]
    out.update({
        "mem_tracked_peak_bytes": busiest["peak"],  # type: ignore[index]
        "mem_tracked_peak_bytes_per_rank": [t["peak"] for t in tracked],  # type: ignore[index]
        "mem_tracked_categories_per_rank": tracked,
        "mem_tracked_method": per_rank[0].mem_tracked_method,
        "mem_tracked_reason": None,
    })
    return out


def mfu_fields(precision: str, name: str, device: torch.device, model_tflops: float, fp32_mode: Any = None) -> dict[str, Any]:
    """MFU against the peak of the units the matmuls ran on: the catalog entry the device
    name (and, where variants share a name, its memory) picks, at the config's precision,
    or at tf32 for fp32 with TF32 allowed. A result above 100% means that peak cannot be
    this device's: null with the reason, never a figure no device can reach."""
    memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    mode, setting = (fp32_mode or fp32_matmul_mode)() if device.type == "cuda" else (None, None)
    hfu = hfu_fields(precision, name, memory_gib, model_tflops)
    # fp8's MFU divides by the bf16 dense peak (catalog.mfu_precision; an "fp8 MFU"
    # against the fp8 peak is hfu_pct, beside it).
    precision = mfu_precision(precision)
    peak, reason = peak_tflops(name, precision, memory_gib, mode or "ieee")
    mfu = 100.0 * model_tflops / peak if peak else None
    if mfu is not None and mfu > 100.0:
        reason = (f"model FLOPs at {mfu:.0f}% of the {peak:g} TFLOPS peak: that peak ({reason}) cannot be this "
                  "device's; check its catalog entry")
        mfu = None
    return {"peak_tflops": peak, "mfu_pct": mfu, "mfu_reason": None if mfu is not None else reason,
            "mfu_peak_precision": peak_precision(precision, mode or "ieee") if peak else None,
            "device_memory_gib": memory_gib, "tf32_matmul": None if mode is None else mode == "tf32",
            "fp32_matmul_setting": setting, **hfu}


def hfu_fields(precision: str, name: str, memory_gib: float | None, model_tflops: float) -> dict[str, Any]:
    """fp8 configs: model FLOPs against the device's dense fp8 peak (hfu_pct), the peak of
    the units the float8 linears run on. The same FLOPs as MFU (recomputation is not
    added), and not every matmul runs in fp8 (attention's, the output head), so it is a
    lower bound of the fp8 units' use. Null with the reason otherwise."""
    if precision != "fp8":
        return {"hfu_pct": None, "hfu_peak_tflops": None,
                "hfu_reason": "recorded for fp8 configs only: MFU's peak is already that of the units the matmuls ran on"}
    peak, reason = peak_tflops(name, "fp8", memory_gib)
    hfu = 100.0 * model_tflops / peak if peak else None
    if hfu is not None and hfu > 100.0:
        reason, hfu = f"model FLOPs at {hfu:.0f}% of the {peak:g} TFLOPS fp8 peak ({reason}): check its catalog entry", None
    return {"hfu_pct": hfu, "hfu_peak_tflops": peak, "hfu_reason": None if hfu is not None else reason}


def breakdown_fields(per_rank: list[RankFigures]) -> dict[str, Any]:
    """Mean over ranks of the profiled per-step split; comm_fraction = exposed / step."""
    parts = [r.breakdown for r in per_rank if r.breakdown]
    if not parts:
        return {}
    mean = {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}
    out = {f"breakdown_{k}": v for k, v in mean.items()}
    out["breakdown_per_rank"] = parts
    out["comm_fraction"] = mean["exposed_comm_s"] / mean["window_s"] if mean["window_s"] > 0 else None
    out["breakdown_method"] = ("torch.profiler: NCCL kernels vs other kernels, memcpys and memsets" if "cuda" in per_rank[0].mem_method
                               else "torch.profiler: gloo collective work vs top-level ops of the training thread")
    return out


# A rank is a straggler when its busy time per step exceeds the least busy rank's by
# this factor: between identical ranks on CPU we see a few percent of noise.
STRAGGLER_FACTOR = 1.2


def rank_spread(cfg: RunConfig, per_rank: list[RankFigures], device: torch.device) -> dict[str, Any]:
    """Per-rank busy time per step (median over steps) and the ranks that lag.

    Step time cannot show a straggler: collectives make every rank wait for the slowest,
    so all ranks see the same step time. Busy (main-thread CPU) time per step can, on
    CPU ranks; on GPUs kernels run asynchronously and it is null with the reason.
    """
    if len(per_rank) < 2:
        return {"rank_spread_reason": "one rank: no spread between ranks to measure"}
    if device.type != "cpu":
        return {"per_rank_busy_s": None, "rank_spread_pct": None, "straggler_ranks": None,
                "rank_spread_reason": "busy time is read from thread CPU time, which only works on CPU ranks"}
    crowded = cores_shared()
    if crowded:
        return {"per_rank_busy_s": None, "rank_spread_pct": None, "straggler_ranks": None,
                "rank_spread_reason": f"{crowded}: a rank waiting for a core would look like a straggler"}
    # Median over steps: one slow step (a page fault, the first step after a config
    # switch) must not make a rank a straggler.
    busy = [stats.summarize(r.busy_steps)["median"] for r in per_rank]
    fastest = min(busy)
    return {
        "per_rank_busy_s": busy,
        "rank_spread_pct": 100.0 * (max(busy) - min(busy)) / min(busy) if min(busy) > 0 else None,
        "straggler_ranks": [i for i, b in enumerate(busy) if fastest > 0 and b > STRAGGLER_FACTOR * fastest],
        "rank_spread_reason": None,
    }


def cores_shared() -> str | None:
    """Why this host's ranks do not each have cores of their own (None when they do).

    Busy-time measurements (bubble, stragglers) read thread CPU time, which only equals
    compute when no rank waits for a core. Counts the ranks torchrun started on this
    host (LOCAL_WORLD_SIZE), so it holds for one node and for many."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    threads = torch.get_num_threads()
    cores = os.cpu_count() or 1
    if local * threads > cores:
        return f"{local} ranks x {threads} thread(s) on {cores} cores"
    return None


def pipeline_grad_sync(cfg: RunConfig) -> dict[str, Any]:
    """How a pipeline's data-parallel replicas reduced their gradients (schedules.GRAD_SYNC;
    None without replicas); nothing for configs that are not pipelined."""
    if not cfg.pipelined:
        return {}
    return {"pp_grad_sync": grad_sync_of(cfg)}


def pipeline_bubble(cfg: RunConfig, per_rank: list[RankFigures], device: torch.device) -> dict[str, Any]:
    """Measured idle fraction of pipeline stages beside the theory.

    Measured on CPU as 1 - (main-thread CPU time / wall time) per step, the median over
    the measured steps, averaged over ranks: with one intra-op thread per rank all of a
    stage's compute runs on its main thread, while waiting for a neighbour (gloo recv)
    costs no CPU time. The median, not the window total, so that a few steps during
    which a shared VM took the core away (wall time passes, CPU time does not) do not
    read as bubble. It holds only when every rank has a core of its own; otherwise (and
    on GPUs, where kernels run asynchronously) it is null with the reason.
    """
    if not cfg.pipelined:
        return {}
    theory = theoretical_bubble(cfg.pp, cfg.grad_accum, cfg.pp_schedule, cfg.virtual_stages)
    out: dict[str, Any] = {"pp_bubble_theoretical": theory, "pp_bubble_measured": None,
                           "pp_bubble_per_rank": None, "pp_bubble_reason": None,
                           "pp_bubble_theoretical_reason": bubble_unknown_reason(cfg.pp, cfg.grad_accum,
                                                                                 cfg.pp_schedule)}
    crowded = cores_shared()
    if device.type != "cpu":
        out["pp_bubble_reason"] = "measured from thread CPU time, which only works on CPU ranks"
    elif crowded:
        out["pp_bubble_reason"] = f"{crowded}: waiting for a core would count as bubble"
    else:
        idle = [step_idle_fraction(r) for r in per_rank]
        out["pp_bubble_per_rank"] = idle
        out["pp_bubble_measured"] = sum(idle) / len(idle)
    return out


def step_idle_fraction(rank_figures: RankFigures) -> float:
    """Median over measured steps of 1 - busy / wall for one rank (window totals when the
    per-step lists do not line up)."""
    walls = [t for w in rank_figures.windows for t in w]
    busy = rank_figures.busy_steps
    if len(walls) != len(busy) or not walls or min(walls) <= 0:
        return 1.0 - rank_figures.busy_s / rank_figures.measured_s
    return float(stats.summarize([1.0 - b / w for b, w in zip(busy, walls)])["median"])


def fail_config(cfg: RunConfig, device: torch.device, run_dir: RunDir, exc: BaseException) -> None:
    """Record why this rank failed the config, then leave the job.

    Failing fast is how ranks agree after an OOM or a crash: the other ranks may be
    blocked in a collective this rank will never join, so instead of trying to talk to
    them, this rank writes its failure file and exits; torchrun then stops the others,
    and the launcher records the config and relaunches for the rest of the sweep.
    """
    rank = dist.get_rank()
    mem: dict[str, Any] = {}
    try:
        mem = read_peak(device)
    except Exception:  # memory figures are a courtesy here; the failure is what matters
        pass
    info = {"config_id": cfg.config_id, "rank": rank, "time": time.time(),
            "status": "oom" if isinstance(exc, torch.OutOfMemoryError) else "error",
            "error_type": type(exc).__name__, "error": first_line(str(exc)),
            "traceback": traceback.format_exc(), **mem}
    store.write_json_atomic(run_dir.failure(cfg.config_id, rank), info)
    print(f"[mgbench worker] rank {rank} failed {cfg.config_id}: {info['error_type']}: {info['error']}",
          file=sys.stderr, flush=True)
    os._exit(FAILED_CONFIG_EXIT)


def measure_round(cfg: RunConfig, device: torch.device, meter: EnergyMeter, run_dir: RunDir, round_no: int,
                  rounds: int) -> RankFigures:
    """Round ``round_no`` (from 1) of one config on this rank (the whole config when it
    has one round); ``rounds``: the most rounds of any config in the job."""
    mark_started(cfg, run_dir, round_no, rounds)
    last = round_no == cfg.rounds
    try:
        # Profile in the last round, check in the first (its figures do not change).
        mine = measure(cfg, device, meter, profile=last, check=round_no == 1, track=last)
    except Exception as e:  # every failure leaves the job: see fail_config
        fail_config(cfg, device, run_dir, e)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return mine


def merge_rounds(parts: list[RankFigures]) -> RankFigures:
    """One rank's figures from several rounds of a config, as if measured in one go.

    Step samples, windows and times add up; build and warm-up times are the first
    round's (later rounds repeat them); memory is the peak over rounds (tracked memory:
    the last round's, the only one tracked); losses are the first round's (every round
    restarts from the same seed, so they repeat)."""
    if len(parts) == 1:
        return parts[0]
    energies = [p.energy_j for p in parts]
    mems = [p.mem_peak_gib for p in parts]
    reserved = [p.mem_reserved_peak_gib for p in parts]
    inits = [p.mem_init_peak_gib for p in parts]
    return dataclasses.replace(
        parts[0],
        measured_s=sum(p.measured_s for p in parts),
        busy_s=sum(p.busy_s for p in parts),
        busy_steps=[t for p in parts for t in p.busy_steps],
        windows=[w for p in parts for w in p.windows],
        breakdown=parts[-1].breakdown,
        mem_peak_gib=None if None in mems else max(mems),  # type: ignore[type-var]
        mem_reserved_peak_gib=None if None in reserved else max(reserved),  # type: ignore[type-var]
        mem_init_peak_gib=None if None in inits else max(inits),  # type: ignore[type-var]
        mem_tracked=parts[-1].mem_tracked,  # tracked in the last round only
        mem_tracked_method=parts[-1].mem_tracked_method,
        mem_tracked_reason=parts[-1].mem_tracked_reason,
        mem_tracked_s=parts[-1].mem_tracked_s,
        energy_j=None if None in energies else sum(energies),  # type: ignore[arg-type]
        window_s=sum(p.window_s for p in parts),
        energy_steps=None if any(p.energy_steps is None for p in parts) else sum(p.energy_steps for p in parts),
        energy_reason=next((p.energy_reason for p in parts if p.energy_reason), None),
        data_waits=_joined([p.data_waits for p in parts]),
        data_host_waits=_joined([p.data_host_waits for p in parts]),
        compile_counts=_added_counts([p.compile_counts for p in parts]),
    )


def _joined(lists: list[list[float] | None]) -> list[float] | None:
    """Per-step lists of the rounds one after the other (None if a round has none)."""
    return None if any(x is None for x in lists) else [v for x in lists for v in x]  # type: ignore[union-attr]


def _added_counts(counts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Compile counts of the rounds added up (each round compiles afresh); None if a round has none."""
    if any(c is None for c in counts):
        return None
    out = {k: None if any(c[k] is None for c in counts) else sum(c[k] for c in counts)  # type: ignore[index]
           for k in COMPILE_COUNTS}
    return {**out, "compile_counts_reason": next((c["compile_counts_reason"] for c in counts  # type: ignore[index]
                                                  if c["compile_counts_reason"]), None)}  # type: ignore[index]


def finish_config(cfg: RunConfig, mine: RankFigures, device: torch.device, run_dir: RunDir, run_id: str,
                  started: str) -> Record | None:
    """Gather every rank's figures for one config; rank 0 returns its record, others None."""
    rank = dist.get_rank()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    fields = summarize_config(cfg, everyone, device)
    fields.update(correctness(cfg, mine.check, device, run_dir))
    sample = run_dir.sample(cfg.config_id)
    store.write_json_atomic(sample, {"config_id": cfg.config_id, "per_rank_step_times_s": [r.windows for r in everyone],
                                     "losses": fields["losses"]})
    return Record(cfg, run_id, "ok", started_at=started, finished_at=dt.datetime.now().isoformat(timespec="seconds"),
                  samples_file=run_dir.relative(sample), backend=backend_of(cfg), torch_version=torch.__version__,
                  device_name=fields.pop("device_name"), **fields)


def is_negative_control(cfg: RunConfig) -> bool:
    """A config that injects a training bug: it runs :func:`check_only`, never a timed
    window (the suite skips one whose check_steps is 0: nothing would catch the bug)."""
    return bug_of(cfg.inject) is not None


def check_only(cfg: RunConfig, device: torch.device, run_dir: RunDir, run_id: str) -> Record | None:
    """A negative control: the check window on a fresh model with the bug applied
    (:func:`mgbench.runner.check.run_check`), nothing timed. The bug breaks the training it
    is applied to, so the config's speed is not a result; timing the clean model instead
    would repeat the clean config's figures under the bug's label. Rank 0 returns the
    record (status "checked", the verdict beside the reference's figures), others None."""
    started = dt.datetime.now().isoformat(timespec="seconds")
    mark_started(cfg, run_dir)
    compile_counts(cfg)  # compiled blocks start from a fresh compiler state, as in measure
    try:
        checked = run_check(cfg, device)  # gathered: the same on every rank
    except Exception as e:  # every failure leaves the job: see fail_config
        fail_config(cfg, device, run_dir, e)
    gc.collect()
    if dist.get_rank() != 0:
        return None
    return Record(cfg, run_id, "checked", started_at=started, finished_at=dt.datetime.now().isoformat(timespec="seconds"),
                  global_batch=batch_of(cfg), backend=backend_of(cfg), torch_version=torch.__version__,
                  device_name=device_name(device), **correctness(cfg, checked, device, run_dir))


def correctness(cfg: RunConfig, checked: dict[str, Any] | None, device: torch.device, run_dir: RunDir) -> dict[str, Any]:
    """The check window's figures against the single-process reference's, as record fields."""
    if checked is None:
        return {"correct": None, "correct_reason": "check_steps = 0: nothing checked"}
    try:
        ref = reference.reference_check(cfg, device, run_dir)
    except torch.OutOfMemoryError:
        return {"correct": None, "correct_reason": "the single-process reference does not fit on one device"}
    out = compare_check(checked, ref, cfg.precision, lossy=cfg.grad_compression != "none",
                        compiled=cfg.compile)
    if cfg.workload == "vision":  # the check window's data: class patterns, not Markov tokens
        from ..workloads.vision import LEARNABLE_IMAGES

        out["check_data"] = LEARNABLE_IMAGES
    return out


def run_configs(configs: list[RunConfig], device: torch.device, meter: EnergyMeter, run_dir: RunDir,
                run_id: str) -> None:
    """Measure every config of the job, round by round, and append each record as soon as
    the config's last round ends.

    With rounds = 1 (the default) this is config after config. With more, round k of
    every config runs before round k + 1 of any (asv interleaves its rounds the same
    way), so a machine whose speed drifts over minutes slows every config alike instead
    of whichever happened to run during the slow spell. A negative control runs once,
    in the first round (:func:`check_only`)."""
    parts: dict[str, list[RankFigures]] = {c.config_id: [] for c in configs}
    started: dict[str, str] = {}
    rounds = max(c.rounds for c in configs)
    for r in range(rounds):
        for cfg in configs:
            control = is_negative_control(cfg)
            if r >= (1 if control else cfg.rounds):
                continue
            rec = None
            if control:
                rec = check_only(cfg, device, run_dir, run_id)
            else:
                started.setdefault(cfg.config_id, dt.datetime.now().isoformat(timespec="seconds"))
                parts[cfg.config_id].append(measure_round(cfg, device, meter, run_dir, r + 1, rounds))
                if r == cfg.rounds - 1:
                    rec = finish_config(cfg, merge_rounds(parts.pop(cfg.config_id)), device, run_dir, run_id,
                                        started[cfg.config_id])
            if rec is not None:  # rank 0, the config's last round
                store.append_record(run_dir, rec)
                print(f"[mgbench worker] {cfg.config_id} {rec.status}", flush=True)
            dist.barrier()


def mark_started(cfg: RunConfig, run_dir: RunDir, round_no: int = 1, rounds: int = 1) -> None:
    """Tell the launcher which config runs now, since when, and in which round (its
    timeout, failure attribution and round progress read this file)."""
    if dist.get_rank() == 0:
        store.write_json_atomic(run_dir.progress(os.environ.get("MGBENCH_GROUP", "group")),
                                {"config_id": cfg.config_id, "started": time.time(), "round": round_no,
                                 "rounds": rounds})


def warm_process(cfg: RunConfig, device: torch.device, run_dir: RunDir) -> None:
    """A few untimed steps of the job's first timed config before anything is measured.

    The first config of a fresh process otherwise pays for thread-pool start-up, the
    allocator's first growth and lazy communicator set-up (NCCL creates communicators on
    the first collective): seen here as the first config running 15-30% slower than the
    same config later in the job. A failure here is that config's failure.
    """
    mark_started(cfg, run_dir)
    try:
        prep = prepare(cfg, device)
        steps = max(2, min(cfg.warmup_steps, 5))
        batches = batches_for(cfg, range(steps), prep.dp_rank, prep.dp_size, device)
        for b in batches:
            train_step(prep, b, device, cfg.precision)
        sync(device)
        dist.barrier()
        del prep, batches
        # torch's memory tracker takes 1-2 s to import on a 2-core VM: paid here, once per
        # job, not by the first config's tracked step (mem_tracked_s).
        if cfg.track_memory:
            import torch.distributed._tools.fsdp2_mem_tracker  # noqa: F401
            import torch.distributed._tools.mem_tracker  # noqa: F401
    except Exception as e:  # as if the first config itself failed: see fail_config
        fail_config(cfg, device, run_dir, e)
    gc.collect()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--job", required=True, help="job file written by mgbench.runner.launch: the configs to run")
    args = ap.parse_args(argv)
    job = json.loads(Path(args.job).read_text())
    run_dir, run_id = RunDir(job["run_dir"]), job["run_id"]
    configs = [RunConfig.from_dict(c) for c in job["configs"]]
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = configs[0].device == "cuda"
    # Collective timeout: longer than any config may take, so a hang is reported by the
    # launcher's per-config timer as `timeout` (with the config named) rather than as a
    # collective error in whichever config happens to run into it. Shorter than forever,
    # so an orphaned rank still dies.
    pg_timeout = dt.timedelta(seconds=max(c.timeout_s for c in configs) + 60)
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=pg_timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=pg_timeout)
    meter = EnergyMeter(device.type, local_rank, local_rank)
    if local_rank == 0:
        # Each node's fingerprint, for the manifest of a multi-node run.
        node = int(os.environ.get("GROUP_RANK", 0))
        path = run_dir.node(node)
        if not path.exists():
            from ..telemetry.interconnect import detect
            from ..telemetry.machine import fingerprint

            path.parent.mkdir(exist_ok=True)
            store.write_json_atomic(path, {"node_rank": node, "machine": fingerprint(), "interconnect": detect()})
    try:
        # Warmed on the first config that will be timed: a negative control times nothing.
        timed = next((c for c in configs if not is_negative_control(c)), None)
        if timed is not None:
            warm_process(timed, device, run_dir)
        # Everything alive now (torch's modules, the process group) lives as long as the
        # job: exempt it from the full collections that free each config's model. Each of
        # those otherwise walks every torch object, ~0.14 s on a 2-core VM, two per config.
        gc.freeze()
        run_configs(configs, device, meter, run_dir, run_id)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
