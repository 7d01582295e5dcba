import numpy as np
import pytest

from mgbench import suite as S
from mgbench.layout import Layout, for_strategy
from mgbench.strategies.pipeline import chunk_layers, stage_module
from mgbench.strategies.schedules import theoretical_bubble
from mgbench.workloads.gpt import DecoderLM
from mgbench.model_shape import ModelShape
from mgbench.strategies import REGISTRY
from tests.factories import make_config


def test_validator_names_every_degree_and_the_world():
    (msg,) = Layout.of(dp=2, tp=2, pp=2).runner_problems(4)
    assert msg == ("layout dp=2 x tp=2 x pp=2 on world size 4: degrees multiply to 8, not 4; choose degrees whose "
                   "product dp x tp x pp x cp is 4")


@pytest.mark.parametrize(
    "dims,kw,expected",
    [
        (Layout.of(tp=3, dp=1), {"heads": 8}, "tp=3 does not divide the 8 attention heads"),
        (Layout.of(tp=2), {"kv_heads": 1}, "tp=2 does not divide the 1 kv heads"),
        (Layout.of(pp=8), {"layers": 4}, "pp=8 x 1 virtual stage(s) exceeds the 4 layers"),
        (Layout.of(pp=2), {"layers": 4, "virtual_stages": 4}, "pp=2 x 4 virtual stage(s) exceeds the 4 layers"),
        (Layout.of(pp=4), {"num_microbatches": 2}, "2 micro-batches cannot fill 4 pipeline stages"),
        (Layout.of(tp=2), {"vocab": 255}, "does not divide the vocabulary 255"),
    ],
)
def test_validator_problems(dims, kw, expected):
    problems = dims.runner_problems(dims.world, **kw)
    assert any(expected in p for p in problems), problems


def test_valid_layout_has_no_problems():
    assert Layout.of(dp=2, tp=2, pp=2).runner_problems(8, layers=8, heads=8, kv_heads=2, ffn_hidden=64, vocab=256,
                                                    num_microbatches=4) == []


def test_strategy_default_degrees():
    assert for_strategy("tp", 4, None)[0] == Layout.of(tp=4)
    assert for_strategy("pp", 4, None)[0] == Layout.of(pp=4)
    assert for_strategy("fsdp+tp", 8, None)[0] == Layout.of(dp=4, tp=2)
    assert for_strategy("pp+tp+dp", 8, None)[0] == Layout.of(dp=2, tp=2, pp=2)
    assert for_strategy("fsdp+tp", 4, {"dp": 1, "tp": 4})[0] == Layout.of(dp=1, tp=4)
    assert for_strategy("ddp", 4, None)[0] == Layout.of(dp=4)
    assert "data parallel only" in for_strategy("ddp", 4, {"tp": 2})[1]
    assert "also names pp" in for_strategy("fsdp+tp", 4, {"pp": 2, "tp": 2})[1]


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


# -- one layout type (issue 31, item 2) -------------------------------------------------------


@pytest.mark.parametrize("strategy", [s.name for s in REGISTRY])
def test_every_strategy_goes_to_a_layout_and_back_through_the_registry(strategy):
    """A runner config's Layout (degrees, ZeRO stage, sequence parallelism, HSDP) names its
    strategy again: the registry's facts are the whole conversion, in both directions."""
    s = next(x for x in REGISTRY if x.name == strategy)
    nproc = 1 if s.degrees == () else 8
    extra = {"model": "tiny-moe"} if s.prepare == "expert_parallel" else {}
    cfg = make_config(strategy=strategy, nproc=nproc, **extra)
    layout = Layout.from_config(cfg)
    assert layout.num_gpus == nproc and layout.degrees() == {k: getattr(cfg, k) for k in ("dp", "tp", "pp", "ep", "cp")}
    assert layout.zero == cfg.zero_stage
    assert layout.runner_strategy() == (strategy, None)


def test_pp_tp_dp_replicas_follow_dp_mode():
    for mode, zero, replicas in (("ddp", 0, 1), ("fsdp", 3, 1), ("hsdp", 3, 2)):
        lay = Layout.from_config(make_config(strategy="pp+tp+dp", nproc=16, dp_mode=mode, replicas=2))
        assert (lay.zero, lay.replicas, lay.fsdp_enabled) == (zero, replicas, zero == 3)
        assert lay.runner_strategy() == ("pp+tp+dp", None)


def test_a_layout_no_runner_strategy_trains_says_why():
    name, why = Layout(num_gpus=8, tp=2, pp=2, zero=1).runner_strategy()
    assert name is None and "not ZeRO-1" in why
    name, why = Layout(num_gpus=8, tp=2, zero=0).runner_strategy()
    assert name is None and "fsdp+tp" in why


def test_properties_answer_per_row_of_a_vectorised_layout():
    """plan's search holds its candidates as one Layout of arrays: the same properties."""
    lay = Layout(num_gpus=np.array([8, 16, 16]), tp=np.array([1, 2, 8]), pp=np.array([1, 2, 1]),
                 zero=np.array([0, 3, 1]), micro_batch=np.array([1, 2, 1]), global_batch=32)
    assert lay.dp.tolist() == [8, 4, 2]
    assert lay.num_micro.tolist() == [4, 4, 16]
    assert lay.fsdp_enabled.tolist() == [False, True, False]
    assert lay.pipelined.tolist() == [False, True, False]
    row = lay.take(lay.fsdp_enabled).row(0)
    assert row == Layout(num_gpus=16, tp=2, pp=2, zero=3, micro_batch=2, global_batch=32)
    assert row.dp == 4 and row.fsdp_enabled is True


def test_model_kwargs_are_what_the_models_take():
    """Every keyword Layout.model_kwargs gives is a parameter of the step model and of the
    memory model (one conversion, no second list of keywords to forget)."""
    import inspect

    from mgbench.planner.layout_time import step_time
    from mgbench.planner.memory import memory_per_gpu

    kw = Layout(recompute="selective").model_kwargs()
    assert kw["recompute"] == 3
    for fn in (step_time, memory_per_gpu):
        assert set(kw) <= set(inspect.signature(fn).parameters), fn.__name__


def test_a_published_row_becomes_its_layout():
    # Megatron-Bridge's H100 Qwen3-30B-A3B row: 16 GPUs, PP 2 with 24 virtual stages, EP 8,
    # GBS 512 of MBS 2: dp 8 and 512 / (2 x 8) = 32 micro-batches; no tp, so no sequence
    # parallelism.
    row = {"num_gpus": 16, "pp": 2, "ep": 8, "zero": 1, "micro_batch": 2, "seq": 4096, "global_batch": 512,
           "precision": "fp8", "recompute": "none", "schedule": "interleaved", "virtual_stages": 24}
    lay = Layout.from_published(row)
    assert (lay.tp, lay.pp, lay.dp, lay.ep, lay.cp) == (1, 2, 8, 8, 1)
    assert lay.num_micro == 32 and lay.virtual_stages == 24 and lay.sequence_parallel is False
    assert Layout.from_published({**row, "tp": 2, "num_gpus": 32}).sequence_parallel is True
    # FSDP2's CPU offload where the row says so (torchtitan's enable_cpu_offload), else none.
    assert lay.offload is False and Layout.from_published({**row, "zero": 3, "offload": True}).offload is True
