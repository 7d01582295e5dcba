"""Training workloads and the one interface the runner reaches them through.

A config's ``model`` is one of three model specs, each frozen and hashable, each
serialised by ``to_dict`` into the config (and so into its id and its record as
``model_*``):

- :class:`~mgbench.model_shape.ModelShape`: mgbench's own decoder LM (workloads/gpt.py);
- :class:`HFModel`: a Hugging Face causal LM built from its config (workloads/hf.py,
  needs ``transformers``: the extra ``mgbench[hf]``); workload ``gpt``, since it is a
  decoder LM trained on tokens like the built-in one;
- :class:`VisionModel`: an image classifier, ResNet or ViT (workloads/vision.py, plain
  torch); workload ``vision``.

The rank side asks :func:`implementation` for the module that builds the model; every
implementation module has ``build(cfg) -> nn.Module`` whose result has a ``blocks``
container (an ``nn.ModuleDict`` or ``nn.ModuleList``: the units FSDP shards and
activation checkpointing wraps), takes a micro-batch's inputs and returns logits scored
by the same mean cross-entropy (:func:`mgbench.workloads.gpt.lm_loss`: next-token
logits (batch, seq, vocab) against token ids, or class logits (batch, classes) against
labels). Batches come from :func:`mgbench.runner.training.batches_for`.

Everything here is torch-free: the suite validator and the launcher read it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MgbenchError
from ..model_shape import ModelShape
from ..strategies import DATA_PARALLEL

# --- Hugging Face models ---------------------------------------------------------------

HF_PREFIX = "hf:"
# model_type -> (mgbench dim -> the config key holding it). Only architectures whose
# config maps onto a ModelShape (so FLOPs, labels and the planner have a shape) are taken.
_LLAMA_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "vocab": "vocab_size",
               "head_dim": "head_dim", "tie_embeddings": "tie_word_embeddings"}
HF_DIM_KEYS: dict[str, dict[str, str]] = {
    "llama": _LLAMA_KEYS,
    "mistral": _LLAMA_KEYS,
    "qwen2": _LLAMA_KEYS,
    "gpt2": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn_hidden": "n_inner",
             "vocab": "vocab_size", "positions": "n_positions", "tie_embeddings": "tie_word_embeddings"},
}
# Strategies the Hugging Face and vision models run under: one process, and the registry's
# data-parallel entries, which need nothing of a model but its blocks (hsdp excepted: not
# yet checked with them). HF models add tp / fsdp+tp where their config has a
# tensor-parallel plan (workloads/hf_tp.py); pipelines would need stage splits.
WHOLE_MODEL_STRATEGIES = ("single",) + tuple(s for s in DATA_PARALLEL if s != "hsdp")
HF_STRATEGIES = WHOLE_MODEL_STRATEGIES


def _hf_shape(arch: str, cfg: dict[str, Any], name: str) -> ModelShape:
    """The ModelShape an HF config maps onto (FLOPs per token, the label, the planner):
    the planner's reader (mgbench/hf_config.py), one for both. GPT-2's LayerNorm, biases
    and learned positions are not in it; the record counts parameters from the built
    model (num_params) while FLOPs use the matmul weights."""
    from ..hf_config import shape_from_hf

    return shape_from_hf({**cfg, "model_type": arch}, name)


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face causal LM given by its config (no weights: built with
    ``AutoModelForCausalLM.from_config`` and the run's seed). The config is held whole,
    so a changed config.json is a different config, and a record says what ran."""

    arch: str  # the config's model_type
    config_json: str  # the HF config as canonical JSON (sorted keys): hashable
    name: str
    shape: ModelShape = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.arch not in HF_DIM_KEYS:
            raise MgbenchError(f"Hugging Face model_type {self.arch!r} is not supported; mgbench builds "
                               f"{', '.join(HF_DIM_KEYS)} configs (those that map onto its model shape)")
        try:
            shape = _hf_shape(self.arch, self.config, self.name)
        except MgbenchError as e:
            raise MgbenchError(f"model {self.name}: {e}") from None
        object.__setattr__(self, "shape", shape)

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.config_json)

    def to_dict(self) -> dict[str, Any]:
        return {"hf": self.arch, "name": self.name, "config": self.config}

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str) -> "HFModel":
        arch = config.get("model_type")
        if not isinstance(arch, str):
            raise MgbenchError(f"model {name}: the Hugging Face config has no model_type")
        return cls(arch, json.dumps(config, sort_keys=True), name)

    @classmethod
    def from_file(cls, path: str) -> "HFModel":
        """From ``hf:PATH`` (PATH absolute, or relative to the current directory: the
        suite loader has already made paths relative to the suite file absolute)."""
        from ..hf_config import name_of, read_config

        config = read_config(path, f"model hf:{path}", "relative to the suite file's folder")
        return cls.from_config(config, HF_PREFIX + name_of(path))

    @classmethod
    def from_dims(cls, dims: dict[str, Any]) -> "HFModel":
        """From ``{hf = "llama", layers = ..., hidden = ...}``: mgbench's dim names mapped
        onto the architecture's config keys; keys it does not name take the HF config
        class's defaults when the model is built."""
        d = dict(dims)
        arch = d.pop("hf")
        if arch not in HF_DIM_KEYS:
            raise MgbenchError(f"model hf = {arch!r} is not supported; choose one of {', '.join(HF_DIM_KEYS)}")
        keys = HF_DIM_KEYS[arch]
        unknown = sorted(set(d) - set(keys))
        if unknown:
            raise MgbenchError(f"model hf = {arch!r}: unknown dim(s) {', '.join(unknown)}; allowed: {', '.join(keys)}")
        config = {"model_type": arch, **{keys[k]: v for k, v in d.items()}}
        label = " ".join(f"{k}{v}" for k, v in d.items())
        return cls.from_config(config, f"{HF_PREFIX}{arch}({label})")


# --- vision models -----------------------------------------------------------------------

# Presets, with their sources. ResNet: bottleneck blocks (1x1, 3x3, 1x1, expansion 4),
# stride on the 3x3 ("v1.5", as torchvision builds it), He et al. 2015, "Deep Residual
# Learning for Image Recognition", table 1. ViT: Dosovitskiy et al. 2020, "An Image is
# Worth 16x16 Words", table 1 (ViT-Base: 12 layers, hidden 768, MLP 3072, 12 heads),
# patch 16, class token, learned position embeddings, pre-norm blocks. The tiny ones
# are for CPU tests: their dims are stated here and nowhere else.
VISION_PRESETS: dict[str, dict[str, Any]] = {
    "resnet50": {"kind": "resnet", "blocks": (3, 4, 6, 3), "widths": (64, 128, 256, 512), "classes": 1000},
    "resnet_tiny": {"kind": "resnet", "blocks": (1, 1), "widths": (8, 16), "classes": 10},
    "vit_b_16": {"kind": "vit", "layers": 12, "hidden": 768, "mlp": 3072, "heads": 12, "patch": 16, "classes": 1000},
    "vit_tiny": {"kind": "vit", "layers": 2, "hidden": 32, "mlp": 64, "heads": 2, "patch": 8, "classes": 10},
}
RESNET_EXPANSION = 4
# The blocks are convolutions or encoder layers that mgbench's tensor-parallel plan does
# not cover: the whole-model strategies only.
VISION_STRATEGIES = WHOLE_MODEL_STRATEGIES


@dataclass(frozen=True)
class VisionModel:
    """An image classifier preset of :data:`VISION_PRESETS`."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in VISION_PRESETS:
            raise MgbenchError(f"unknown vision model {self.name!r}; choose one of {', '.join(VISION_PRESETS)}")

    @property
    def dims(self) -> dict[str, Any]:
        return VISION_PRESETS[self.name]

    def to_dict(self) -> dict[str, Any]:
        return {"vision": self.name, "name": self.name}

    def num_params(self, image_size: int) -> int:
        """Trainable parameters as built (ViT's position embeddings grow with the image)."""
        return _resnet_count(self.dims, image_size)[0] if self.dims["kind"] == "resnet" \
            else _vit_count(self.dims, image_size)[0]

    def macs_forward(self, image_size: int) -> int:
        """Multiply-accumulates of one image's forward pass: convolutions and matmuls (the
        convention of torchvision's and timm's "GFLOPS" tables, which count MACs), no
        norms, activations, pooling or softmax."""
        return _resnet_count(self.dims, image_size)[1] if self.dims["kind"] == "resnet" \
            else _vit_count(self.dims, image_size)[1]

    def flops_per_image(self, image_size: int) -> float:
        """Training FLOPs per image: 3 x the forward (backward costs twice the forward),
        2 FLOPs per MAC; the same convention as 6N per token for LMs."""
        return 6.0 * self.macs_forward(image_size)

    def problem(self, image_size: int) -> str | None:
        """Why this model cannot take images of this size (None when it can)."""
        d = self.dims
        if d["kind"] == "vit" and image_size % d["patch"]:
            return f"{self.name} cuts images into {d['patch']}x{d['patch']} patches: image_size {image_size} " \
                   f"is not a multiple of {d['patch']}"
        least = 2 ** (len(d["blocks"]) + 1) if d["kind"] == "resnet" else d["patch"]
        if image_size < least:
            return f"{self.name} needs image_size >= {least}, got {image_size}"
        return None


def _conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _resnet_count(d: dict[str, Any], size: int) -> tuple[int, int]:
    """(parameters, forward MACs) of a bottleneck ResNet as vision.py builds it."""
    stem = d["widths"][0]
    params, macs = 3 * 49 * stem + 2 * stem, 0
    h = _conv_out(size, 7, 2, 3)
    macs += h * h * 3 * 49 * stem
    h = _conv_out(h, 3, 2, 1)  # max pool
    c_in = stem
    for i, (n, w) in enumerate(zip(d["blocks"], d["widths"])):
        out = w * RESNET_EXPANSION
        for b in range(n):
            stride = 2 if i > 0 and b == 0 else 1
            h2 = _conv_out(h, 3, stride, 1)
            params += c_in * w + 9 * w * w + w * out + 2 * (w + w + out)
            macs += h * h * c_in * w + h2 * h2 * 9 * w * w + h2 * h2 * w * out
            if b == 0 and (stride != 1 or c_in != out):  # projection shortcut
                params += c_in * out + 2 * out
                macs += h2 * h2 * c_in * out
            h, c_in = h2, out
    params += c_in * d["classes"] + d["classes"]
    macs += c_in * d["classes"]
    return params, macs


def _vit_count(d: dict[str, Any], size: int) -> tuple[int, int]:
    """(parameters, forward MACs) of a ViT as vision.py builds it."""
    hid, mlp, p, L, C = d["hidden"], d["mlp"], d["patch"], d["layers"], d["classes"]
    patches = (size // p) ** 2
    t = patches + 1  # the class token
    per_layer = 2 * hid + 3 * hid * hid + 3 * hid + hid * hid + hid + 2 * hid + 2 * hid * mlp + mlp + hid
    params = 3 * p * p * hid + hid + hid + t * hid + L * per_layer + 2 * hid + hid * C + C
    per_layer_macs = t * (4 * hid * hid + 2 * hid * mlp) + 2 * t * t * hid
    macs = patches * 3 * p * p * hid + L * per_layer_macs + hid * C
    return params, macs


# --- the model spec of a config -------------------------------------------------------------

# Keys a model spec adds to a flat record beside ModelShape's model_<dim> (record.py reads them back).
SPEC_RECORD_KEYS = ("model_hf", "model_config", "model_vision")


def check_model(v: Any) -> str | None:
    """The suite check of ``model``: a preset, dims, ``hf:PATH``, ``{hf = ...}`` or a vision preset."""
    from .. import catalog

    if isinstance(v, str) and v.startswith(HF_PREFIX):
        return None if len(v) > len(HF_PREFIX) else "hf: needs the path of a Hugging Face config.json, e.g. " \
                                                     "\"hf:models/tiny-llama/config.json\""
    if isinstance(v, str) and v in VISION_PRESETS:
        return None
    if isinstance(v, dict) and "hf" in v:
        try:
            HFModel.from_dims(v)
        except MgbenchError as e:
            return str(e)
        return None
    if isinstance(v, str):
        names = tuple(catalog.model_presets()) + tuple(VISION_PRESETS)
        if v in names:
            return None if v in VISION_PRESETS else catalog.model_shape(v).runner_problem()
        import difflib

        hint = difflib.get_close_matches(v, names, n=1)
        more = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"{v!r} is not one of {', '.join(names)}{more}, nor \"hf:PATH/config.json\""
    if isinstance(v, dict):
        try:
            shape = ModelShape.from_dict(v)
        except MgbenchError as e:
            return str(e)
        return shape.runner_problem()
    return f"must be a preset name, \"hf:PATH/config.json\" or a table of dims, got {v!r}"


def model_spec(workload: str, v: Any) -> Any:
    """The typed model of a config from what a suite, a job file or a record holds."""
    if isinstance(v, (ModelShape, HFModel, VisionModel)):
        spec = v
    elif isinstance(v, str) and v.startswith(HF_PREFIX):
        spec = HFModel.from_file(v[len(HF_PREFIX):])
    elif isinstance(v, str) and v in VISION_PRESETS:
        spec = VisionModel(v)
    elif isinstance(v, dict) and "vision" in v:
        spec = VisionModel(v["vision"])
    elif isinstance(v, dict) and "hf" in v and "config" in v:
        spec = HFModel.from_config(v["config"], v.get("name") or HF_PREFIX + v["hf"])
    elif isinstance(v, dict) and "hf" in v:
        spec = HFModel.from_dims(v)
    elif isinstance(v, dict):
        spec = ModelShape.from_dict({"name": "custom", **v})
    else:
        from .. import catalog

        spec = catalog.model_shape(v)
    if isinstance(spec, ModelShape) and (why := spec.runner_problem()):
        raise MgbenchError(f"model {_name(spec)}: {why}")
    if workload == "vision" and not isinstance(spec, VisionModel):
        raise MgbenchError(f"workload \"vision\" needs an image model ({', '.join(VISION_PRESETS)}), got "
                           f"model {_name(spec)!r}; use a [[sweep]] table per workload")
    if workload != "vision" and isinstance(spec, VisionModel):
        raise MgbenchError(f"model {spec.name!r} is an image classifier: set workload = \"vision\"")
    return spec


def _name(spec: Any) -> str:
    return getattr(spec, "name", None) or "custom"


def spec_from_record(rec: dict[str, Any]) -> Any:
    """The model spec of a flat record (its model_* fields; a row of a pandas table of
    records too, whose gaps are NaN: record_values)."""
    from ..record_values import value_of

    if (vision := value_of(rec, "model_vision")) is not None:
        return VisionModel(vision)
    if (hf := value_of(rec, "model_hf")) is not None:
        return HFModel.from_config(rec["model_config"], value_of(rec, "model_name") or HF_PREFIX + hf)
    return ModelShape.from_record(rec)


def resolve_hf_path(value: Any, base: Path) -> Any:
    """A suite's ``hf:PATH`` with a relative PATH made absolute against ``base`` (the
    suite file's folder); anything else unchanged."""
    if isinstance(value, str) and value.startswith(HF_PREFIX):
        p = Path(value[len(HF_PREFIX):])
        if not p.is_absolute():
            return HF_PREFIX + str((base / p).resolve())
    return value


# --- what the runner asks of a config's workload ------------------------------------------

def implementation(cfg: Any) -> Any:
    """The rank-side module that builds ``cfg``'s model (None: mgbench's own DecoderLM).
    Imported here, lazily: transformers takes seconds to import and only hf configs need it."""
    import importlib

    if isinstance(cfg.model, HFModel):
        return importlib.import_module("mgbench.workloads.hf")
    if isinstance(cfg.model, VisionModel):
        return importlib.import_module("mgbench.workloads.vision")
    return None


def fp8_problem(spec: Any) -> str | None:
    """Why ``precision = "fp8"`` would run none of a model's block matmuls in float8 (None
    when it would): torchao's float8 training swaps ``nn.Linear`` layers only, and the
    output projection stays bf16 (strategies/fp8.py)."""
    if isinstance(spec, VisionModel) and spec.dims["kind"] == "resnet":
        return (f"precision = \"fp8\": {spec.name}'s blocks are convolutions and torchao float8 training converts "
                "nn.Linear layers only (nothing would run in fp8); use bf16 or a ViT")
    if isinstance(spec, HFModel) and spec.arch == "gpt2":
        # transformers builds GPT-2's attention and MLP from its own Conv1D, not nn.Linear.
        return ("precision = \"fp8\": GPT-2's blocks are transformers Conv1D layers and torchao float8 training "
                "converts nn.Linear layers only (nothing but the output head would run in fp8); use bf16")
    return None


def skip_reason(cfg: Any) -> str | None:
    """Why the workload cannot run this config (None when it can): strategies it lacks,
    sizes it cannot take, an optional package that is missing."""
    import importlib.util

    spec = cfg.model
    if cfg.precision == "fp8" and (why := fp8_problem(spec)):
        return why
    if isinstance(spec, VisionModel):
        if cfg.strategy not in VISION_STRATEGIES:
            return f"the vision workload runs the data-parallel strategies ({', '.join(VISION_STRATEGIES)}), " \
                   f"not {cfg.strategy}"
        return spec.problem(cfg.image_size)
    if isinstance(spec, HFModel):
        from .hf_tp import TP_STRATEGIES, plan_problem

        if cfg.strategy not in HF_STRATEGIES + TP_STRATEGIES:
            return f"Hugging Face models run the data-parallel strategies ({', '.join(HF_STRATEGIES)}) and " \
                   f"{' / '.join(TP_STRATEGIES)} where the model has a tensor-parallel plan; " \
                   f"{cfg.strategy} is not wired to them"
        if cfg.strategy in TP_STRATEGIES and (why := plan_problem(spec)):
            return why
        if cfg.compile:
            return "compile = true is not wired to Hugging Face models"
        positions = spec.config.get("n_positions") if spec.arch == "gpt2" else None
        if positions is not None and cfg.seq_len > positions:
            return f"{spec.name} has learned positions for {positions} tokens: seq_len {cfg.seq_len} is longer"
        if importlib.util.find_spec("transformers") is None:
            return "Hugging Face models need transformers: pip install 'mgbench[hf]'"
    return None


def throughput(cfg: Any, step_time_s: float, world: int) -> dict[str, Any]:
    """Record fields of the workload's units per second and of its FLOPs: tokens for LMs,
    images for the vision workload (whose token fields are null with the reason)."""
    if isinstance(cfg.model, VisionModel):
        images = cfg.global_batch
        flops = cfg.model.flops_per_image(cfg.image_size)
        return {"tokens_per_step": None, "tokens_per_s": None, "tokens_per_s_per_device": None,
                "tokens_reason": "vision workload: throughput is counted in images (images_per_s)",
                "images_per_s": images / step_time_s, "images_per_s_per_device": images / step_time_s / world,
                "flops_per_token": None, "flops_per_image": flops,
                "model_tflops_per_device": flops * images / step_time_s / world / 1e12,
                "num_params": cfg.model.num_params(cfg.image_size)}
    tokens_per_step = cfg.global_batch * cfg.seq_len
    tokens_per_s = tokens_per_step / step_time_s
    flops_per_token = cfg.shape.flops_per_token(cfg.seq_len)
    # A Hugging Face model's own count (GPT-2's biases, LayerNorms and learned positions
    # are not in its ModelShape); FLOPs count the matmul weights, which the shape has.
    impl = implementation(cfg)
    return {"tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / world, "flops_per_token": flops_per_token,
            "model_tflops_per_device": flops_per_token * tokens_per_s / world / 1e12,
            "num_params": impl.num_params(cfg) if impl is not None else cfg.shape.num_params()}
