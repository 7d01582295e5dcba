import pytest
import torch

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.model_shape import ModelShape
from mgbench.workloads.gpt import DecoderLM


def built_params(shape: ModelShape) -> int:
    model = DecoderLM(shape, max_seq_len=16)
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


@pytest.mark.parametrize(
    "shape",
    [
        catalog.model_shape("tiny"),
        ModelShape(layers=2, hidden=48, heads=6, kv_heads=2, ffn_hidden=96, vocab=100),
        ModelShape(layers=1, hidden=32, heads=2, ffn_hidden=64, vocab=50, mlp="gelu", tie_embeddings=True),
        ModelShape(layers=1, hidden=32, heads=4, head_dim=16, ffn_hidden=64, vocab=50),
        ModelShape(layers=1, hidden=32, heads=2, ffn_hidden=64, vocab=50, vocab_multiple=64),  # built with 64 rows
    ],
)
def test_formula_param_count_matches_built_model(shape):
    assert built_params(shape) == shape.num_params()


def test_gpt2_small_is_124m_by_hand():
    s = catalog.model_shape("gpt2-small")
    # Per layer: 4 h^2 attention + 2 h (4h) MLP + 2 h norm scales.
    per_layer = 4 * 768**2 + 2 * 768 * 3072 + 2 * 768
    expected = 12 * per_layer + 768 + 50304 * 768  # tied head; the vocabulary built padded to 50304
    assert s.padded_vocab == 50304 and s.vocab == 50257
    assert s.num_params() == expected
    assert 123e6 < expected < 125e6  # "124M" minus GPT-2's 0.8M position embeddings and biases


def test_llama3_8b_published_count():
    # Meta reports 8.03B parameters for Llama 3 8B.
    assert abs(catalog.model_shape("llama3-8b").num_params() / 1e9 - 8.03) < 0.01


def test_flops_per_token_hand_calculation():
    s = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=176, vocab=256)
    # N: blocks + final norm + output projection (the embedding lookup has no FLOPs).
    block = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64
    n = 2 * block + 64 + 256 * 64
    assert s.flops_per_token(32) == 6 * n + 12 * 2 * 64 * 32


def test_flops_per_token_torchtitan_convention_for_untied_llama():
    # torchtitan: 6 * (params - embedding) + 12 * l * h * q * t
    s = catalog.model_shape("llama3-8b")
    expected = 6 * (s.num_params() - s.vocab * s.hidden) + 12 * 32 * 32 * 128 * 8192
    assert s.flops_per_token(8192) == expected


def test_bad_shapes_are_clear_errors():
    with pytest.raises(MgbenchError, match="kv_heads"):
        ModelShape(layers=1, hidden=64, heads=4, kv_heads=3, ffn_hidden=8, vocab=8)
    with pytest.raises(MgbenchError, match="divide by heads"):
        ModelShape(layers=1, hidden=65, heads=4, ffn_hidden=8, vocab=8)
    with pytest.raises(MgbenchError, match="unknown model dim"):
        ModelShape.from_dict({"layers": 1, "hidden": 8, "heads": 2, "ffn_hidden": 8, "vocab": 8, "hiden": 3})


def test_forward_shapes_and_causality():
    torch.manual_seed(0)
    shape = catalog.model_shape("tiny")
    model = DecoderLM(shape, max_seq_len=16)
    x = torch.randint(0, shape.vocab, (2, 16))
    logits = model(x)
    assert logits.shape == (2, 16, shape.vocab)
    # Changing a later token must not change earlier logits (causal attention).
    x2 = x.clone()
    x2[:, 10] = (x2[:, 10] + 1) % shape.vocab
    assert torch.allclose(model(x2)[:, :10], logits[:, :10], atol=1e-6)
    assert not torch.allclose(model(x2)[:, 10:], logits[:, 10:])
