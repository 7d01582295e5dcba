"""The probe's time-shared CPU figures, measured for real (no mocks): a replay of single
op calls sees the share of a core its process holds, and the strategies' tiny steps run
as one gloo group of n processes (probe/framework.py)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mgbench.probe import kernels
from mgbench.probe.framework import tiny_config


@pytest.fixture
def recorded_ops():
    from mgbench.planner.opcount import count_step

    return count_step(tiny_config("single", 1), record=True)["recorded"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux) to share a core")
def test_the_elementwise_rate_holds_the_share_of_the_core_the_process_got(recorded_ops):
    # This process and a busy loop pinned to one core: each holds it about half the time.
    # Single calls timed alone are mostly uninterrupted, so without the measured share the
    # rate would be the held-core one, as if the core were this process's alone.
    saved_aff, saved_threads = os.sched_getaffinity(0), torch.get_num_threads()
    cpu = min(saved_aff)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spin.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        torch.set_num_threads(1)
        ew = kernels.elementwise(torch.device("cpu"), recorded_ops * 2, repeats=3)
    finally:
        spin.kill()
        spin.wait()
        os.sched_setaffinity(0, saved_aff)
        torch.set_num_threads(saved_threads)
    assert ew["cpu_share"] < 0.8, ew["cpu_share"]
    assert ew["bytes_per_s"] == pytest.approx(ew["held_core_bytes_per_s"] * ew["cpu_share"])


def test_cpu_share_is_cpu_time_over_wall_time_at_most_one():
    assert kernels.cpu_share_of(0.5, 1.0) == pytest.approx(0.5)
    assert kernels.cpu_share_of(1.2, 1.0) == 1.0  # a clock's jitter is not more than a core
    assert kernels.cpu_share_of(0.0, 0.0) == 1.0


def test_the_tiny_strategy_steps_run_as_one_gloo_group_of_n_ranks(tmp_path):
    # Two processes meet through a FileStore, as the probe's concurrent processes do.
    code = textwrap.dedent(f"""
        import json, sys, torch
        import torch.distributed as dist
        from mgbench.probe.framework import residuals
        torch.set_num_threads(1)
        rank = int(sys.argv[1])
        store = dist.FileStore({str(tmp_path / "store")!r}, 2)
        rows = residuals(1, 5e-6, strategies=("ddp",), ranks=2, rank=rank, store=store)
        open({str(tmp_path)!r} + f"/out{{rank}}.json", "w").write(json.dumps(rows))
    """)
    # stderr to files, not pipes: a rank blocked on a full pipe would stall the other's collectives
    logs = [tmp_path / f"err{r}.txt" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stderr=logs[r].open("w")) for r in range(2)]
    try:
        for p, log in zip(procs, logs):
            p.wait(timeout=120)
            assert p.returncode == 0, log.read_text()[-2000:]
    finally:  # a rank that hangs is not left running after the test
        for p in procs:
            p.kill()
    import json

    for r in range(2):
        (row,) = json.loads((tmp_path / f"out{r}.json").read_text())
        assert row["strategy"] == "ddp" and row["ranks"] == 2 and row["layers"] == 1
        assert row["collectives"] >= 1  # DDP's gradient all-reduce, counted at 2 ranks
        assert row["step_s"] > 0 and row["residual_s"] >= 0


def test_no_ddp_model_outlives_the_probes_process_group(monkeypatch):
    # A DDP reducer freed after its gloo group is destroyed destroys the group itself, and
    # the group's destructor joins gloo's threads holding the GIL one of them may wait
    # for: a probe rank once hung forever that way at its very end. residuals() must let
    # go of every model (here: the last one its timing loop held) before the group goes.
    import gc

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from mgbench.probe.framework import residuals

    alive_at_destroy = []
    destroy = dist.destroy_process_group

    def watched(*a, **kw):
        alive_at_destroy.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*a, **kw)

    monkeypatch.setattr(dist, "destroy_process_group", watched)
    (row,) = residuals(1, 5e-6, strategies=("ddp",))
    assert row["strategy"] == "ddp" and row["step_s"] > 0
    # Both groups: the op count's world-1 group and the timing loop's.
    assert len(alive_at_destroy) == 2 and alive_at_destroy == [0, 0], alive_at_destroy
