"""Zero-bubble schedules with data-parallel replicas: which gradient reduction a pipelined
config uses (schedules.grad_sync), that the schedule gate no longer refuses them, and
that the record says which reduction ran, and that torch's memory tracker (which fails
inside the split input pass) is not run on their steps. The numerics (each schedule correct on pp 2 x
dp 2 under ddp / fsdp / hsdp, the skipped reduction caught) are checked on 4 gloo ranks
in tests/unit/test_check_gloo.py (test_zero_bubble_schedules_with_data_parallel_replicas)."""

import dataclasses

import pytest
import torch

from mgbench.record import Record
from mgbench.runner.worker import pipeline_grad_sync, track_memory
from mgbench.strategies import schedules
from tests.factories import make_config

SPLIT = [s.name for s in schedules.REGISTRY if s.split_backward]


def test_the_split_backward_schedules_are_the_zero_bubble_family():
    assert SPLIT == ["interleaved_zb", "zbv", "dualpipev"]


@pytest.mark.parametrize("schedule", [s.name for s in schedules.REGISTRY])
def test_grad_sync_by_schedule_and_dp_mode(schedule):
    split = schedule in SPLIT
    # DDP's reducer hooks never see the split weight pass: those stages are unwrapped and
    # all-reduced after the schedule; the others keep DDP.
    assert schedules.grad_sync(schedule, "ddp") == ("allreduce_after_schedule" if split else "ddp_reducer")
    # FSDP / HSDP: torch's perform_reduce_grad either way; split stages stay unsharded
    # from forward to backward.
    for mode in ("fsdp", "hsdp"):
        assert schedules.grad_sync(schedule, mode) == ("fsdp_reduce_grad_unsharded" if split else "fsdp_reduce_grad")
    assert schedules.grad_sync(schedule, None) is None  # no replicas, nothing to reduce


@pytest.mark.parametrize("schedule", SPLIT)
def test_zero_bubble_schedules_pass_the_gate_that_used_to_refuse_replicas(schedule):
    # pp 2, 4 micro-batches (DualPipeV's minimum there, a multiple of pp for interleaved).
    assert schedules.schedule_problem(schedule, 2, 4, compile=False) is None
    # What torch still refuses keeps its reason.
    assert "compile = false" in schedules.schedule_problem(schedule, 2, 4, compile=True)


def test_every_grad_sync_is_described_and_named_in_the_record_help():
    text = next(f for f in dataclasses.fields(Record) if f.name == "pp_grad_sync").metadata["help"]
    for key, description in schedules.GRAD_SYNC.items():
        assert key in text and description
    answers = {schedules.grad_sync(s.name, m) for s in schedules.REGISTRY for m in ("ddp", "fsdp", "hsdp")}
    assert answers == set(schedules.GRAD_SYNC)


def test_the_record_says_which_reduction_ran():
    zb = make_config(strategy="pp+tp+dp", nproc=4, pp=2, dp=2, tp=1, pp_schedule="zbv", grad_accum=4)
    assert pipeline_grad_sync(zb) == {"pp_grad_sync": "allreduce_after_schedule"}
    assert pipeline_grad_sync(dataclasses.replace(zb, dp_mode="fsdp")) == {"pp_grad_sync": "fsdp_reduce_grad_unsharded"}
    assert pipeline_grad_sync(dataclasses.replace(zb, pp_schedule="1f1b")) == {"pp_grad_sync": "ddp_reducer"}
    alone = make_config(strategy="pp", nproc=2, pp_schedule="zbv", grad_accum=4)
    assert pipeline_grad_sync(alone) == {"pp_grad_sync": None}  # no replicas
    assert pipeline_grad_sync(make_config(strategy="ddp", nproc=2)) == {}  # not a pipeline


def test_the_memory_tracker_is_not_run_on_split_backward_steps():
    # torch 2.13's tracker fails inside the split input pass (seen on gloo), and a rank
    # whose tracked step fails would leave its pipeline neighbours waiting: every rank
    # skips it alike, with the reason, before any collective.
    for name in SPLIT:
        assert "autograd.grad" in schedules.memory_tracker_problem(name)
    assert schedules.memory_tracker_problem("1f1b") is None
    zb = make_config(strategy="pp+tp+dp", nproc=4, pp=2, dp=2, tp=1, pp_schedule="dualpipev", grad_accum=4)
    got = track_memory(zb, prep=None, batches=[], device=torch.device("cpu"))  # no process group: no barrier
    assert got == {"mem_tracked_reason": schedules.memory_tracker_problem("dualpipev")}


def test_no_grad_sync_on_a_config_with_no_gradient_reduction_is_refused():
    # One process, no wrapper: there is nothing for the bug to skip, which must be said,
    # not silently injected as a no-op.
    from mgbench.runner.inject import _skip_grad_sync
    from mgbench.strategies.pieces import Prepared

    model = torch.nn.Linear(2, 2)
    prep = Prepared(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, dp_rank=0, dp_size=1,
                    modules=[model])
    with pytest.raises(ValueError, match="needs a data-parallel gradient reduction"):
        _skip_grad_sync(prep)


def _on_gloo_threads(size, body):
    """Run ``body(rank, group)`` on ``size`` threads, each a rank of one gloo group (no
    default process group, no launch): what the ranks returned, by rank."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    store, got, errors = dist.HashStore(), {}, []

    def rank(r):
        try:
            got[r] = body(r, dist.ProcessGroupGloo(dist.PrefixStore("t", store), r, size, timedelta(seconds=20)))
        except Exception as e:  # noqa: BLE001 (re-raised below, on the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got


def test_mean_allreduce_and_expert_grad_sync_divide_the_summed_gradients_once():
    """Both reductions sum over their group with allreduce_flat and divide by their own
    count there (the flat buffer, once per dtype): the mean over the pipeline's replicas,
    and for expert weights the sum over the expert data-parallel group over the world size
    (strategies/expert_parallel.py). Dividing twice, or not at all, fails the values."""
    from mgbench.strategies.expert_parallel import ExpertGradSync
    from mgbench.strategies.pipeline import mean_allreduce

    def grads(r):  # two dtypes: one buffer each
        return [torch.full((3,), 1.0 + r), torch.full((2, 2), 10.0 * (1 + r)), torch.full((2,), 1.0 + r,
                                                                                            dtype=torch.float64)]

    def pipeline(r, group):
        stage = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros_like(g)) for g in grads(r))
        for p, g in zip(stage, grads(r)):
            p.grad = g
        mean_allreduce([stage], group)()
        return [p.grad for p in stage]

    def experts(r, group):
        sync = ExpertGradSync([], group, world=4, ddp_no_sync=None)
        sync._ready = grads(r)
        mine = sync._ready
        sync._reduce_all()
        return mine

    for got in _on_gloo_threads(2, pipeline).values():  # mean of ranks 1 and 2: 1.5
        assert [g.unique().tolist() for g in got] == [[1.5], [15.0], [1.5]]
        assert got[2].dtype == torch.float64
    for got in _on_gloo_threads(2, experts).values():  # (1 + 2) / 4
        assert [g.unique().tolist() for g in got] == [[0.75], [7.5], [0.75]]
    # ep = dp: each expert on one rank (a group of one): nothing to sum, still / world.
    (alone,) = _on_gloo_threads(1, experts).values()
    assert [g.unique().tolist() for g in alone] == [[0.25], [2.5], [0.25]]
