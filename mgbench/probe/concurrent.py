"""The CPU kernels of a rank, probed as the ranks of a run meet them: n processes at once.

CPU ranks of one run share the host: at n ranks each rank gets ``threads_per_rank(n)``
threads, and all n compute at the same time, so each meets the others in the shared cache,
the memory bus and, when n x threads exceeds the cores, the scheduler's time slices. On
this project's 2-core VM a 1-thread GEMM ran 15-40% slower and the step's elementwise ops
40-60% slower beside a second process than alone. Rather than scale single-process rates
by arithmetic, the probe starts n processes that run the same kernels together (they wait
for each other before the first timing, and run the same sequence, so their timed spans
overlap), and records the median of their figures. Then (``framework_layers`` in SPEC)
the same processes form a gloo group and time each data-parallel strategy's step on the
tiny model (probe/framework.py): what a step costs beyond its ops at that rank count.

Run as ``python -m mgbench.probe.concurrent SPEC OUT``: SPEC a JSON object (model,
tokens, dtypes, threads, ranks, index, ready_dir); OUT the JSON file to write.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

BARRIER_TIMEOUT_S = 120.0


def rank_kernels(model: str, tokens: int, dtypes: list[str], threads: int, recorded: list[Any] | None = None,
                 progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """GEMMs of the model's layer shapes, causal SDPA, per-op overhead and the replayed
    non-matmul ops of one step (probe/kernels.py), at ``threads`` threads in this process
    (``recorded``: that step's traced ops, when already traced)."""
    import torch

    from .. import catalog
    from ..planner.opcount import count_step
    from . import kernels
    from .workload import attention_shapes, workload_config

    dev = torch.device("cpu")
    shape = catalog.model_shape(model)
    gemm_shapes = kernels.layer_gemms(shape, tokens)
    if recorded is None:
        progress(f"tracing one training step of {shape.name} for its non-matmul ops")
        recorded = count_step(workload_config(shape, tokens), record=True)["recorded"]
    saved = torch.get_num_threads()
    out: dict[str, Any] = {"gemm": [], "attention": []}
    try:
        kernels.use_threads(threads)
        for dtype in dtypes:
            progress(f"GEMM {dtype}: {len(gemm_shapes)} shapes of a {shape.name} layer at {tokens} tokens")
            out["gemm"].append(kernels.gemm(dev, dtype, gemm_shapes))
            progress(f"attention {dtype}")
            out["attention"].append(kernels.attention(dev, dtype, attention_shapes(shape, tokens, "cpu")))
        progress(f"per-op overhead and the step's {len(recorded)} non-matmul ops")
        out["host_ops"] = {**kernels.op_overhead(dev), "elementwise": kernels.elementwise(dev, recorded)}
    finally:
        torch.set_num_threads(saved)
    return out


def run_together(ranks: int, model: str, tokens: int, dtypes: list[str], threads: int,
                 timeout_s: float = 600.0, framework_layers: int | None = None) -> dict[str, Any]:
    """:func:`rank_kernels` in ``ranks`` processes at once (each at ``threads`` threads),
    merged: the median over the processes of every figure (median_merge). With
    ``framework_layers``, also ``framework``: the strategies' tiny steps on those
    processes as one gloo group of ``ranks`` (probe/framework.py residuals)."""
    from ..errors import MgbenchError
    from ..launching import child_env

    with tempfile.TemporaryDirectory(prefix="mgbench-probe-") as tmp:
        # A rank's environment (this mgbench importable, as for a run's ranks), at the
        # probed thread count.
        env = {**child_env(ranks, "cpu", "probe"), "OMP_NUM_THREADS": str(threads)}
        procs, outs, errs = [], [], []
        for i in range(ranks):
            spec = {"model": model, "tokens": tokens, "dtypes": dtypes, "threads": threads, "ranks": ranks,
                    "index": i, "ready_dir": tmp, "framework_layers": framework_layers}
            outs.append(Path(tmp) / f"out{i}.json")
            errs.append(Path(tmp) / f"err{i}.txt")  # a file, not a pipe: nothing blocks on a full buffer
            with open(errs[-1], "w") as err:
                procs.append(subprocess.Popen([sys.executable, "-m", "mgbench.probe.concurrent", json.dumps(spec),
                                               str(outs[-1])], env=env, stdout=subprocess.DEVNULL, stderr=err))
        error = _wait_all(procs, errs, timeout_s)
        if error:
            raise MgbenchError(f"the probe's {ranks} concurrent kernel processes failed: {error}")
        return median_merge([json.loads(o.read_text()) for o in outs])


def _wait_all(procs: list[subprocess.Popen], errs: list[Path], timeout_s: float) -> str | None:
    """Wait for every process; the first failure as one line (the last line of its stderr:
    the exception, for a Python failure), or None when all succeeded. The group shares
    one time limit, and the first failure ends the wait: the others would otherwise sit
    at the barrier or in their gloo group until their own timeouts. Whatever still runs
    then is killed."""
    error = None
    live = dict(enumerate(procs))
    t_stop = time.monotonic() + timeout_s
    while live and error is None and time.monotonic() < t_stop:
        for i, p in list(live.items()):
            if p.poll() is None:
                continue
            del live[i]
            if p.returncode:
                lines = errs[i].read_text(errors="replace").strip().splitlines()
                error = f"process {i}: {lines[-1] if lines else f'exit status {p.returncode}'}"
                break
        else:
            time.sleep(0.05)
    for i, p in live.items():
        p.kill()
        p.wait()
        if error is None:
            error = f"process {i} did not finish within {timeout_s:g} s (killed)"
    return error


def median_merge(results: list[Any]) -> Any:
    """One result from several of the same structure: numbers become their median (a number
    every result shares stays as it is), dicts and equal-length lists are merged entry by
    entry, anything else is the first's."""
    first = results[0]
    if isinstance(first, bool) or not isinstance(first, (int, float, dict, list)):
        return first
    if isinstance(first, (int, float)):
        nums = [r for r in results if isinstance(r, (int, float))]
        if len(nums) != len(results) or all(r == first for r in results):
            return first  # a count or label the processes share keeps its type (2, not 2.0)
        return statistics.median(nums)
    if isinstance(first, dict):
        return {k: median_merge([r[k] for r in results]) if all(isinstance(r, dict) and k in r for r in results)
                else v for k, v in first.items()}
    if all(isinstance(r, list) and len(r) == len(first) for r in results):
        return [median_merge(list(items)) for items in zip(*results)]
    return first


def _barrier(ready_dir: str, index: int, ranks: int) -> None:
    """Wait until every process of the group is ready (imports and trace done), so their
    timed kernels run at the same time."""
    Path(ready_dir, f"ready{index}").touch()
    t_stop = time.monotonic() + BARRIER_TIMEOUT_S
    while sum(1 for _ in Path(ready_dir).glob("ready*")) < ranks:
        if time.monotonic() > t_stop:
            raise SystemExit(f"probe process {index}: the other {ranks - 1} did not start within {BARRIER_TIMEOUT_S:g} s")
        time.sleep(0.01)


def main(argv: list[str]) -> None:
    spec, out = json.loads(argv[0]), Path(argv[1])
    import torch

    torch.set_num_threads(spec["threads"])
    # Trace before the barrier (it is not timed), then time the kernels together.
    from .. import catalog
    from ..planner.opcount import count_step
    from .workload import workload_config

    recorded = count_step(workload_config(catalog.model_shape(spec["model"]), spec["tokens"]), record=True)["recorded"]
    _barrier(spec["ready_dir"], spec["index"], spec["ranks"])
    res = rank_kernels(spec["model"], spec["tokens"], spec["dtypes"], spec["threads"], recorded)
    if spec.get("framework_layers") and spec["ranks"] > 1:
        import torch.distributed as dist

        from .framework import residuals

        store = dist.FileStore(str(Path(spec["ready_dir"], "gloo-store")), spec["ranks"])
        res["framework"] = residuals(spec["framework_layers"], res["host_ops"]["op_overhead_s"],
                                     ranks=spec["ranks"], rank=spec["index"], store=store)
    out.write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1:])
