"""The workload's memory-slimming choices (mgbench/workloads/gpt.py) compute what the plain
formulas compute: chunked fp32 cross-entropy, RMSNorm with fp32 statistics, SDPA's own
grouped-query attention, the residual stream in the autocast dtype, a padded vocabulary."""

import pytest
import torch
import torch.nn.functional as F

from mgbench.model_shape import ModelShape
from mgbench.workloads import gpt


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("tokens", [5, 64, 130])  # fewer tokens than chunks, even, uneven
def test_chunked_loss_equals_plain_cross_entropy(dtype, tokens):
    torch.manual_seed(0)
    logits = torch.randn(1, tokens, 50, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, 50, (1, tokens))
    got = gpt.lm_loss(logits, targets)
    (g_got,) = torch.autograd.grad(got, logits)
    ref = F.cross_entropy(logits.float().reshape(-1, 50), targets.reshape(-1))
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(g_got, g_ref)


def test_rmsnorm_matches_the_fp32_formula():
    torch.manual_seed(0)
    norm = gpt.RMSNorm(16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
    torch.testing.assert_close(norm.double()(x), ref)
    xb = x.to(torch.bfloat16)
    out = gpt.RMSNorm(16)(xb)
    assert out.dtype == torch.bfloat16  # the stream's dtype, not fp32


def test_sdpa_gqa_equals_repeated_kv_heads():
    torch.manual_seed(0)
    shape = ModelShape(layers=1, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=50)
    attn = gpt.Attention(shape).double()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    cos, sin = (t.double() for t in gpt.rotary_tables(shape.dim_head, 6))
    got = attn(x, cos, sin)
    b, s, _ = x.shape
    q = gpt.apply_rotary(attn.wq(x).view(b, s, -1, 8), cos, sin).transpose(1, 2)
    k = gpt.apply_rotary(attn.wk(x).view(b, s, -1, 8), cos, sin).transpose(1, 2)
    v = attn.wv(x).view(b, s, -1, 8).transpose(1, 2)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    ref = attn.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
    torch.testing.assert_close(got, ref)


def test_rotary_is_a_rotation_of_pairs():
    cos, sin = gpt.rotary_tables(4, 3)
    x = torch.randn(1, 3, 2, 4)
    y = gpt.apply_rotary(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # rotations keep lengths
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position 0: angle 0


def test_residual_stream_is_bf16_under_autocast():
    shape = ModelShape(layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=50)
    model = gpt.DecoderLM(shape, 8)
    seen = []
    model.blocks["1"].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 50, (1, 8)))
    assert seen == [torch.bfloat16]


def test_vocabulary_is_built_padded():
    shape = ModelShape(layers=1, hidden=16, heads=2, ffn_hidden=32, vocab=50, vocab_multiple=64, tie_embeddings=True)
    model = gpt.DecoderLM(shape, 8)
    assert model.tok_emb.weight.shape[0] == model.head.weight.shape[0] == 64
    assert model(torch.randint(0, 50, (1, 8))).shape[-1] == 64
    assert int(gpt.random_batch(0, 0, 4, 8, shape.vocab).max()) < 50  # targets never a padding row
