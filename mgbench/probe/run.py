"""`mgbench probe`: measure the machine at hand into a hardware profile."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any, Callable

from .. import catalog
from ..errors import MgbenchError
from ..show import clock
from ..model_shape import ModelShape
from .profile import PROFILE_VERSION, hardware_profile
from .workload import attention_shapes

DEFAULT_DTYPES = {"cpu": ["float32"], "cuda": ["bfloat16", "float16", "float32"]}
MEMORY_OPERAND_BYTES = {"cpu": 64 * 2**20, "cuda": 1 * 2**30}


def probe(device: str = "auto", dtypes: list[str] | None = None, model: str | None = None,
          tokens: int | None = None, comm: bool = True, results_dir: str = "results",
          progress: Callable[[str], None] = print, max_ranks: int | None = None) -> dict[str, Any]:
    """Run every microbenchmark and return the profile (not yet written). ``max_ranks``:
    on CPU, the largest rank count probed (default launching.cpu_rank_limit); runs with
    more ranks are then priced from the largest probed row, scaled by the cores' share."""
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
        from ..telemetry.tf32 import fp32_matmul_mode

        # fp32 GEMMs below ran in this mode: on tensor cores (tf32) or not (ieee).
        prof["fp32_matmul"], prof["fp32_matmul_setting"] = fp32_matmul_mode()
    ram = machine.get("ram_gib")
    prof["host_memory_bytes"] = ram * 2**30 if ram else None

    phases = phase_count(kind, _cpu_ranks(max_ranks), dtypes, comm, count)
    hint = ([] if max_ranks else ["--max-ranks N probes fewer rank counts"]) + (["--no-comm skips the all-reduce "
                                                                                 "runs"] if comm else [])
    progress = numbered(progress, phases, t_start, f" ({', '.join(hint)})" if kind == "cpu" and hint else "")
    prof["memory"] = kernels.memory_bandwidth(dev, MEMORY_OPERAND_BYTES[kind])
    if kind == "cpu":
        at_ranks = _cpu_rank_kernels(prof, shape, tokens, dtypes, cores, progress, _cpu_ranks(max_ranks))
        prof["framework"] = _framework(prof, shape, progress, at_ranks)
    else:
        _device_kernels(prof, dev, shape, tokens, dtypes, progress)
    prof["copies"] = _copies(dev)
    comm_dtype = dtypes[0] if kind == "cuda" else "float32"
    if not comm:
        prof["comm"] = {"null_reason": "skipped (--no-comm)"}
    elif kind == "cpu":  # at every rank count a CPU run uses: ranks time-share the cores, so latency grows with them
        fits = [_comm(kind, n, comm_dtype, results_dir, progress) for n in _cpu_ranks(max_ranks) if n > 1]
        if fits:
            prof["comm"], prof["comm_at"] = fits[0], fits
        else:
            prof["comm"] = {"null_reason": f"skipped (--max-ranks {max_ranks}: no collective on one rank)"}
    else:
        prof["comm"] = _comm(kind, count, comm_dtype, results_dir, progress)
    prof["probe_s"] = time.monotonic() - t_start
    # The same profile type a catalog accelerator has (hardware_profile.py): what `plan
    # --hardware` and the evidence regime read, every figure measured here or null with why.
    prof["hardware_profile"] = hardware_profile(prof).to_dict()
    return prof


def phase_count(kind: str, cpu_ranks: list[int], dtypes: list[str], comm: bool, devices: int) -> int:
    """The progress lines a probe prints: on CPU one a rank count, the framework rows, and
    an all-reduce run at each rank count above one; on a GPU machine GEMM and attention
    per dtype, and one all-reduce run where there are two or more devices."""
    if kind == "cpu":
        return len(cpu_ranks) + 1 + (sum(n > 1 for n in cpu_ranks) if comm else 0)
    return 2 * len(dtypes) + int(comm and devices > 1)


def numbered(progress: Callable[[str], None], phases: int, t_start: float, hint: str = "") -> Callable[[str], None]:
    """``progress`` with each phase line numbered out of ``phases`` and the time so far
    (the probe's length grows with the rank counts and dtypes probed); ``hint`` follows
    the first line."""
    done = [0]

    def say(message: str) -> None:
        done[0] += 1
        progress(f"[{done[0]}/{phases}, {clock(time.monotonic() - t_start)}] {message}" + (hint if done[0] == 1 else ""))
    return say


def _cpu_ranks(max_ranks: int | None) -> list[int]:
    """The CPU rank counts probed: 1, 2, 4 ... up to the host's rank limit or ``max_ranks``."""
    from ..launching import cpu_rank_limit

    limit = cpu_rank_limit() if max_ranks is None else min(max_ranks, cpu_rank_limit())
    return _pow2_upto(limit)


def _cpu_rank_kernels(prof: dict[str, Any], shape: ModelShape, tokens: int, dtypes: list[str], cores: int,
                      progress: Callable[[str], None], ranks: list[int]) -> list[dict[str, Any]]:
    """GEMM, attention and host-op rows for each rank count a CPU run uses (1, 2, 4 ...
    up to launching.cpu_rank_limit), each tagged with its ``ranks`` and ``threads``
    (launching.threads_per_rank): one rank in this process, n ranks as n processes
    timing the same kernels at once (probe/concurrent.py), as the ranks of a run share
    the cores. Returns the framework rows those n processes timed as one gloo group
    (probe/framework.py)."""
    from ..launching import threads_per_rank
    from .concurrent import rank_kernels, run_together

    prof["gemm"], prof["attention"], prof["host_ops"] = [], [], []
    framework_rows: list[dict[str, Any]] = []
    for n in ranks:
        t = threads_per_rank(n, cores)
        progress(f"{n} rank(s) at {t} thread(s) each: GEMM, attention, per-op overhead, the step's non-matmul ops"
                 + (f" ({n} processes at once)" if n > 1 else ""))
        res = (rank_kernels(shape.name, tokens, dtypes, t) if n == 1 else
               run_together(n, shape.name, tokens, dtypes, t, framework_layers=shape.layers))
        tag = {"threads": t, "ranks": n}
        prof["gemm"] += [{**g, **tag} for g in res["gemm"]]
        prof["attention"] += [{**a, **tag} for a in res["attention"]]
        prof["host_ops"].append({**res["host_ops"], **tag})
        framework_rows += res.get("framework") or []
    return framework_rows


def _framework(prof: dict[str, Any], shape: ModelShape, progress: Callable[[str], None],
               at_ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Each data-parallel strategy's per-step cost beyond its aten ops (probe/framework.py):
    on one rank at the 1-rank thread count, timed here, and ``at_ranks``: the rows the
    concurrent kernel processes timed at each larger rank count."""
    import torch

    from . import framework, kernels

    one = next(h for h in prof["host_ops"] if h["ranks"] == 1)
    progress(f"framework cost per step of {', '.join(framework.STRATEGIES)} on a tiny {shape.layers}-layer model")
    saved = torch.get_num_threads()
    try:
        kernels.use_threads(one["threads"])
        rows = [{**r, "threads": one["threads"]} for r in framework.residuals(shape.layers, one["op_overhead_s"])]
    finally:
        torch.set_num_threads(saved)
    # Rows at 2, 4 ... ranks: timed by the concurrent kernel processes as one gloo group.
    threads = {h["ranks"]: h["threads"] for h in prof["host_ops"]}
    rows += [{**r, "threads": threads[r["ranks"]]} for r in at_ranks]
    return {"threads": one["threads"], "rows": rows,
            "method": "the runner's step of each strategy for a model of the workload's layers at hidden "
                      f"{framework.TINY['hidden']}, on one rank (world-1 gloo) and on each probed rank count "
                      "(that many processes in one gloo group, probe/concurrent.py): median step - counted ops x "
                      "the per-op overhead probed at that rank count"}


def _device_kernels(prof: dict[str, Any], dev: Any, shape: ModelShape, tokens: int, dtypes: list[str],
                    progress: Callable[[str], None]) -> None:
    """GEMM and attention rows of a GPU (its host ops are not priced: a GPU runs ops
    asynchronously, so their dispatch overlaps the kernels)."""
    import torch

    from . import kernels

    t = torch.get_num_threads()
    shapes = kernels.layer_gemms(shape, tokens)
    prof["gemm"], prof["attention"] = [], []
    for dtype in dtypes:
        progress(f"GEMM {dtype}: {len(shapes)} shapes of a {shape.name} layer at {tokens} tokens")
        prof["gemm"].append({**kernels.gemm(dev, dtype, shapes), "threads": t})
    for dtype in dtypes:
        progress(f"attention {dtype}")
        prof["attention"].append({**kernels.attention(dev, dtype, attention_shapes(shape, tokens, "cuda")),
                                  "threads": t})
    prof["host_ops"] = {"null_reason": "CPU only: a GPU runs ops asynchronously, so their dispatch overlaps the kernels"}


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
    from .kernels import release

    size = 256 * 2**20
    out = {name: copies.measure(name, size, dev, warmup=3, iters=10)["algbw_gbps"] for name in copies.COPIES}
    release()  # the copies' device buffers are freed: give them back before the comm ranks start
    return out


def _comm(kind: str, nproc: int, dtype: str, results_dir: str, progress: Callable[[str], None]) -> dict[str, Any]:
    """The all-reduce alpha-beta fit of a short `mgbench comm` run on ``nproc`` ranks
    (CPU ranks, or the devices of a GPU machine)."""
    from ..comm.run import run_comm
    from ..store import load_comm_fits, new_run_id

    if nproc < 2:
        return {"null_reason": "one device: no collective to measure"}
    progress(f"all_reduce on {nproc} {kind} ranks (a short `mgbench comm` run)")
    run_dir = run_comm(nproc, kind, ["all_reduce"], [dtype], results_dir, run_id=new_run_id(f"probe-comm-n{nproc}"),
                       progress=lambda _m: None)
    fit = load_comm_fits(Path(run_dir)).get(f"all_reduce:{dtype}:all")
    return {"nproc": nproc, "dtype": dtype, "run": Path(run_dir).name, "all_reduce": fit}


def probe_in_child(device: str, results_dir: str, progress: Callable[[str], None]) -> Path:
    """:func:`probe` with its default workload, in a child process (``python -m
    mgbench.probe``, mgbench/probe/__main__.py) that writes the profile to its default
    path; returns that path. Each progress line of the child is passed to ``progress``
    as it comes. MgbenchError with the child's last line of stderr (its error) when it
    fails, whatever the failure.

    Why a child: on a GPU the probe's kernels create a CUDA context on GPU 0 and leave
    the caching allocator's blocks there; a process that probed in itself holds both
    until it exits. `mgbench run` probes before its configs, and its process lives
    through them: its rank 0 would lose that memory and, on a GPU in EXCLUSIVE_PROCESS
    compute mode, could not open GPU 0 at all. The child's context and memory go with it."""
    import subprocess
    import tempfile

    from ..launching import child_env

    with tempfile.TemporaryDirectory(prefix="mgbench-probe-") as tmp:
        out, err = Path(tmp, "profile-path"), Path(tmp, "stderr.txt")
        spec = {"device": device, "results_dir": str(results_dir)}
        # This mgbench importable and the child's output unbuffered (lines come as printed);
        # stderr to a file, not a pipe, so that nothing blocks on a full buffer.
        with open(err, "w") as err_file:
            proc = subprocess.Popen(child_argv(spec, out), env=child_env(1, device, "probe"), stdout=subprocess.PIPE,
                                    stderr=err_file, text=True, errors="replace")
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                progress(line.rstrip("\n"))
            proc.wait()
        finally:
            if proc.poll() is None:  # interrupted here (Ctrl-C): the child does not outlive us
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if proc.returncode:
            lines = err.read_text(errors="replace").strip().splitlines()
            raise MgbenchError(lines[-1].strip() if lines else
                               f"the probe process ended with exit status {proc.returncode}")
        return Path(out.read_text())


def child_argv(spec: dict[str, Any], out: Path) -> list[str]:
    """The command of :func:`probe_in_child`'s process: SPEC (JSON) and the file it names
    the profile in."""
    import json
    import sys

    return [sys.executable, "-m", "mgbench.probe", json.dumps(spec), str(out)]


def child_main(argv: list[str]) -> None:
    """The child of :func:`probe_in_child`: probe, write the profile, name it in OUT.
    Progress lines go to stdout, flushed one by one; an error ends the process with its
    message as one line of stderr."""
    import json

    from .profile import write_profile

    spec, out = json.loads(argv[0]), Path(argv[1])
    try:
        prof = probe(device=spec["device"], results_dir=spec["results_dir"], progress=lambda m: print(m, flush=True))
        path = write_profile(prof, default_path(prof, spec["results_dir"]))
    except MgbenchError as e:
        raise SystemExit(" ".join(str(e).split()))  # one line: the parent reads the last
    out.write_text(str(path))


def default_path(profile: dict[str, Any], results_dir: str) -> Path:
    """results/profiles/<host>-<device>-<date>.json: one store, named by machine and time."""
    from ..store import profiles_dir

    stamp = profile["created_at"].replace(":", "").replace("-", "")
    return profiles_dir(results_dir) / f"{profile['hostname']}-{profile['device']}-{stamp}.json"
