"""The workload interface (mgbench/workloads): Hugging Face model specs, the vision models'
sizes and FLOPs against published figures, and the bad inputs each refuses."""

import importlib.util
import json

import pytest
import torch

from mgbench.config import RunConfig
from mgbench.errors import MgbenchError
from mgbench.record import Record
from mgbench.suite import expand, parse_suite
from mgbench.workloads import VISION_PRESETS, HFModel, VisionModel
from tests.factories import make_config

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
NO_TRANSFORMERS = "transformers is not installed (the optional extra mgbench[hf])"

# Published sizes, from torchvision's weight metadata (torchvision/models/resnet.py,
# ResNet50_Weights.IMAGENET1K_V1: num_params 25557032, _ops 4.089; vision_transformer.py,
# ViT_B_16_Weights.IMAGENET1K_V1: num_params 86567656, _ops 17.564), where "_ops" are
# GFLOPS counted as multiply-accumulates at 224 x 224 (the convention of timm's GMACs).
PUBLISHED = {"resnet50": (25_557_032, 4.089e9), "vit_b_16": (86_567_656, 17.564e9)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_models_match_published_parameters_and_macs(name):
    params, macs = PUBLISHED[name]
    m = VisionModel(name)
    assert m.num_params(224) == params
    assert m.macs_forward(224) == pytest.approx(macs, rel=5e-4)
    assert m.flops_per_image(224) == 6 * m.macs_forward(224)


@pytest.mark.parametrize("name", sorted(VISION_PRESETS))
def test_built_models_have_the_counted_parameters_and_macs(name):
    """The analytic counts (used for MFU) against the modules themselves, on the meta
    device (no memory, no compute): parameters, and forward MACs by torch's FLOP counter."""
    from torch.utils.flop_counter import FlopCounterMode

    from mgbench.workloads import vision

    cfg = make_config(workload="vision", model=name, image_size=224)
    with torch.device("meta"):
        model = vision.build(cfg)
        x = torch.empty(2, 3, 224, 224)
    assert sum(p.numel() for p in model.parameters()) == cfg.model.num_params(224)
    with FlopCounterMode(display=False) as counter:
        assert model(x).shape == (2, VISION_PRESETS[name]["classes"])
    assert counter.get_total_flops() == 2 * 2 * cfg.model.macs_forward(224)  # 2 images, 2 FLOPs a MAC


def test_parameter_counts_match_torchvision_where_it_imports():
    try:
        import torchvision.models as tvm
    except Exception as e:  # CPU torch with a CUDA torchvision wheel: its C extension fails to load
        pytest.skip(f"torchvision does not import here ({type(e).__name__}: {e}); compared on a GPU machine")
    for name, build in (("resnet50", tvm.resnet50), ("vit_b_16", tvm.vit_b_16)):
        with torch.device("meta"):
            theirs = sum(p.numel() for p in build().parameters())
        assert VisionModel(name).num_params(224) == theirs


def test_learnable_images_carry_their_class_and_random_ones_do_not():
    from mgbench.workloads.vision import image_rows

    x, y = image_rows(0, 0, range(64), 16, 4, learnable=True)
    x2, y2 = image_rows(0, 0, range(32, 64), 16, 4, learnable=True)
    assert torch.equal(x[32:], x2) and torch.equal(y[32:], y2)  # a rank's rows are the global batch's
    # Images of one class sit closer to each other than to those of another class.
    means = torch.stack([x[y == c].mean(0) for c in range(4)])
    within = (x - means[y]).pow(2).mean()
    assert within < 0.1 < (means[0] - means[1]).pow(2).mean()
    r, _ = image_rows(0, 0, range(64), 16, 4, learnable=False)
    assert not torch.equal(r, x)


def test_vision_and_lm_models_refuse_the_other_workload():
    with pytest.raises(MgbenchError, match="workload \"vision\" needs an image model"):
        RunConfig(workload="vision", model="tiny")
    with pytest.raises(MgbenchError, match="image classifier: set workload = \"vision\""):
        RunConfig(model="resnet50")


def test_hf_config_errors_are_one_line(tmp_path):
    with pytest.raises(MgbenchError, match="cannot read the config") as e:
        RunConfig(model=f"hf:{tmp_path}/missing/config.json")
    assert "\n" not in str(e.value)
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(MgbenchError, match="model_type 'bert' is not supported"):
        RunConfig(model=f"hf:{bad}")
    bad.write_text("{not json")
    with pytest.raises(MgbenchError, match="not valid JSON"):
        RunConfig(model=f"hf:{bad}")
    with pytest.raises(MgbenchError, match="unknown dim"):
        HFModel.from_dims({"hf": "llama", "layers": 2, "hiden": 8})


def test_a_missing_hf_config_exits_2_with_one_line(cli, tmp_path):
    (tmp_path / "s.toml").write_text('[sweep]\nmodel = "hf:nowhere/config.json"\n')
    p = cli("run", "s.toml", "--dry-run")
    assert p.returncode == 2, p.stderr
    assert "cannot read the config" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_hf_path_is_relative_to_the_suite_folder(tmp_path, monkeypatch):
    folder = tmp_path / "bench"
    (folder / "m").mkdir(parents=True)
    (folder / "m" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4}))
    monkeypatch.chdir(tmp_path)  # not the suite's folder
    suite = parse_suite('[sweep]\nmodel = "hf:m/config.json"\n', str(folder / "suite.toml"))
    (cfg,) = expand(suite, "cpu", 1)
    assert cfg.model_name == "hf:m" and cfg.shape.layers == 2 and cfg.shape.kv_heads == 4
    assert cfg.model.config["hidden_size"] == 32


def test_unsupported_layouts_are_skipped_with_the_reason():
    text = """
[[sweep]]
model = { hf = "gpt2", layers = 2, hidden = 32, heads = 2, vocab = 64, positions = 16 }
strategy = ["tp", "ddp"]
nproc = 2
seq_len = 32
[[sweep]]
model = { hf = "llama", layers = 2, hidden = 32, heads = 4, ffn_hidden = 64, vocab = 64 }
strategy = "ddp"
nproc = 2
compile = [true, false]
[[sweep]]
workload = "vision"
model = "vit_tiny"
strategy = ["pp", "fsdp"]
image_size = [32, 36]
nproc = 2
"""
    got = {c.label: c.skip_reason for c in expand(parse_suite(text), "cpu", 2)}
    reasons = list(got.values())
    assert sum("gpt2 configs have no tensor-parallel plan" in (r or "") for r in reasons) == 1
    assert sum("learned positions for 16 tokens: seq_len 32" in (r or "") for r in reasons) == 1
    assert sum("vision workload runs the data-parallel strategies" in (r or "") for r in reasons) == 2
    assert sum(r == "compile = true is not wired to Hugging Face models" for r in reasons) == 1
    assert [r for r in reasons if r and "not a multiple of 8" in r] == [
        "vit_tiny cuts images into 8x8 patches: image_size 36 is not a multiple of 8"]
    assert None in reasons  # fsdp at 32 runs


@pytest.mark.parametrize("model", ["vit_tiny", {"hf": "llama", "layers": 2, "hidden": 32, "heads": 4,
                                                "ffn_hidden": 64, "vocab": 64}])
def test_records_of_hf_and_vision_configs_read_back(model):
    cfg = make_config(workload="vision" if model == "vit_tiny" else "gpt", model=model, strategy="ddp", nproc=2)
    flat = Record(cfg, "run", "ok", images_per_s=1.0).to_dict()
    back = Record.from_dict(json.loads(json.dumps(flat)))
    assert back.config == cfg and back.config.config_id == cfg.config_id and back.images_per_s == 1.0


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_hf_models_build_seeded_without_dropout():
    from mgbench.strategies.apply import build_model
    from mgbench.workloads.hf import hf_config

    cfg = make_config(model={"hf": "gpt2", "layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "positions": 32},
                      seq_len=16)
    a, b = build_model(cfg), build_model(cfg)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    conf = hf_config(cfg)
    assert conf.resid_pdrop == conf.attn_pdrop == conf.embd_pdrop == 0.0  # GPT-2's default is 0.1
    assert len(a.blocks) == 1 and a(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, 64)


def test_hf_configs_are_skipped_without_transformers(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    text = '[sweep]\nmodel = { hf = "llama", layers = 2, hidden = 32, heads = 4, ffn_hidden = 64, vocab = 64 }\n'
    (cfg,) = expand(parse_suite(text), "cpu", 1)
    assert cfg.skip_reason == "Hugging Face models need transformers: pip install 'mgbench[hf]'"


def test_fp8_is_skipped_for_models_with_no_linear_blocks():
    """torchao's float8 converts nn.Linear only: ResNet's convolutions and GPT-2's Conv1D
    blocks would run nothing in fp8 (ResNet: an error on the rank; GPT-2: only its head)."""
    text = """
[[sweep]]
workload = "vision"
model = ["resnet_tiny", "vit_tiny"]
image_size = 32
strategy = "ddp"
nproc = 2
precision = "fp8"
[[sweep]]
model = [{ hf = "gpt2", layers = 2, hidden = 32, heads = 2, vocab = 64, positions = 16 },
         { hf = "llama", layers = 2, hidden = 32, heads = 4, ffn_hidden = 64, vocab = 64 }]
strategy = "ddp"
nproc = 2
seq_len = 16
precision = "fp8"
"""
    got = {c.model_name: c.skip_reason or "" for c in expand(parse_suite(text), "cpu", 2)}
    assert "resnet_tiny's blocks are convolutions" in got["resnet_tiny"]
    assert "GPT-2's blocks are transformers Conv1D" in next(r for n, r in got.items() if "gpt2" in n)
    assert "nn.Linear" not in got["vit_tiny"]
    assert "nn.Linear" not in next(r for n, r in got.items() if "llama" in n)


@pytest.mark.skipif(not HAS_TRANSFORMERS or importlib.util.find_spec("torchao") is None,
                    reason="needs transformers and torchao (the extras mgbench[hf] and mgbench[fp8])")
def test_fp8_keeps_a_hugging_face_lm_head_in_bf16():
    from torchao.float8.float8_linear import Float8Linear

    from mgbench.strategies import fp8
    from mgbench.strategies.apply import build_model

    cfg = make_config(model={"hf": "llama", "layers": 1, "hidden": 32, "heads": 2, "ffn_hidden": 64, "vocab": 64},
                      seq_len=16, precision="fp8")
    model = build_model(cfg)
    assert fp8.convert(model, "tensorwise", fsdp=False) == 7  # q, k, v, o, gate, up, down
    assert not isinstance(model.lm.lm_head, Float8Linear)
