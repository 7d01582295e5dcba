"""The host's optimizer work under CPU offload (planner/host_step.py), by hand from the
rates hardware.toml stores, and against torch's own AdamW code."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import torch

from mgbench import catalog
from mgbench.planner import hardware, host_step, layout_time
from mgbench.planner import memory as M
from mgbench.planner.optimizer import muon_matrices

LLAMA8 = catalog.model_shape("llama3-8b")
H100 = hardware.resolve("dgx-h100")
KW = dict(seq=4096, global_batch=16, micro_batch=1, tp=1, pp=1, dp=8, zero=3, recompute=2)

# hardware.toml [host_cpu.ns_per_element.fp32]: mul_, lerp_, addcmul_, sqrt, div_scalar,
# add_, addcdiv_, vector_norm.
FP32 = dict(mul_=0.329, lerp_=0.677, addcmul_=0.587, sqrt=1.811, div_scalar=1.824, add_=0.342, addcdiv_=0.810,
            vector_norm=0.333, adamw_fused=1.289)


def test_adamw_on_the_host_is_the_sum_of_torchs_ops_by_hand():
    # weight decay mul_, lerp_, mul_ + addcmul_, sqrt, / scalar, add_, addcdiv_
    by_hand = 0.329 + 0.677 + 0.329 + 0.587 + 1.811 + 1.824 + 0.342 + 0.810
    assert host_step.adamw_ns_per_element(host_step.ns_per_element("fp32")) == pytest.approx(by_hand)
    assert host_step.clip_ns_per_element(host_step.ns_per_element("fp32")) == pytest.approx(0.333 + 0.329)
    assert host_step.ns_per_element("fp32") == pytest.approx(FP32)


def test_the_ops_priced_are_the_ones_torchs_single_tensor_adamw_runs():
    # A trace of the code the rule names: each op of ADAMW_OPS appears in torch's
    # _single_tensor_adam (the path CPU tensors take), as a call on the tensors.
    src = inspect.getsource(importlib.import_module("torch.optim.adam")._single_tensor_adam)
    if "decoupled_weight_decay" not in src:
        pytest.skip(f"torch {torch.__version__} keeps AdamW's step in torch/optim/adamw.py (the rule traced 2.13)")
    for op in ("param.mul_(1 - lr * weight_decay)", "exp_avg.lerp_(grad", "exp_avg_sq.mul_(beta2).addcmul_(",
               "exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)", "param.addcdiv_(exp_avg, denom"):
        assert op in src, op
    assert host_step.ADAMW_OPS == ("mul_", "lerp_", "mul_", "addcmul_", "sqrt", "div_scalar", "add_", "addcdiv_")


def test_offloaded_adamw_adds_its_host_step_to_the_step():
    r = layout_time.step_time(LLAMA8, H100, offload=True, **KW)
    shard = float(M.stage_params(LLAMA8, 1, 1)) / 8
    # FSDP2's fp32 master weights and gradients (the stack's 4, 4, 8): fp32 rates.
    per = (0.329 + 0.677 + 0.329 + 0.587 + 1.811 + 1.824 + 0.342 + 0.810) + (0.333 + 0.329)
    host = float(r["breakdown"]["host_optimizer_s"])
    assert host == pytest.approx(shard * per * 1e-9, rel=1e-9)
    # It adds to the step: the same layout without it costs exactly that much less.
    assert float(r["step_time_s"]) - host == pytest.approx(
        sum(float(r["breakdown"][k]) for k in ("compute_s", "bubble_s", "tp_comm_s", "pp_comm_s", "exposed_dp_comm_s",
                                                 "ep_comm_s", "cp_comm_s", "offload_s", "moe_host_s",
                                                 "moe_efa_notify_s", "optimizer_s")), rel=1e-9)
    # A bf16 run (weights and gradients in 2 bytes) runs the bf16 rates, by hand from
    # hardware.toml: the for-loop 0.339 + 0.448 + 0.339 + 0.424 + 1.057 + 1.066 + 0.340 + 0.557
    # = 4.570, clipping 0.245 + 0.339 = 0.584 ns an element.
    bf16 = layout_time.step_time(LLAMA8, H100, offload=True, offload_state_bytes=(2.0, 2.0, 4.0), **KW)
    assert float(bf16["breakdown"]["host_optimizer_s"]) == pytest.approx(shard * (4.570 + 0.584) * 1e-9, rel=1e-9)
    # Without offload the optimizer steps on the GPU: nothing on the host.
    assert float(layout_time.step_time(LLAMA8, H100, **KW)["breakdown"]["host_optimizer_s"]) == 0.0


def test_a_stack_that_passes_fused_steps_the_fused_kernel():
    # torchtitan's optimizer implementation defaults to "fused": one kernel, 1.289 ns an
    # element in fp32, not the for-loop's 6.709.
    assert host_step.implementation_of("torchtitan") == "fused"
    assert host_step.implementation_of("megatron-lm") == "for-loop" == host_step.implementation_of(None)
    titan = dataclasses.replace(H100, stack="torchtitan")
    r = layout_time.step_time(LLAMA8, titan, offload=True, **KW)
    shard = float(M.stage_params(LLAMA8, 1, 1)) / 8
    assert float(r["breakdown"]["host_optimizer_s"]) == pytest.approx(shard * (1.289 + 0.662) * 1e-9, rel=1e-6)
    assert any("AdamW's step (fused kernel)" in n for n in r["notes"])
    # Under Muon dion's own scalar optimizer steps the AdamW parameters: not torch's fused.
    assert host_step.implementation_of("torchtitan", "muon") == "for-loop"


def test_the_runner_is_priced_as_it_builds_its_host_optimizer():
    # Under offload the runner builds AdamW for the cpu device, where optimizer_kw leaves
    # it unfused, and it clips no gradient: the for-loop's ops alone.
    from mgbench.strategies.pieces import optimizer_kw

    assert not optimizer_kw(torch.device("cpu")).get("fused", False)
    assert host_step.implementation_of("mgbench") == "for-loop" and not host_step.clips("mgbench")
    runner = dataclasses.replace(H100, stack="mgbench")
    r = layout_time.step_time(LLAMA8, runner, offload=True, **KW)
    shard = float(M.stage_params(LLAMA8, 1, 1)) / 8
    assert float(r["breakdown"]["host_optimizer_s"]) == pytest.approx(shard * 6.709 * 1e-9, rel=1e-6)
    assert any("the stack clips no gradient" in n for n in r["notes"])


@pytest.mark.parametrize("state_bytes,dtype", [
    ((4.0, 4.0, 8.0), "fp32"),    # FSDP2's fp32 sharded weights
    ((2.0, 4.0, 12.0), "fp32"),   # bf16 weights with an fp32 master copy: AdamW updates the master
    ((2.0, 2.0, 4.0), "bf16"),    # bf16 throughout (torchtitan's training.dtype bfloat16)
    ((2.0, 2.0, 2.0), "bf16"),
])
def test_one_dtype_for_the_step_and_the_clipping(state_bytes, dtype):
    # FSDP2 casts the host gradients to the sharded weights' dtype: one dtype for both.
    assert host_step.dtype_of(state_bytes) == dtype
    r = layout_time.step_time(LLAMA8, H100, offload=True, offload_state_bytes=state_bytes, **KW)
    shard = float(M.stage_params(LLAMA8, 1, 1)) / 8
    per = {"fp32": 6.709 + 0.662, "bf16": 4.570 + 0.584}[dtype]  # for-loop + clipping, by hand
    assert float(r["breakdown"]["host_optimizer_s"]) == pytest.approx(shard * per * 1e-9, rel=1e-9)


def test_under_muon_only_the_non_matrix_parameters_step_adamw_on_the_host():
    share = host_step.adamw_share(LLAMA8, "muon")
    muon = sum(k * n * c for k, n, c in muon_matrices(LLAMA8))
    assert share == pytest.approx(1 - muon / LLAMA8.num_params())
    # Llama 3 8B: the embedding and output layer (2 x 128256 x 4096) and the norms.
    assert share * LLAMA8.num_params() == pytest.approx(2 * 128256 * 4096 + (2 * 32 + 1) * 4096)
    assert host_step.adamw_share(LLAMA8, "adamw") == 1.0
    r = layout_time.step_time(LLAMA8, H100, offload=True, optimizer="muon", **KW)
    shard = float(M.stage_params(LLAMA8, 1, 1)) / 8
    per = share * 6.709 + 0.662  # AdamW on its share, clipping on every gradient (fp32)
    assert float(r["breakdown"]["host_optimizer_s"]) == pytest.approx(shard * per * 1e-9, rel=1e-6)


def test_the_stored_rates_name_where_they_were_measured():
    t = host_step.host_cpu()
    assert "Emerald Rapids" in t["cpu"] and t["command"].startswith("python tests/perf/bench_host_optimizer.py")
    assert set(t["ns_per_element"]["fp32"]) == set(host_step.OPS) == set(t["ns_per_element"]["bf16"])
    assert host_step.pageable_bytes_per_s() == 10.0e9


def test_predicts_step_line_adds_up_with_the_optimizer_terms():
    # The step line's parts (compute, bubble, exposed comm, optimizer, host optimizer step)
    # add up to the step: a user reads where the time goes from it.
    import re

    from click.testing import CliRunner

    from mgbench.cli import main

    r = CliRunner().invoke(main, ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8",
                                  "--zero", "3", "--offload", "--optimizer", "muon", "--global-batch", "16"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("step time"))
    total = float(re.search(r"step time\s+([\d.]+) s", line).group(1))
    parts = dict((k, float(v)) for k, v in re.findall(r"([a-zA-Z][a-zA-Z -]*?) ([\d.]+)(?=[,)])", line.split("(", 1)[1]))
    assert {"optimizer", "host optimizer step"} <= set(parts), parts
    assert sum(parts.values()) == pytest.approx(total, abs=0.002 * len(parts))


def test_the_bench_that_sets_the_rates_runs_and_times_every_priced_op():
    # tests/perf/bench_host_optimizer.py sets hardware.toml [host_cpu]: run it tiny (its
    # figures at this size mean nothing) so that it cannot rot unnoticed.
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "tests/perf/bench_host_optimizer.py"), "--elements", "65536",
                          "--repeats", "1", "--json", "--scaling", "1,2"], capture_output=True, text=True,
                         timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for dtype in ("fp32", "bf16"):
        assert set(d["ns_per_element"][dtype]) == set(host_step.OPS)
        assert all(v > 0 for v in d["ns_per_element"][dtype].values())
        assert set(d["check"][dtype]) == {"adamw_step", "clip_grad_norm_"}
    assert set(d["scaling"]) == {"adamw for-loop", "adamw fused", "clip_grad_norm_"}
    assert d["scaling"]["adamw fused"]["1"]["speedup"] == 1.0
    bad = subprocess.run([sys.executable, str(root / "tests/perf/bench_host_optimizer.py"), "--scaling", "0"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert bad.returncode == 2 and "--scaling takes thread counts of 1 or more" in bad.stderr


def test_a_dense_offload_interval_says_no_published_run_checks_the_host_step():
    # predict and plan add the reason to an offload interval (with its seconds in predict)
    # unless a published offload run checks the host step (host_step.checked_moe_optimizers);
    # without offload there is none.
    import json

    from click.testing import CliRunner

    from mgbench.cli import main

    def reasons(*args):
        r = CliRunner().invoke(main, ["predict", "--num-gpus", "8", "--zero", "3", "--json", *args])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["interval_reasons"]

    dense = reasons("--model", "llama3-8b", "--system", "dgx-h100", "--offload", "--global-batch", "16")
    assert any("no published run checks it" in x and "s of the" in x for x in dense)
    assert not any("no published run checks it" in x
                   for x in reasons("--model", "llama3-8b", "--system", "dgx-h100", "--global-batch", "16"))
    # An MoE model under the optimizer of the one published MoE offload run (Muon, whose host
    # steps AdamW for its embedding, head and norms only) is covered by that run's class; under
    # AdamW, whose host step that run never ran on every weight, it is not (a re-read found it
    # said nothing: qwen3-30b-a3b's host step 28 s of a 30 s step).
    moe = ("--model", "qwen3-30b-a3b", "--system", "dgx-b200", "--ep", "8", "--offload", "--global-batch", "16")
    assert not any("no published run checks it" in x for x in reasons(*moe, "--optimizer", "muon"))
    assert any("no published run checks it" in x for x in reasons(*moe))
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-70b", "--tokens", "1e12", "--systems", "dgx-h100",
                                  "--offload", "--max-gpus", "16", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["ranked"]
    assert {any("no published run checks it" in x for x in row["interval_reasons"]) for row in rows
            if row["offload"]} == {True}
    assert not any("no published run checks it" in x for row in rows if not row["offload"]
                   for x in row["interval_reasons"])


def test_a_host_step_a_stack_does_not_state_is_called_assumed(monkeypatch):
    # A re-read found the defaults (torch's for-loop AdamW, clipping on) used silently for every
    # stack that states neither; predict's note now names what was assumed, and a misspelt
    # host_adamw is one line, not a KeyError.
    import pytest

    from mgbench.errors import MgbenchError
    from mgbench.planner import host_step

    assert "states no host_adamw: torch's for-loop AdamW" in host_step.note("adamw", "megatron-lm")
    assert "assumed" not in host_step.note("adamw", "torchtitan")  # it states both
    assert "assumed" not in host_step.note("adamw", "mgbench")
    # the runner clips nothing (strategies build no clipping), the stacks it models do
    assert not host_step.clips("mgbench") and host_step.clips("torchtitan") and host_step.clips("megatron-lm")
    monkeypatch.setattr(host_step, "stacks", lambda: {"x": {"host_adamw": "fusde", "host_clip": True}})
    with pytest.raises(MgbenchError, match=r"host_adamw = 'fusde': one of for-loop, fused"):
        host_step.implementation_of("x")
