"""Issue 30, item 1: one worker process runs many configs, and dynamo's state outlived
each one: the next compiled config's blocks were recompiled as a change of the last
one's (dynamic shapes from the second micro-batch size on, each counted against the
recompile limit). Each compiled config now starts from a reset compiler, and its record
counts recompiles and graph breaks. Compiled with dynamo's "eager" backend: dynamo's
tracing, guards and caches without generating kernels."""

import dataclasses

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

from mgbench.process_group import gloo_group
from mgbench.record import Record
from mgbench.runner import worker
from mgbench.runner.tolerance import check_config
from mgbench.strategies import apply, pieces
from mgbench.telemetry.energy import EnergyMeter
from tests.factories import make_rank_figures

CPU = torch.device("cpu")


def compile_eager(model):
    for key in pieces.block_keys(model):
        model.blocks[key].compile(backend="eager")


def compiled(micro_batch):
    return check_config("single", compile=True, micro_batch=micro_batch, grad_accum=1, warmup_steps=1,
                        measured_steps=2, check_steps=0, track_memory=False)


def measure_in_turn(configs):
    """Each config through the worker's measure(), in one process as a job runs them; per
    config, the compiles torch's own metrics saw."""
    out = []
    for cfg in configs:
        clear_compilation_metrics()
        figures = worker.measure(cfg, CPU, EnergyMeter("cpu", 0, local_rank=1), profile=False, check=False,
                                 track=False)
        out.append((figures, [(m.compile_id, m.recompile_reason) for m in get_compilation_metrics()]))
    return out


@pytest.fixture(scope="module")
def two_sizes():
    mp = pytest.MonkeyPatch()
    mp.setattr(pieces, "apply_compile", compile_eager)
    torch._dynamo.reset()
    try:
        with gloo_group():
            yield measure_in_turn([compiled(2), compiled(4)])
    finally:
        mp.undo()


def test_the_second_micro_batch_size_compiles_afresh_with_static_shapes(two_sizes):
    (_, first), (_, second) = two_sizes
    assert first and all(reason is None for _, reason in first)
    # Before: ('0/1', "tensor 'x' size mismatch at index 0. expected 2, actual 4"): a
    # recompile of the first config's graph, with L['x'] marked dynamic.
    assert second and all(reason is None for _, reason in second), second
    assert all(cid.endswith("/0") for cid, _ in second)


def test_each_config_counts_its_own_recompiles_and_graph_breaks(two_sizes):
    for figures, _ in two_sizes:
        assert figures.compile_counts == {"num_recompiles": 0, "num_graph_breaks": 0, "compile_counts_reason": None}


class Breaks(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1


def test_recompiles_and_graph_breaks_are_counted_from_a_reset():
    counts = pieces.CompileCounts()
    m = Breaks()
    m.compile(backend="eager")
    for n in (2, 3, 5):  # 3: both functions (forward and its resume after the break) recompile, dynamic
        m(torch.randn(n, 4))
    assert counts.read() == {"num_recompiles": 2, "num_graph_breaks": 2, "compile_counts_reason": None}
    fresh = pieces.CompileCounts()  # resets dynamo: the next config starts from nothing
    assert fresh.read() == {"num_recompiles": 0, "num_graph_breaks": 0, "compile_counts_reason": None}


def test_the_record_says_the_counts_or_why_not():
    cfg = compiled(2)
    ranks = [make_rank_figures(rank=r, compile_counts={"num_recompiles": n, "num_graph_breaks": 1,
                                                       "compile_counts_reason": None}) for r, n in enumerate((0, 3))]
    out = worker.compile_fields(cfg, ranks)
    assert out == {"num_recompiles": 3, "num_graph_breaks": 1, "compile_counts_reason": None}  # the most of any rank
    off = worker.compile_fields(dataclasses.replace(cfg, compile=False), [make_rank_figures()])
    assert off["num_recompiles"] is None and off["num_graph_breaks"] is None and "compile = false" in \
        off["compile_counts_reason"]
    lost = worker.compile_fields(cfg, [ranks[0], make_rank_figures(rank=1)])
    assert lost["num_recompiles"] is None and lost["compile_counts_reason"].startswith("rank 1")
    rec = Record(cfg, "r", "ok", **out).to_dict()  # declared fields, with units
    assert rec["num_recompiles"] == 3 and rec["num_graph_breaks"] == 1


def test_rounds_add_their_counts():
    a = make_rank_figures(compile_counts={"num_recompiles": 1, "num_graph_breaks": 2, "compile_counts_reason": None})
    b = make_rank_figures(compile_counts={"num_recompiles": 0, "num_graph_breaks": 2, "compile_counts_reason": None})
    assert worker.merge_rounds([a, b]).compile_counts == {"num_recompiles": 1, "num_graph_breaks": 4,
                                                          "compile_counts_reason": None}


def test_blocks_compile_with_the_configured_backend(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: seen.append(kw.get("backend")))
    monkeypatch.setattr(pieces, "COMPILE_BACKEND", "eager")
    model = apply.build_model(compiled(2))
    pieces.apply_compile(model)
    assert seen == ["eager"] * len(pieces.block_keys(model))
