"""Launch utilities shared by `mgbench run`, `mgbench comm` and the Slurm path: where a
job runs (devices, cluster), the torchrun command line and the environment of its ranks.

Torch-free at import: the launcher never loads the rank side (torch is imported inside
:func:`detect_devices` only, and only on a host with a GPU driver).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import MgbenchError

SHARED_FS_WAIT_S = 120  # how long a follower node waits to see the leader's run folder
# The first line each rank writes to its stderr (see run_rank): which global rank wrote the file.
RANK_BANNER = "[mgbench] global rank"
_BANNER = re.compile(rf"^{re.escape(RANK_BANNER)} (\d+)\b", re.MULTILINE)


@dataclass(frozen=True)
class Cluster:
    """A multi-node launch: this node's place in it. Node 0 (the leader) creates the run
    folder and writes every record; the folder must be on a filesystem all nodes share."""

    nnodes: int
    node_rank: int
    rdzv_endpoint: str
    nproc_per_node: int
    rdzv_prefix: str = "mgbench"

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def leader(self) -> bool:
        return self.node_rank == 0

    def manifest_entry(self) -> dict[str, object]:
        """What a run's manifest says about the launch."""
        return {"nnodes": self.nnodes, "nproc_per_node": self.nproc_per_node,
                "rdzv_endpoint": self.rdzv_endpoint, "world_size": self.world}


def check_cluster_args(nnodes: int, node_rank: int, rdzv_endpoint: str | None,
                       nproc_per_node: int | None = None) -> None:
    """Refuse cluster options no launch can use (MgbenchError naming the bad value and
    what is allowed), before anything is measured or written: --nnodes below 1, a
    --node-rank outside 0..N-1, --nproc-per-node below 1, an --rdzv-endpoint that is not
    HOST or HOST:PORT with a port in 1-65535 (torchrun would only fail at the rendezvous;
    without a port it takes its default, 29400; an IPv6 host in brackets, [::1]:29500)."""
    if nnodes < 1:
        raise MgbenchError(f"--nnodes {nnodes}: give 1 or more nodes")
    if not 0 <= node_rank < nnodes:
        raise MgbenchError(f"--node-rank {node_rank}: with --nnodes {nnodes} give 0"
                           + (f" to {nnodes - 1}" if nnodes > 1 else " (one node is rank 0)"))
    if nproc_per_node is not None and nproc_per_node < 1:
        raise MgbenchError(f"--nproc-per-node {nproc_per_node}: give 1 or more ranks per node")
    if rdzv_endpoint is not None and (why := _endpoint_problem(rdzv_endpoint)) is not None:
        raise MgbenchError(f"--rdzv-endpoint {rdzv_endpoint!r}: {why}; give HOST or HOST:PORT with a port from 1 to "
                           "65535, e.g. node0:29500 (an IPv6 host in brackets: [fe80::1]:29500)")


def _endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with a rendezvous endpoint (None: nothing): HOST, HOST:PORT,
    [IPV6] or [IPV6]:PORT, as torchrun parses them."""
    if endpoint.startswith("["):
        host, close, rest = endpoint[1:].partition("]")
        if not close:
            return "an IPv6 host needs its closing bracket"
        if rest and not rest.startswith(":"):
            return "text after the bracketed host that is not :PORT"
        port = rest[1:] if rest else None
    else:
        host, colon, port = endpoint.partition(":")
        if colon and ":" in port:
            return "an IPv6 host must be in brackets"
        port = port if colon else None
    if not host.strip():
        return "no host"
    if port is not None and not (port.isascii() and port.isdecimal() and 1 <= int(port) <= 65535):
        return f"port {port!r} is not a number from 1 to 65535"
    return None


def detect_devices() -> tuple[str, int]:
    """("cuda", GPU count) when CUDA devices are visible, else ("cpu", CPU ranks allowed).

    CPU ranks allowed is max(4, cores): gloo ranks on one host share the cores, and
    tests need 4 ranks even on a 2-core machine; beyond that oversubscription only
    measures the scheduler.
    """
    from .telemetry.machine import gpu_device_nodes

    if not gpu_device_nodes():  # no GPU driver: CPU, without importing torch
        return "cpu", cpu_rank_limit()
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda", torch.cuda.device_count()
    return "cpu", cpu_rank_limit()


def cpu_rank_limit() -> int:
    """How many gloo ranks a CPU config may ask for on this host (see detect_devices)."""
    return max(4, os.cpu_count() or 1)


def threads_per_rank(nproc: int, cores: int | None = None) -> int:
    """Threads each of ``nproc`` CPU ranks gets on a host of ``cores`` cores (this one by
    default): an equal share, at least one."""
    return max(1, (cores or os.cpu_count() or 1) // nproc)


def torchrun_argv(nproc: int, job_path: Path, log_dir: Path, module: str = "mgbench.runner.worker",
                  cluster: Cluster | None = None, rdzv_id: str = "") -> list[str]:
    """torchrun (torch.distributed.run): on this host with a free local port, or, for a
    multi-node launch, one agent per node meeting at the c10d rendezvous endpoint. Each
    rank's stdout/stderr is also kept in its own file under ``log_dir``; the rank module
    reads its work from the job file ``job_path``. Each rank starts through
    :func:`run_rank`, which names its global rank first thing in its stderr file."""
    if cluster is None or cluster.nnodes == 1:
        where = ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc}"]
    else:
        where = [f"--nnodes={cluster.nnodes}", f"--nproc-per-node={cluster.nproc_per_node}",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={cluster.rdzv_endpoint}",
                 f"--rdzv-id={cluster.rdzv_prefix}-{rdzv_id}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--log-dir={log_dir}", "--redirects=3",
            "--tee=3", "-m", "mgbench.launching", module, "--job", str(job_path)]


def run_rank(argv: list[str]) -> None:
    """A rank's entry point (``python -m mgbench.launching MODULE ARGS...``): write
    RANK_BANNER and this process's global rank (torchrun's RANK) to stderr, then run
    MODULE as ``__main__`` with ARGS.

    torchrun keeps a rank's stderr under ``<log dir>/.../<local rank>/stderr.log``, and
    in a multi-node launch its c10d rendezvous numbers the nodes in an order of its own
    (by host, not by --node-rank): the folder and the node do not tell the global rank,
    the file's first line does (:func:`rank_of_stderr`)."""
    import runpy

    module, *args = argv
    print(f"{RANK_BANNER} {os.environ.get('RANK', '0')} (local rank {os.environ.get('LOCAL_RANK', '0')} of "
          f"torchrun's node {os.environ.get('GROUP_RANK', '0')})", file=sys.stderr, flush=True)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def rank_of_stderr(path: Path) -> int | None:
    """The global rank that wrote a rank's stderr file (run_rank's first line); None
    when the file is missing or the rank died before it wrote the line."""
    try:
        with open(path, errors="replace") as f:
            m = _BANNER.search(f.read(4096))  # the first line, after any warning the interpreter printed
    except OSError:
        return None
    return int(m[1]) if m else None


def child_env(nproc: int, device: str, tag: str) -> dict[str, str]:
    """Environment of a torchrun job's ranks."""
    env = dict(os.environ)
    # The worker must import this same mgbench, installed or not.
    pkg_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["MGBENCH_GROUP"] = tag
    if device == "cpu":
        # Share the cores between ranks instead of letting each rank spawn one thread
        # per core (which oversubscribes and measures contention, not the strategy).
        env["OMP_NUM_THREADS"] = str(threads_per_rank(nproc))
    else:
        # A failed or timed-out NCCL collective aborts the communicator and ends the
        # process, instead of leaving a rank blocked forever: the launcher then records
        # the config. Warnings only, so logs stay readable.
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        env.setdefault("NCCL_DEBUG", "WARN")
    return env


if __name__ == "__main__":
    run_rank(sys.argv[1:])
