import pytest

from mgbench import suite as S
from mgbench.parallel_dims import ParallelDims
from mgbench.strategies import dims_for
from mgbench.strategies.pipeline import chunk_layers, stage_module
from mgbench.strategies.schedules import theoretical_bubble
from mgbench.workloads.gpt import DecoderLM
from mgbench.model_shape import ModelShape


def test_validator_names_every_degree_and_the_world():
    (msg,) = ParallelDims(dp=2, tp=2, pp=2).problems(4)
    assert msg == "layout dp=2 x tp=2 x pp=2 on world size 4: degrees multiply to 8, not 4"


@pytest.mark.parametrize(
    "dims,kw,expected",
    [
        (ParallelDims(tp=3, dp=1), {"heads": 8}, "tp=3 does not divide the 8 attention heads"),
        (ParallelDims(tp=2), {"kv_heads": 1}, "tp=2 does not divide the 1 kv heads"),
        (ParallelDims(pp=8), {"layers": 4}, "pp=8 x 1 virtual stage(s) exceeds the 4 layers"),
        (ParallelDims(pp=2), {"layers": 4, "virtual_stages": 4}, "pp=2 x 4 virtual stage(s) exceeds the 4 layers"),
        (ParallelDims(pp=4), {"num_microbatches": 2}, "2 micro-batches cannot fill 4 pipeline stages"),
        (ParallelDims(tp=2), {"vocab": 255}, "does not divide the vocabulary 255"),
    ],
)
def test_validator_problems(dims, kw, expected):
    problems = dims.problems(dims.world, **kw)
    assert any(expected in p for p in problems), problems


def test_valid_layout_has_no_problems():
    assert ParallelDims(dp=2, tp=2, pp=2).problems(8, layers=8, heads=8, kv_heads=2, ffn_hidden=64, vocab=256,
                                                    num_microbatches=4) == []


def test_strategy_default_degrees():
    assert dims_for("tp", 4, None)[0] == ParallelDims(tp=4)
    assert dims_for("pp", 4, None)[0] == ParallelDims(pp=4)
    assert dims_for("fsdp+tp", 8, None)[0] == ParallelDims(dp=4, tp=2)
    assert dims_for("pp+tp+dp", 8, None)[0] == ParallelDims(dp=2, tp=2, pp=2)
    assert dims_for("fsdp+tp", 4, {"dp": 1, "tp": 4})[0] == ParallelDims(dp=1, tp=4)
    assert dims_for("ddp", 4, None)[0] == ParallelDims(dp=4)
    assert "data parallel only" in dims_for("ddp", 4, {"tp": 2})[1]
    assert "also names pp" in dims_for("fsdp+tp", 4, {"pp": 2, "tp": 2})[1]


def test_impossible_layouts_are_skipped_with_one_line_each():
    text = """name = "x"
[sweep]
model = { layers = 4, hidden = 64, heads = 8, kv_heads = 8, ffn_hidden = 96, vocab = 240 }
strategy = ["fsdp+tp", "pp"]
nproc = 4
grad_accum = 4
layout = [{dp = 2, tp = 2}, {dp = 1, tp = 3}, {dp = 3, tp = 2}, {pp = 8}]
"""
    configs = S.expand(S.parse_suite(text, "x.toml"), "cpu", 4)
    by = {(c.strategy, c.dp, c.tp, c.pp): c.skip_reason for c in configs}
    assert by[("fsdp+tp", 2, 2, 1)] is None
    assert "tp=3 does not divide the 8 attention heads" in by[("fsdp+tp", 1, 3, 1)]
    assert "degrees multiply to 6, not 4" in by[("fsdp+tp", 3, 2, 1)]
    assert "exceeds the 4 layers" in by[("pp", 1, 1, 8)]
    assert all("\n" not in (r or "") for r in by.values())


def test_layout_key_validation():
    with pytest.raises(Exception, match="unknown degree 'tpp'"):
        S.parse_suite('[sweep]\nlayout = {tpp = 2}', "t.toml")


def test_global_batch_counts_data_parallel_replicas_only():
    text = 'name = "x"\n[sweep]\nmodel = "tiny"\nstrategy = "pp+tp+dp"\nnproc = 8\nmicro_batch = 2\ngrad_accum = 4\n'
    (cfg,) = S.expand(S.parse_suite(text, "x"), "cpu", 8)
    assert (cfg.dp, cfg.tp, cfg.pp) == (2, 2, 2)
    assert cfg.global_batch == 2 * 4 * 2


def test_chunks_are_balanced_by_layer_count():
    assert [len(r) for r in chunk_layers(8, 4)] == [2, 2, 2, 2]
    assert [list(r) for r in chunk_layers(5, 2)] == [[0, 1, 2], [3, 4]]


def test_stage_module_keeps_its_blocks_and_ends():
    shape = ModelShape(layers=4, hidden=32, heads=2, ffn_hidden=64, vocab=50)
    first = stage_module(DecoderLM(shape, 8), 0, 2)
    last = stage_module(DecoderLM(shape, 8), 1, 2)
    assert list(first.blocks.keys()) == ["0", "1"] and first.tok_emb is not None and first.head is None
    assert list(last.blocks.keys()) == ["2", "3"] and last.tok_emb is None and last.head is not None


def test_theoretical_bubble():
    assert theoretical_bubble(4, 8, "1f1b", 1) == pytest.approx(3 / 11)
    assert theoretical_bubble(4, 8, "gpipe", 1) == pytest.approx(3 / 11)
    assert theoretical_bubble(4, 8, "interleaved", 2) == pytest.approx(3 / 19)
