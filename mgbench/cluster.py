"""Slurm: the sbatch script for a multi-node sweep, submission, job state, and reading
a Slurm allocation into a multi-node launch."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import MgbenchError
from .store import RunDir
from .launching import Cluster

RDZV_PORT = 29500
# Cores per GPU rank a GPU job asks for unless told (--cpus-per-gpu): the rank's Python
# thread, CUDA's and NCCL's own threads (the NCCL proxy per communicator) and torch's
# intra-op pool each want a core, and a site without per-GPU defaults otherwise gives the
# whole task one core, which all ranks of the node share. 4 fits the smallest common
# GPU nodes (4 GPUs, 16 cores); DGX-class nodes have 14-16 per GPU.
DEFAULT_CPUS_PER_GPU = 4
# Memory of a GPU job unless told (--mem): 0 is Slurm's "all of each node's memory"
# (sbatch --mem), right for a job that holds every GPU of its nodes.
DEFAULT_GPU_MEM = "0"
MEM_FORMAT = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)
# sbatch --time's formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds; and no limit: UNLIMITED, INFINITE or -1
# (Slurm's time_str2mins, src/common/parse_time.c).
TIME_FORMAT = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite|-1)$", re.IGNORECASE)


def check_mem(mem: str) -> str:
    """A Slurm --mem value (per node: a number of MB, or with a K/M/G/T suffix; 0 = all)."""
    if not MEM_FORMAT.match(mem):
        raise MgbenchError(f"--mem {mem!r}: give Slurm's memory per node, e.g. 0 (all of it), 256G or 512000 (MB)")
    return mem


def check_time(time_limit: str) -> str:
    """A Slurm --time value in one of sbatch's formats (TIME_FORMAT); sbatch would
    otherwise refuse the job only when it is submitted."""
    if not TIME_FORMAT.match(time_limit):
        raise MgbenchError(f"--time {time_limit!r}: give Slurm's time limit as MINUTES, MM:SS, HH:MM:SS, D-HH, "
                           "D-HH:MM, D-HH:MM:SS or UNLIMITED, e.g. 02:00:00 or 1-12")
    return time_limit


def slurm_cluster(nproc_per_node: int, rdzv_prefix: str) -> Cluster:
    """This node's place in the current Slurm job (SLURM_NNODES, SLURM_NODEID, the head
    node from `scontrol show hostnames`)."""
    env = os.environ
    missing = [k for k in ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST") if k not in env]
    if missing:
        raise MgbenchError(f"--from-slurm: not inside a Slurm job step ({', '.join(missing)} unset); "
                           "use `mgbench slurm ... --submit` or srun")
    head = env.get("MGBENCH_HEAD_NODE") or head_node(env["SLURM_JOB_NODELIST"])
    return Cluster(int(env["SLURM_NNODES"]), int(env["SLURM_NODEID"]), f"{head}:{RDZV_PORT}", nproc_per_node,
                   f"{rdzv_prefix}-{env['SLURM_JOB_ID']}")


def head_node(nodelist: str) -> str:
    exe = shutil.which("scontrol")
    if exe is None:
        raise MgbenchError("scontrol not found: cannot expand SLURM_JOB_NODELIST; set MGBENCH_HEAD_NODE")
    out = subprocess.run([exe, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not out.stdout.split():
        raise MgbenchError(f"scontrol show hostnames {nodelist} failed: {out.stderr.strip()}")
    return out.stdout.split()[0]


def sbatch_script(run_dir: Path, suite_name: str, nodes: int, gpus_per_node: int, device: str,
                  partition: str | None = None, time_limit: str | None = None, account: str | None = None,
                  python: str = sys.executable, cpus_per_gpu: int | None = None, mem: str | None = None) -> str:
    """One task per node, each running `mgbench run --resume RUN --from-slurm`: torchrun
    then starts the ranks on every node and they meet at the head node's rendezvous.

    The one task holds every rank of its node, so it asks for their cores together:
    ``cpus_per_gpu`` per rank (GPU jobs: DEFAULT_CPUS_PER_GPU; CPU ranks: 1) and ``mem``
    per node (GPU jobs: all of it, DEFAULT_GPU_MEM; CPU jobs: the site's default)."""
    run_dir = run_dir.resolve()
    lines = ["#!/bin/bash", f"#SBATCH --job-name=mgbench-{suite_name}", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={RunDir(run_dir).slurm_output_pattern()}"]
    if cpus_per_gpu is not None and cpus_per_gpu < 1:
        raise MgbenchError(f"--cpus-per-gpu {cpus_per_gpu}: give at least 1 core per rank")
    if device == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
        lines.append(f"#SBATCH --cpus-per-task={gpus_per_node * (cpus_per_gpu or DEFAULT_CPUS_PER_GPU)}")
        lines.append(f"#SBATCH --mem={check_mem(mem if mem is not None else DEFAULT_GPU_MEM)}")
    else:
        lines.append(f"#SBATCH --cpus-per-task={gpus_per_node * (cpus_per_gpu or 1)}")  # CPU ranks: one core each
        if mem is not None:
            lines.append(f"#SBATCH --mem={check_mem(mem)}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={check_time(time_limit)}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    cmd = (f"{shlex.quote(python)} -m mgbench.cli run --resume {shlex.quote(str(run_dir))} --from-slurm "
           f"--nproc-per-node {gpus_per_node} --device {device}")
    lines += [
        "set -euo pipefail",
        "# The rendezvous lives on the first node of the allocation.",
        'export MGBENCH_HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {cmd}",
        "",
    ]
    return "\n".join(lines)


def submit(script: Path) -> str:
    exe = shutil.which("sbatch")
    if exe is None:
        raise MgbenchError("sbatch not found: run on a Slurm login node, or drop --submit and copy the script")
    out = subprocess.run([exe, "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        why = " | ".join(ln.strip() for ln in out.stderr.splitlines() if ln.strip())  # one line, however many sbatch wrote
        raise MgbenchError(f"sbatch refused the job: {why or f'exit status {out.returncode}'}")
    return out.stdout.strip().split(";")[0]


def job_state(job_id: str) -> tuple[str, str | None]:
    """(state, why) of a Slurm job: PENDING / RUNNING / COMPLETED / FAILED ... from squeue,
    then sacct, UNKNOWN if neither answers; ``why`` is squeue's reason a job still waits
    (Resources, Priority, a QOS limit, ReqNodeNotAvail ...), None otherwise."""
    for cmd in (["squeue", "-h", "-j", job_id, "-o", "%T|%r"], ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]):
        exe = shutil.which(cmd[0])
        if exe is None:
            continue
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=30)
        state, why = parse_state_line(out.stdout) if out.returncode == 0 else ("", None)
        if state:
            return state, why
    return "UNKNOWN", None


def parse_state_line(text: str) -> tuple[str, str | None]:
    """squeue's "STATE|REASON" (or sacct's "STATE ...") first line as (state, reason); the
    reason only while the job waits, and not squeue's "None"."""
    line = text.strip().split("\n")[0].strip()
    state, _, reason = line.partition("|")
    state = state.split()[0] if state.split() else ""
    reason = reason.strip()
    return state, (reason if state == "PENDING" and reason and reason != "None" else None)
