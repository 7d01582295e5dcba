"""The software stack as an explicit input of the performance model (``--stack``).

The same kernels on the same GPUs give different step times under different frameworks
(Megatron-Core vs FSDP-based stacks: fusion, overlap, memory layout). The planner's
constants (hardware.toml [planner]) are solved from Megatron-LM's published runs, so the
``megatron-lm`` stack is 1 by construction; another stack's efficiency is the factor its
own published runs need (compute time / factor), solved from its calibration row of
published_runs.toml and scored on its validation rows (``python -m
mgbench.planner.validation_report`` prints the error per stack). A stack whose factor has no
measured run behind it is null with the reason, and predicting with it is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import catalog
from ..errors import MgbenchError
from .hardware import Hardware

# The stack the planner's constants were calibrated on and validated against (8 published
# Megatron-LM rows): the one with the most evidence behind it, so the default. Users of
# another stack say so with --stack; its interval then comes from that stack's rows.
DEFAULT_STACK = "megatron-lm"
# What a stack's linears keep for backward (stacks.toml saved_inputs): torch autograd's
# tensors, or Transformer Engine's (memory.layer_activations te=).
SAVED_INPUTS = ("torch", "transformer-engine")
# The FP8 scaling recipe of a stack that names none (stacks.toml fp8_recipe): Megatron-Core's
# own default (TransformerConfig.fp8_recipe = "delayed", NVIDIA/Megatron-LM
# megatron/core/transformer/transformer_config.py @d98e8a64), Transformer Engine's too.
DEFAULT_FP8_RECIPE = "delayed"


def stacks() -> dict[str, dict[str, Any]]:
    """Every stack of data/stacks.toml, keyed by name."""
    return catalog.load("stacks.toml")["stacks"]


def efficiency_stack(name: str) -> str:
    """The stack whose published runs set ``name``'s efficiency: its own, or where it
    carries a sibling's (stacks.toml ``efficiency_from``, with its ``efficiency_reason``)
    that sibling's; MgbenchError for a carry to no stack of the file, in a circle, or
    without its reason. A name the file lacks is returned as it is (:func:`efficiency`
    refuses it)."""
    known, seen = stacks(), ()
    while (carried := known.get(name, {}).get("efficiency_from")) is not None:
        if carried not in known or carried in seen + (name,) or not known[name].get("efficiency_reason"):
            raise MgbenchError(f"stacks.toml [stacks.{name}] efficiency_from {carried!r}: not another stack of the "
                               "file, carried in a circle, or without its efficiency_reason")
        seen, name = seen + (name,), carried
    return name


def efficiency(name: str) -> float:
    """The stack's factor on compute time (1 for the calibration stack); a stack with no
    run of its own to solve it from may carry a sibling's (:func:`efficiency_stack`)."""
    known = stacks()
    if name not in known:
        raise MgbenchError(f"unknown --stack {name!r}; known: {', '.join(known)}")
    source = efficiency_stack(name)
    eff = known[source].get("efficiency")
    if eff is None:
        usable = [k for k in known if known[efficiency_stack(k)].get("efficiency") is not None]
        raise MgbenchError(f"--stack {name}: no efficiency yet ({known[source]['null_reason']}); "
                           f"use one of {', '.join(usable)}")
    return float(eff)


def carried_note(name: str | None) -> str | None:
    """The line predict and plan add where ``name`` carries another stack's efficiency
    (what its published runs do not measure); None where the stack's own runs set it."""
    if name is None or name not in stacks() or (source := efficiency_stack(name)) == name:
        return None
    return (f"--stack {name}: efficiency carried from {source}: {stacks()[name]['efficiency_reason']}; a dense "
            f"model's interval comes from {source}'s runs too")


# --state-bytes: the bytes a parameter a run keeps where its recipe differs from its stack's
# default (stacks.toml state_bytes); the settings users most often change, each from the
# code that sets it.
STATE_BYTES_HELP = (
    "Bytes a parameter the run keeps as WEIGHTS,GRADIENTS,OPTIMIZER (before ZeRO sharding; 16-bit training), "
    "where its recipe differs from the --stack's default (stacks.toml state_bytes; megatron-lm 2,4,12: bf16 "
    "weights, fp32 main grads, fp32 master weights and Adam moments). Megatron-Bridge's performance recipes "
    "reduce gradients in bf16 (grad_reduce_in_fp32 False): 2,2,12; Megatron-LM with --grad-reduce-in-bf16 the "
    "same; bf16 Adam moments (--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16) make the optimizer 8; an optimizer "
    "kept in host memory (Megatron-LM --chunked-optimizer-state-offload) 0, its staging buffers not counted. Memory "
    "only: data-parallel traffic is priced at 2 bytes a gradient either way.")


def parse_state_bytes(values: Any) -> tuple[float, float, float] | None:
    """``--state-bytes W,G,O`` (a list of three strings, or None) as three floats; an
    MgbenchError naming the problem where they are not three numbers, each at most 16
    bytes a parameter, the weights and gradients above 0 and the optimizer's at least 0
    (0: kept in host memory)."""
    if values is None or len(values) == 0:
        return None
    where = f"--state-bytes {','.join(str(v) for v in values)}"
    if len(values) != 3:
        raise MgbenchError(f"{where}: give three numbers, WEIGHTS,GRADIENTS,OPTIMIZER bytes a parameter "
                           "(e.g. 2,2,12)")
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise MgbenchError(f"{where}: each of the three must be a number of bytes (e.g. 2,2,12)") from None
    w, g, o = out
    if not (0.0 < w <= 16.0 and 0.0 < g <= 16.0 and 0.0 <= o <= 16.0):  # NaN too
        raise MgbenchError(f"{where}: weights and gradients must be above 0, the optimizer at least 0 (kept in host "
                           "memory), each at most 16 bytes a parameter (e.g. 2,2,12)")
    return out  # type: ignore[return-value]


def row_state_bytes(row: dict[str, Any]) -> tuple[float, float, float] | None:
    """A data file row's ``state_bytes`` (its recipe's bytes a parameter, as
    :func:`parse_state_bytes` reads --state-bytes), or None where it gives none."""
    given = row.get("state_bytes")
    return None if given is None else parse_state_bytes([str(x) for x in given])


def memory_of(name: str | None, state_bytes: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """How the stack holds memory (data/stacks.toml [stacks.NAME.memory]), as keyword
    arguments of memory.memory_per_gpu: ``state_bytes`` (weights, gradients, optimizer
    states per parameter under 16-bit training; the argument replaces the stack's where a
    run's recipe sets its own: :func:`parse_state_bytes`), ``loss``, ``loss_vocab_parallel`` and
    ``te_saved_inputs`` (saved_inputs = "transformer-engine": what its linears keep),
    ``pipeline_outputs_freed`` (a sent stage output keeps no data) and ``expert_epilogue``
    (:func:`counts_expert_epilogue`). ``None``: the default stack."""
    name = name or DEFAULT_STACK
    known = stacks()
    if name not in known:
        raise MgbenchError(f"unknown --stack {name!r}; known: {', '.join(known)}")
    m = known[name]["memory"]
    from .memory import LOSS_NAMES

    if m.get("loss") not in LOSS_NAMES:
        raise MgbenchError(f"stacks.toml [stacks.{name}.memory] loss must be one of {', '.join(LOSS_NAMES)}, "
                           f"got {m.get('loss')!r}")
    saved = m.get("saved_inputs", "torch")
    if saved not in SAVED_INPUTS:
        raise MgbenchError(f"stacks.toml [stacks.{name}.memory] saved_inputs must be one of {', '.join(SAVED_INPUTS)}, "
                           f"got {saved!r}")
    held = tuple(float(x) for x in (m["state_bytes"] if state_bytes is None else state_bytes))
    return {"state_bytes": held, "loss": m["loss"],
            "loss_vocab_parallel": bool(m["loss_vocab_parallel"]),
            "te_saved_inputs": saved == "transformer-engine",
            "pipeline_outputs_freed": bool(m.get("pipeline_outputs_freed", False)),
            "expert_epilogue": counts_expert_epilogue(name),
            "moe_eager_saved": bool(m.get("moe_eager_saved", False))}


# data/stacks.toml expert_epilogue: the implementations whose gpt-oss expert ops are counted.
EXPERT_EPILOGUES = ("megatron-core",)


def counts_expert_epilogue(name: str | None) -> bool:
    """Whether the stack runs gpt-oss's expert clamp and bias as the eager ops
    planner/moe.py EPILOGUE_BYTES counts (data/stacks.toml ``expert_epilogue``, one of
    :data:`EXPERT_EPILOGUES`; absent: not counted for it)."""
    name = name or DEFAULT_STACK
    value = stacks().get(name, {}).get("expert_epilogue")
    if value is not None and value not in EXPERT_EPILOGUES:
        raise MgbenchError(f"stacks.toml [stacks.{name}] expert_epilogue must be one of {', '.join(EXPERT_EPILOGUES)} "
                           f"or absent, got {value!r}")
    return value is not None


def apply(hw: Hardware, name: str | None) -> Hardware:
    """``hw`` with the stack's efficiency (``None``: the default stack)."""
    name = name or DEFAULT_STACK
    return dataclasses.replace(hw, stack_eff=efficiency(name), stack=name)


def fp8_recipe(name: str | None, given: str | None = None) -> str:
    """The FP8 scaling recipe a run on stack ``name`` is priced under: ``given``
    (--fp8-recipe), else the stack's (stacks.toml ``fp8_recipe``, else
    :data:`DEFAULT_FP8_RECIPE`). The one resolution: layout_time.step_time prices with it,
    predict and plan print it."""
    from .perf import FP8_RECIPES

    if given is not None:
        return given
    from ..probe.profile import STACK as RUNNER_STACK

    name = name or DEFAULT_STACK
    if name == RUNNER_STACK and "fp8_recipe" not in stacks().get(name, {}):
        from ..config import RunConfig  # the runner's own default, stated once (config.py)

        return RunConfig.__dataclass_fields__["fp8_recipe"].default
    recipe = stacks().get(name, {}).get("fp8_recipe", DEFAULT_FP8_RECIPE)
    if recipe not in FP8_RECIPES:
        raise MgbenchError(f"stacks.toml [stacks.{name}] fp8_recipe must be one of {', '.join(FP8_RECIPES)}, "
                           f"got {recipe!r}")
    return recipe
