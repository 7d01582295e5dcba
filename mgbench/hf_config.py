"""A Hugging Face ``config.json`` read into mgbench's model spec (:class:`ModelShape`),
without transformers and without a network: the planner's ``--hf PATH`` and the runner's
``model = "hf:PATH"`` both size a model through :func:`shape_from_hf`.

Each architecture's keys are read as its transformers configuration class names them;
a key a config leaves out takes that class's default where the default decides the
size (Gemma ties its embeddings, GPT-2's MLP is 4 h wide). What is not counted is said
in :class:`ModelShape`'s docstring (biases, extra norms: under 0.1% of the parameters of
every published config in tests/fixtures/hf/published).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

from .errors import MgbenchError
from .model_shape import ModelShape

Reader = Callable[[dict[str, Any], str], ModelShape]


def read_config(path: str | Path, label: str | None = None, where: str = "or of the folder holding it"
                ) -> dict[str, Any]:
    """The JSON object of a config.json (a folder holding one is accepted too); errors
    start with ``label`` (default ``--hf PATH``) and say ``where`` a path is looked for."""
    p = Path(path)
    label = label or f"--hf {path}"
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise MgbenchError(f"{label}: cannot read the config ({e.strerror}); give the path of a Hugging Face "
                           f"config.json, {where}") from None
    except UnicodeDecodeError as e:  # Hugging Face writes config.json as UTF-8: other bytes are damage
        raise MgbenchError(f"{label}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); a "
                           "Hugging Face config.json is UTF-8 JSON: repair it or download it again") from None
    except json.JSONDecodeError as e:
        raise MgbenchError(f"{label}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise MgbenchError(f"{label}: a Hugging Face config is a JSON object")
    return cfg


def name_of(path: str | Path) -> str:
    """A model's name from its config's path: the folder's name for .../NAME/config.json."""
    p = Path(path)
    if p.is_dir():
        return p.name
    return p.parent.name if p.stem == "config" and p.parent.name else p.stem


def shape_from_file(path: str | Path) -> ModelShape:
    """:func:`shape_from_hf` of a config.json on disk."""
    return shape_from_hf(read_config(path), name_of(path))


def shape_from_hf(cfg: dict[str, Any], name: str) -> ModelShape:
    """The ModelShape of a Hugging Face config; one clear error for an architecture not
    read here or a config that lacks a key its size needs."""
    left_out = None
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Gemma 3 4B+): the language model
        left_out = _other_towers(cfg)
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    arch = cfg.get("model_type")
    if "model_type" not in cfg:
        raise MgbenchError(f"model {name}: the Hugging Face config has no model_type")
    if not isinstance(arch, str):
        raise MgbenchError(f"model {name}: the Hugging Face config's model_type must be a string (e.g. \"llama\"), "
                           f"got {arch!r}")
    reader = READERS.get(arch)
    if reader is None:
        raise MgbenchError(f"model {name}: Hugging Face model_type {arch!r} is not read by mgbench; it reads "
                           f"{', '.join(sorted(READERS))} (or give the dims: --layers, --hidden, ...)")
    try:
        shape = reader(cfg, name)
        return dataclasses.replace(shape, left_out=left_out) if left_out else shape
    except KeyError as e:
        raise MgbenchError(f"model {name}: the Hugging Face {arch} config lacks {e.args[0]}") from None
    except BadValue as e:
        key, what, value = e.args
        raise MgbenchError(f"model {name}: the Hugging Face {arch} config's {key} must be {what}, got {value!r}"
                           ) from None


class BadValue(Exception):
    """A config key holding a value of the wrong kind, as (key, what it must be, the
    value), raised where a reader here computes with it before ModelShape checks the
    dims (a string in arithmetic, an int iterated over would end in a traceback);
    :func:`shape_from_hf` names the model."""


def _int(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    """A dim the config must give (KeyError when it does not, unless ``default``), as
    given: ModelShape says which dim is not a positive integer."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise KeyError(key)
        return default
    return v


def _is_count(v: Any) -> bool:
    """Whether ``v`` is a positive integer (JSON true is not one)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _layer_list(cfg: dict[str, Any], key: str) -> list[int] | None:
    """A list of layer indices the config may give (mlp_only_layers, moe_layers)."""
    v = cfg.get(key)
    if v is not None and not (isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)):
        raise BadValue(key, "a list of layer indices (integers)", v)
    return v


def _head_dim(cfg: dict[str, Any]) -> int | None:
    """head_dim when it differs from hidden / heads (None: the default). A hidden or
    heads that is no positive integer is left to ModelShape to name."""
    h, a, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("head_dim")
    if d is None:
        return None
    if not _is_count(d):
        raise BadValue("head_dim", "a positive integer", d)
    return None if _is_count(h) and _is_count(a) and h % a == 0 and d == h // a else d


def _local(cfg: dict[str, Any], layers: int, default_every: int) -> dict[str, Any]:
    """sliding_window and global_every from a config: ``layer_types`` when it lists them,
    else every ``default_every``-th layer global (0: all local; Mistral v0.1)."""
    w = cfg.get("sliding_window")
    if w is None or cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if not full:
            return {"sliding_window": w, "global_every": 0}
        k = full[0] + 1
        if full != list(range(k - 1, layers, k)):
            raise MgbenchError(f"layer_types places full attention at layers {full}: only every k-th layer global "
                               "is modelled")
        return {"sliding_window": w, "global_every": k}
    pattern = cfg.get("sliding_window_pattern", default_every)
    return {"sliding_window": w, "global_every": pattern}


def _common(cfg: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
    heads = _int(cfg, "num_attention_heads")
    return dict(layers=_int(cfg, "num_hidden_layers"), hidden=_int(cfg, "hidden_size"), heads=heads,
                kv_heads=cfg.get("num_key_value_heads") or heads, vocab=_int(cfg, "vocab_size"),
                head_dim=_head_dim(cfg), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), name=name,
                **extra)


def _llama(cfg: dict[str, Any], name: str) -> ModelShape:
    """llama, mistral, qwen2, qwen3, phi3 (fused qkv and gate_up: the same weights)."""
    d = _common(cfg, name, ffn_hidden=_int(cfg, "intermediate_size"), mlp="swiglu")
    return ModelShape(**d, **_local(cfg, d["layers"], 0))


def _other_towers(cfg: dict[str, Any]) -> str:
    """What a multimodal config (one with a ``text_config``) holds besides its language
    model: each other ``*_config`` table (vision, audio ...), with the sizes it states."""
    towers = []
    for key, sub in cfg.items():
        if key == "text_config" or not key.endswith("_config") or not isinstance(sub, dict):
            continue
        sizes = [f"{sub[k]} {what}" for k, what in (("num_hidden_layers", "layers"), ("hidden_size", "hidden"),
                                                    ("intermediate_size", "MLP")) if isinstance(sub.get(k), int)]
        towers.append(f"the {key.removesuffix('_config')} tower ({key}" + (": " + ", ".join(sizes) if sizes else "")
                      + ")")
    what = " and ".join(towers) if towers else "whatever the config holds beside its text_config"
    return f"{what}, and the tokens it feeds the language model: only the language model (text_config) is sized and priced"


def _gemma(cfg: dict[str, Any], name: str) -> ModelShape:
    """gemma (1), gemma2 (local/global alternating), gemma3 (5 local : 1 global): GeGLU,
    tied embeddings unless a config says otherwise."""
    d = _common(cfg, name, ffn_hidden=_int(cfg, "intermediate_size"), mlp="geglu")
    d["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    every = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}.get(cfg["model_type"])
    return ModelShape(**d, **(_local(cfg, d["layers"], every) if every else {}))


def _gpt2(cfg: dict[str, Any], name: str) -> ModelShape:
    h = _int(cfg, "n_embd")
    # MLP 4 h wide unless given; no width from an n_embd that is no positive integer (ModelShape names it as hidden).
    ffn = cfg.get("n_inner") or (4 * h if _is_count(h) else None)
    return ModelShape(layers=_int(cfg, "n_layer"), hidden=h, heads=_int(cfg, "n_head"), ffn_hidden=ffn,
                      vocab=_int(cfg, "vocab_size"), mlp="gelu",
                      tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), name=name)


def _mixtral(cfg: dict[str, Any], name: str) -> ModelShape:
    """mixtral and gpt_oss: every layer MoE, experts as wide as intermediate_size; gpt_oss's
    experts carry biases and clamp their gated inputs to swiglu_limit (transformers'
    GptOssExperts)."""
    f = _int(cfg, "intermediate_size")
    d = _common(cfg, name, ffn_hidden=f, mlp="swiglu", experts=_int(cfg, "num_local_experts"),
                top_k=_int(cfg, "num_experts_per_tok"))
    oss = cfg["model_type"] == "gpt_oss"
    # swiglu_limit's default is transformers' GptOssConfig's own (7.0): a config without it means that.
    extra = {"expert_bias": True, "glu_clamp": _swiglu_limit(cfg)} if oss else {}
    return ModelShape(**d, **extra, **_local(cfg, d["layers"], 2 if oss else 0))


def _swiglu_limit(cfg: dict[str, Any]) -> float:
    """gpt_oss's swiglu_limit (7.0 where the config leaves it out or null)."""
    v = cfg.get("swiglu_limit")
    if v is None:
        return 7.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise BadValue("swiglu_limit", "a positive number", v)
    return float(v)


def _qwen_moe(cfg: dict[str, Any], name: str) -> ModelShape:
    """qwen3_moe: experts of moe_intermediate_size; layers listed in mlp_only_layers are
    dense (only a leading run is modelled); every decoder_sparse_step-th layer is an MoE
    layer (transformers' Qwen3MoeDecoderLayer: (index + 1) % step == 0, ModelShape's
    moe_interval), with no mlp_only_layers beside a step other than 1 (whose phase would
    then differ from moe_interval's)."""
    layers = _int(cfg, "num_hidden_layers")
    dense = sorted(_layer_list(cfg, "mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1)
    if dense != list(range(len(dense))) or not isinstance(step, int) or step < 1 or (dense and step != 1):
        raise MgbenchError(f"model {name}: only leading dense layers, or MoE every k-th layer with none, are modelled "
                           f"(mlp_only_layers {dense}, decoder_sparse_step {step!r})")
    d = _common(cfg, name, ffn_hidden=_int(cfg, "intermediate_size"), mlp="swiglu",
                experts=_int(cfg, "num_experts"), top_k=_int(cfg, "num_experts_per_tok"),
                expert_ffn_hidden=_int(cfg, "moe_intermediate_size"), dense_layers=len(dense), moe_interval=step)
    return ModelShape(**d, **_local(cfg, layers, 0))


def _llama4(cfg: dict[str, Any], name: str) -> ModelShape:
    """llama4_text (Llama 4 Scout, Maverick; the text_config of their multimodal configs):
    experts and one shared expert of intermediate_size, dense layers of
    intermediate_size_mlp, MoE every interleave_moe_layer_step-th layer (transformers'
    Llama4TextConfig: moe_layers = range(step - 1, layers, step) unless listed, ModelShape's
    moe_interval). Its chunked attention (three layers in four attend within
    attention_chunk_size-token chunks, every no_rope_layer_interval-th globally) is read as a
    sliding window of the chunk's size, global every no_rope_layer_interval-th layer: the same up to the chunk, and an upper bound
    beyond (a window holds up to the chunk's keys a query, a chunk half of that on average)."""
    layers = _int(cfg, "num_hidden_layers")
    step = cfg.get("interleave_moe_layer_step", 1)
    listed = _layer_list(cfg, "moe_layers")
    # (A layers that is no positive integer: ModelShape names it.)
    if not isinstance(step, int) or step < 1 or (listed is not None and _is_count(layers)
                                                 and listed != list(range(step - 1, layers, step))):
        raise MgbenchError(f"model {name}: only MoE every k-th layer from the k-th is modelled (moe_layers {listed}, "
                           f"interleave_moe_layer_step {step!r})")
    expert = _int(cfg, "intermediate_size")
    d = _common(cfg, name, ffn_hidden=cfg.get("intermediate_size_mlp") or expert, mlp="swiglu",
                experts=_int(cfg, "num_local_experts"), top_k=_int(cfg, "num_experts_per_tok"),
                expert_ffn_hidden=expert, shared_experts=1, moe_interval=step)
    chunk = cfg.get("attention_chunk_size")
    # no_rope_layer_interval: transformers' Llama4TextConfig default, 4 (the NoPE layers are
    # the global ones)
    local = {"sliding_window": chunk, "global_every": cfg.get("no_rope_layer_interval", 4)} if chunk else {}
    return ModelShape(**d, **local)


def _deepseek(cfg: dict[str, Any], name: str) -> ModelShape:
    """deepseek_v2 / deepseek_v3: MLA, shared experts, leading dense layers, MTP modules."""
    if cfg.get("moe_layer_freq", 1) != 1:
        raise MgbenchError(f"model {name}: moe_layer_freq {cfg['moe_layer_freq']} (DeepSeek's MoE layers at index % k "
                           "== 0 past the dense ones) is not modelled; leading dense layers are, and MoE every k-th "
                           "layer from the k-th (moe_interval)")
    heads = _int(cfg, "num_attention_heads")
    return ModelShape(layers=_int(cfg, "num_hidden_layers"), hidden=_int(cfg, "hidden_size"), heads=heads,
                      ffn_hidden=_int(cfg, "intermediate_size"), vocab=_int(cfg, "vocab_size"), mlp="swiglu",
                      tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                      experts=_int(cfg, "n_routed_experts"), top_k=_int(cfg, "num_experts_per_tok"),
                      expert_ffn_hidden=_int(cfg, "moe_intermediate_size"),
                      shared_experts=cfg.get("n_shared_experts") or 0,
                      dense_layers=cfg.get("first_k_dense_replace") or 0,
                      kv_lora_rank=_int(cfg, "kv_lora_rank"), q_lora_rank=cfg.get("q_lora_rank"),
                      qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"), qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
                      v_head_dim=_int(cfg, "v_head_dim"), mtp_layers=cfg.get("num_nextn_predict_layers") or 0,
                      name=name)


READERS: dict[str, Reader] = {
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "phi3": _llama,
    "gemma": _gemma, "gemma2": _gemma, "gemma3": _gemma, "gemma3_text": _gemma,
    "gpt2": _gpt2,
    "mixtral": _mixtral, "gpt_oss": _mixtral,
    "qwen3_moe": _qwen_moe,
    "llama4_text": _llama4, "llama4": _llama4,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
}
