"""`mgbench probe`: measure the machine at hand into a hardware profile."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any, Callable

from .. import catalog
from ..errors import MgbenchError
from ..model_shape import ModelShape
from .profile import PROFILE_VERSION

DEFAULT_DTYPES = {"cpu": ["float32"], "cuda": ["bfloat16", "float16", "float32"]}
MEMORY_OPERAND_BYTES = {"cpu": 64 * 2**20, "cuda": 1 * 2**30}


def probe(device: str = "auto", dtypes: list[str] | None = None, model: str | None = None,
          tokens: int | None = None, comm: bool = True, results_dir: str = "results",
          progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every microbenchmark and return the profile (not yet written)."""
    import torch

    from ..launching import detect_devices
    from ..telemetry.machine import fingerprint
    from . import kernels

    t_start = time.monotonic()
    kind, count = detect_devices()
    if device == "cuda" and kind != "cuda":
        raise MgbenchError("--device cuda: no CUDA device is visible here; use --device cpu or auto")
    if device == "cpu":
        kind = "cpu"
    dev = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    dtypes = dtypes or DEFAULT_DTYPES[kind]
    for d in dtypes:
        if d not in kernels.DTYPES:
            raise MgbenchError(f"--dtype {d}: choose from {', '.join(kernels.DTYPES)}")
    name, default_tokens = default_workload(kind)
    shape: ModelShape = catalog.model_shape(model or name)
    tokens = tokens or default_tokens
    cores = os.cpu_count() or 1
    device_name = torch.cuda.get_device_name(dev) if kind == "cuda" else "cpu"
    machine = fingerprint()
    prof: dict[str, Any] = {
        "profile_version": PROFILE_VERSION,
        "created_at": dt.datetime.now().isoformat(timespec="seconds"),
        "hostname": machine.get("hostname"), "machine": machine,
        "device": kind, "device_name": device_name if kind == "cuda" else (machine.get("cpu_model") or "cpu"),
        "accelerator": catalog.match_accelerator(device_name) if kind == "cuda" else None,
        "num_devices": count if kind == "cuda" else 1, "cores": cores,
        "torch_version": torch.__version__,
        "workload": {"model": shape.name, "tokens": tokens},
    }
    if kind == "cuda":
        prof["device_memory_bytes"] = torch.cuda.get_device_properties(dev).total_memory
        from ..runner.training import fp32_matmul_mode

        # fp32 GEMMs below ran in this mode: on tensor cores (tf32) or not (ieee).
        prof["fp32_matmul"], prof["fp32_matmul_setting"] = fp32_matmul_mode()
    ram = machine.get("ram_gib")
    prof["host_memory_bytes"] = ram * 2**30 if ram else None

    if kind == "cpu":  # each count a rank gets at 1, 2, 4 ... ranks (launching.threads_per_rank)
        from ..launching import cpu_rank_limit, threads_per_rank

        thread_counts = sorted({threads_per_rank(n, cores) for n in _pow2_upto(cpu_rank_limit())})
    else:
        thread_counts = [torch.get_num_threads()]
    saved = torch.get_num_threads()
    prof["gemm"] = []
    shapes = kernels.layer_gemms(shape, tokens)
    try:
        for dtype in dtypes:
            for t in thread_counts:
                torch.set_num_threads(t)
                progress(f"GEMM {dtype}, {t} thread(s): {len(shapes)} shapes of a {shape.name} layer at {tokens} tokens")
                prof["gemm"].append({**kernels.gemm(dev, dtype, shapes), "threads": t})
    finally:
        torch.set_num_threads(saved)

    progress("memory bandwidth")
    prof["memory"] = kernels.memory_bandwidth(dev, MEMORY_OPERAND_BYTES[kind])
    prof["host_ops"] = _host_ops(dev, thread_counts, shape, tokens, progress) if kind == "cpu" else \
        {"null_reason": "CPU only: a GPU runs ops asynchronously, so their dispatch overlaps the kernels"}
    attn_shapes = [{"batch": max(1, tokens // s), "heads": shape.heads, "seq": s, "head_dim": shape.dim_head}
                   for s in sorted({min(tokens, 128 if kind == "cpu" else 1024), min(tokens, 512 if kind == "cpu" else 4096)})]
    prof["attention"] = []
    try:
        for dtype in dtypes:
            for t in thread_counts:  # on CPU, at each thread count a rank gets (as the GEMMs)
                torch.set_num_threads(t)
                progress(f"attention {dtype}, {t} thread(s)")
                prof["attention"].append({**kernels.attention(dev, dtype, attn_shapes), "threads": t})
    finally:
        torch.set_num_threads(saved)
    prof["copies"] = _copies(dev)
    prof["comm"] = _comm(kind, count, dtypes[0] if kind == "cuda" else "float32", results_dir, progress) if comm \
        else {"null_reason": "skipped (--no-comm)"}
    prof["probe_s"] = time.monotonic() - t_start
    return prof


def _host_ops(dev: Any, thread_counts: list[int], shape: ModelShape, tokens: int,
              progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Per thread count a CPU rank gets: the per-op overhead, and the bandwidth the
    workload's own non-matmul ops get (one fp32 single-process step of the probed model
    at the probed tokens, traced once and replayed), which the probed CPU prediction
    prices a step's non-matmul ops with (planner/perf.py)."""
    import torch

    from ..planner.opcount import count_step
    from . import kernels

    progress(f"tracing one training step of {shape.name} for its non-matmul ops")
    recorded = count_step(workload_config(shape, tokens), record=True)["recorded"]
    saved = torch.get_num_threads()
    out = []
    try:
        for t in thread_counts:
            torch.set_num_threads(t)
            progress(f"per-op overhead and the step's {len(recorded)} non-matmul ops, {t} thread(s)")
            out.append({"threads": t, **kernels.op_overhead(dev), "elementwise": kernels.elementwise(dev, recorded)})
    finally:
        torch.set_num_threads(saved)
    return out


def workload_config(shape: ModelShape, tokens: int) -> Any:
    """The single-process fp32 CPU config whose step the probe replays: the default
    suite's micro-batch and sequence length when ``tokens`` is theirs, else one
    sequence of ``tokens``."""
    from ..config import RunConfig
    from ..suite import load_suite

    sweep = load_suite("default", "cpu").sweeps[0]
    mb, seq = sweep["micro_batch"][0], sweep["seq_len"][0]
    if mb * seq != tokens:
        mb, seq = 1, tokens
    return RunConfig(model=shape, strategy="single", nproc=1, micro_batch=mb, seq_len=seq, precision="fp32",
                     device="cpu")


def _pow2_upto(n: int) -> list[int]:
    return [2**i for i in range(n.bit_length()) if 2**i <= n]


def default_workload(kind: str) -> tuple[str, int]:
    """The default suite's model and tokens per micro-batch on this device kind
    (suites/default.toml), so that predicting that suite from the profile uses GEMMs of
    the shapes it really runs."""
    from ..suite import load_suite

    sweep = load_suite("default", kind).sweeps[0]
    return sweep["model"][0], sweep["micro_batch"][0] * sweep["seq_len"][0]


def _copies(dev: Any) -> dict[str, Any]:
    """Host-device and device-device copy GB/s (comm/copies.py, as `mgbench comm` measures them)."""
    from ..comm import copies

    if dev.type != "cuda":
        return {"null_reason": copies.NOT_APPLICABLE}
    size = 256 * 2**20
    return {name: copies.measure(name, size, dev, warmup=3, iters=10)["algbw_gbps"] for name in copies.COPIES}


def _comm(kind: str, count: int, dtype: str, results_dir: str, progress: Callable[[str], None]) -> dict[str, Any]:
    """The all-reduce alpha-beta fit of a short `mgbench comm` run on this machine."""
    from ..comm.run import run_comm
    from ..store import load_comm_fits, new_run_id

    nproc = 2 if kind == "cpu" else count
    if nproc < 2:
        return {"null_reason": "one device: no collective to measure"}
    progress(f"all_reduce on {nproc} {kind} ranks (a short `mgbench comm` run)")
    run_dir = run_comm(nproc, kind, ["all_reduce"], [dtype], results_dir, run_id=new_run_id(f"probe-comm-n{nproc}"),
                       progress=lambda _m: None)
    fit = load_comm_fits(Path(run_dir)).get(f"all_reduce:{dtype}:all")
    return {"nproc": nproc, "dtype": dtype, "run": Path(run_dir).name, "all_reduce": fit}


def default_path(profile: dict[str, Any], results_dir: str) -> Path:
    """results/profiles/<host>-<device>-<date>.json: one store, named by machine and time."""
    from ..store import profiles_dir

    stamp = profile["created_at"].replace(":", "").replace("-", "")
    return profiles_dir(results_dir) / f"{profile['hostname']}-{profile['device']}-{stamp}.json"
