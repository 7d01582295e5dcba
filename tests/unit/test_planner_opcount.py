"""The op counter (planner/opcount.py) on modules whose aten ops are known exactly."""

import pytest
import torch

from mgbench.planner.opcount import OpCounter, host_ops, op_kind
from tests.factories import make_config

F32 = 4  # bytes


def test_elementwise_module_counts_every_op_and_byte_by_phase():
    w = torch.nn.Parameter(torch.ones(4, 8))
    x = torch.rand(4, 8)
    opt = torch.optim.SGD([w], lr=0.1, foreach=False)
    with OpCounter() as c:
        (x * w).sum().backward()
        opt.step()
    s = c.summary()
    n = 4 * 8 * F32
    # forward: mul (reads x, w; writes x*w), sum (reads it, writes 1 element), and
    # backward()'s ones_like for the seed gradient (reads and writes 1 element); the
    # optimizer's record_function enter/exit (no tensors) run before its pre-hook.
    assert s["by_phase"]["forward"]["compute"] == 5
    assert s["by_phase"]["forward"]["bytes"] == 3 * n + (n + F32) + 2 * F32
    # backward: sum's backward expands the seed (a view), mul's multiplies it by x, and
    # the gradient is stored detached (a view): 1 compute op of 3 operands
    assert s["by_phase"]["backward"]["compute"] == 1 and s["by_phase"]["backward"]["view"] == 2
    assert s["by_phase"]["backward"]["bytes"] == 3 * n
    # SGD without foreach: one add_ (reads w and its gradient, writes w: in place counts 3 n)
    assert s["by_phase"]["optimizer"]["compute"] == 1 and s["by_phase"]["optimizer"]["bytes"] == 3 * n
    assert s["matmul_ops"] == 0 and s["bytes"] == 10 * n + 3 * F32
    assert host_ops(s) == {"ops": 9.0, "bytes": float(10 * n + 3 * F32), "collectives": 0.0}


def test_matmuls_are_counted_apart_with_their_flops_and_no_bytes():
    lin = torch.nn.Linear(8, 3, bias=False)
    x = torch.rand(4, 8)
    with OpCounter() as c:
        lin(x).sum().backward()
    s = c.summary()
    # forward x @ W.t (t: a view) and the weight gradient grad.t @ x (x needs no gradient)
    assert s["matmul_ops"] == 2 and s["matmul_flops"] == 2 * (2.0 * 4 * 8 * 3)
    assert s["compute_ops"] == 2  # sum, ones_like: matmul operands are not in the bytes
    assert s["bytes"] == (4 * 3 * F32 + F32) + 2 * F32
    assert c.by_name["t"] == 4


def test_sdpa_and_collectives_are_their_own_kinds():
    assert op_kind(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) == "attention"
    assert op_kind(torch.ops.aten.mm.default) == "matmul"
    assert op_kind(torch.ops.aten.transpose.int) == "view"
    assert op_kind(torch.ops.aten.add.Tensor) == "compute"
    assert op_kind(torch.ops.prim.device.default) == "ignored"


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_a_traced_step_under_fake_tensors_counts_what_a_real_step_runs(strategy):
    """count_step on fake tensors (the runner's own build and step) against the same step
    counted on real tensors in a world-1 gloo group, as count_step runs cheap one-rank
    steps: the same ops and bytes. (DDP differs by design: on the fake group its reducer
    runs trace.py's stand-in comm hook, 1% more view and compute ops counted for real.)"""
    from mgbench import catalog
    from mgbench.planner.opcount import count_step, counts_on_real_tensors

    shape = catalog.model_shape("mini")
    cfg = make_config(strategy=strategy, nproc=1, model=shape, micro_batch=2, seq_len=32, precision="fp32")
    traced = count_step(cfg, tensors="fake")
    real = count_step(cfg, tensors="real")
    assert (traced["tensors"], real["tensors"]) == ("fake", "real")
    for k in ("compute_ops", "view_ops", "matmul_ops", "attention_ops", "collective_ops", "bytes", "matmul_flops"):
        assert traced[k] == real[k], k
    assert traced["attention_ops"] == 2 * shape.layers  # one SDPA forward and backward per block
    assert traced["by_phase"]["optimizer"]["compute"] > 0
    # count_step picks the faster real count here (opcount.py says how much faster).
    assert counts_on_real_tensors(cfg)


def test_only_a_cheap_one_rank_step_is_counted_on_real_tensors(monkeypatch):
    import dataclasses

    from mgbench import catalog
    from mgbench.planner import memory as M
    from mgbench.planner.opcount import REAL_STEP_MAX_BYTES, REAL_STEP_MAX_FLOPS, counts_on_real_tensors

    tiny = make_config(strategy="ddp", nproc=1, model=catalog.model_shape("tiny"), micro_batch=2, seq_len=32)
    assert counts_on_real_tensors(tiny)
    # At 2 ranks the fake group's collectives hand back unfilled buffers: fake tensors.
    assert not counts_on_real_tensors(make_config(strategy="ddp", nproc=2, model=catalog.model_shape("tiny")))
    # gpt2-small at seq 1024: ~6e12 FLOP a step, minutes on a CPU: fake tensors.
    assert not counts_on_real_tensors(make_config(strategy="single", nproc=1, model=catalog.model_shape("gpt2-small"),
                                                  micro_batch=8, seq_len=1024))
    # Few FLOPs but over the memory limit alone: a 1-token step of a huge-vocabulary model.
    wide = dataclasses.replace(catalog.model_shape("tiny"), vocab=2_000_000, name="wide-vocab")
    few = make_config(strategy="single", nproc=1, model=wide, micro_batch=1, seq_len=1)
    assert M.memory_for_config(few)["total_bytes"] > REAL_STEP_MAX_BYTES
    assert not counts_on_real_tensors(few)
    # Recomputation is work the step runs: with a limit between the two, the plain step
    # runs for real and the fully recomputed one does not.
    from mgbench.planner import opcount
    from mgbench.planner.perf import hardware_flops_per_token

    full = make_config(strategy="single", nproc=1, model=catalog.model_shape("tiny"), micro_batch=2, seq_len=32,
                       activation_checkpointing="full")
    plain = dataclasses.replace(full, activation_checkpointing="none")
    tokens = plain.global_batch * plain.seq_len
    between = tokens * (hardware_flops_per_token(plain.shape, 32, 0) + hardware_flops_per_token(plain.shape, 32, 2)) / 2
    assert between < REAL_STEP_MAX_FLOPS  # tiny's steps are both under the real limit
    monkeypatch.setattr(opcount, "REAL_STEP_MAX_FLOPS", float(between))
    assert counts_on_real_tensors(plain) and not counts_on_real_tensors(full)


def test_an_unknown_tensors_choice_is_refused():
    from mgbench.planner.opcount import count_step

    with pytest.raises(ValueError, match="auto, real or fake"):
        count_step(make_config(strategy="single", nproc=1), tensors="meta")


def test_recorded_ops_replay_with_their_shapes_strides_and_bytes():
    from mgbench.planner.opcount import TensorSpec
    from mgbench.probe import kernels

    x = torch.rand(4, 1).expand(4, 8)  # a broadcast operand: stride 0 along the row
    y = torch.rand(4, 8)
    with OpCounter(record=True) as c:
        torch.mul(x, y)
    assert c.by_name == {"mul": 1}
    (func, (args, kwargs), nbytes), = c.recorded
    assert args[0] == TensorSpec((4, 8), (1, 0), torch.float32) and nbytes == 3 * 4 * 8 * F32
    assert args[0].make(torch.device("cpu")).stride() == (1, 0)
    # an op random data cannot stand for (mismatched matmul shapes) is left out and counted
    bad = (torch.ops.aten.mm.default, ((TensorSpec((2, 3), (3, 1), torch.float32),
                                        TensorSpec((4, 5), (5, 1), torch.float32)), {}), 0)
    res = kernels.elementwise(torch.device("cpu"), c.recorded + [bad], repeats=1)
    assert res["ops"] == 1 and res["ops_failed"] == 1 and res["bytes"] == nbytes and res["bytes_per_s"] > 0


def test_a_config_the_trace_cannot_run_gets_a_reason_not_a_crash():
    import dataclasses

    from mgbench import catalog
    from mgbench.errors import MgbenchError
    from mgbench.planner.against import _count

    cfg = make_config(model=dataclasses.replace(catalog.model_shape("tiny")))
    object.__setattr__(cfg.shape, "kv_heads", 3)  # past ModelShape's checks: SDPA refuses 4 heads over 3
    with pytest.raises(MgbenchError, match="could not be counted by running one step.*RuntimeError"):
        _count(cfg)


def test_op_counts_are_kept_in_the_run_folder_and_reused(tmp_path, monkeypatch):
    """A config's traced count is stored beside its run (RunDir.op_counts), so the run's
    closing projection and a later `predict --against` trace it once; another version's
    file is not trusted."""
    import json

    from mgbench import store
    from mgbench.planner import against as A
    from mgbench.planner import opcount
    from tests.factories import make_config

    traced = []
    monkeypatch.setattr(opcount, "count_step", lambda cfg: traced.append(cfg) or {})
    monkeypatch.setattr(opcount, "host_ops", lambda counts: {"ops": 7.0})
    monkeypatch.setattr(A, "_COUNTS", {})
    run = store.RunDir(tmp_path)
    cfg = make_config(strategy="single")
    assert A._count(cfg) == {"ops": 7.0} and len(traced) == 1
    A._count(make_config(strategy="ddp", nproc=2))  # another run's config, also in the cache
    A._save_counts(run, [A._count_key(cfg)])
    assert list(json.loads(run.op_counts.read_text())["counts"]) == [A._count_key(cfg)]  # this run's only
    traced.pop()
    monkeypatch.setattr(A, "_COUNTS", {})  # a new process
    A._load_counts(run)
    assert A._count(cfg) == {"ops": 7.0} and len(traced) == 1  # read back, not traced again
    run.op_counts.write_text(json.dumps({"opcount_version": A.OPCOUNT_VERSION + 1, "counts": A._COUNTS}))
    monkeypatch.setattr(A, "_COUNTS", {})
    A._load_counts(run)
    A._count(cfg)
    assert len(traced) == 2


def test_against_refuses_a_profile_of_another_kind_of_device(tmp_path):
    """A GPU profile cannot predict a CPU run (and a run with nothing measured cannot be
    compared): one clear error each, naming the fix."""
    import shutil
    from pathlib import Path

    import pytest

    from mgbench.errors import MgbenchError
    from mgbench.planner.against import against_run

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "v2-smoke"
    shutil.copytree(fixture, tmp_path / "v2-smoke")
    with pytest.raises(MgbenchError, match="probe the machine the run was measured on"):
        against_run({"device": "cuda", "device_name": "H100"}, "v2-smoke", str(tmp_path))
    (tmp_path / "v2-smoke" / "records.jsonl").write_text("")
    with pytest.raises(MgbenchError, match="no ok configs with a step time"):
        against_run({"device": "cpu", "device_name": "cpu"}, "v2-smoke", str(tmp_path))
