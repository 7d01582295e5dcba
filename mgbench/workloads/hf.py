"""Hugging Face causal LMs built from their config (no weights, no network).

``model = "hf:PATH/config.json"`` or ``{ hf = "llama", layers = ..., hidden = ... }``
(:class:`mgbench.workloads.HFModel`). The model is built with
``AutoModelForCausalLM.from_config`` after the run's seed is set, so every rank and the
single-process reference start from the same weights, and trained on the same token
batches and loss as mgbench's own decoder (workload ``gpt``). transformers is imported
here only, on the rank side of hf configs (it takes seconds to import).

What mgbench changes in the config, and why:

- dropout probabilities are set to 0: the correctness check compares the strategy with
  a single-process reference step by step, and dropout masks drawn from different
  random streams would make them differ (mgbench's own decoder has no dropout either);
- ``use_cache = False``: training keeps no key/value cache;
- the parameters are built in fp32 whatever the config's ``torch_dtype`` says: the
  config's ``precision`` key sets the compute precision (autocast), as for every workload;
- attention runs through torch's ``scaled_dot_product_attention`` (``attn_implementation
  = "sdpa"``), the kernel mgbench's own decoder uses.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def hf_config(cfg: Any) -> Any:
    """The transformers config object of ``cfg``'s model, with mgbench's changes applied."""
    from transformers import AutoConfig

    conf = dict(cfg.model.config)
    arch = conf.pop("model_type")
    conf["use_cache"] = False
    for key in ("dtype", "torch_dtype"):  # the checkpoint's storage dtype: precision decides here
        conf.pop(key, None)
    out = AutoConfig.for_model(arch, **conf)
    # Every dropout probability, those the config file gives and the class defaults it
    # leaves (GPT2Config's resid_pdrop, attn_pdrop, embd_pdrop are 0.1): Llama's
    # attention_dropout, ...
    for key, value in out.to_dict().items():
        if isinstance(value, float) and (key.endswith("dropout") or key.endswith("pdrop")):
            setattr(out, key, 0.0)
    return out


class CausalLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab), around a transformers
    ``*ForCausalLM``; ``blocks`` is its list of decoder layers (FSDP shards each,
    activation checkpointing wraps them)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    @property
    def blocks(self) -> nn.ModuleList:
        base = self.lm.base_model
        # Llama-like models keep their layers in .layers, GPT-2 in .h
        return base.layers if hasattr(base, "layers") else base.h

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=tokens, use_cache=False).logits


def build(cfg: Any) -> CausalLM:
    """The model with the current RNG state (the caller seeds it), parameters in fp32."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    # transformers warns about token ids of the original vocabulary (GPT-2's 50256) in a
    # config with a small test vocabulary: unused in training, so not worth a line a build.
    logging.set_verbosity_error()
    # No dtype argument (its name changed across transformers releases): with the config's
    # dtype removed the parameters are built in torch's default, fp32; .float() makes sure.
    lm = AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation="sdpa")
    return CausalLM(lm.float())


def num_params(cfg: Any) -> int:
    """Trainable parameters as built (tied embeddings once), counted on the meta device."""
    with torch.device("meta"):
        model = build(cfg)
    return sum(p.numel() for p in model.parameters())
