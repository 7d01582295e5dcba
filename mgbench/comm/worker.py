"""Rank entry point of `mgbench comm` (started by torchrun)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import stats, store
from ..telemetry.clock import StepClock
from .busbw import busbw_factor
from .collectives import Bench

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def measure(name: str, size: int, dtype: torch.dtype, device: torch.device, warmup: int, iters: int,
            group: Any = None, scope: str = "all") -> dict:
    elem = torch.empty((), dtype=dtype).element_size()
    b = Bench(name, max(1, size // elem), dtype, device, group)
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
            "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(name, n), "busbw_factor": busbw_factor(name, n),
            "wrong": int(w.item()), "device": device.type, "scope": scope}


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
    ap.add_argument("--plan", required=True)
    a = ap.parse_args()
    plan = json.loads(Path(a.plan).read_text())
    local = int(os.environ.get("LOCAL_RANK", 0))
    if plan["device"] == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    run_dir = Path(plan["run_dir"])
    try:
        for scope, group in split_groups():
            for dtype_name in plan["dtypes"]:
                for name in plan["collectives"]:
                    if name == "sendrecv" and dist.get_world_size(group) < 2:
                        continue
                    for size in sizes(plan["min_bytes"], plan["max_bytes"], plan["factor"]):
                        row = measure(name, size, DTYPES[dtype_name], device, plan["warmup"], plan["iters"],
                                      group, scope)
                        if dist.get_rank() == 0:
                            with open(run_dir / "comm.jsonl", "a") as f:
                                f.write(json.dumps({"schema_version": store.SCHEMA_VERSION, **row}) + "\n")
                                f.flush()
                                os.fsync(f.fileno())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
