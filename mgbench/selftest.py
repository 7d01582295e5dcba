"""`python -m mgbench.selftest`: check mgbench's GPU paths on this machine in one command.

For a person with one GPU (or more) who wants to know, in under 10 minutes, whether
mgbench measures this machine right. It runs a small suite through `mgbench run` (NCCL,
the CUDA caching allocator's peaks, NVML energy, torch.compile, activation checkpointing,
fp16 loss scaling with fused AdamW, FSDP2, the CUDA profiler's compute / communication
split, and on two or more GPUs tensor and pipeline parallelism and real collectives),
each config checked against its single-process reference, then `mgbench comm` (copy
bandwidths of one GPU, collectives across two or more). It prints, per config:

- MFU against the catalog peak it used (and which: bf16, or tf32 / fp32 for fp32);
- energy per token, with the window the counter covered and how energy was read;
- peak memory (allocated, and tracked tensors) against `mgbench memory`'s model of the
  config (:func:`mgbench.planner.memory.memory_for_config`);
- step time against `mgbench predict` for this GPU's catalog entry;

and the copy and collective bandwidths. Exit status 0 when every config that can run
here ran, matched its reference, and the comm sweep completed; 1 otherwise; 2 without a
CUDA device (one line says so). ``--device cpu`` runs the same flow on gloo CPU ranks with
a tiny model (the CPU variant: it checks mgbench's plumbing, not a GPU).

Time on one H100 (estimate): 8 configs of a GPT-2-small-sized model at 1,024 tokens, each
built, warmed up (5 steps, the check window among them) and timed (20 steps, energy window
held to at least 5 s): ~10 s each, ~45 s for the compiled one; 3 single-process
references; `mgbench comm` copies from 8 KiB to 1 GiB: ~1 min. About 4 minutes in all.
Measured on one H200 (2026-11-27, results/20261127-184303-selftest-4564): 115 s in all,
the 8 configs in 96 s (the compiled one 17 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from . import catalog, store
from .errors import MgbenchError
from .record import control_verdict

NO_CUDA = ("mgbench selftest: no CUDA device is visible (torch.cuda.is_available() is False), so there is no GPU "
           "path to check here; `python -m mgbench.selftest --device cpu` runs the CPU variant on gloo ranks")

# Every GPU path one or two GPUs can show. Each [[sweep]] says what it is there for.
COMMON = """
seq_len = {seq_len}
micro_batch = {micro_batch}
warmup_steps = {warmup}
measured_steps = {measured}
check_steps = 3
timeout_s = 600
"""
GPU_SUITE = """name = "selftest"
description = "mgbench's GPU paths on this machine (python -m mgbench.selftest)"

[[sweep]]
# One process, bf16: MFU, NVML energy, CUDA memory peaks, step time against predict;
# eager, compiled (inductor on the GPU), and with activation checkpointing.
model = "gpt2-small"
strategy = "single"
precision = "bf16"
compile = [false, true]
{common}
[[sweep]]
model = "gpt2-small"
strategy = "single"
precision = "bf16"
activation_checkpointing = "every_2nd"
{common}
[[sweep]]
# fp32 (its MFU against the fp32 or tf32 peak, as torch's TF32 setting says) and fp16
# (GradScaler with the fused AdamW of CUDA).
model = "gpt2-small"
strategy = "single"
precision = ["fp32", "fp16"]
{common}
[[sweep]]
# NCCL at one rank: DDP with the profiled compute / communication split, FSDP2 in bf16
# and in fp16 (ShardedGradScaler).
model = "gpt2-small"
strategy = "ddp"
nproc = 1
precision = "bf16"
profile = true
{common}
[[sweep]]
model = "gpt2-small"
strategy = "fsdp"
nproc = 1
precision = ["bf16", "fp16"]
{common}
[[sweep]]
# Two GPUs: gradients and activations cross devices. Skipped, with the reason, on one.
model = {{ layers = 12, hidden = 768, heads = 12, ffn_hidden = 2048, vocab = 32000 }}
strategy = ["ddp", "fsdp", "tp", "pp"]
nproc = 2
precision = "bf16"
grad_accum = 4
{common2}
"""
# The CPU variant: the same flow, a tiny model on gloo ranks (plumbing only).
CPU_SUITE = """name = "selftest-cpu"
description = "the selftest's CPU variant (python -m mgbench.selftest --device cpu)"

[[sweep]]
model = "tiny"
strategy = "single"
precision = "fp32"
{common}
[[sweep]]
model = "tiny"
strategy = "ddp"
nproc = 2
precision = "fp32"
{common}
[[sweep]]
model = "tiny"
strategy = "pp"
nproc = 2
precision = "fp16"
grad_accum = 2
{common}
"""


def suite_text(device: str) -> str:
    """The selftest's suite for ``device`` ("cuda" or "cpu")."""
    if device == "cuda":
        common = COMMON.format(seq_len=1024, micro_batch=8, warmup=5, measured=20)
        common2 = COMMON.format(seq_len=1024, micro_batch=2, warmup=5, measured=20)
        return GPU_SUITE.format(common=common, common2=common2)
    return CPU_SUITE.format(common=COMMON.format(seq_len=32, micro_batch=2, warmup=2, measured=4))


def _bytes(b: float | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def predicted_step(rec: dict[str, Any]) -> tuple[float | None, str]:
    """`mgbench predict`'s step time for a record's config on its device's catalog entry,
    or None with the reason."""
    from .planner import hardware
    from .layout import Layout
    from .probe.profile import STACK as RUNNER_STACK
    from .planner.predict import predict
    from .record import config_from_record

    acc = catalog.match_accelerator(rec.get("device_name") or "", rec.get("device_memory_gib"))
    if acc is None:
        return None, f"no catalog entry for {rec.get('device_name')!r}"
    cfg = config_from_record(rec)
    try:
        # The peak the run's MFU used (tf32 for fp32 with TF32 on: catalog.peak_precision).
        hw = hardware.resolve(gpu=acc, precision=rec.get("mfu_peak_precision") or cfg.precision)
        # The runner's own stack: its attention kernel (torch SDPA's FlashAttention-2);
        # it has no fitted efficiency (stacks.toml [stacks.mgbench]), so none is applied.
        hw = dataclasses.replace(hw, stack=RUNNER_STACK)
        return float(predict(cfg.shape, hw, Layout.from_config(cfg))["step_time_s"]), f"{acc}, {hw.system}"
    except (MgbenchError, KeyError) as e:
        return None, str(e)


def config_lines(rec: dict[str, Any]) -> list[str]:
    """What the selftest says about one record."""
    from .planner.memory import memory_for_config
    from .record import config_from_record

    head = f"{rec['label']}: {rec['status']}"
    if rec["status"] == "skipped":
        return [f"{head} ({rec.get('skip_reason')})"]
    if rec["status"] == "checked":
        return [f"{head}: negative control {control_verdict(rec)}"]
    if rec["status"] != "ok":
        return [f"{head}: {rec.get('error')}"]
    verdict = {True: "matches the single-process reference", False: f"DIFFERS: {rec.get('correct_reason')}",
               None: f"not checked: {rec.get('correct_reason')}"}[rec.get("correct")]
    out = [f"{head}, {verdict}"]
    out.append(f"  step {rec['step_time_s'] * 1e3:.1f} ms, {rec['tokens_per_s']:,.0f} tokens/s")
    if rec.get("mfu_pct") is not None:
        out.append(f"  MFU {rec['mfu_pct']:.1f}% of {rec['peak_tflops']:g} TFLOPS "
                   f"({rec.get('mfu_peak_precision')} peak; TF32 matmuls {'on' if rec.get('tf32_matmul') else 'off'})")
    else:
        out.append(f"  MFU - ({rec.get('mfu_reason')})")
    if rec.get("energy_per_token_j") is not None:
        steps = rec.get("num_energy_steps")
        tick = rec.get("energy_update_interval_s")
        out.append(f"  energy {rec['energy_per_token_j'] * 1e3:.3f} mJ/token over a {rec['energy_window_s']:.1f} s "
                   f"window ({steps if steps is not None else '?'} steps, {rec.get('energy_method')}"
                   + (f", counter updates every {tick * 1e3:.0f} ms" if tick else "") + ")")
    else:
        out.append(f"  energy - ({rec.get('energy_reason')})")
    # The model counts the workload's tensors: compare it with the tracked tensors, or else
    # with the allocator's peak (CUDA); a CPU rank's peak is its whole process (RSS).
    model = memory_for_config(config_from_record(rec))["total_bytes"]
    measured = rec.get("mem_peak_gib")
    measured_b = measured * 2**30 if measured is not None else None
    tracked = rec.get("mem_tracked_peak_bytes")
    basis = tracked if tracked else (measured_b if "cuda" in (rec.get("mem_method") or "") else None)
    ratio = f": measured / model {basis / model:.2f}" if basis and model else ""
    out.append(f"  memory peak {_bytes(measured_b)} ({rec.get('mem_method')})"
               + (f", tracked tensors {_bytes(tracked)}" if tracked is not None else "")
               + f"; `mgbench memory` models {_bytes(model)}{ratio}")
    pred, why = predicted_step(rec)
    if pred is not None:
        out.append(f"  `mgbench predict`: {pred * 1e3:.1f} ms ({why}); measured / predicted "
                   f"{rec['step_time_s'] / pred:.2f}")
    else:
        out.append(f"  `mgbench predict`: - ({why})")
    return out


def comm_lines(run_dir: Path) -> list[str]:
    """Copy bandwidths and collective bus bandwidths of a `mgbench comm` run: the largest
    size measured of each, with the alpha-beta fit's bandwidth where there is one."""
    rows = store.load_comm_rows(run_dir)
    fits = store.load_comm_fits(run_dir)
    manifest = store.read_manifest(run_dir)
    out = []
    for kind, label in (("copy", "copy bandwidth"), ("collective", "collective bus bandwidth")):
        sel = [r for r in rows if r.get("kind", "collective") == kind]
        if not sel:
            reason = (manifest.get("comm") or {}).get("copies_reason" if kind == "copy" else "collectives_reason")
            out.append(f"{label}: - ({reason or 'not measured'})")
            continue
        out.append(f"{label} (largest size measured):")
        for name in dict.fromkeys(r["collective"] for r in sel):
            for dtype in dict.fromkeys(r["dtype"] for r in sel if r["collective"] == name):
                big = max((r for r in sel if r["collective"] == name and r["dtype"] == dtype),
                          key=lambda r: r["size_bytes"])
                bw = big["algbw_gbps"] if kind == "copy" else big["busbw_gbps"]
                fit = next((f for k, f in fits.items() if k.startswith(f"{name}:{dtype}:") and f), None)
                wrong = sum(r["wrong"] for r in sel if r["collective"] == name)
                out.append(f"  {name} {dtype}: {bw:.2f} GB/s at {big['size_bytes'] / 2**20:.1f} MiB"
                           + (f" (fit {fit['bw_gbps']:.2f} GB/s)" if fit and fit.get("bw_gbps") else "")
                           + (f", {wrong} WRONG results" if wrong else ""))
    return out


def comm_correct(comm_dir: Any) -> bool:
    """Whether every copy and collective of the comm run returned the right values."""
    return not any(r["wrong"] for r in store.load_comm_rows(comm_dir))


def verdict(records: list[dict[str, Any]], comm_ok: bool) -> tuple[int, str]:
    """Exit status and the closing line: 0 when every runnable config ran ok and matched
    its reference and the comm sweep completed."""
    ran = [r for r in records if r["status"] != "skipped"]
    # A negative control passes when its bug was caught; any other config, when ok and not wrong.
    bad = [r["label"] for r in ran if (r.get("correct") is not False if r["status"] == "checked" else
                                       r["status"] != "ok" or r.get("correct") is False)]
    skipped = len(records) - len(ran)
    tail = f" ({skipped} skipped: they need more GPUs)" if skipped else ""
    if bad or not comm_ok or not ran:
        what = ([f"{len(bad)} config(s) failed or differ: {'; '.join(bad)}"] if bad else []) + \
               ([] if comm_ok else ["the comm sweep did not complete or returned wrong values"]) + ([] if ran else ["no config could run"])
        return 1, "selftest FAILED: " + "; ".join(what) + tail
    return 0, f"selftest passed: {len(ran)} configs ok and matching their references, comm complete{tail}"


def run(device: str, results_dir: str, progress: Callable[[str], None] = print) -> int:
    """Run the selftest on ``device``; print its findings; return the exit status."""
    from . import suite as suite_mod
    from .comm.run import default_nproc, run_comm
    from .launching import cpu_rank_limit, detect_devices
    from .runner.launch import run_suite

    kind, count = detect_devices()
    if device == "cpu":
        kind, count = "cpu", min(cpu_rank_limit(), 2)
    s = suite_mod.parse_suite(suite_text(kind), "<selftest>", kind)
    progress(f"mgbench selftest on {count} {kind} device(s); results under {results_dir}/")
    run_dir = run_suite(s, results_dir=results_dir, device_kind=kind, num_devices=count, progress=progress)
    records = store.latest_records(store.read_records(run_dir))
    comm_ok, comm_out = True, []
    try:
        nproc = default_nproc(kind, count)
        collectives = ["all_reduce", "all_gather", "reduce_scatter"] if kind == "cuda" else ["all_reduce"]
        dtypes = ["bfloat16"] if kind == "cuda" else ["float32"]
        comm_dir = run_comm(nproc, kind, collectives, dtypes, results_dir, progress=progress)
        comm_out = comm_lines(comm_dir)
        comm_ok = comm_correct(comm_dir)
    except MgbenchError as e:
        comm_ok, comm_out = False, [f"comm: {e}"]
    progress("")
    ran = [r for r in records if r["status"] == "ok"]
    if ran:
        progress(f"device {ran[0].get('device_name')}, torch {ran[0].get('torch_version')}")
    for rec in records:
        for line in config_lines(rec):
            progress(line)
    for line in comm_out:
        progress(line)
    status, line = verdict(records, comm_ok)
    progress(f"\n{line}\nresults: {run_dir}")
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mgbench.selftest", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default): the GPU paths; cpu: the CPU variant on gloo ranks (plumbing only)")
    ap.add_argument("--results-dir", default="results", help="where the run folders go (default: results)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        from .launching import detect_devices

        if detect_devices()[0] != "cuda":
            print(NO_CUDA, file=sys.stderr)
            return 2
    try:
        return run(args.device, args.results_dir)
    except MgbenchError as e:
        print(f"mgbench selftest: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
