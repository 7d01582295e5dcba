"""Tensor parallelism of Hugging Face models by their own plan (mgbench/workloads/hf_tp.py):
the style mapping, the plan's path patterns, what is refused with the reason, and the
placements the plan gives a tiny Llama (the 2-rank run against the reference is in
tests/integration/test_hf_vision_cpu.py)."""

import importlib.util
import json

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from mgbench.suite import expand, parse_suite
from mgbench.workloads import hf_tp
from tests.factories import make_config

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
NO_TRANSFORMERS = "transformers is not installed (the optional extra mgbench[hf])"
LLAMA = {"hf": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn_hidden": 64, "vocab": 64}


def test_plan_styles_map_onto_torch_styles():
    col, row = hf_tp.torch_style("colwise"), hf_tp.torch_style("rowwise")
    assert type(col) is ColwiseParallel and col.output_layouts == (Shard(-1),)
    assert type(row) is RowwiseParallel and row.input_layouts == (Shard(-1),) and row.output_layouts == (Replicate(),)
    head = hf_tp.torch_style("colwise_gather_output")
    assert type(head) is ColwiseParallel and head.output_layouts == (Replicate(),)
    emb = hf_tp.torch_style("embedding_rowwise")
    assert type(emb) is RowwiseParallel and emb.input_layouts == (Replicate(),) and emb.output_layouts == (Replicate(),)


def test_an_unknown_plan_style_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="'packed_colwise'"):
        hf_tp.torch_style("packed_colwise")
    why = hf_tp.style_problem({"layers.*.mlp.gate_up_proj": "packed_colwise", "layers.*.o_proj": "rowwise"})
    assert "layers.*.mlp.gate_up_proj = 'packed_colwise'" in why and "o_proj" not in why
    assert hf_tp.style_problem({"layers.*.o_proj": "rowwise"}) is None


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)  # without it every HF config is skipped for that
def test_a_config_whose_plan_has_an_unknown_style_is_skipped_with_the_reason(tmp_path):
    conf = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4,
            "base_model_tp_plan": {"layers.*.self_attn.q_proj": "colwise", "layers.*.mlp.up_proj": "moe_tp_experts"}}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    suite = parse_suite('[sweep]\nmodel = "hf:config.json"\nstrategy = ["tp", "ddp"]\nnproc = 2\n',
                        str(tmp_path / "suite.toml"))
    got = {c.strategy: c.skip_reason for c in expand(suite, "cpu", 2)}
    assert "layers.*.mlp.up_proj = 'moe_tp_experts'" in got["tp"] and got["ddp"] is None


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_models_without_a_plan_and_tp_sp_stay_skipped_with_the_reason():
    text = """
[[sweep]]
model = { hf = "gpt2", layers = 2, hidden = 32, heads = 2, vocab = 64 }
strategy = "tp"
nproc = 2
seq_len = 16
[[sweep]]
model = { hf = "llama", layers = 2, hidden = 32, heads = 4, ffn_hidden = 64, vocab = 64 }
strategy = ["tp", "tp_sp", "fsdp+tp"]
nproc = 2
seq_len = 16
"""
    got = {(c.model.arch, c.strategy): c.skip_reason for c in expand(parse_suite(text), "cpu", 2)}
    assert "gpt2 configs have no tensor-parallel plan" in got[("gpt2", "tp")]
    assert "tp_sp is not wired to them" in got[("llama", "tp_sp")]
    assert got[("llama", "tp")] is None and got[("llama", "fsdp+tp")] is None


def test_plan_patterns_match_one_path_component_per_star():
    names = ["model.layers.0.self_attn.q_proj", "model.layers.11.self_attn.q_proj", "model.layers.0.mlp.up_proj",
             "model.layers.0.self_attn.q_proj.lora", "model.layers.0.block.self_attn.q_proj", "lm_head"]
    got = hf_tp.expand({"model.layers.*.self_attn.q_proj": "colwise", "lm_head": "colwise_gather_output"}, names)
    assert got == {"model.layers.0.self_attn.q_proj": "colwise", "model.layers.11.self_attn.q_proj": "colwise",
                   "lm_head": "colwise_gather_output"}
    # A plan entry that splits nothing would run a replicated layer under a tp label.
    with pytest.raises(ValueError, match="matches no module"):
        hf_tp.expand({"model.layers.*.attn.c_attn": "colwise"}, names)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_the_plan_table_matches_the_installed_transformers():
    """HAS_TP_PLAN (read by the torch-free suite validator) against the config classes,
    and every style of each planned model's whole plan is one mgbench maps."""
    from transformers import AutoConfig

    from mgbench.workloads import HF_DIM_KEYS
    from mgbench.workloads.hf import build

    assert set(hf_tp.HAS_TP_PLAN) == set(HF_DIM_KEYS)
    for arch, has in hf_tp.HAS_TP_PLAN.items():
        assert bool(type(AutoConfig.for_model(arch)).base_model_tp_plan) == has, arch
        if has:
            with torch.device("meta"):
                model = build(make_config(model={**LLAMA, "hf": arch}))
            plan = hf_tp.model_plan(model.lm)
            assert hf_tp.style_problem(plan) is None and "lm_head" in plan, (arch, plan)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_the_plan_splits_a_tiny_llama_as_it_says():
    """On a 1-rank mesh (in this process): every planned module's weight becomes a DTensor
    split the way its style says; norms stay plain tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from mgbench.workloads.hf import build

    model = build(make_config(model=LLAMA, strategy="tp"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        hf_tp.apply_tensor_parallel(model, init_device_mesh("cpu", (1,)), sequence_parallel=False)
        placements = {n: p.placements for n, p in model.named_parameters() if isinstance(p, DTensor)}
        plain = sorted(n for n, p in model.named_parameters() if not isinstance(p, DTensor))
        logits = model(torch.zeros(1, 4, dtype=torch.long))
    finally:
        dist.destroy_process_group()
    assert type(logits) is torch.Tensor and logits.shape == (1, 4, 64)  # full logits for the loss
    for i in range(2):
        layer = f"lm.model.layers.{i}."
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            assert placements.pop(layer + proj + ".weight") == (Shard(0),)  # output features
        for proj in ("self_attn.o_proj", "mlp.down_proj"):
            assert placements.pop(layer + proj + ".weight") == (Shard(1),)  # input features
    assert placements.pop("lm.model.embed_tokens.weight") == (Shard(0),)  # vocabulary
    assert placements.pop("lm.lm_head.weight") == (Shard(0),)
    assert placements == {}
    assert all("norm" in n for n in plain) and len(plain) == 5


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_tied_embeddings_and_sequence_parallel_are_refused_on_the_rank_too():
    """The suite skips both; a config reaching the rank anyway is refused, not mis-trained
    (splitting the embedding and the head separately would untie their one weight)."""
    from mgbench.workloads.hf import build

    tied = build(make_config(model={**LLAMA, "tie_embeddings": True}))
    with pytest.raises(ValueError, match="tied embeddings"):
        hf_tp.apply_tensor_parallel(tied, None, sequence_parallel=False)
    with pytest.raises(ValueError, match="sequence parallelism"):
        hf_tp.apply_tensor_parallel(build(make_config(model=LLAMA)), None, sequence_parallel=True)
