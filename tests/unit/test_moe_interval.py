"""MoE layers interleaved with dense ones (ModelShape.moe_interval; Llama 4 Maverick:
every second layer), counted in the spec, the planner's stage terms, the Hugging Face
reader and the runner's model."""
import dataclasses
import json
from pathlib import Path

import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.hf_config import shape_from_file
from mgbench.model_shape import ModelShape
from mgbench.planner import perf
from mgbench.planner.memory import stage_param_split


def _maverick() -> ModelShape:
    return catalog.model_shape("llama-4-maverick")


def test_maverick_has_its_published_parameter_counts_with_every_second_layer_moe():
    m = _maverick()
    assert m.moe_layers == 24 and [i for i in range(6) if m.is_moe_layer(i)] == [1, 3, 5]
    # Meta: 400B total, 17B active (two digits each); 0.5% of the tolerance.
    assert m.num_params() / 400e9 == pytest.approx(1.0, abs=0.005)
    assert m.num_active_params() / 17e9 == pytest.approx(1.0, abs=0.02)
    # By hand: 24 dense blocks of attention + 3 h x 16384 and 24 MoE blocks of attention,
    # router, 128 + 1 experts of 3 h x 8192; embedding and head of 202048 x 5120.
    h = 5120
    attn = h * 40 * 128 * 2 + h * 8 * 128 * 2
    dense = 24 * (attn + 2 * h + 3 * h * 16384)
    moe = 24 * (attn + 2 * h + h * 128 + 129 * 3 * h * 8192)
    assert m.num_params() == dense + moe + 2 * 202048 * h + h
    # Every layer MoE would be twice the experts: the interval is what the count rests on.
    every = dataclasses.replace(m, moe_interval=1)
    assert every.num_expert_params() == 2 * m.num_expert_params()


def test_a_stage_holds_one_moe_layer_in_every_interval():
    m = _maverick()
    assert float(m.stage_moe_layers(24)) == 12 and float(m.stage_moe_layers(5)) == 3
    assert float(dataclasses.replace(m, moe_interval=1).stage_moe_layers(24)) == 24
    # Memory: a 2-stage pipeline's stage holds 12 layers of experts, not 24.
    _, experts = stage_param_split(m, tp=1, pp=2, ep=64)
    assert float(experts) == pytest.approx(12 * 128 * m.expert_params() / 64)


def test_interleaved_dense_layers_keep_their_tensor_parallel_collectives():
    # With a shared expert every layer's MLP runs them (Maverick); without, only the dense half.
    m = _maverick()
    assert float(perf.collective_counts(48, 4, 1, 1, 0, 1, 0, shape=m)["tp"]) == 4 * 48
    no_shared = dataclasses.replace(m, shared_experts=0)
    assert float(perf.tp_mlp_layers(no_shared, 48)) == 24
    assert float(perf.collective_counts(48, 4, 1, 1, 0, 1, 0, shape=no_shared)["tp"]) == 2 * 48 + 2 * 24


def test_a_bad_interval_is_refused_with_what_to_set():
    with pytest.raises(MgbenchError, match="moe_interval must be an integer >= 1"):
        dataclasses.replace(_maverick(), moe_interval=0)
    with pytest.raises(MgbenchError, match="leaves no MoE layer"):
        ModelShape(layers=4, hidden=64, heads=4, ffn_hidden=128, vocab=256, experts=4, top_k=1, moe_interval=5)
    with pytest.raises(MgbenchError, match="apply to MoE models only"):
        ModelShape(layers=4, hidden=64, heads=4, ffn_hidden=128, vocab=256, moe_interval=2)


def test_the_interval_left_at_one_keeps_config_ids():
    # A neutral value is left out of to_dict, so every config id hashed before it existed stays.
    m = catalog.model_shape("qwen3-30b-a3b")
    assert "moe_interval" not in m.to_dict()
    assert _maverick().to_dict()["moe_interval"] == 2
    assert ModelShape.from_dict(_maverick().to_dict()) == _maverick()


def test_a_qwen_moe_config_with_a_sparse_step_reads_as_the_interval(tmp_path):
    base = json.loads((Path(__file__).parents[1] / "fixtures" / "hf" / "published" / "qwen3-30b-a3b"
                       / "config.json").read_text())
    stepped = tmp_path / "config.json"
    stepped.write_text(json.dumps({**base, "decoder_sparse_step": 2}))
    s = shape_from_file(stepped)
    assert s.moe_interval == 2 and s.moe_layers == 24
    # With leading dense layers its phase would differ from moe_interval's: refused.
    mixed = tmp_path / "mixed" / "config.json"
    mixed.parent.mkdir()
    mixed.write_text(json.dumps({**base, "decoder_sparse_step": 2, "mlp_only_layers": [0]}))
    with pytest.raises(MgbenchError, match="MoE every k-th layer"):
        shape_from_file(mixed)


def test_a_deepseek_config_with_moe_every_kth_layer_is_refused(tmp_path):
    # DeepSeek's moe_layer_freq puts MoE layers at index % k == 0 past the dense ones, a phase
    # moe_interval does not have: refused in one line naming both.
    base = json.loads((Path(__file__).parents[1] / "fixtures" / "hf" / "published" / "deepseek-v3"
                       / "config.json").read_text())
    assert shape_from_file(Path(__file__).parents[1] / "fixtures" / "hf" / "published" / "deepseek-v3"
                           / "config.json").moe_interval == 1
    freq = tmp_path / "config.json"
    freq.write_text(json.dumps({**base, "moe_layer_freq": 2}))
    with pytest.raises(MgbenchError, match="moe_layer_freq 2 .* is not modelled.*moe_interval"):
        shape_from_file(freq)


def test_the_runners_model_builds_the_interleaved_layers_with_the_specs_parameters():
    import torch

    from mgbench.workloads.gpt import DecoderLM
    from mgbench.workloads.moe import MoE

    shape = ModelShape(layers=4, hidden=32, heads=4, ffn_hidden=64, vocab=128, experts=4, top_k=1,
                       expert_ffn_hidden=16, shared_experts=1, moe_interval=2)
    model = DecoderLM(shape, max_seq_len=8)
    kinds = [isinstance(model.blocks[str(i)].mlp, MoE) for i in range(4)]
    assert kinds == [False, True, False, True]
    assert sum(p.numel() for p in model.parameters()) == shape.num_params()
    assert model(torch.randint(0, 128, (2, 8))).shape == (2, 8, 128)


def _llama4_config(step: int, experts: int) -> dict:
    # The shape of meta-llama/Llama-4-{Maverick-17B-128E,Scout-17B-16E}'s config.json: a
    # multimodal wrapper whose text_config transformers' Llama4TextConfig reads.
    return {"model_type": "llama4", "vision_config": {"num_hidden_layers": 34, "hidden_size": 1408},
            "text_config": {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
                            "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                            "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
                            "num_local_experts": experts, "num_experts_per_tok": 1,
                            "interleave_moe_layer_step": step, "attention_chunk_size": 8192,
                            "tie_word_embeddings": False}}


def test_a_llama4_config_reads_as_the_preset_its_vision_tower_left_out(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_llama4_config(2, 128)))
    s = shape_from_file(path)
    preset = _maverick()
    assert {k: v for k, v in s.to_dict().items() if k != "name"} == \
        {k: v for k, v in preset.to_dict().items() if k != "name"}
    assert "vision tower" in (s.left_out or "")
    # Scout: every layer MoE, 16 experts: 109B total, 17B active (Meta's model card); the
    # language model is 107.8B of it, the rest its vision tower (34 layers of 1408), which is
    # left out.
    path.write_text(json.dumps(_llama4_config(1, 16)))
    scout = shape_from_file(path)
    assert scout.moe_layers == 48
    assert scout.num_params() == pytest.approx(107.77e9, rel=1e-3) and scout.num_params() < 109e9
    assert scout.num_active_params() / 17e9 == pytest.approx(1.0, abs=0.02)
    # An explicit moe_layers list other than the interleave's is refused, not misread.
    cfg = _llama4_config(2, 128)
    cfg["text_config"]["moe_layers"] = [0, 2, 4]
    path.write_text(json.dumps(cfg))
    with pytest.raises(MgbenchError, match="only MoE every k-th layer from the k-th"):
        shape_from_file(path)


def test_the_command_line_takes_the_interval_and_refuses_one_that_leaves_no_moe_layer():
    from click.testing import CliRunner

    from mgbench.cli import main

    dims = ["memory", "--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "256", "--experts", "4",
            "--top-k", "1", "--num-gpus", "1"]
    ok = CliRunner().invoke(main, dims + ["--moe-interval", "2"])
    assert ok.exit_code == 0 and "MoE every 2 layers (2 of 4)" in ok.output
    bad = CliRunner().invoke(main, dims + ["--moe-interval", "5"])
    assert bad.exit_code == 2 and "leaves no MoE layer" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize("pp,v", [(1, 1), (2, 1), (4, 1), (2, 12), (4, 4), (8, 2), (3, 4), (6, 2)])
def test_a_ranks_moe_layers_are_the_busiest_ranks_of_its_interleaved_chunks(pp, v):
    # An interleaved schedule gives rank r the chunks r, r + pp, ...; with 3-block chunks at
    # interval 2 some ranks hold 2 MoE layers a chunk (a review found 6 priced where 8 sat).
    m = _maverick()
    c = m.layers // (pp * v)
    per_rank = [sum(m.is_moe_layer(i) for k in range(v) for i in range((k * pp + r) * c, (k * pp + r) * c + c))
                for r in range(pp)]
    assert float(m.stage_moe_layers(c * v, v)) == max(per_rank)


def test_memory_prices_the_busiest_ranks_experts_under_virtual_stages():
    m = _maverick()
    _, plain = stage_param_split(m, tp=1, pp=4, ep=8)
    _, interleaved = stage_param_split(m, tp=1, pp=4, ep=8, chunks=4)
    # 12 blocks a rank: 6 MoE layers as one run, 8 as four runs of 3.
    assert float(interleaved) == pytest.approx(float(plain) * 8 / 6)


def test_chunked_attention_is_priced_no_dearer_than_a_window_of_the_chunk():
    # At 8192 tokens a chunk is the whole sequence (the published rows' length: nothing moves);
    # at 32768 the window of 8192 on 36 of 48 layers prices far fewer score FLOPs than global.
    m = _maverick()
    glob = dataclasses.replace(m, sliding_window=None, global_every=0)
    assert m.flops_per_token(8192) == pytest.approx(glob.flops_per_token(8192))
    assert m.flops_per_token(32768) < glob.flops_per_token(32768)
