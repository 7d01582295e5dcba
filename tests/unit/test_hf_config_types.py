"""Values of the wrong type in a Hugging Face config.json (an audit of `--hf`,
2026-11-29): a string head_dim, an int where a list of layers belongs, bytes that are not
UTF-8. Each is one line naming the model, the key and what it must be, exit status 2,
never a traceback; the configs they were cut from still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.hf_config import read_config, shape_from_hf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
LLAMA = json.loads((FIXTURES / "tiny-llama" / "config.json").read_text())
QWEN3_MOE = json.loads((FIXTURES / "published" / "qwen3-30b-a3b" / "config.json").read_text())
GPT_OSS = json.loads((FIXTURES / "published" / "gpt-oss-120b" / "config.json").read_text())
# Llama 4 Scout's text_config (meta-llama/Llama-4-Scout-17B-16E): every layer MoE.
LLAMA4_TEXT = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40,
               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
               "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1}


def _memory(tmp_path: Path, cfg: dict | bytes):  # type: ignore[no-untyped-def]
    """`mgbench memory --hf` of a config.json holding ``cfg``."""
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(cfg if isinstance(cfg, bytes) else json.dumps(cfg).encode())
    return CliRunner().invoke(main, ["memory", "--hf", str(path)])


def _one_line_exit_2(tmp_path: Path, cfg: dict | bytes, *words: str) -> str:
    r = _memory(tmp_path, cfg)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and all(w in r.output for w in words), r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    return r.output


@pytest.mark.parametrize("cfg", [LLAMA, {**LLAMA, "head_dim": 16}, {**LLAMA, "head_dim": 32}, QWEN3_MOE, GPT_OSS,
                                 {**LLAMA4_TEXT, "moe_layers": list(range(48))}, {**GPT_OSS, "swiglu_limit": None}])
def test_the_valid_configs_still_read(tmp_path, cfg):
    r = _memory(tmp_path, cfg)
    assert r.exit_code == 0, (r.output, r.exception)


@pytest.mark.parametrize("value", ["64", 0, -8, True, 64.0, [64]])
def test_a_head_dim_that_is_no_positive_integer_is_named(tmp_path, value):
    _one_line_exit_2(tmp_path, {**LLAMA, "head_dim": value},
                     f"model m: the Hugging Face llama config's head_dim must be a positive integer, got {value!r}")


def test_a_head_dim_beside_a_hidden_of_the_wrong_type_names_the_hidden(tmp_path):
    # head_dim is compared with hidden / heads: a string hidden there ended in a TypeError.
    _one_line_exit_2(tmp_path, {**LLAMA, "hidden_size": "64", "head_dim": 16},
                     "model dim hidden must be a positive integer, got '64'")
    _one_line_exit_2(tmp_path, {**LLAMA, "num_attention_heads": 0, "head_dim": 16},
                     "model dim heads must be a positive integer, got 0")


@pytest.mark.parametrize("value", [3, "0", {"0": 1}, [0, "1"], [True]])
def test_mlp_only_layers_that_is_no_list_of_layers_is_named(tmp_path, value):
    _one_line_exit_2(tmp_path, {**QWEN3_MOE, "mlp_only_layers": value}, "the Hugging Face qwen3_moe config's "
                     f"mlp_only_layers must be a list of layer indices (integers), got {value!r}")


@pytest.mark.parametrize("value", [3, "0", [0.5]])
def test_moe_layers_that_is_no_list_of_layers_is_named(tmp_path, value):
    _one_line_exit_2(tmp_path, {**LLAMA4_TEXT, "moe_layers": value}, "the Hugging Face llama4_text config's "
                     f"moe_layers must be a list of layer indices (integers), got {value!r}")


def test_moe_layers_beside_a_layer_count_of_the_wrong_type_names_the_count(tmp_path):
    _one_line_exit_2(tmp_path, {**LLAMA4_TEXT, "num_hidden_layers": "48", "moe_layers": [0]},
                     "model dim layers must be a positive integer, got '48'")


@pytest.mark.parametrize("value", ["x", [7], 0, True])
def test_a_swiglu_limit_that_is_no_positive_number_is_named(tmp_path, value):
    _one_line_exit_2(tmp_path, {**GPT_OSS, "swiglu_limit": value},
                     f"the Hugging Face gpt_oss config's swiglu_limit must be a positive number, got {value!r}")


@pytest.mark.parametrize("value", ["64", {"a": 1}, [64]])
def test_a_gpt2_width_of_the_wrong_type_is_named(tmp_path, value):
    # Its MLP is 4 x n_embd wide unless given: 4 x a dict was a TypeError.
    cfg = {"model_type": "gpt2", "n_embd": value, "n_layer": 2, "n_head": 4, "vocab_size": 256}
    _one_line_exit_2(tmp_path, cfg, f"model dim hidden must be a positive integer, got {value!r}")


def test_a_config_that_is_not_utf8_is_named(tmp_path):
    out = _one_line_exit_2(tmp_path, b'{"model_type": "llama", "name": "\xff"}', "config.json: not UTF-8 text",
                           "byte 0xff at offset 33")
    assert out.startswith("mgbench: error: --hf ")
    with pytest.raises(MgbenchError, match="model hf:x: not UTF-8 text"):
        read_config(tmp_path / "m" / "config.json", "model hf:x")


def test_the_text_config_of_a_multimodal_wrapper_is_checked_alike():
    with pytest.raises(MgbenchError, match="llama4_text config's moe_layers must be a list of layer indices"):
        shape_from_hf({"model_type": "llama4", "text_config": {**LLAMA4_TEXT, "moe_layers": 3}}, "m")
