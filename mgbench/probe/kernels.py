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
from .workload import ATTENTION_FWD_BWD_PASSES

WARMUP_S = 0.03  # per measured kernel
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def timer(device: torch.device, fn: Callable[[], Any], repeats: int, min_time_s: float) -> list[float]:
    """Seconds per call of ``fn``: ``repeats`` spans of back-to-back calls, each at least
    ``min_time_s`` long, synchronised only at their ends (so a short kernel's launch
    latency is not counted once per call). tests/gpu/kernel_rates.py times with it too."""
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


def release() -> None:
    """Give back to the driver the device memory torch's caching allocator keeps after a
    kernel's operands are freed (GiBs: the memory-bandwidth operands alone are 3 GiB), so
    that `mgbench probe` does not hold it on GPU 0 after each kernel, through the rest of
    the probe (its comm ranks use that GPU). A no-op where CUDA was never initialised."""
    torch.cuda.empty_cache()


def use_threads(threads: int, settle_s: float = 1.0) -> None:
    """Set the CPU thread count and run a small parallel GEMM until its speed settles.

    Right after a change of thread count an OpenMP pool can stay slow for many calls
    (on this project's 2-core VM the first layer shape after a switch to 2 threads ran at
    1% of its speed for every timed repeat): the spin ends when two consecutive 20 ms
    windows agree within 20%, or after ``settle_s``."""
    torch.set_num_threads(threads)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    t_stop, last = time.perf_counter() + settle_s, None
    while time.perf_counter() < t_stop:
        t0, calls = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.02:
            torch.mm(a, b)
            calls += 1
        per_call = (time.perf_counter() - t0) / calls
        if last is not None and abs(per_call - last) <= 0.2 * last:
            return
        last = per_call


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
    for s, times in zip(shapes, _two_passes(shapes, lambda s: _gemm_call(device, dt, s),
                                            lambda fn: timer(device, fn, repeats, min_time_s))):
        flops = 2.0 * s["m"] * s["k"] * s["n"]
        rows.append({**s, "flops": flops, "best_s": min(times), "median_s": statistics.median(times),
                     "tflops_best": flops / min(times) / 1e12, "tflops_median": flops / statistics.median(times) / 1e12})
    release()  # the operands went with _two_passes' calls
    total = sum(r["flops"] for r in rows)
    return {"dtype": dtype, "shapes": rows,
            "best_tflops": max(r["tflops_best"] for r in rows),
            "typical_tflops": total / sum(r["median_s"] for r in rows) / 1e12}


def _gemm_call(device: torch.device, dt: torch.dtype, s: dict[str, Any]) -> Callable[[], Any]:
    a = torch.randn(s["m"], s["k"], device=device, dtype=dt)
    b = torch.randn(s["k"], s["n"], device=device, dtype=dt)
    return lambda: torch.mm(a, b)


def _two_passes(shapes: list[dict[str, Any]], make: Callable[[dict[str, Any]], Callable[[], Any]],
                time_fn: Callable[[Callable[[], Any]], list[float]]) -> list[list[float]]:
    """Each shape's timed repeats from the better of two passes over the shapes (the
    second in reverse order): a disturbance shorter than a pass (another process on the
    cores, a thread pool waking up) slows one pass of a shape, rarely both, so the
    figure is the kernel's, not the disturbance's. Better = lower median."""
    calls = [make(s) for s in shapes]
    first = [time_fn(fn) for fn in calls]
    second = [time_fn(fn) for fn in reversed(calls)][::-1]
    return [a if statistics.median(a) <= statistics.median(b) else b for a, b in zip(first, second)]


def memory_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> dict[str, Any]:
    """Bytes/s of an out-of-place add over ``nbytes`` per operand (reads 2, writes 1),
    the access pattern of the elementwise work in a training step."""
    n = nbytes // 4
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    times = timer(device, lambda: torch.add(a, b, out=c), repeats, 0.05)
    del a, b, c
    release()
    moved = 3.0 * n * 4
    return {"bytes_per_s": moved / min(times), "median_bytes_per_s": moved / statistics.median(times),
            "operand_bytes": n * 4, "method": "torch.add(a, b, out=c): 2 reads + 1 write per element"}


def attention(device: torch.device, dtype: str, shapes: list[dict[str, Any]], repeats: int = 5) -> dict[str, Any]:
    """Forward + backward TFLOP/s of causal scaled_dot_product_attention; FLOPs are the
    two matmuls' 4 b h s^2 d forward, halved for causal, times ATTENTION_FWD_BWD_PASSES."""
    dt = DTYPES[dtype]
    rows = []

    def make(s: dict[str, Any]) -> Callable[[], None]:
        q, k, v = (torch.randn(s["batch"], s["heads"], s["seq"], s["head_dim"], device=device, dtype=dt,
                               requires_grad=True) for _ in range(3))

        def step() -> None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()
        return step

    for s, times in zip(shapes, _two_passes(shapes, make, lambda fn: timer(device, fn, repeats, 0.02))):
        flops = ATTENTION_FWD_BWD_PASSES * 0.5 * 4.0 * s["batch"] * s["heads"] * s["seq"] ** 2 * s["head_dim"]
        rows.append({**s, "flops": flops, "tflops_best": flops / min(times) / 1e12,
                     "tflops_median": flops / statistics.median(times) / 1e12})
    release()  # q, k, v and their gradients went with _two_passes' calls
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
    times = timer(device, chain, repeats, 0.02)
    return {"op_overhead_s": statistics.median(times) / ops, "best_op_overhead_s": min(times) / ops,
            "ops_per_chain": ops,
            "method": f"{links}-link chain of tiny autograd ops (mul, t, add) forward + backward, per aten op"}


def elementwise(device: torch.device, recorded: list[tuple[Any, Any, int]], repeats: int = 3) -> dict[str, Any]:
    """Bytes/s that the workload's own non-matmul ops get: each compute op of one traced
    step (``recorded`` by planner/opcount.py: norms, rotary, SiLU, the loss, AdamW's
    per-tensor updates ...) run on fresh tensors of its recorded shapes and strides, and
    timed; the median of ``repeats`` calls of each op, summed. The same call on a
    one-element tensor, times the op count, is taken off (that is per-op overhead, priced
    apart), leaving the bytes the ops read and write over their data's own time.

    Before each timed call the core's private (L2) cache is overwritten: a step's working
    set (weights, gradients, optimizer states, activations kept for backward) is far
    larger than it, so an op's operands arrive from the shared cache or memory, not hot
    from having just been made, as fresh replay inputs would be (on this project's 2-core
    VM the default model's ops take 20 ms hot, 31 ms so, 33 ms in the real step). Denormal
    floats are flushed while replaying: ops repeated in place on random data would
    otherwise drift into them, which a training step's data does not.

    Each op is timed alone (one call, median of ``repeats``), so its figure is its time
    while this process holds a core: a call the scheduler interrupts is an outlier the
    median drops. When ranks outnumber the cores they hold one only part of the time
    (with 4 one-thread processes on this project's 2-core VM, half), and a step's ops
    stretch by that much; the spans of the other probes (GEMMs, SDPA, per-op overhead: 10
    to 20 ms each) hold that share, these single calls do not (they gave 4 ranks a
    higher rate than 2). So the replay also measures the share of a core the process
    got while it ran, ``cpu_share`` = this thread's CPU time / wall time over the replay
    (at most 1), and the rate is the held-core rate times it. The one-element add taken
    off per op is timed the same way, by single calls."""
    tiny = torch.rand(1, device=device)
    tiny_s = _single_call_median(device, lambda: torch.ops.aten.add.Tensor(tiny, tiny))
    from ..planner.opcount import materialize

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    evict = torch.empty(private_cache_bytes() * torch.get_num_threads() // 4)
    total_s, total_bytes, failed = 0.0, 0, 0
    flushed = torch.set_flush_denormal(True)
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    try:
        for func, spec, nbytes in recorded:
            try:
                args, kwargs = materialize(spec, device)
                func(*args, **kwargs)  # warm-up (and a check that the op takes these arguments)
            except Exception:  # an op whose arguments random data cannot stand for: left out, counted
                failed += 1
                continue
            times = []
            for _ in range(repeats):
                evict.fill_(1.0)
                sync()
                t0 = time.perf_counter()
                func(*args, **kwargs)
                sync()
                times.append(time.perf_counter() - t0)
            total_s += statistics.median(times)
            total_bytes += nbytes
    finally:
        if flushed:
            torch.set_flush_denormal(False)
    cpu_share = cpu_share_of(time.thread_time() - cpu0, time.perf_counter() - wall0)
    n = len(recorded) - failed
    data_s = max(total_s - n * tiny_s, 1e-9)
    return {"bytes_per_s": total_bytes / data_s * cpu_share, "held_core_bytes_per_s": total_bytes / data_s,
            "cpu_share": cpu_share, "bytes": total_bytes, "ops": n, "ops_failed": failed,
            "replay_s": total_s, "tiny_op_s": tiny_s, "evicted_bytes": evict.numel() * 4,
            "method": "the workload's compute ops of one step replayed on random tensors of their shapes; "
                      "bytes over (time - ops x one-element add), single calls, times the share of a core "
                      "the process held over the replay (its CPU time / wall time)"}


def cpu_share_of(cpu_s: float, wall_s: float) -> float:
    """The share of a core a thread held over a span: its CPU time over the span's wall
    time, at most 1 (1 for an empty span)."""
    return min(1.0, cpu_s / wall_s) if wall_s > 0 else 1.0


def _single_call_median(device: torch.device, fn: Callable[[], Any], calls: int = 201) -> float:
    """Median seconds of ``calls`` single calls of ``fn`` (each timed alone, as the
    replayed ops are), after the usual warm-up."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timer(device, fn, 1, WARMUP_S)
    times = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def private_cache_bytes(default: int = 2 * 2**20) -> int:
    """Bytes of one core's largest private cache (L2 on x86 and most ARM servers), from
    Linux sysfs; ``default`` where that cannot be read."""
    from pathlib import Path

    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((idx / "level").read_text())
            shared = (idx / "shared_cpu_list").read_text().strip()
            size = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if level >= 2 and shared in ("0", "") and size.endswith("K"):
            best = max(best, int(size[:-1]) * 1024)
    return best or default
