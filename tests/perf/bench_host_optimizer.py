"""What the host's CPU spends on an optimizer step under CPU offload, one thread: the
per-element cost of each torch op AdamW's CPU step and gradient clipping run, and the
whole step timed, so the planner's sum of the ops (planner/host_step.py) is checked
against torch itself in the same run.

    python tests/perf/bench_host_optimizer.py [--elements 67108864] [--repeats 3] [--json]
                                              [--scaling 1,2,4,8]

One thread because torchrun sets OMP_NUM_THREADS=1 for every rank when it starts more
than one a node and the variable is unset (torch/distributed/run.py), so an FSDP2 rank's
CPU optimizer step runs on one core. Tensors far larger than the caches: the ops run at
one core's memory rate, as a shard of billions of parameters does. The figures it prints
under "ns_per_element" are what data/hardware.toml [host_cpu] stores (with this machine's
CPU and torch version); "check" compares the planner's sum with the timed step.
``--scaling`` also times torch's own steps at each thread count given (what a run that sets
OMP_NUM_THREADS or torch.set_num_threads would get; the planner prices one thread), as
the speed-up over one thread, in the same run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mgbench.planner import host_step  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PIECES = 8  # tensors the elements are split into


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (after one untimed warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def tensors(n: int, dtype: torch.dtype, low: float = 0.0) -> list[torch.Tensor]:
    """``n`` elements in ``PIECES`` tensors, as a shard is many parameters (and as
    :func:`timed_steps` holds them, so an op and the step allocate alike)."""
    return [torch.rand(n // PIECES, dtype=dtype).add_(low) for _ in range(PIECES)]


def op_costs(n: int, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """Nanoseconds an element of each op host_step.OPS names, over ``n`` elements."""
    a, b = tensors(n, dtype), tensors(n, dtype)
    c = tensors(n, dtype, low=1.0)  # a positive denominator, made once
    each = {
        "mul_": lambda i: a[i].mul_(1.0),
        "lerp_": lambda i: a[i].lerp_(b[i], 0.1),
        "addcmul_": lambda i: a[i].addcmul_(b[i], b[i], value=0.001),
        "sqrt": lambda i: b[i].sqrt(),                 # a new tensor, as AdamW's denominator
        "div_scalar": lambda i: b[i] / 1.0001,         # a new tensor, as its bias correction
        "add_": lambda i: a[i].add_(1e-8),
        "addcdiv_": lambda i: a[i].addcdiv_(b[i], c[i], value=-1e-6),
        "vector_norm": lambda i: torch.linalg.vector_norm(a[i]),
    }
    total = PIECES * (n // PIECES)
    out = {name: best_seconds(lambda: [fn(i) for i in range(PIECES)], repeats) / total * 1e9
           for name, fn in each.items()}
    # torch's fused AdamW kernel is one op over the step's four tensors.
    params = [torch.nn.Parameter(t) for t in tensors(n, dtype)]
    for p in params:
        p.grad = torch.rand_like(p)
    out["adamw_fused"] = best_seconds(torch.optim.AdamW(params, lr=1e-3, fused=True).step, repeats) / total * 1e9
    assert set(out) == set(host_step.OPS), "the bench times every op the planner prices"
    return out


def timed_steps(n: int, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """Nanoseconds an element of torch's own AdamW step and clip_grad_norm_, on ``n``
    elements in ``PIECES`` parameters."""
    params = [torch.nn.Parameter(t) for t in tensors(n, dtype)]
    for p in params:
        p.grad = torch.rand_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)  # torch's default on CPU tensors: the for-loop
    total = sum(p.numel() for p in params)
    return {"adamw_step": best_seconds(opt.step, repeats) / total * 1e9,
            "clip_grad_norm_": best_seconds(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0), repeats)
            / total * 1e9}


def thread_scaling(n: int, counts: list[int], repeats: int) -> dict[str, dict[str, dict[str, float]]]:
    """fp32 nanoseconds an element of torch's for-loop and fused AdamW steps and of
    clip_grad_norm_ at each thread count, with the speed-up over the first count given."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for threads in counts:
        torch.set_num_threads(threads)
        params = [torch.nn.Parameter(t) for t in tensors(n, torch.float32)]
        for p in params:
            p.grad = torch.rand_like(p)
        total = sum(p.numel() for p in params)
        timed = {"adamw for-loop": torch.optim.AdamW(params, lr=1e-3).step,
                 "adamw fused": torch.optim.AdamW(params, lr=1e-3, fused=True).step,
                 "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_(params, 1.0)}
        for what, fn in timed.items():
            out.setdefault(what, {})[str(threads)] = {"ns": best_seconds(fn, repeats) / total * 1e9}
    for by_count in out.values():
        first = next(iter(by_count.values()))["ns"]
        for v in by_count.values():
            v["ns"], v["speedup"] = round(v["ns"], 3), round(first / v["ns"], 2)
    return out


def cpu_name() -> str:
    """The CPU's model name, family and model numbers from /proc/cpuinfo (Linux), else
    what platform knows."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info.splitlines()[:30])}
    return f"{field.get('model name', '?')} (family {field.get('cpu family', '?')} model {field.get('model', '?')})"


def main() -> None:
    """Time the ops and the steps, print the figures and the planner's error on each step."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=int, default=64 * 2 ** 20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--scaling", default=None, metavar="N,N,...",
                    help="also time torch's steps at these thread counts (e.g. 1,2,4,8)")
    args = ap.parse_args()
    counts = [int(x) for x in args.scaling.split(",")] if args.scaling else []
    if any(n < 1 for n in counts):
        ap.error("--scaling takes thread counts of 1 or more")
    torch.set_num_threads(1)
    out: dict[str, Any] = {"cpu": cpu_name(), "torch": torch.__version__,
                           "threads": torch.get_num_threads(), "elements": args.elements,
                           "ns_per_element": {}, "check": {}}
    for name, dtype in DTYPES.items():
        costs = op_costs(args.elements, dtype, args.repeats)
        out["ns_per_element"][name] = {k: round(v, 3) for k, v in costs.items()}
        steps = timed_steps(args.elements, dtype, args.repeats)
        model = {"adamw_step": host_step.adamw_ns_per_element(costs),
                 "clip_grad_norm_": host_step.clip_ns_per_element(costs)}
        out["check"][name] = {k: {"timed_ns": round(steps[k], 3), "model_ns": round(model[k], 3),
                                  "error_pct": round((model[k] / steps[k] - 1.0) * 100.0, 1)} for k in steps}
    if counts:
        out["scaling"] = thread_scaling(args.elements, counts, args.repeats)
        torch.set_num_threads(1)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"one thread, {args.elements:,} elements, torch {out['torch']}")
    for name in DTYPES:
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in out["ns_per_element"][name].items()) + " ns/element")
        for k, c in out["check"][name].items():
            print(f"  {k}: timed {c['timed_ns']:.3f} ns/element, planner's sum of ops {c['model_ns']:.3f} "
                  f"({c['error_pct']:+.1f}%)")
    for what, by_count in out.get("scaling", {}).items():
        print(f"{what}: " + ", ".join(f"{n} threads {v['ns']:.3f} ns/element ({v['speedup']:.2f}x)"
                                      for n, v in by_count.items()))


if __name__ == "__main__":
    main()
