"""Rank entry point of `mgbench comm` (started by torchrun with ``--job FILE``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import collectives, stats, store
from ..collectives import Collective
from . import copies
from ..collectives import DTYPES as DTYPE_NAMES
from ..telemetry.clock import StepClock

# The dtypes `mgbench comm` accepts (collectives.DTYPES), as torch's.
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


class Bench:
    """One collective's buffers on this rank for one nominal size, laid out as its
    registry entry says, and the checks of its result."""

    def __init__(self, coll: Collective, size_bytes: int, dtype: torch.dtype, device: torch.device,
                 group: Any = None) -> None:
        self.coll, self.group = coll, group
        self.rank, self.n = dist.get_rank(group), dist.get_world_size(group)
        elem = torch.empty((), dtype=dtype).element_size()
        lay = coll.layout(size_bytes, elem, self.n)
        self.chunk, self.size_bytes = lay.chunk, lay.size_bytes
        self.inp = torch.empty(lay.send, dtype=dtype, device=device)
        self.out = self.inp if coll.in_place else torch.empty(lay.recv, dtype=dtype, device=device)

    def fill(self) -> None:
        """Inputs whose correct outputs are known exactly."""
        self.coll.fill(self.inp, self.rank, self.n, self.chunk)

    def call(self) -> Callable[[], None]:
        """A function that runs the collective once on these buffers."""
        return self.coll.call(self.inp, self.out, self.group, self.rank, self.n)

    def wrong(self) -> int:
        """Elements that differ from the expected result (nccl-tests' #wrong)."""
        exp = self.coll.expected(self.out, self.rank, self.n, self.chunk)
        return int((self.out != exp).sum().item())


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Nominal sizes from min_bytes, times factor each step, up to max_bytes."""
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def measure(name: str, size: int, dtype: torch.dtype, device: torch.device, warmup: int, iters: int,
            group: Any = None, scope: str = "all") -> dict[str, Any]:
    """One row: the collective checked once, then timed back to back at nominal size ``size``."""
    coll = collectives.get(name)
    b = Bench(coll, size, dtype, device, group)
    b.fill()
    b.call()()
    if device.type == "cuda":
        torch.cuda.synchronize()
    wrong = b.wrong()
    b.inp.zero_()  # values do not matter for timing; zeros keep repeated all_reduce finite
    fn = b.call()
    for _ in range(warmup):
        fn()
    # Back to back, as nccl-tests runs its iterations: a host sync per iteration would put
    # the launch gap and the ranks' skew into every small-message time.
    clock = StepClock(device)
    clock.mark()
    for _ in range(iters):
        fn()
        clock.mark()
    times = clock.step_times()
    # nccl-tests reports the slowest rank: a collective is done when every rank is.
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    w = torch.tensor([wrong], dtype=torch.int64, device=device)
    dist.all_reduce(w, group=group)
    slowest = t.tolist()
    s = stats.summarize(slowest)
    n = dist.get_world_size(group)
    algbw = b.size_bytes / s["median"] / 1e9
    return {"collective": name, "size_bytes": b.size_bytes, "count": b.chunk, "dtype": str(dtype).replace("torch.", ""),
            "nproc": n, "time_s": s["median"], "time_p10_s": s["p10"], "time_p90_s": s["p90"], "times_s": slowest,
            "algbw_gbps": algbw, "busbw_gbps": algbw * coll.busbw(n), "busbw_factor": coll.busbw(n),
            "wrong": int(w.item()), "device": device.type, "scope": scope, "kind": "collective"}


def applies(name: str, n: int) -> bool:
    """Whether a collective is measured on a group of n ranks: never on one rank, where it
    moves nothing between devices (busbw would read 0 for every size), nor below the
    collective's own minimum."""
    return n >= max(2, collectives.get(name).min_ranks)


def split_groups() -> list[tuple[str, Any]]:
    """("all", None) and, across nodes, ("intra", this node's group) and ("inter", the
    group of this local rank on every node), as NCCL_TESTS_SPLIT does: every group of a
    kind runs at once, so inter-node links are loaded as in training."""
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    if nodes < 2:
        return [("all", None)]
    node = int(os.environ.get("GROUP_RANK", 0))
    where: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(where, (node, int(os.environ.get("LOCAL_RANK", 0))))
    mine: dict[str, Any] = {}
    for kind, key in (("intra", lambda x: x[0]), ("inter", lambda x: x[1])):
        for value in sorted({key(x) for x in where}):
            ranks = [r for r, x in enumerate(where) if key(x) == value]
            g = dist.new_group(ranks)  # every rank creates every group, in the same order
            if dist.get_rank() in ranks:
                mine[kind] = g
    return [("all", None), ("intra", mine["intra"]), ("inter", mine["inter"])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True, help="the job file the launcher wrote (what to sweep, where to write)")
    a = ap.parse_args()
    job = json.loads(Path(a.job).read_text())
    local = int(os.environ.get("LOCAL_RANK", 0))
    if job["device"] == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        for scope, group in split_groups():
            for dtype_name in job["dtypes"]:
                for name in job["collectives"]:
                    if not applies(name, dist.get_world_size(group)):
                        continue
                    for size in sizes(job["min_bytes"], job["max_bytes"], job["factor"]):
                        row = measure(name, size, DTYPES[dtype_name], device, job["warmup"], job["iters"],
                                      group, scope)
                        if dist.get_rank() == 0:
                            store.append_comm_row(job["run_dir"], row)
        if job.get("copies") and device.type == "cuda":
            # Rank 0's GPU alone (the others wait): copies from every rank at once would
            # share the host's memory and PCIe root and measure the contention instead.
            if dist.get_rank() == 0:
                for name in job["copies"]:
                    for size in sizes(job["min_bytes"], job["max_bytes"], job["factor"]):
                        store.append_comm_row(job["run_dir"], copies.measure(name, size, device, job["warmup"],
                                                                             job["iters"]))
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
