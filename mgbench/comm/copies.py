"""Copy bandwidth of one GPU, as rows beside the collectives of `mgbench comm`:
device to device, and host to device and device to host from pinned (page-locked) and
from pageable host memory (what CUDA's bandwidthTest and nvbandwidth measure).

A copy of S bytes in t seconds is S / t (bandwidth = algbw = busbw, factor 1). A
device-to-device copy reads and writes every byte once, so the memory traffic behind it
is twice that figure. Pageable copies go through a pinned staging buffer of the driver,
so they are slower than pinned ones; the gap is what pinning buys a data loader.

On CPU ranks there is no device memory: copies are not applicable and no row is written
(:data:`NOT_APPLICABLE` says so in the run's manifest and table).
"""

from __future__ import annotations

from typing import Any, NamedTuple

NOT_APPLICABLE = "copy bandwidth needs a GPU: CPU ranks have no device memory to copy to or from"


class Copy(NamedTuple):
    """Where a copy reads and writes, and whether its host side is pinned."""

    src: str  # "cuda" or "cpu"
    dst: str
    pinned: bool


COPIES: dict[str, Copy] = {
    "copy_d2d": Copy("cuda", "cuda", False),
    "copy_h2d_pinned": Copy("cpu", "cuda", True),
    "copy_h2d_pageable": Copy("cpu", "cuda", False),
    "copy_d2h_pinned": Copy("cuda", "cpu", True),
    "copy_d2h_pageable": Copy("cuda", "cpu", False),
}


def is_copy(row: dict[str, Any]) -> bool:
    """A copy row (not a collective)."""
    return row.get("kind") == "copy"


def row(name: str, size_bytes: int, times_s: list[float], wrong: int) -> dict[str, Any]:
    """One comm row of a copy measured ``len(times_s)`` times (median, p10, p90)."""
    from .. import stats

    s = stats.summarize(times_s)
    bw = size_bytes / s["median"] / 1e9
    c = COPIES[name]
    return {"collective": name, "kind": "copy", "size_bytes": size_bytes, "count": size_bytes, "dtype": "uint8",
            "nproc": 1, "time_s": s["median"], "time_p10_s": s["p10"], "time_p90_s": s["p90"], "times_s": times_s,
            "algbw_gbps": bw, "busbw_gbps": bw, "busbw_factor": 1.0, "wrong": wrong, "device": "cuda",
            "scope": "local", "pinned": c.pinned, "direction": f"{c.src}->{c.dst}"}


def buffers(name: str, size_bytes: int, device: Any) -> tuple[Any, Any]:
    """Source (filled with a known pattern) and destination of a copy."""
    import torch

    c = COPIES[name]
    pattern = torch.arange(251, dtype=torch.uint8)  # a prime period: a misplaced block shows
    reps = -(-size_bytes // 251)

    def alloc(where: str) -> Any:
        if where == "cuda":
            return torch.empty(size_bytes, dtype=torch.uint8, device=device)
        return torch.empty(size_bytes, dtype=torch.uint8, pin_memory=c.pinned)

    src, dst = alloc(c.src), alloc(c.dst)
    src.copy_(pattern.repeat(reps)[:size_bytes])
    dst.zero_()
    return src, dst


def measure(name: str, size_bytes: int, device: Any, warmup: int, iters: int) -> dict[str, Any]:
    """One row: the copy checked once, then timed back to back with CUDA events (as the
    collectives are)."""
    import torch

    from ..telemetry.clock import StepClock

    src, dst = buffers(name, size_bytes, device)
    pinned = COPIES[name].pinned
    dst.copy_(src, non_blocking=pinned)
    torch.cuda.synchronize(device)
    wrong = int((dst.to(device) != src.to(device)).sum().item())
    for _ in range(warmup):
        dst.copy_(src, non_blocking=pinned)
    clock = StepClock(torch.device(device))
    clock.mark()
    for _ in range(iters):
        dst.copy_(src, non_blocking=pinned)
        clock.mark()
    return row(name, size_bytes, clock.step_times(), wrong)
