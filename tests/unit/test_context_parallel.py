"""Context parallelism (strategy cp): the load-balanced split, its positions and causal
mask by hand, the layout and its refusals. The run itself (cp=2 x dp=2 on 4 gloo ranks,
checked against the reference, with its injected bug) is in suites/modern.toml
(tests/integration/test_modern.py)."""

import pytest
import torch

from mgbench import suite as S
from mgbench.layout import Layout
from mgbench.layout import for_strategy
from mgbench.strategies.context_parallel import SequenceShard, causal_mask, local_positions
from mgbench.workloads.gpt import DecoderLM
from mgbench.model_shape import ModelShape
from tests.factories import make_config


def test_load_balanced_split_by_hand():
    # seq 16, cp 2: 4 chunks of 4; rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2.
    assert local_positions(16, 2, 0) == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(16, 2, 1) == [4, 5, 6, 7, 8, 9, 10, 11]
    # cp 4 on 16 tokens: 8 chunks of 2; rank r takes chunks r and 7 - r.
    assert [local_positions(16, 4, r) for r in range(4)] == [
        [0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    # Every position exactly once over the group, and the same causal work on every rank
    # (sum over its queries of the keys each sees: positions + 1).
    for cp in (2, 4):
        ranks = [local_positions(32, cp, r) for r in range(cp)]
        assert sorted(p for r in ranks for p in r) == list(range(32))
        assert len({sum(p + 1 for p in r) for r in ranks}) == 1
    with pytest.raises(ValueError, match="not divisible by 2 x cp = 4"):
        local_positions(10, 2, 0)


def test_causal_mask_follows_global_positions():
    # seq 8, cp 2: rank 0 holds positions [0, 1, 6, 7], rank 1 [2, 3, 4, 5]; the gathered
    # keys arrive as rank 0's then rank 1's: positions [0, 1, 6, 7, 2, 3, 4, 5].
    m = causal_mask(8, 2, 1)
    assert m.shape == (4, 8)
    # Query at position 2 sees keys 0, 1, 2 (gathered slots 0, 1, 4).
    assert m[0].tolist() == [True, True, False, False, True, False, False, False]
    # Query at position 5 sees 0..5 (every slot but positions 6 and 7).
    assert m[3].tolist() == [True, True, False, False, True, True, True, True]
    m0 = causal_mask(8, 2, 0)
    assert m0[1].tolist() == [True, True, False, False, False, False, False, False]  # position 1
    assert m0[3].tolist() == [True] * 8  # position 7 sees everything
    # Each query sees exactly (its position + 1) keys.
    assert m0.sum(1).tolist() == [1, 2, 7, 8] and m.sum(1).tolist() == [3, 4, 5, 6]


def test_sharded_rotary_positions_match_the_full_sequence():
    """A model given a rank's global positions rotates its tokens as the full-sequence
    model does (positions index the rotary tables, not 0..local-1)."""
    shape = ModelShape(layers=1, hidden=32, heads=2, kv_heads=2, ffn_hidden=64, vocab=64)
    model = DecoderLM(shape, max_seq_len=8)
    tokens = torch.arange(8)[None, :]
    shard = SequenceShard(torch.tensor(local_positions(8, 2, 1)))
    x, y = shard(tokens, tokens + 1)
    assert x.tolist() == [[2, 3, 4, 5]] and y.tolist() == [[3, 4, 5, 6]]
    seen = {}
    attn = model.blocks["0"].attn
    attn.attend = lambda q, k, v: seen.setdefault("q", q) * 0  # capture the rotated queries
    model.positions = shard.index
    model(x)
    local_q = seen.pop("q")
    model.positions = None
    model(tokens)
    assert torch.allclose(local_q, seen["q"][:, :, 2:6])


def test_cp_layout_degrees_and_label():
    assert for_strategy("cp", 4, None)[0] == Layout.of(dp=2, cp=2)
    assert for_strategy("cp", 4, {"cp": 4})[0] == Layout.of(dp=1, cp=4)
    assert Layout.of(dp=2, cp=2).world == 4
    cfg = make_config(strategy="cp", nproc=4, layout={"cp": 2}, model="tiny", seq_len=32)
    assert (cfg.dp, cfg.cp, cfg.global_batch) == (2, 2, 2 * cfg.grad_accum * cfg.micro_batch)  # dp samples only
    assert "[dp=2 cp=2]" in cfg.label
    assert ("cp", 2) in cfg.identity() and cfg.params()["cp"] == 2
    other = make_config(strategy="cp", nproc=4, layout={"cp": 4}, model="tiny", seq_len=32)
    assert other.config_id != cfg.config_id


def test_cp_refusals_fire_with_one_line_each():
    text = """name = "x"
[sweep]
model = { layers = 2, hidden = 64, heads = 4, kv_heads = 4, ffn_hidden = 176, vocab = 256 }
strategy = "cp"
nproc = 4
seq_len = [30, 32]
compile = [false, true]
layout = [{cp = 2}, {cp = 3}]
"""
    by = {(c.seq_len, c.compile, c.cp, c.dp): c.skip_reason for c in S.expand(S.parse_suite(text, "x.toml"), "cpu", 4)}
    assert by[(32, False, 2, 2)] is None
    assert "cp=2 needs seq_len divisible by 2 x cp = 4" in by[(30, False, 2, 2)]
    assert "compile = true is not wired to cp" in by[(32, True, 2, 2)]
    assert "degrees multiply to 3, not 4" in by[(32, False, 3, 1)]
    assert all("\n" not in (r or "") for r in by.values())
    moe = S.expand(S.parse_suite('name = "x"\n[sweep]\nmodel = "tiny-moe"\nstrategy = "cp"\nnproc = 4\n', "x"),
                   "cpu", 4)
    assert "MoE models run under" in moe[0].skip_reason
    with pytest.raises(Exception, match="unknown degree 'cq'; allowed: dp, tp, pp, ep, cp"):
        S.parse_suite('[sweep]\nlayout = {cq = 2}', "t.toml")
