"""Custom model dims on the planner's command line: MLP kind, tied embeddings, FFN defaults."""

import pytest

from mgbench.model_shape import default_ffn_hidden
from mgbench.commands.planning import resolve_shape


def test_default_ffn_follows_each_mlp_kinds_convention():
    assert default_ffn_hidden(768, "gelu") == 3072  # GPT-2 small: 4h
    assert default_ffn_hidden(4096, "swiglu") == 11008  # Llama 2 7B (Touvron et al. 2023, table of dims)
    assert default_ffn_hidden(5120, "swiglu") == 13824  # Llama 2 13B


def test_gpt3_dims_can_be_given_and_count_175b_parameters():
    dims = dict(layers=96, hidden=12288, heads=96, kv_heads=None, ffn_hidden=None, vocab=51200, mlp="gelu",
                tie_embeddings=True)
    shape = resolve_shape(None, None, dims)
    assert shape.ffn_hidden == 4 * 12288 and shape.mlp == "gelu" and shape.tie_embeddings
    # GPT-3 175B (Brown et al. 2020, table 2.1): 175.0B parameters
    assert shape.num_params() == pytest.approx(175.0e9, rel=0.005)


def test_swiglu_is_the_default_and_explicit_ffn_wins():
    base = dict(layers=2, hidden=512, heads=8, kv_heads=None, vocab=1000, mlp=None, tie_embeddings=None)
    assert resolve_shape(None, None, {**base, "ffn_hidden": None}).ffn_hidden == 1536  # 8*512/3 = 1365 -> 1536
    assert resolve_shape(None, None, {**base, "ffn_hidden": 2000}).ffn_hidden == 2000


def test_predict_accepts_gpt3_style_dims(cli):
    p = cli("predict", "--layers", "96", "--hidden", "12288", "--heads", "96", "--mlp", "gelu", "--vocab", "51200",
            "--tie-embeddings", "--gpu", "a100-sxm-80gb", "--num-gpus", "1024", "--tp", "8", "--pp", "8",
            "--global-batch", "1536", "--json")
    assert p.returncode == 0, p.stderr
