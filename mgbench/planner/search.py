"""`mgbench plan`: search system x GPUs x TP x PP x DP x ZeRO x micro-batch x recompute.

Every candidate is evaluated at once with numpy (memory.py and perf.py take arrays),
one system at a time. Layouts that do not divide or do not fit in memory are dropped;
the rest get days, GPU-hours, cost and energy; the best layout per (system, GPU count)
forms the ranked table and the time-vs-cost Pareto front.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import MgbenchError
from ..model_shape import ModelShape
from . import cost, hardware, perf, stack
from .memory import RECOMPUTE, STATE_BYTES, memory_per_gpu

TP_CHOICES = (1, 2, 4, 8)
PP_CHOICES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)
ZERO_CHOICES = (0, 1, 2, 3)
MICRO_BATCH_CHOICES = (1, 2, 4, 8)


@dataclass
class PlanOptions:
    """What `mgbench plan` searches and the cost assumptions it prices with.

    Each field's metadata is its command-line option (mgbench/cli_options.py builds
    `plan`'s options and `report`'s --plan-* options from these fields): "help" is the
    option's help text, "choices" its allowed values, "metavar" its placeholder, and
    "set_by" names the option that fills a field which is not an option itself. A
    field added here is an option of `plan` with no other edit.
    """

    tokens: float = field(metadata={"help": "Training tokens, e.g. 1.5e13."})
    seq_len: int = field(default=4096, metadata={"help": "Sequence length in tokens."})
    global_batch_tokens: int = field(
        default=4 * 2**20,  # 4M tokens per step, a common large-model batch
        metadata={"help": "Tokens per optimizer step (global batch x sequence length)."})
    systems: list[str] | None = field(
        default=None, metadata={"help": "Comma-separated catalog systems (default: all).", "metavar": "A,B,..."})
    max_gpus: int = field(default=4096, metadata={"help": "Largest GPU count considered."})
    precision: str = field(
        default="bf16",
        metadata={"help": "Training precision: the peak FLOP/s used and the bytes per value.",
                  "choices": tuple(STATE_BYTES)})
    deadline_days: float | None = field(
        default=None, metadata={"help": "Keep only options that finish within this many days."})
    budget_usd: float | None = field(
        default=None, metadata={"help": "Keep only options that cost at most this many USD."})
    spot: bool = field(default=False, metadata={"help": "Spot prices and preemptions."})
    checkpoint_minutes: float = field(
        default=60.0, metadata={"help": "Minutes between checkpoints (a failure loses half of one, on average)."})
    failure_rate: float = field(
        default=cost.FAILURE_RATE_PER_GPU_HOUR,
        metadata={"help": "Failures per GPU-hour (default from Llama 3's 54-day report)."})
    restart_minutes: float = field(
        default=cost.RESTART_MINUTES,
        metadata={"help": "Minutes to detect a failure, reschedule and reload a checkpoint (an assumption)."})
    checkpoint_write_minutes: float = field(
        default=cost.CHECKPOINT_WRITE_MINUTES,
        metadata={"help": "Minutes the job stalls per checkpoint save (an assumption)."})
    preemption_rate: float = field(
        default=cost.SPOT_PREEMPTIONS_PER_NODE_HOUR,
        metadata={"help": "Spot preemptions per node-hour, when on spot (an assumption)."})
    power_fraction: float = field(
        default=cost.POWER_FRACTION_OF_TDP,
        metadata={"help": "Average GPU power as a fraction of TDP (an assumption)."})
    pue: float = field(
        default=cost.PUE, metadata={"help": "Facility power usage effectiveness (an assumption)."})
    overlap: float = field(
        default=perf.DEFAULT_OVERLAP,
        metadata={"help": "Fraction of the data-parallel communication window hidden behind backward."})
    top: int = field(default=20, metadata={"help": "Rows of the ranked table."})
    stack: str = field(
        default=stack.DEFAULT_STACK,
        metadata={"help": "Software stack whose published runs set the achieved efficiency "
                          "(mgbench/data/stacks.toml; a stack with no measured run is refused with the reason).",
                  "choices": tuple(stack.stacks())})
    # A hardware profile (`mgbench probe`): plan on the probed machine instead of catalog systems.
    profile: dict[str, Any] = field(default_factory=dict, metadata={"set_by": "--hardware"})
    calibration: dict[str, Any] = field(default_factory=dict, metadata={"set_by": "--calibrate"})
    # The calibrated systems' interval regime (uncertainty.calibrated of the same fit).
    calibration_regime: dict[str, Any] = field(default_factory=dict, metadata={"set_by": "--calibrate"})
    # system -> measured Hardware link fields
    links: dict[str, dict[str, float]] = field(default_factory=dict, metadata={"set_by": "--comm"})


def gpu_counts(gpus_per_node: int, max_gpus: int) -> np.ndarray:
    """Partial nodes by powers of two, then whole nodes up to max_gpus."""
    small = [n for n in (1, 2, 4) if n < gpus_per_node and n <= max_gpus]
    return np.array(small + list(range(gpus_per_node, max_gpus + 1, gpus_per_node)), dtype=np.int64)


def _grid(*axes: np.ndarray) -> list[np.ndarray]:
    return [g.ravel() for g in np.meshgrid(*axes, indexing="ij")]


def evaluate_system(shape: ModelShape, system: str, opts: PlanOptions, prices: cost.Prices) -> tuple[dict[str, np.ndarray], int]:
    """All candidates of one system; returns the feasible ones (columns) and the count evaluated."""
    hw = hardware.resolve(system=system, precision=opts.precision, **opts.calibration.get(system, {}))
    if system in opts.links:
        hw = dataclasses.replace(hw, **opts.links[system])
    hw = stack.apply(hw, opts.stack)
    return evaluate_hardware(shape, hw, gpu_counts(hw.gpus_per_node, opts.max_gpus), opts, prices, opts.overlap)


def profile_counts(profile: dict[str, Any], max_gpus: int) -> list[int]:
    """Rank counts a probed machine can run: powers of two and its device count, up to its
    devices (GPU) or cores (CPU: more ranks than cores only time-share them)."""
    top = min(max_gpus, profile["cores"] if profile["device"] == "cpu" else profile.get("num_devices", 1))
    return sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= top} | ({top} if top >= 1 else set()))


def evaluate_profile(shape: ModelShape, opts: PlanOptions, prices: cost.Prices) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Candidates on the probed machine of ``opts.profile``, one rank count at a time (on
    CPU each count has its own share of the cores); counts the profile cannot price are
    skipped with the reason."""
    from ..probe import profile as P

    pieces, evaluated, notes = [], 0, []
    for n in profile_counts(opts.profile, opts.max_gpus):
        try:
            hw = P.hardware(opts.profile, opts.precision, ranks=n)
        except MgbenchError as e:
            notes.append(f"{n} rank(s) not considered: {e}")
            continue
        hw = dataclasses.replace(hw, gpus_per_node=n)
        cols, k = evaluate_hardware(shape, hw, np.array([n], dtype=np.int64), opts, prices,
                                    min(opts.overlap, P.overlap(opts.profile, n, opts.overlap)))
        pieces.append(cols)
        evaluated += k
    return pieces, evaluated, notes


def evaluate_hardware(shape: ModelShape, hw: hardware.Hardware, counts: np.ndarray, opts: PlanOptions,
                      prices: cost.Prices, overlap: float) -> tuple[dict[str, np.ndarray], int]:
    """All candidates on ``hw`` at these GPU counts (columns of the feasible ones) and the count evaluated."""
    system = hw.system
    B = max(1, opts.global_batch_tokens // opts.seq_len)
    tps_ = np.array([t for t in TP_CHOICES if t <= hw.gpus_per_node])
    pps = np.array([p for p in PP_CHOICES if p <= shape.layers])
    N, T, P, Z, MB, RC = _grid(counts, tps_, pps,
                               np.array(ZERO_CHOICES), np.array(MICRO_BATCH_CHOICES), np.arange(len(RECOMPUTE)))
    evaluated = N.size
    heads_ok = (shape.heads % T == 0) & ((shape.kv_heads % T == 0) | (T % shape.kv_heads == 0))
    ok = heads_ok & (N % (T * P) == 0)
    D = np.where(ok, N // np.maximum(T * P, 1), 1)
    ok &= B % (MB * D) == 0
    # ZeRO stages only differ with data parallelism: keep stage 0 alone when dp = 1.
    ok &= (D > 1) | (Z == 0)
    N, T, P, Z, MB, RC, D = (a[ok] for a in (N, T, P, Z, MB, RC, D))
    M = B // (MB * D)
    sp = T > 1
    mem = memory_per_gpu(shape, seq=opts.seq_len, micro_batch=MB, num_micro=M, tp=T, pp=P, dp=D, zero=Z,
                         precision=opts.precision, recompute=RC, sp=sp, flash=True)
    fits = mem["total_bytes"] <= hw.memory_bytes
    N, T, P, Z, MB, RC, D, M, sp = (a[fits] for a in (N, T, P, Z, MB, RC, D, M, sp))
    mem_total = mem["total_bytes"][fits]
    out = perf.step_time(shape, hw, seq=opts.seq_len, global_batch=B, micro_batch=MB, tp=T, pp=P, dp=D, zero=Z,
                         recompute=RC, precision=opts.precision, overlap=overlap, sp=sp, flash=True)
    tps = out["tokens_per_s"]
    good = cost.goodput(N, hw.gpus_per_node, opts.checkpoint_minutes, opts.failure_rate, opts.restart_minutes,
                        opts.checkpoint_write_minutes, opts.spot, opts.preemption_rate)
    hours = opts.tokens / tps / 3600.0 / good
    gpu_hours = N * hours
    price, price_source = prices.lookup(system, hw.gpu, opts.spot)
    usd = gpu_hours * price if price is not None else np.full(N.shape, np.nan)
    cols = {
        "num_gpus": N, "tp": T, "pp": P, "dp": D, "zero": Z, "micro_batch": MB, "recompute": RC,
        "num_micro_batches": M, "tokens_per_s": tps, "mfu": out["mfu"], "goodput": good, "days": hours / 24.0,
        "gpu_hours": gpu_hours, "cost_usd": usd, "usd_per_million_tokens": usd / (opts.tokens / 1e6),
        "energy_kwh": cost.energy_kwh(N, hw.tdp_w, hours, opts.power_fraction, opts.pue),
        "memory_per_gpu_bytes": mem_total,
    }
    cols["_meta"] = {"system": system, "gpu": hw.gpu, "price_usd_per_gpu_hour": price, "price_source": price_source,
                     "device_memory_bytes": hw.memory_bytes, "max_power_kw": hw.max_power_kw,
                     "gpus_per_node": hw.gpus_per_node, "tdp_w": hw.tdp_w}  # type: ignore[assignment]
    return cols, evaluated


def _row(cols: dict[str, Any], i: int) -> dict[str, Any]:
    meta = cols["_meta"]
    r: dict[str, Any] = {"system": meta["system"], "gpu": meta["gpu"]}
    for k, v in cols.items():
        if k == "_meta":
            continue
        x = v[i].item()
        r[k] = None if isinstance(x, float) and np.isnan(x) else x
    r["recompute"] = RECOMPUTE[int(r["recompute"])]
    nodes = -(-r["num_gpus"] // meta["gpus_per_node"])
    r["node_power_kw"] = meta["max_power_kw"]
    r["cluster_power_kw"] = meta["max_power_kw"] * nodes if meta["max_power_kw"] else None
    r["price_usd_per_gpu_hour"] = meta["price_usd_per_gpu_hour"]
    r["device_memory_bytes"] = meta["device_memory_bytes"]
    return r


def pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows not beaten on both days and cost by any other row (cost known)."""
    priced = sorted((r for r in rows if r["cost_usd"] is not None), key=lambda r: (r["days"], r["cost_usd"]))
    front, best_cost = [], float("inf")
    for r in priced:
        if r["cost_usd"] < best_cost:
            front.append(r)
            best_cost = r["cost_usd"]
    return front


def plan(shape: ModelShape, opts: PlanOptions, prices: cost.Prices | None = None) -> dict[str, Any]:
    """Search every system's layouts; return ranked bests, the Pareto front and a recommendation."""
    t0 = time.perf_counter()
    prices = prices or cost.Prices()
    names = opts.systems or list(hardware.systems())
    for s in names:
        if s not in hardware.systems():
            raise MgbenchError(f"--systems: unknown system {s!r}; known: {', '.join(hardware.systems())}")
    if opts.tokens <= 0:
        raise MgbenchError("--tokens must be positive (e.g. 1.5e13)")
    evaluated, feasible, bests, price_notes, notes = 0, 0, [], {}, []
    if opts.profile:
        pieces, evaluated, notes = evaluate_profile(shape, opts, prices)
        if not pieces:
            raise MgbenchError("the profile cannot price any rank count: " + "; ".join(notes))
    else:
        pieces = []
        for s in names:
            cols, n = evaluate_system(shape, s, opts, prices)
            evaluated += n
            pieces.append(cols)
    for cols in pieces:
        s = cols["_meta"]["system"]
        k = cols["num_gpus"].size
        feasible += k
        price_notes[s] = cols["_meta"]["price_source"]
        if k == 0:
            continue
        # Best layout per GPU count: highest throughput (ties: less memory).
        order = np.lexsort((cols["memory_per_gpu_bytes"], -cols["tokens_per_s"], cols["num_gpus"]))
        first = np.ones(order.size, dtype=bool)
        first[1:] = cols["num_gpus"][order][1:] != cols["num_gpus"][order][:-1]
        bests += [_row(cols, i) for i in order[first]]
    elapsed = time.perf_counter() - t0

    def allowed(r: dict[str, Any]) -> bool:
        if opts.deadline_days is not None and r["days"] > opts.deadline_days:
            return False
        if opts.budget_usd is not None and (r["cost_usd"] is None or r["cost_usd"] > opts.budget_usd):
            return False
        return True

    ok = [r for r in bests if allowed(r)]
    ranked = sorted(ok, key=lambda r: (r["cost_usd"] is None, r["cost_usd"] or 0.0, r["days"]))
    for r in ranked[: opts.top]:
        _add_interval(r, opts)
    rec, reasons = _recommend(ranked, bests, opts)
    reasons += notes
    reasons += _distinguishable(ranked[: opts.top])
    if rec is not None and opts.deadline_days is not None and rec["days_interval"][1] > opts.deadline_days:
        reasons.append(f"at its interval's upper end ({rec['days_interval'][1]:.1f} days) it would miss the "
                       f"{opts.deadline_days:g}-day deadline")
    return {
        "model": shape.name, "tokens": opts.tokens, "seq_len": opts.seq_len,
        "global_batch": max(1, opts.global_batch_tokens // opts.seq_len),
        "num_candidates": evaluated, "num_feasible": feasible, "num_meeting_constraints": len(ok),
        "elapsed_s": elapsed, "candidates_per_s": evaluated / elapsed if elapsed > 0 else None,
        "recommendation": rec, "reasons": reasons, "ranked": ranked[: opts.top],
        "pareto": pareto(ok), "prices": price_notes,
        "assumptions": {
            "failure_rate_per_gpu_hour": opts.failure_rate, "checkpoint_minutes": opts.checkpoint_minutes,
            "restart_minutes": opts.restart_minutes, "power_fraction_of_tdp": opts.power_fraction, "pue": opts.pue,
            "spot": opts.spot, "overlap": opts.overlap, "stack": None if opts.profile else opts.stack,
            "hardware_profile": opts.profile.get("hostname") if opts.profile else None,
        },
    }


def _add_interval(r: dict[str, Any], opts: PlanOptions) -> None:
    """A candidate's intervals (planner/uncertainty.py): on step time and tokens/s per GPU,
    and, scaled alike, on days and cost (both proportional to step time)."""
    from . import uncertainty

    reg = uncertainty.regime(r["gpu"], r["pp"] > 1, opts.profile or None,
                             stack=stack.DEFAULT_STACK if opts.profile else opts.stack)
    if opts.calibration_regime and r["system"] in opts.calibration:
        reg = opts.calibration_regime
    step = max(1, opts.global_batch_tokens // opts.seq_len) * opts.seq_len / r["tokens_per_s"]
    iv = uncertainty.intervals(step, r["tokens_per_s"] / r["num_gpus"], reg)
    r.update(step_time_s_interval=iv["step_time_s_interval"],
             tokens_per_s_per_gpu_interval=iv["tokens_per_s_per_gpu_interval"], regime=reg["regime"],
             interval_reasons=reg["reasons"])
    lo, hi = 1.0 - reg["low"], 1.0 + reg["high"]
    r["days_interval"] = [r["days"] * lo, r["days"] * hi]
    r["cost_usd_interval"] = None if r["cost_usd"] is None else [r["cost_usd"] * lo, r["cost_usd"] * hi]


def _distinguishable(ranked: list[dict[str, Any]]) -> list[str]:
    """Which runners-up the recommendation cannot be told apart from, given the intervals."""
    from .uncertainty import overlap

    if len(ranked) < 2:
        return []
    best, key = ranked[0], "cost_usd_interval" if ranked[0]["cost_usd"] is not None else "days_interval"
    close = [r for r in ranked[1:] if r.get(key) and overlap(best[key], r[key])]
    lines = [f"prediction interval ({best['regime']}): {best['days_interval'][0]:.1f} to {best['days_interval'][1]:.1f} days; "
             + "; ".join(best["interval_reasons"])]
    if close:
        lines.append("not distinguishable from it within the intervals: " + ", ".join(
            f"{r['num_gpus']}x {r['gpu']} ({r['system']})" for r in close[:5]))
    return lines


def _recommend(ranked: list[dict[str, Any]], all_rows: list[dict[str, Any]], opts: PlanOptions) -> tuple[dict[str, Any] | None, list[str]]:
    if not all_rows:
        return None, ["no layout of any system fits this model in memory within --max-gpus"]
    if not ranked:
        fastest = min(all_rows, key=lambda r: r["days"])
        why = [f"no layout meets the constraints; the fastest is {fastest['num_gpus']}x {fastest['gpu']} "
               f"({fastest['system']}) at {fastest['days']:.1f} days"]
        return None, why
    r = ranked[0]
    priced = r["cost_usd"] is not None
    reasons = [
        f"{r['num_gpus']}x {r['gpu']} ({r['system']}) with tp={r['tp']} pp={r['pp']} dp={r['dp']}, ZeRO-{r['zero']}, "
        f"micro-batch {r['micro_batch']}, recompute {r['recompute']}",
        (f"cheapest of {len(ranked)} (system, GPU count) options meeting the constraints: "
         f"USD {r['cost_usd']:,.0f} ({r['usd_per_million_tokens']:.3f} per million tokens)" if priced
         else "no price known for any option meeting the constraints; ranked by time (pass --price)"),
        f"{r['days']:.1f} days at {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.0f}%, goodput {100 * r['goodput']:.0f}%",
        f"needs {r['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU of {r['device_memory_bytes'] / 1e9:.0f} GB",
    ]
    faster = [x for x in ranked[1:] if x["days"] < r["days"] and x["cost_usd"] is not None]
    if priced and faster:
        f = min(faster, key=lambda x: x["cost_usd"])
        reasons.append(f"finishing sooner ({f['days']:.1f} days on {f['num_gpus']}x {f['gpu']}) costs "
                       f"USD {f['cost_usd'] - r['cost_usd']:,.0f} more")
    return r, reasons
