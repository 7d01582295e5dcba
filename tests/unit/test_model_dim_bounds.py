"""Model dimensions have upper bounds (model_shape.MAX_DIM, MAX_DIMS): an audit's plan with
10**30 layers (from the command line or a Hugging Face config) never came back, while
memory and predict printed absurd figures."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mgbench.cli import main
from mgbench.errors import MgbenchError
from mgbench.model_shape import MAX_DIM, MAX_DIMS, ModelShape


def test_the_largest_dims_are_taken_and_one_more_is_refused():
    ModelShape(layers=MAX_DIMS["layers"], hidden=256, heads=4, ffn_hidden=512, vocab=1000)
    with pytest.raises(MgbenchError, match=r"model dim layers = 65,537 is past 65,536"):
        ModelShape(layers=MAX_DIMS["layers"] + 1, hidden=256, heads=4, ffn_hidden=512, vocab=1000)
    with pytest.raises(MgbenchError, match=r"model dim vocab = 16,777,217 is past 16,777,216"):
        ModelShape(layers=2, hidden=256, heads=4, ffn_hidden=512, vocab=MAX_DIM + 1)


@pytest.mark.parametrize("command", [["plan", "--tokens", "1e9", "--systems", "dgx-h100"],
                                     ["predict", "--system", "dgx-h100", "--num-gpus", "8"],
                                     ["memory", "--num-gpus", "8"]])
def test_an_absurd_layer_count_is_one_line_at_once(command, tmp_path):
    dims = ["--layers", str(10 ** 30), "--hidden", "256", "--heads", "4", "--vocab", "1000"]
    r = CliRunner().invoke(main, [*command, *dims])
    assert r.exit_code == 2 and "model dim layers" in r.output and "Traceback" not in r.output, r.output
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 10 ** 30, "hidden_size": 256,
                               "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000}))
    r = CliRunner().invoke(main, [*command, "--hf", str(cfg)])
    assert r.exit_code == 2 and "layers" in r.output, r.output
