"""Tensor parallelism of Hugging Face models through their own tensor-parallel plan.

transformers describes how a model splits over tensor-parallel ranks in a plan: the
config class's ``base_model_tp_plan`` (module path patterns of the base model, ``*``
standing for a layer index, mapped to a style name such as ``"colwise"``), merged by the
model with its own ``_tp_plan`` (the ``lm_head``) and, since transformers 5, a
vocabulary-split input embedding. mgbench applies that plan with torch's DTensor
``parallelize_module``, mapping each style name onto torch's parallel style that does
the same thing (the meanings are those transformers registers for the names in
``transformers/distributed/tensor_parallel.py``, 5.23):

- ``colwise``: the weight split over its output features, input replicated, output left
  split on the last dimension (the q/k/v and MLP input projections: each rank computes
  its own heads, and the attention's ``view(..., -1, head_dim)`` takes the local head
  count);
- ``rowwise``: the weight split over its input features, input split on the last
  dimension, partial outputs summed (o_proj, down_proj: one all-reduce per block half);
- ``colwise_gather_output``: column split with the output gathered whole (the lm_head:
  full logits for the loss, as mgbench's own decoder does);
- ``embedding_rowwise``: the embedding table split over the vocabulary, partial lookups
  summed (as mgbench's own decoder splits its token embedding).

A style outside this table is refused with the reason rather than guessed at. Models
whose config has no plan (GPT-2 in transformers 5.23) do not run tp. Sequence parallelism
(``tp_sp``) is not built: the plans split projections only, not the norms and residual
stream over the sequence.

This module is importable without torch or transformers (the suite validator reads
:func:`plan_problem`); :func:`apply_tensor_parallel` runs on the ranks.
"""

from __future__ import annotations

import re
from typing import Any

# Strategies a model with a plan runs under (the data-parallel ones are in HF_STRATEGIES).
# fsdp+tp: FSDP2 over dp after the plan over tp, the order the GPT path uses.
TP_STRATEGIES = ("tp", "fsdp+tp")
# model_type -> whether its config class has a base_model_tp_plan (transformers 5.23; a
# unit test reads the installed classes and fails when this drifts from them). Checked
# here, not by importing transformers: the suite validator runs without torch.
HAS_TP_PLAN: dict[str, bool] = {"llama": True, "mistral": True, "qwen2": True, "gpt2": False}
# Plan style names mgbench maps onto torch's parallel styles (see the module docstring).
KNOWN_STYLES = ("colwise", "rowwise", "colwise_gather_output", "embedding_rowwise")


def plan_problem(spec: Any) -> str | None:
    """Why the Hugging Face model ``spec`` (an HFModel) cannot run tensor parallel
    (None when it can): no plan for its architecture, or a plan in its config.json with
    a style mgbench does not map."""
    if not HAS_TP_PLAN.get(spec.arch, False):
        have = ", ".join(a for a, yes in HAS_TP_PLAN.items() if yes)
        return (f"{spec.name}: {spec.arch} configs have no tensor-parallel plan (base_model_tp_plan) in transformers; "
                f"tp runs models that have one ({have}); use ddp or fsdp")
    return style_problem(spec.config.get("base_model_tp_plan") or {})


def style_problem(plan: dict[str, Any]) -> str | None:
    """Why ``plan`` (module pattern -> style name) cannot be applied (None when it can)."""
    unknown = sorted({f"{k} = {v!r}" for k, v in plan.items() if v not in KNOWN_STYLES})
    if unknown:
        return (f"tensor-parallel plan style(s) mgbench does not map: {', '.join(unknown)} "
                f"(mapped: {', '.join(KNOWN_STYLES)}); use ddp or fsdp")
    return None


def torch_style(name: str) -> Any:
    """torch's parallel style for a plan style name (ValueError for an unknown one)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    if name == "colwise_gather_output":
        return ColwiseParallel(output_layouts=Replicate())
    if name == "embedding_rowwise":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    raise ValueError(style_problem({"?": name}))


def model_plan(lm: Any) -> dict[str, str]:
    """The whole model's plan (paths from the ``*ForCausalLM``): transformers' merged
    instance plan where it has one (5.x), else the config's base-model plan under the
    base model's prefix plus the class's own (the lm_head)."""
    plan = dict(getattr(lm, "_tp_plan", None) or {})
    if not any(k.startswith(lm.base_model_prefix + ".") for k in plan):
        base = getattr(lm.config, "base_model_tp_plan", None) or {}
        plan.update({f"{lm.base_model_prefix}.{k}": v for k, v in base.items()})
    return plan


def expand(plan: dict[str, str], names: list[str]) -> dict[str, str]:
    """Module path -> style for every module path in ``names`` a plan pattern matches
    (``*`` matches one path component, as in transformers' plans). A pattern matching
    nothing is an error: a plan that silently splits less than it says would run
    replicated layers under a tp label."""
    out: dict[str, str] = {}
    for pattern, style in plan.items():
        rx = re.compile("^" + r"[^.]+".join(re.escape(part) for part in pattern.split("*")) + "$")
        hits = [n for n in names if rx.match(n)]
        if not hits:
            raise ValueError(f"tensor-parallel plan entry {pattern!r} matches no module of the model")
        out.update({n: style for n in hits})
    return out


def apply_tensor_parallel(model: Any, mesh: Any, sequence_parallel: bool) -> None:
    """Split a CausalLM (workloads/hf.py) over ``mesh`` by its model's plan."""
    from torch.distributed.tensor.parallel import parallelize_module

    if sequence_parallel:
        raise ValueError("sequence parallelism is not built for Hugging Face models")
    lm = model.lm
    if getattr(lm.config, "tie_word_embeddings", False):
        # Splitting embedding and head separately would replace the one shared weight
        # with two: the suite skips this, here it is refused rather than mis-trained.
        raise ValueError("tensor parallelism with tied embeddings is not supported")
    plan = model_plan(lm)
    if (why := style_problem(plan)):
        raise ValueError(why)
    if not plan:
        raise ValueError(f"{type(lm).__name__} has no tensor-parallel plan")
    names = [n for n, _ in lm.named_modules()]
    # One call per module: parallelize_module's own wildcard matching varies across
    # torch releases; the expanded paths are exact.
    for path, style in expand(plan, names).items():
        parallelize_module(lm.get_submodule(path), mesh, torch_style(style))
