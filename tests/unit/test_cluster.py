from pathlib import Path

import pytest

from mgbench.cluster import sbatch_script, slurm_cluster
from mgbench.errors import MgbenchError
from mgbench.launching import Cluster, torchrun_argv


def test_sbatch_script_for_4_nodes_of_8_gpus():
    text = sbatch_script(Path("/shared/results/exp1"), "gpu", 4, 8, "cuda", partition="h100", time_limit="02:00:00",
                         account="ml", python="/opt/venv/bin/python")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for directive in ("--job-name=mgbench-gpu", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8",
                      "--partition=h100", "--time=02:00:00", "--account=ml",
                      "--output=/shared/results/exp1/logs/slurm-%j.out"):
        assert f"#SBATCH {directive}" in lines
    assert 'export MGBENCH_HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun == ("srun --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/venv/bin/python -m mgbench.cli run "
                    "--resume /shared/results/exp1 --from-slurm --nproc-per-node 8 --device cuda")
    # All #SBATCH lines come before the first command, or Slurm ignores them.
    first_cmd = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert all(not line.startswith("#SBATCH") for line in lines[first_cmd:])


def test_cpu_cluster_asks_for_cores_not_gpus():
    text = sbatch_script(Path("/r/x"), "smoke", 2, 2, "cpu")
    assert "#SBATCH --cpus-per-task=2" in text and "--gpus-per-node" not in text


def test_multi_node_torchrun_uses_c10d_rendezvous():
    c = Cluster(nnodes=4, node_rank=2, rdzv_endpoint="node0:29500", nproc_per_node=8, rdzv_prefix="exp1")
    argv = torchrun_argv(32, Path("job.json"), Path("logs"), cluster=c, rdzv_id="group-0-n32-a0")
    for arg in ("--nnodes=4", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500",
                "--rdzv-id=exp1-group-0-n32-a0"):
        assert arg in argv
    assert "--standalone" not in argv
    assert c.world == 32 and not c.leader


def test_slurm_environment(monkeypatch):
    for k in ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(MgbenchError, match="not inside a Slurm job"):
        slurm_cluster(8, "x")
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    monkeypatch.setenv("MGBENCH_HEAD_NODE", "gpu01")
    assert slurm_cluster(8, "exp") == Cluster(2, 1, "gpu01:29500", 8, "exp-123")


# Issue 15 defect 10: GPU jobs asked for no cores or memory; on a site without per-GPU
# defaults every rank of a node then shared the task's one core.
def test_gpu_job_asks_for_cores_per_rank_and_the_nodes_memory():
    lines = sbatch_script(Path("/r/x"), "gpu", 2, 8, "cuda").splitlines()
    assert "#SBATCH --cpus-per-task=32" in lines  # 8 ranks x 4 cores
    assert "#SBATCH --mem=0" in lines  # all of each node's memory
    first_cmd = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert all(not line.startswith("#SBATCH") for line in lines[first_cmd:])


def test_cores_and_memory_can_be_overridden():
    text = sbatch_script(Path("/r/x"), "gpu", 1, 4, "cuda", cpus_per_gpu=12, mem="480G")
    assert "#SBATCH --cpus-per-task=48" in text and "#SBATCH --mem=480G" in text and "--mem=0" not in text
    cpu = sbatch_script(Path("/r/x"), "smoke", 1, 4, "cpu", cpus_per_gpu=2, mem="16000")
    assert "#SBATCH --cpus-per-task=8" in cpu and "#SBATCH --mem=16000" in cpu
    assert "--mem" not in sbatch_script(Path("/r/x"), "smoke", 1, 4, "cpu")  # CPU jobs: the site's default


@pytest.mark.parametrize("kw,match", [(dict(mem="lots"), "--mem 'lots'"), (dict(cpus_per_gpu=0), "at least 1 core")])
def test_bad_cores_or_memory_is_one_clear_error(kw, match):
    with pytest.raises(MgbenchError, match=match):
        sbatch_script(Path("/r/x"), "gpu", 1, 8, "cuda", **kw)


def test_cli_rejects_a_bad_mem_in_one_line(cli):
    p = cli("slurm", "smoke", "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu", "--mem", "2 GB")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == ("mgbench: error: --mem '2 GB': give Slurm's memory per node, e.g. 0 (all of it), "
                                "256G or 512000 (MB)")
