"""mgbench.process_group.gloo_group: no model built in the block outlives the group."""

import gc

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mgbench.process_group import gloo_group


def _live_ddp() -> int:
    return sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())


def _build_then_fail() -> None:
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.zeros(2, 4)).sum().backward()
    raise RuntimeError("step failed")


def test_a_failed_blocks_models_are_gone_before_the_group(monkeypatch):
    # The failing function's frame stays in the traceback, and with it its DDP model; freed
    # only after the group, the reducer would destroy the group itself (gloo can deadlock
    # there). gloo_group clears the traceback's frames before destroying the group.
    alive = []
    destroy = dist.destroy_process_group

    def watched(*a, **kw):
        alive.append(_live_ddp())
        return destroy(*a, **kw)

    monkeypatch.setattr(dist, "destroy_process_group", watched)
    with pytest.raises(RuntimeError, match="step failed") as info:
        with gloo_group():
            _build_then_fail()
    assert alive == [0]
    assert not dist.is_initialized()
    assert info.traceback[-1].name == "_build_then_fail"  # the traceback itself is kept


def test_the_group_replaces_one_already_there():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with gloo_group():
        assert dist.get_world_size() == 1
    assert not dist.is_initialized()
