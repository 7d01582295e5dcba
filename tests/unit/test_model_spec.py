"""One model spec for runner and planner (issue 31): published Hugging Face configs read
without transformers give the published parameter counts; every model option is on
`memory`, `predict` and `plan`; head sizes other than hidden / heads, MLA, MTP, local
attention and selective recompute are priced; the runner refuses what it does not build;
a --system holding another GPU than --gpu is honoured and said."""

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgbench import catalog
from mgbench.cli import main
from mgbench.cli_options import MODEL_GROUP
from mgbench.errors import MgbenchError
from mgbench.hf_config import shape_from_file, shape_from_hf
from mgbench.layout import RECOMPUTE
from mgbench.model_shape import ModelShape
from mgbench.planner import hardware
from mgbench.planner import memory as M
from mgbench.planner import perf

PUBLISHED = Path(__file__).parents[1] / "fixtures" / "hf" / "published"
COUNTS = tomllib.loads((PUBLISHED / "counts.toml").read_text())


def _matches_published(ours: float, published: float, digits: int) -> bool:
    """Within 0.5%, or equal to the published figure at the digits it was published
    with (rounded or cut: "3.3B" may be 3.35B cut to two digits). A figure published
    to n significant digits says no more than that."""
    if abs(ours / published - 1.0) <= 0.005:
        return True
    unit = 10 ** (len(str(int(published))) - digits)  # the last published digit's place
    return round(ours / unit) * unit == published or int(ours // unit) * unit == published


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_published_configs_give_the_published_parameter_counts(name):
    pub = COUNTS[name]
    s = shape_from_file(PUBLISHED / name / "config.json")
    total = s.num_params() - (s.num_mtp_params() if pub.get("main_model_excludes_mtp") else 0)
    assert _matches_published(total, pub["total"], pub["digits"]), (total, pub["total"])
    if "active" in pub:
        active = s.num_active_params()
        if not pub["active_counts_input_embedding"]:
            active -= s.num_embedding_params()
        if pub.get("main_model_excludes_mtp"):
            active -= s.num_mtp_params(active=True)
        assert _matches_published(active, pub["active"], pub.get("active_digits", pub["digits"])), (active, pub["active"])
    if "total_with_mtp" in pub:
        assert s.num_params() == pytest.approx(pub["total_with_mtp"], rel=0.005)


def test_the_published_check_fails_on_a_wrong_count():
    # The comparison is not so loose that a wrong shape passes: one layer fewer is 3% off.
    assert not _matches_published(8_030_261_248 * 31 / 32, 8_030_261_248, 10)
    assert not _matches_published(3.46e9, 3.3e9, 2)  # neither 3.3 rounded nor cut
    assert _matches_published(3.353e9, 3.3e9, 2) and _matches_published(36.63e9, 37e9, 2)


def test_hand_counts_of_the_architectures_read_here():
    # gpt-oss-120b: head_dim 64 on hidden 2880 (45 would be hidden / heads), q 64 heads,
    # kv 8 heads, 128 experts of 3 x 2880 x 2880, router 2880 x 128.
    s = shape_from_file(PUBLISHED / "gpt-oss-120b")
    h, d = 2880, 64
    attn = h * 64 * d * 2 + h * 8 * d * 2
    layer = attn + 128 * 3 * h * h + h * 128 + 2 * h
    assert s.num_params() == 36 * layer + 2 * 201088 * h + h
    assert s.num_local_layers == 18 and s.sliding_window == 128
    # Gemma 2: GeGLU (three matrices), tied embeddings although the config leaves the key out.
    g = shape_from_file(PUBLISHED / "gemma-2-9b")
    assert g.gated_mlp and g.tie_embeddings and g.global_every == 2 and g.dim_head == 256
    # Mixtral: every layer MoE of width intermediate_size.
    m = shape_from_file(PUBLISHED / "mixtral-8x7b")
    assert (m.experts, m.top_k, m.moe_ffn_hidden, m.moe_layers) == (8, 2, 14336, 32)


def test_attention_flops_count_mla_widths_and_local_windows_by_hand():
    ds = catalog.model_shape("deepseek-v3")
    # MLA: q.k over 128 + 64 dims, the values over 128, 128 heads: 6 x s x 128 x (192 + 128) a
    # layer, for the 61 layers and the MTP module's block.
    assert ds.attention_flops_per_token(4096) == (61 + 1) * 6 * 4096 * 128 * (192 + 128)
    # The MTP module passes the shared head once more: never recomputed, on the last stage.
    assert perf.head_flops_per_token(ds) == 2 * 6 * 7168 * 129280
    none, full = (perf.hardware_flops_per_token(ds, 4096, RECOMPUTE.index(m)) for m in ("none", "full"))
    blocks_fwd = 2 * (ds.num_matmul_params() - ds.num_head_matmul_params()) + ds.attention_flops_per_token(4096) / 3
    assert full - none == pytest.approx(blocks_fwd)
    oss = catalog.model_shape("gpt-oss-120b")
    # 18 global layers over the whole sequence, 18 local ones over 128 tokens.
    per_key = 6 * 64 * (64 + 64)
    assert oss.attention_flops_per_token(8192) == per_key * (18 * 8192 + 18 * 128)
    assert oss.attention_flops_per_token(64) == per_key * 36 * 64  # shorter than the window: all alike
    # What a causal kernel computes: a global layer's query sees s / 2 keys on average, a
    # local one's all 128 of its window but the first 128 positions' (128 - 128^2 / 2s),
    # not half the window; shorter than the window, half the sequence.
    assert oss.causal_attention_flops_per_token(8192) == pytest.approx(per_key * (18 * 4096 + 18 * (128 - 1.0)))
    assert oss.causal_attention_flops_per_token(64) == pytest.approx(per_key * 36 * 32)
    h100 = hardware.resolve(system="dgx-h100")
    # the kernel is credited FlashAttention's 3.5 forward passes where the model counts 3, at
    # the default stack's kernel fraction at 8K (cuDNN on the GH100: 0.527)
    assert perf.flash_attention_s(oss, h100, 8192, 0, 1000.0) == pytest.approx(
        per_key * (18 * 4096 + 18 * 127) * 1000 * 3.5 / 3 / (h100.peak_tflops * 1e12 * 0.527))
    dense = catalog.model_shape("llama3-8b")  # full attention: PaLM's 12 L h s
    assert dense.attention_flops_per_token(2048) == 12 * 32 * 4096 * 2048


def test_hf_reader_errors_name_the_problem(tmp_path):
    with pytest.raises(MgbenchError, match="model_type 'mamba' is not read by mgbench; it reads .*deepseek_v3"):
        shape_from_hf({"model_type": "mamba"}, "m")
    with pytest.raises(MgbenchError, match="llama config lacks intermediate_size"):
        shape_from_hf({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                       "vocab_size": 10}, "m")
    with pytest.raises(MgbenchError, match="cannot read the config"):
        shape_from_file(tmp_path / "missing.json")
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(MgbenchError, match="is a JSON object"):
        shape_from_file(tmp_path)


def test_model_spec_checks_mla_and_local_attention_dims():
    base = dict(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=256)
    with pytest.raises(MgbenchError, match="needs qk_nope_head_dim"):
        ModelShape(**base, kv_lora_rank=16)
    with pytest.raises(MgbenchError, match="belong to multi-head latent attention"):
        ModelShape(**base, q_lora_rank=16)
    with pytest.raises(MgbenchError, match="global_every .* set sliding_window"):
        ModelShape(**base, global_every=2)
    with pytest.raises(MgbenchError, match="--head-dim"):
        ModelShape(layers=2, hidden=2880, heads=64, ffn_hidden=128, vocab=256)  # head dim 45
    # Neutral values stay out of a config's id (runner configs built before them keep theirs).
    assert set(ModelShape(**base).to_dict()) == {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                                                 "head_dim", "mlp", "tie_embeddings", "name"}


def test_the_runner_refuses_what_its_decoder_does_not_build():
    from mgbench.suite import parse_suite

    with pytest.raises(MgbenchError, match="does not build mtp_layers.*`mgbench run` cannot measure it"):
        parse_suite('[sweep]\nmodel = "deepseek-v3"\n')
    with pytest.raises(MgbenchError, match="does not build mlp = 'squared_relu'"):
        parse_suite('[sweep]\nmodel = {layers = 2, hidden = 64, heads = 4, ffn_hidden = 128, vocab = 256, '
                    'mlp = "squared_relu"}\n')
    assert catalog.model_shape("llama3-8b").runner_problem() is None


def _option_names(command) -> set[str]:
    ctx = command.make_context(command.name, ["--help"], resilient_parsing=True)
    return {o for p in command.get_params(ctx) for o in p.opts}


def test_every_model_option_is_on_plan_predict_and_memory():
    wanted = {o.flag for o in MODEL_GROUP}
    assert {"--hf", "--head-dim", "--kv-lora-rank", "--mtp-layers", "--sliding-window"} <= wanted
    for name in ("plan", "predict", "memory"):
        missing = wanted - _option_names(main.commands[name])
        assert not missing, f"{name} lacks {sorted(missing)}"


GPT_OSS_DIMS = ["--layers", "36", "--hidden", "2880", "--heads", "64", "--kv-heads", "8", "--head-dim", "64",
                "--vocab", "201088", "--experts", "128", "--top-k", "4", "--ffn-hidden", "2880"]


def test_plan_takes_a_hugging_face_config_and_dims_alike():
    r = CliRunner().invoke(main, ["plan", "--hf", str(PUBLISHED / "gpt-oss-120b" / "config.json"), "--tokens", "1e11",
                                  "--systems", "dgx-h100", "--max-gpus", "64", "--json"])
    assert r.exit_code == 0, r.output
    by_hf = json.loads(r.output)
    r = CliRunner().invoke(main, ["plan", *GPT_OSS_DIMS, "--sliding-window", "128", "--global-every", "2",
                                  "--expert-bias", "--glu-clamp", "7", "--tokens", "1e11", "--systems", "dgx-h100", "--max-gpus", "64", "--json"])
    assert r.exit_code == 0, r.output
    by_dims = json.loads(r.output)
    # The same model by either door: the same recommendation.
    assert by_hf["ranked"][0]["days"] == pytest.approx(by_dims["ranked"][0]["days"])


def test_predict_takes_a_head_size_other_than_hidden_over_heads():
    r = CliRunner().invoke(main, ["predict", *GPT_OSS_DIMS, "--system", "dgx-h100", "--num-gpus", "8", "--ep", "8",
                                  "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tokens_per_s"] > 0
    r = CliRunner().invoke(main, ["predict", *GPT_OSS_DIMS[:8], *GPT_OSS_DIMS[10:], "--system", "dgx-h100"])
    assert r.exit_code == 2 and "head dim 45 must be even" in r.output and "--head-dim" in r.output


def test_a_model_is_given_one_way():
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--hf", str(PUBLISHED / "llama-3.1-8b"),
                                  "--tokens", "1e9"])
    assert r.exit_code == 2 and "exactly one of --model NAME, --hf" in r.output
    r = CliRunner().invoke(main, ["plan", "--params", "8e9", "--tokens", "1e9"])
    assert r.exit_code == 2 and "plan needs the model's shape" in r.output


# --- selective recompute (Megatron-LM / NeMo's default) ------------------------------------

def test_selective_recompute_matches_korthikanti_table_2_by_hand():
    # GPT-3 175B (Korthikanti et al. 2022, table 3): a = 96, h = 12288, s = 2048, t = 8,
    # b = 1, 16-bit activations. Table 2, bytes per layer: tensor + sequence parallel
    # s b h (34 / t + 5 a s / (h t)); with selective recompute s b h 34 / t.
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    gpt3 = ModelShape(layers=96, hidden=h, heads=a, ffn_hidden=4 * h, vocab=51200, mlp="gelu")
    full = M.korthikanti_bytes_per_layer(gpt3, s, b, t, True, False, "bf16")
    sel = M.korthikanti_bytes_per_layer(gpt3, s, b, t, True, False, "bf16", selective=True)
    assert full == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)))
    assert sel == pytest.approx(s * b * h * 34 / t)
    # Tensor parallel without sequence parallel: s b h (10 + 24 / t) selective (table 2, row 4).
    assert M.korthikanti_bytes_per_layer(gpt3, s, b, t, False, False, "bf16", selective=True) == \
        pytest.approx(s * b * h * (10 + 24 / t))


def test_selective_recompute_drops_exactly_the_scores_from_the_planner_activations():
    gpt3 = ModelShape(layers=96, hidden=12288, heads=96, ffn_hidden=4 * 12288, vocab=51200, mlp="gelu")
    tokens, t = 2048, 8
    plain = M.layer_activations(gpt3, tokens, t, True, "bf16", flash=False, seq=2048)
    sel = M.layer_activations(gpt3, tokens, t, True, "bf16", flash=False, seq=2048, selective=True)
    # Korthikanti's 5 a s^2 b / t bytes of scores, softmax and dropout, and the fp32 LSE.
    assert plain - sel == pytest.approx(tokens * (5 * 96 * 2048 / t + M.LSE_BYTES * 96 / t))
    kw = dict(seq=2048, micro_batch=1, tp=8, pp=1, dp=1, flash=False, sp=True)
    mem = {rc: M.memory_per_gpu(gpt3, recompute=RECOMPUTE.index(rc), **kw)["activations_bytes"]
           for rc in ("none", "selective", "full")}
    assert mem["full"] < mem["selective"] < mem["none"]


def test_selective_recompute_adds_the_attention_forward_only():
    s = catalog.model_shape("llama3-8b")
    none = perf.hardware_flops_per_token(s, 8192, RECOMPUTE.index("none"))
    sel = perf.hardware_flops_per_token(s, 8192, M.SELECTIVE)
    full = perf.hardware_flops_per_token(s, 8192, RECOMPUTE.index("full"))
    assert sel - none == pytest.approx(4 * 32 * 4096 * 8192)  # the forward's 4 L h s
    assert none < sel < full


def test_recompute_selective_works_in_memory_predict_and_plan_and_says_the_runner_cannot_measure_it():
    for args in (["memory", "--model", "llama3-8b", "--tp", "8", "--num-gpus", "8"],
                 ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "8", "--num-gpus", "8"]):
        r = CliRunner().invoke(main, [*args, "--recompute", "selective", "--seq-len", "8192"])
        assert r.exit_code == 0, r.output
        assert "mgbench's runner checkpoints none, every_2nd, full only" in r.output
    # plan searches it beside the runner's modes (its grid is every RECOMPUTE index).
    from mgbench.planner.search import PlanOptions, plan
    from mgbench.planner.cost import Prices

    res = plan(catalog.model_shape("llama3-8b"), PlanOptions(tokens=1e11, systems=["dgx-h100"], max_gpus=8,
                                                             seq_len=8192), Prices(None, []))
    assert res["num_candidates"] > 0 and {r["recompute"] for r in res["ranked"]} <= set(RECOMPUTE)


# --- hardware: a --system holding another GPU -----------------------------------------------

def test_a_system_with_another_gpu_is_honoured_and_said():
    r = CliRunner().invoke(main, ["predict", "--system", "dgx-a100", "--gpu", "a100-sxm-40gb", "--model", "llama3-8b",
                                  "--num-gpus", "16", "--zero", "3", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["gpu"] == "a100-sxm-40gb" and res["system"] == "dgx-a100[a100-sxm-40gb]"
    assert res["device_memory_bytes"] == pytest.approx(40 * 2**30)  # the label read as GiB (planner/hardware.py GIB)
    r = CliRunner().invoke(main, ["predict", "--system", "dgx-a100", "--model", "llama3-8b", "--num-gpus", "16",
                                  "--zero", "3", "--json"])
    assert json.loads(r.output)["device_memory_bytes"] == pytest.approx(80 * 2**30)


# --- torchtitan's op-level selective activation checkpointing -------------------------------

def test_op_level_checkpointing_by_hand():
    # A llama-like block, bf16 (e = 2), one rank: the block input, SDPA's output and
    # log-sum-exp, and half of the matmul outputs (q, k, v, w1, w3: q + 2 k + 2 F; wo and
    # w2: 2 h).
    s = ModelShape(layers=4, hidden=256, heads=8, kv_heads=2, ffn_hidden=704, vocab=100)
    h, q, k, F, a, e, N = 256, 256, 64, 704, 8, 2.0, 1000
    want = N * (e * h + e * q + M.LSE_BYTES * a + e * (q + 2 * k + 2 * F) / 2 + e * h)
    assert float(M.layer_activations(s, N, 1, False, "bf16", op_sac=True)) == pytest.approx(want)
    assert want < float(M.layer_activations(s, N, 1, False, "bf16"))
    # MLA (DeepSeek-V3's attention) at tp 2: the up-projections' outputs (128 x 192 queries,
    # 128 x 256 keys and values) are split, the down-projections' (the 1,536 query latent, the
    # 512 kv latent with its 64-wide rotary key) are whole on each rank.
    v3 = catalog.model_shape("deepseek-v3")
    a3, v, h3 = 128, 128, 7168
    want = N * (e * h3 + (e * a3 * v + M.LSE_BYTES * a3) / 2 + e * ((a3 * 192 + a3 * 256 + 18432 * 2) / 2
                                                                  + 1536 + 576) / 2 + e * h3)
    got = float(M.layer_activations(dataclasses.replace(v3, experts=0, top_k=0, shared_experts=0, dense_layers=0,
                                                        expert_ffn_hidden=None, mtp_layers=0),
                                    N, 2, False, "bf16", op_sac=True))
    assert got == pytest.approx(want)
    # Half of the blocks' matmul forward is recomputed; attention's is saved, not redone.
    block_weights = s.num_matmul_params() - s.hidden - s.padded_vocab * s.hidden
    none = perf.hardware_flops_per_token(s, 512, 0)
    assert perf.hardware_flops_per_token(s, 512, M.OP_SAC) - none == pytest.approx(0.5 * 2 * block_weights)
    # Its memory sits between every_2nd's and none's for a deep model, above full's.
    big = catalog.model_shape("llama3-8b")
    acts = {rc: M.memory_per_gpu(big, seq=8192, recompute=RECOMPUTE.index(rc), dp=8, zero=3)["activations_bytes"]
            for rc in ("none", "full", "op")}
    assert acts["full"] < acts["op"] < acts["none"]


def test_predict_and_plan_resolve_hardware_through_one_function(monkeypatch):
    from mgbench.planner import resolve as R
    from mgbench.planner.cost import Prices
    from mgbench.planner.search import PlanOptions, plan

    seen = []
    real = R.resolve
    monkeypatch.setattr(R, "resolve", lambda **kw: seen.append(kw) or real(**kw))
    r = CliRunner().invoke(main, ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8",
                                  "--stack", "torchtitan", "--json"])
    assert r.exit_code == 0, r.output
    plan(catalog.model_shape("llama3-8b"), PlanOptions(tokens=1e10, systems=["dgx-h100"], max_gpus=8,
                                                       stack="torchtitan"), Prices(None, []))
    assert [k["system"] for k in seen] == ["dgx-h100", "dgx-h100"]
    assert seen[0]["stack"] == seen[1]["stack"] == "torchtitan"
    # The rules are the resolution's, whichever command asks.
    with pytest.raises(MgbenchError, match="replaces --system"):
        real(precision="bf16", system="dgx-h100", profile={"device": "cpu"})
    with pytest.raises(MgbenchError, match="no FP8 peak|fp8"):
        real(precision="fp8", system="dgx-a100")


def test_memory_trace_refuses_what_the_runner_cannot_run_in_one_line():
    for extra in (["--recompute", "selective"], ["--recompute", "op"]):
        r = CliRunner().invoke(main, ["memory", "--model", "tiny", "--num-gpus", "2", "--zero", "3", "--trace", *extra])
        assert r.exit_code == 2 and "priced without --trace" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["memory", "--model", "deepseek-v3", "--num-gpus", "2", "--zero", "3", "--trace"])
    assert r.exit_code == 2 and "--trace builds the model with the runner's decoder" in r.output


def test_a_multimodal_configs_vision_tower_is_named_as_not_priced(tmp_path):
    """A Gemma 3 4B-style config: the language model (text_config) is sized; its vision
    tower is not, and predict, memory and plan say so rather than drop it silently."""
    cfg = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
        "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = shape_from_file(tmp_path / "config.json")
    assert s.layers == 34 and "vision tower (vision_config: 27 layers, 1152 hidden, 4304 MLP)" in s.left_out
    for args in (["predict", "--system", "dgx-h100", "--num-gpus", "8"], ["memory", "--num-gpus", "8"],
                 ["plan", "--tokens", "1e11", "--systems", "dgx-h100", "--max-gpus", "16"]):
        r = CliRunner().invoke(main, [*args, "--hf", str(tmp_path)])
        assert r.exit_code == 0 and "not priced: the vision tower" in r.output, (args, r.output[-500:])
    # A description, not a dimension: the same shape, the same config id.
    plain = dataclasses.replace(s, left_out=None)
    assert s == plain and s.to_dict() == plain.to_dict() and "left_out" not in s.to_dict()
    # Every other tower is named (Gemma 3n has audio too); a wrapper with none of them known
    # still says the language model alone is priced.
    cfg["audio_config"] = {"hidden_size": 1536, "num_hidden_layers": 12}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "the audio tower (audio_config: 12 layers, 1536 hidden)" in shape_from_file(tmp_path / "config.json").left_out
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": cfg["text_config"]}))
    assert "only the language model (text_config)" in shape_from_file(tmp_path / "config.json").left_out
    # The text model alone has nothing left out.
    (tmp_path / "config.json").write_text(json.dumps(cfg["text_config"]))
    assert shape_from_file(tmp_path / "config.json").left_out is None


def test_a_record_read_back_through_a_table_keeps_its_integer_dims():
    # pandas holds an integer column with gaps as floats (64 -> 64.0): `mgbench report
    # --plan-*` on an H200 selftest record failed with "vocab_multiple ... got 64.0".
    from mgbench.workloads import spec_from_record

    rec = {"model_layers": 12.0, "model_hidden": 768.0, "model_heads": 12.0, "model_ffn_hidden": 3072.0,
           "model_vocab": 50257.0, "model_vocab_multiple": 64.0, "model_mlp": "gelu", "model_tie_embeddings": True}
    shape = spec_from_record(rec)
    assert shape.vocab_multiple == 64 and isinstance(shape.vocab_multiple, int) and shape.padded_vocab == 50304
    with pytest.raises(MgbenchError, match="vocab_multiple"):  # a fractional dim is still refused
        spec_from_record({**rec, "model_vocab_multiple": 64.5})
