"""The analytic memory model (mgbench/planner/memory.py): its formulas, its sums and its
names. Agreement with what the workload really allocates is tests/unit/test_memory_trace.py's."""

import numpy as np
import pytest

from mgbench import catalog
from mgbench.config import CHECKPOINTING
from mgbench.model_shape import ModelShape
from mgbench.planner import memory as M
from tests.factories import make_config

# Korthikanti et al.'s GPT: multi-head attention, GELU MLP of width 4h.
GPT = ModelShape(layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=1000, mlp="gelu")
s, b, h, a = 2048, 2, 1024, 16


@pytest.mark.parametrize(
    "t,sp,flash,expected",
    [
        (1, False, False, s * b * h * (34 + 5 * a * s / h)),            # no parallelism
        (4, False, False, s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4))),  # tensor parallel
        (4, True, False, s * b * h * (34 / 4 + 5 * a * s / (h * 4))),   # TP + sequence parallel
        (1, False, True, s * b * h * 34),                               # flash attention: no scores
    ],
)
def test_korthikanti_table_2_for_the_step_time_model(t, sp, flash, expected):
    got = M.korthikanti_bytes_per_layer(GPT, s, b, t, sp, flash, "bf16")
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_the_runners_recompute_modes_are_the_planners_first_ones():
    # The planner adds what production stacks run (selective) after the runner's modes,
    # so a runner mode's index is the same in both.
    from mgbench.layout import RECOMPUTE, RUNNER_RECOMPUTE

    assert RUNNER_RECOMPUTE == CHECKPOINTING == RECOMPUTE[:len(CHECKPOINTING)]


def test_loss_chunks_match_the_workload():
    from mgbench.workloads import gpt

    assert M.LOSS_CHUNKS == gpt.LOSS_CHUNKS


def test_layer_activations_count_each_saved_tensor():
    # llama-like block, bf16, one rank: norms 2 x (3 e h + 8), q k v out, lse, SwiGLU 4 e F.
    shape = ModelShape(layers=1, hidden=256, heads=8, kv_heads=2, ffn_hidden=704, vocab=100)
    e, q, k = 2, 256, 64
    per_token = 2 * (3 * e * 256 + 8) + e * (2 * q + 2 * k) + 4 * 8 + 4 * e * 704
    assert float(M.layer_activations(shape, 96, 1, False, "bf16")) == 96 * per_token
    # Tensor parallelism splits heads and MLP; sequence parallelism also the norms'
    # own tensors, but the gathered norm output is whole on every rank.
    t = 2
    tp_only = 2 * (3 * e * 256 + 8) + (e * (2 * q + 2 * k) + 4 * 8 + 4 * e * 704) / t
    tp_sp = 2 * ((2 * e * 256 + 8) / t + e * 256) + (e * (2 * q + 2 * k) + 4 * 8 + 4 * e * 704) / t
    assert float(M.layer_activations(shape, 96, t, False, "bf16")) == pytest.approx(96 * tp_only)
    assert float(M.layer_activations(shape, 96, t, True, "bf16")) == pytest.approx(96 * tp_sp)


def test_activation_formula_is_vectorised():
    got = M.layer_activations(GPT, np.array([1024, 2048]), np.array([1, 4]), np.array([False, True]), "bf16")
    assert got.shape == (2,)
    assert got[1] > 0


@pytest.mark.parametrize("zero,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(zero, gb):
    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam.
    out = M.memory_per_gpu(None, params=7.5e9, dp=64, zero=zero)
    assert float(out["model_states_bytes"]) / 1e9 == pytest.approx(gb, abs=0.05)


def test_params_mode_zero3_adds_the_gathered_working_set():
    # DeepSpeed's estimator adds the largest layer to ZeRO-3's model states; --params mode
    # takes it as an input (computed + prefetched: twice its 16-bit weights).
    z3 = M.memory_per_gpu(None, params=7.5e9, dp=1024, zero=3, largest_layer_params=1e8)
    assert float(z3["gathered_params_bytes"]) == pytest.approx(2 * 1e8 * 2)
    assert float(z3["total_bytes"]) == pytest.approx(float(z3["model_states_bytes"] + z3["gathered_params_bytes"]))
    assert z3["gathered_params_known"]
    # Not given: not guessed, and said so.
    unknown = M.memory_per_gpu(None, params=7.5e9, dp=1024, zero=3)
    assert float(unknown["gathered_params_bytes"]) == 0.0 and not unknown["gathered_params_known"]
    assert float(M.memory_per_gpu(None, params=7.5e9, dp=1024, zero=2, largest_layer_params=1e8)
                 ["gathered_params_bytes"]) == 0.0


def test_params_mode_says_when_the_working_set_is_missing():
    from mgbench.layout import Layout
    from mgbench.planner.predict import memory

    out = memory(None, Layout(num_gpus=64, zero=3), params=7.5e9)
    assert "largest-layer-params" in out["notes"][0]
    assert memory(None, Layout(num_gpus=64, zero=3), params=7.5e9, largest_layer_params=1e8)["notes"] == []


PARTS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "gathered_params_bytes",
         "temporaries_bytes", "fixed_bytes", "allowance_bytes")


def test_components_add_up_to_the_total_for_every_layout():
    shape = catalog.model_shape("llama3-8b")
    tp, pp, zero, rc, mb = np.meshgrid([1, 2, 8], [1, 4], [0, 1, 2, 3], [0, 1, 2], [1, 4], indexing="ij")
    m = M.memory_per_gpu(shape, seq=8192, micro_batch=mb.ravel(), num_micro=8, tp=tp.ravel(), pp=pp.ravel(),
                         dp=16, zero=zero.ravel(), recompute=rc.ravel(), sp=tp.ravel() > 1)
    assert np.allclose(sum(m[k] for k in PARTS), m["total_bytes"], rtol=1e-12)
    # ZeRO-3 carries a gathered working set; ZeRO-2 does not.
    z3 = zero.ravel() == 3
    assert (m["gathered_params_bytes"][z3] > 0).all() and (m["gathered_params_bytes"][~z3] == 0).all()


def test_pipeline_in_flight_micro_batches():
    assert M.in_flight(4, 16, "1f1b") == 4
    assert M.in_flight(4, 16, "gpipe") == 16
    assert M.in_flight(4, 2, "1f1b") == 2
    assert M.in_flight(4, 16, "interleaved", 2) == pytest.approx(4 * (1 + 3 / 8))
    assert M.in_flight(1, 16, "gpipe") == 1


def test_stage_params_split_layers_and_tensor_shards():
    shape = catalog.model_shape("llama3-8b")
    full = M.stage_params(shape, 1, 1)
    assert float(full) == pytest.approx(shape.num_params())
    assert float(M.stage_params(shape, 2, 1)) == pytest.approx((shape.num_params() - shape.hidden) / 2 + shape.hidden)
    expected = 8 * shape.params_per_layer() + shape.vocab * shape.hidden + shape.hidden
    assert float(M.stage_params(shape, 1, 4)) == pytest.approx(expected)


def test_total_includes_stated_allowance():
    shape = catalog.model_shape("llama3-8b")
    m = M.memory_per_gpu(shape, seq=4096, micro_batch=1, dp=8, zero=3, recompute=2)
    sub = sum(float(m[k]) for k in PARTS if k not in ("allowance_bytes", "fixed_bytes"))  # fixed costs: not proportional
    assert float(m["allowance_bytes"]) == pytest.approx(M.ALLOWANCE_FRACTION * sub)


def test_fp32_states_are_16_bytes_per_param():
    out = M.model_states(1e9, 1, 0, "fp32")
    assert float(out["model_states_bytes"]) == 16e9


@pytest.mark.parametrize("strategy,nproc,extra", [
    ("single", 1, {}), ("ddp", 2, {}), ("zero1", 4, {}), ("fsdp", 4, {"activation_checkpointing": "full"}),
    ("fsdp_grad_op", 2, {}), ("tp", 2, {}), ("tp_sp", 2, {}), ("pp", 2, {"grad_accum": 4}),
    ("fsdp+tp", 4, {"activation_checkpointing": "every_2nd"}),
])
def test_memory_for_config_categories_add_up(strategy, nproc, extra):
    cfg = make_config(strategy=strategy, nproc=nproc, model="tiny", precision="bf16", **extra)
    out = M.memory_for_config(cfg)
    assert set(out) == set(M.CONFIG_KEYS)
    assert sum(out[k] for k in M.CONFIG_KEYS if k != "total_bytes") == out["total_bytes"]
    assert all(v >= 0 for v in out.values())


def test_memory_for_config_is_the_highest_phase():
    cfg = make_config(strategy="ddp", nproc=2, model="tiny", precision="bf16", micro_batch=4)
    phases = M.runner_phases(cfg)
    assert M.memory_for_config(cfg)["total_bytes"] == max(p["total_bytes"] for p in phases.values())
    # DDP holds a second copy of the gradients in its buckets; one replica does not.
    single = M.memory_for_config(make_config(strategy="single", model="tiny", precision="bf16", micro_batch=4))
    assert M.memory_for_config(cfg)["temporaries_bytes"] > single["temporaries_bytes"]


def test_zero1_partition_is_torchs_greedy_split():
    # Largest first, each to the least-loaded rank: 10 -> 0, 9 -> 1, 8 -> 1, 3 -> 0, 1 -> 0.
    assert M._zero1_partition([1, 10, 9, 8, 3], 2) == [10, 3, 1]


def test_cpu_adamw_scratch_is_previous_plus_two_current():
    assert M._adamw_scratch([4, 1, 3, 3], "single") == 3 + 2 * 3
    assert M._adamw_scratch([4, 1, 3, 3], "foreach") == 11
    assert M._adamw_scratch([4, 1, 3, 3], "fused") == 0


def test_strategy_facts_come_from_the_registry_not_from_names():
    """runner_phases once listed FSDP strategies by name and left out hsdp and fsdp+ep,
    which the registry counts as ZeRO-3: their memory was modelled as DDP's."""
    from mgbench.strategies import REGISTRY
    from tests.factories import make_config

    assert {s.name for s in REGISTRY if s.fsdp_sharded} >= {"fsdp", "fsdp_grad_op", "hsdp", "fsdp+tp", "fsdp+ep"}
    assert {s.name for s in REGISTRY if s.ddp_replicated} >= {"ddp", "zero1", "ep", "cp"}
    assert not any(s.fsdp_sharded and s.ddp_replicated for s in REGISTRY)
    for st, kw in (("hsdp", {"replicas": 2}), ("fsdp+ep", {"model": "tiny-moe"})):
        phases = M.runner_phases(make_config(strategy=st, nproc=4, precision="bf16", **kw))
        assert "root_reduce_scatter" in phases, st  # FSDP2's phases, as for fsdp
    assert "ddp_finalize" in M.runner_phases(make_config(strategy="ep", nproc=4, model="tiny-moe"))


def test_rank_0_of_a_v_holds_its_in_flight_activations_and_the_logits_at_once():
    # In ZB-V's and DualPipeV's V rank 0 runs the first chunk (the most micro-batches in
    # flight) and the last (the output layer): its logits come on top, where a loop's first
    # and last stages are different GPUs (the larger of the two). A review found the V
    # priced as a loop, 19 GB under the runner's own count for this layout.
    shape = catalog.model_shape("llama3-8b")
    kw = dict(seq=8192, micro_batch=2, tp=1, pp=4, dp=2, zero=1, num_micro=8, precision="bf16", loss="fp32")
    loop = M.memory_per_gpu(shape, schedule="1f1b", **kw)
    vee = M.memory_per_gpu(shape, schedule="zbv", **kw)
    tokens = 8192 * 2
    logits_kept = 4.0 * tokens * shape.padded_vocab  # the fp32 loss's kept log-probs
    assert float(vee["activations_bytes"]) > float(loop["activations_bytes"]) + logits_kept
