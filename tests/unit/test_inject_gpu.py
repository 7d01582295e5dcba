"""slow@ fault injection on a CUDA rank, whose steps return before the GPU has run them.

torch.cuda.synchronize is replaced by a wait for a simulated GPU queue (the one CUDA call
this needs; nothing else is faked): a step "queues" 0.1 s of GPU work and returns at
once, as a CUDA training step does."""

import time

import pytest
import torch

from mgbench.runner.inject import Injector


@pytest.fixture
def gpu_queue(monkeypatch):
    """busy[0]: when the simulated GPU finishes what was queued so far."""
    busy = [0.0]
    syncs = []

    def synchronize(device=None):  # torch.cuda.synchronize: wait for the queued kernels
        syncs.append(device)
        time.sleep(max(0.0, busy[0] - time.perf_counter()))

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    return busy, syncs


def test_slow_rank_on_gpu_is_delayed_by_its_whole_step(gpu_queue):
    """Before: the delay was (factor - 1) x the launch time (microseconds), and a CPU
    spin while the GPU still ran the queue delayed nothing: the rank was not slower."""
    busy, syncs = gpu_queue
    inj = Injector("slow@rank=0,factor=3", 0, torch.device("cuda", 0))
    inj.before_step(5)
    t0 = time.perf_counter()
    busy[0] = t0 + 0.1  # the step queued 0.1 s of kernels and returned
    inj.after_step()
    took = time.perf_counter() - t0
    # its 0.1 s of GPU work, then 2 x 0.1 s more (upper bound loose: a shared VM may
    # take the core away during the spin)
    assert 0.28 < took < 0.6
    assert syncs and syncs[-1] == torch.device("cuda", 0)


def test_other_ranks_and_cpu_ranks_never_wait_for_a_gpu(gpu_queue):
    busy, syncs = gpu_queue
    other = Injector("slow@rank=1,factor=3", 0, torch.device("cuda", 0))
    other.before_step(0)
    busy[0] = time.perf_counter() + 0.1
    t0 = time.perf_counter()
    other.after_step()
    assert time.perf_counter() - t0 < 0.05 and not syncs  # no wait for the 0.1 s queue
    cpu = Injector("slow@rank=0,factor=2", 0, torch.device("cpu"))
    cpu.before_step(0)
    time.sleep(0.05)
    t0 = time.perf_counter()
    cpu.after_step()
    assert 0.045 < time.perf_counter() - t0 < 0.3 and not syncs
