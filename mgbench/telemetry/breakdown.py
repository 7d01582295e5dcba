"""Split a profiled window of training steps into compute, communication, the part of
communication hidden behind compute, the exposed part, and idle time.

From torch.profiler events: communication is the union of collective events (gloo's
work on its worker threads, or inline on the training thread, on CPU; NCCL kernels on
GPU); compute is the union of the outermost aten ops on the training thread less the
time that thread spends inside a collective (CPU), or of the other GPU kernels, memcpys
and memsets (GPU); Python and framework time between ops counts as idle. On the GPU
timeline the profiler also puts ranges that are not work: user annotations
(``record_function`` ranges mirrored onto the stream, e.g. FSDP2's "FSDP::all_gather",
which span the wait for a collective), CUDA syncs and profiler ranges. They carry
DeviceType.CUDA like kernels do, so events are told apart by kineto's activity type.
Then

    overlapped = |compute ∩ comm|     exposed = |comm \\ compute|
    idle       = window - |compute ∪ comm|
    compute + exposed + idle = window   (exactly, by construction)
"""

from __future__ import annotations

from typing import Any, Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged, non-overlapping intervals."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """Parts of merged intervals ``x`` not covered by merged intervals ``y``."""
    out = []
    for a, b in x:
        cur = a
        for c, d in y:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def split(compute: Iterable[Interval], comm: Iterable[Interval], window: Interval) -> dict[str, float]:
    """Seconds of compute, comm, overlapped comm, exposed comm and idle in ``window``."""
    lo, hi = window
    cp = union(clip(compute, lo, hi))
    cm = union(clip(comm, lo, hi))
    both = length(intersect(cp, cm))
    c, m = length(cp), length(cm)
    return {"compute_s": c, "comm_s": m, "overlapped_comm_s": both, "exposed_comm_s": m - both,
            "idle_s": (hi - lo) - (c + m - both), "window_s": hi - lo}


COMM_MARKERS = ("gloo:", "nccl:", "ncclKernel", "ncclDevKernel")

# Kineto activity types (FunctionEvent.activity_type) of work a GPU does: kernels, copies
# and fills. Not "gpu_user_annotation", "cuda_sync" or "cuda_profiler_range", which
# torch also reports with DeviceType.CUDA (profiler_kineto.cpp, deviceTypeFromActivity).
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def is_comm(name: str) -> bool:
    return any(m in name for m in COMM_MARKERS)


def is_gpu_work(e: Any) -> bool:
    """A kernel, memcpy or memset on the GPU timeline (not an annotation range or a wait).
    Events from a torch without ``activity_type`` fall back to ``is_user_annotation``."""
    from torch.autograd import DeviceType

    if e.device_type != DeviceType.CUDA:
        return False
    kind = getattr(e, "activity_type", None)
    if kind is not None:
        return kind in GPU_WORK
    return not getattr(e, "is_user_annotation", False)


def training_thread(events: list[Any]) -> int | None:
    """The profiler's id of the thread that ran the step: the one with the most time in
    top-level, non-communication ops (forward and the autograd engine run there on CPU)."""
    busy: dict[int, float] = {}
    for e in events:
        if e.cpu_parent is None and not is_comm(e.name):
            busy[e.thread] = busy.get(e.thread, 0.0) + e.time_range.elapsed_us()
    return max(busy, key=busy.get) if busy else None


def from_profile(prof: Any, main_thread: int | None, window_us: Interval, on_gpu: bool) -> dict[str, float]:
    """Apply ``split`` to a finished torch.profiler run (times in microseconds).
    ``main_thread`` None: found with training_thread."""
    if main_thread is None and not on_gpu:
        main_thread = training_thread(prof.events())
    compute: list[Interval] = []
    comm: list[Interval] = []
    blocking: list[Interval] = []  # collectives run inline on the training thread: waiting, not compute
    for e in prof.events():
        tr = e.time_range
        iv = (float(tr.start), float(tr.end))
        if on_gpu:
            if is_gpu_work(e):
                (comm if is_comm(e.name) else compute).append(iv)
        else:
            if is_comm(e.name) and not e.name.startswith("c10d::"):
                comm.append(iv)  # a collective's execution: gloo's worker threads, or inline
                if e.thread == main_thread:
                    blocking.append(iv)
            elif e.thread == main_thread and e.name.startswith("aten::") and not (
                    e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")):
                # Outermost aten ops only: wrappers such as FSDP's pre-forward hook also
                # hold the time the thread waits for a collective, which is not compute.
                compute.append(iv)
    if blocking:
        compute = subtract(union(compute), union(blocking))
    out = split(compute, comm, window_us)
    return {k: v / 1e6 for k, v in out.items()}
