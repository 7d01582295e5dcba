"""Microbenchmarks of the machine at hand: GEMM, memory bandwidth, attention.

Each returns plain dicts of measured figures. Timing: a few warm-up calls, then the
best and the median of timed repeats (best is what the hardware can do, the median what
a training step sees). Each span is timed with perf_counter between device
synchronisations (CUDA) or directly (CPU ops are synchronous). FLOP counts are the textbook ones:
2 m n k for a GEMM, 4 b h s^2 d for attention's two matmuls (halved when causal).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..model_shape import ModelShape

WARMUP_S = 0.03  # per measured kernel
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _timer(device: torch.device, fn: Callable[[], Any], repeats: int, min_time_s: float) -> list[float]:
    """Seconds per call of ``fn``: ``repeats`` spans, each long enough to be timed well."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # Warm up for a while, not one call: after a thread-count change a CPU thread pool
    # can run slow for its first calls; a short spin settles it before the timed spans.
    t_end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < t_end:
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_time_s / one))  # calls per span, so short kernels are not launch-bound noise
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / inner)
    return out


def layer_gemms(shape: ModelShape, tokens: int) -> list[dict[str, Any]]:
    """The matrix products one transformer layer runs for ``tokens`` tokens, forward and
    backward: each linear (m = tokens, k = in, n = out) also runs as its input gradient
    (tokens x out x in) and its weight gradient (in x tokens x out)."""
    h, F_, q = shape.hidden, shape.ffn_hidden, shape.heads * shape.dim_head
    kv = shape.kv_heads * shape.dim_head
    linears = [("q", h, q), ("k", h, kv), ("v", h, kv), ("o", q, h), ("up", h, F_), ("down", F_, h)]
    if shape.mlp == "swiglu":
        linears.append(("gate", h, F_))
    out = []
    for name, k, n in linears:
        out += [{"role": f"{name}.fwd", "m": tokens, "k": k, "n": n},
                {"role": f"{name}.dgrad", "m": tokens, "k": n, "n": k},
                {"role": f"{name}.wgrad", "m": k, "k": tokens, "n": n}]
    return out


def gemm(device: torch.device, dtype: str, shapes: list[dict[str, Any]], repeats: int = 5,
         min_time_s: float = 0.01) -> dict[str, Any]:
    """TFLOP/s of each (m, k, n) product; ``typical`` is total FLOPs over total median
    time (what a layer of these shapes achieves), ``best`` the fastest shape's best."""
    dt = DTYPES[dtype]
    rows = []
    for s in shapes:
        a = torch.randn(s["m"], s["k"], device=device, dtype=dt)
        b = torch.randn(s["k"], s["n"], device=device, dtype=dt)
        times = _timer(device, lambda: torch.mm(a, b), repeats, min_time_s)
        flops = 2.0 * s["m"] * s["k"] * s["n"]
        rows.append({**s, "flops": flops, "best_s": min(times), "median_s": statistics.median(times),
                     "tflops_best": flops / min(times) / 1e12, "tflops_median": flops / statistics.median(times) / 1e12})
    total = sum(r["flops"] for r in rows)
    return {"dtype": dtype, "shapes": rows,
            "best_tflops": max(r["tflops_best"] for r in rows),
            "typical_tflops": total / sum(r["median_s"] for r in rows) / 1e12}


def memory_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> dict[str, Any]:
    """Bytes/s of an out-of-place add over ``nbytes`` per operand (reads 2, writes 1),
    the access pattern of the elementwise work in a training step."""
    n = nbytes // 4
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    times = _timer(device, lambda: torch.add(a, b, out=c), repeats, 0.05)
    moved = 3.0 * n * 4
    return {"bytes_per_s": moved / min(times), "median_bytes_per_s": moved / statistics.median(times),
            "operand_bytes": n * 4, "method": "torch.add(a, b, out=c): 2 reads + 1 write per element"}


def attention(device: torch.device, dtype: str, shapes: list[dict[str, Any]], repeats: int = 5) -> dict[str, Any]:
    """Forward + backward TFLOP/s of causal scaled_dot_product_attention; FLOPs are the
    two matmuls' 4 b h s^2 d forward, halved for causal, times 3 with backward."""
    dt = DTYPES[dtype]
    rows = []
    for s in shapes:
        q, k, v = (torch.randn(s["batch"], s["heads"], s["seq"], s["head_dim"], device=device, dtype=dt,
                               requires_grad=True) for _ in range(3))

        def step() -> None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()

        times = _timer(device, step, repeats, 0.02)
        flops = 3.0 * 0.5 * 4.0 * s["batch"] * s["heads"] * s["seq"] ** 2 * s["head_dim"]
        rows.append({**s, "flops": flops, "tflops_best": flops / min(times) / 1e12,
                     "tflops_median": flops / statistics.median(times) / 1e12})
    return {"dtype": dtype, "shapes": rows, "best_tflops": max(r["tflops_best"] for r in rows),
            "typical_tflops": sum(r["flops"] for r in rows) / sum(r["flops"] / r["tflops_median"] for r in rows)}


def op_overhead(device: torch.device, links: int = 32, repeats: int = 5) -> dict[str, Any]:
    """Seconds of fixed cost per aten op in a training step: a chain of tiny (2 x 2)
    autograd ops, forward and backward, whose data costs nothing, timed and divided by
    the aten ops it dispatches (counted by the planner's own OpCounter, so the ops priced
    and the ops probed are counted alike). Each link is a multiply, a transpose (a view:
    a step dispatches about one view per two compute ops) and an add, as in a step."""
    from ..planner.opcount import OpCounter

    x = torch.rand(2, 2, device=device, requires_grad=True)
    c = torch.rand(2, 2, device=device)

    def chain() -> None:
        y = x
        for _ in range(links):
            y = (y * c).t() + c
        y.sum().backward()

    chain()
    with OpCounter() as counter:
        chain()
    s = counter.summary()
    ops = s["compute_ops"] + s["view_ops"]
    times = _timer(device, chain, repeats, 0.02)
    return {"op_overhead_s": statistics.median(times) / ops, "best_op_overhead_s": min(times) / ops,
            "ops_per_chain": ops,
            "method": f"{links}-link chain of tiny autograd ops (mul, t, add) forward + backward, per aten op"}


def elementwise(device: torch.device, operand_bytes: int, repeats: int = 5) -> dict[str, Any]:
    """Bytes/s that a step's unfused elementwise ops get on operands of ``operand_bytes``
    (the workload's activation size, not a DRAM-sized buffer: on a CPU those stay in
    cache). ``torch.add(a, b)`` allocating its result, as a step's ops do, timed at that
    size and on a tiny operand; the difference removes the per-op overhead, leaving
    3 x operand bytes (2 reads, 1 write) over the data's own time."""
    n = max(1, operand_bytes // 4)
    a, b = torch.rand(n, device=device), torch.rand(n, device=device)
    ta, tb = torch.rand(1, device=device), torch.rand(1, device=device)
    big = statistics.median(_timer(device, lambda: torch.add(a, b), repeats, 0.02))
    tiny = statistics.median(_timer(device, lambda: torch.add(ta, tb), repeats, 0.02))
    moved = 3.0 * n * 4
    return {"bytes_per_s": moved / max(big - tiny, 1e-9), "operand_bytes": n * 4, "op_s": big, "tiny_op_s": tiny,
            "method": "torch.add(a, b) at the operand size minus the same on one element: 2 reads + 1 write"}
