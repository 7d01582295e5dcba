import numpy as np
import pytest

from mgbench import catalog
from mgbench.model_shape import ModelShape
from mgbench.planner import memory as M

# Korthikanti et al.'s GPT: multi-head attention, GELU MLP of width 4h.
GPT = ModelShape(layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=1000, mlp="gelu")
s, b, h, a = 2048, 2, 1024, 16


@pytest.mark.parametrize(
    "t,sp,rc,flash,expected",
    [
        (1, False, 0, False, s * b * h * (34 + 5 * a * s / h)),            # no parallelism
        (4, False, 0, False, s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4))),  # tensor parallel
        (4, True, 0, False, s * b * h * (34 / 4 + 5 * a * s / (h * 4))),   # TP + sequence parallel
        (4, False, 1, False, s * b * h * (10 + 24 / 4)),                   # TP + selective recompute
        (4, True, 1, False, 34 * s * b * h / 4),                           # TP + SP + selective
        (1, False, 0, True, s * b * h * 34),                               # flash attention: no scores
        (1, False, 2, False, 2 * s * b * h),                               # full recompute: layer input
        (4, True, 2, False, 2 * s * b * h / 4),
    ],
)
def test_activations_match_korthikanti_table_2(t, sp, rc, flash, expected):
    got = M.activations_per_layer(GPT, s, b, t, sp, rc, flash, "bf16")
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_activation_formula_is_vectorised():
    got = M.activations_per_layer(GPT, s, np.array([1, 2]), np.array([1, 4]), np.array([False, True]), 0, False, "bf16")
    assert got.shape == (2,)
    assert got[0] == pytest.approx(s * 1 * h * (34 + 5 * a * s / h))


@pytest.mark.parametrize("zero,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(zero, gb):
    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam.
    out = M.memory_per_gpu(None, params=7.5e9, dp=64, zero=zero)
    assert float(out["model_states_bytes"]) / 1e9 == pytest.approx(gb, abs=0.05)
    assert float(out["total_bytes"]) == float(out["model_states_bytes"])  # states alone


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
    # tp=2 halves everything (vocab-parallel embedding too), up to the replicated final norm.
    assert float(M.stage_params(shape, 2, 1)) == pytest.approx((shape.num_params() - shape.hidden) / 2 + shape.hidden)
    # pp=4: 8 blocks plus one of embedding / output projection.
    expected = 8 * shape.params_per_layer() + shape.vocab * shape.hidden + shape.hidden
    assert float(M.stage_params(shape, 1, 4)) == pytest.approx(expected)


def test_total_includes_stated_allowance():
    shape = catalog.model_shape("llama3-8b")
    m = M.memory_per_gpu(shape, seq=4096, micro_batch=1, dp=8, zero=3, recompute=2)
    sub = m["model_states_bytes"] + m["activations_bytes"] + m["gathered_params_bytes"]
    assert float(m["allowance_bytes"]) == pytest.approx(M.ALLOWANCE_FRACTION * float(sub))
    assert float(m["total_bytes"]) == pytest.approx(float(sub) * (1 + M.ALLOWANCE_FRACTION))


def test_fp32_states_are_16_bytes_per_param():
    out = M.model_states(1e9, 1, 0, "fp32")
    assert float(out["model_states_bytes"]) == 16e9
