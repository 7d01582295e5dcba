"""Loads the data files in mgbench/data: accelerators, links, systems and model shapes.

The TOML files are the one place for each hardware figure and model shape; this module
only reads them and answers questions such as "what is the bf16 peak of this device?".
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from typing import Any

from .errors import MgbenchError
from .model_shape import ModelShape


@functools.cache
def load(name: str) -> dict[str, Any]:
    """One data file of mgbench/data, parsed (cached)."""
    text = resources.files("mgbench.data").joinpath(name).read_text()
    return tomllib.loads(text)


def accelerators() -> dict[str, dict[str, Any]]:
    """All accelerators of hardware.toml, keyed by catalog id (e.g. ``h100-sxm``)."""
    return load("hardware.toml")["accelerators"]


def accelerator(key: str) -> dict[str, Any]:
    """One accelerator by catalog id; MgbenchError naming the valid ids otherwise."""
    acc = accelerators()
    if key not in acc:
        raise MgbenchError(f"unknown accelerator {key!r}; known: {', '.join(acc)}")
    return acc[key]


def match_accelerator(device_name: str) -> str | None:
    """Catalog id of the accelerator whose ``match`` patterns fit a device name.

    Returns None for devices the catalog does not know (a CPU, a new GPU): callers
    then report peak-based figures such as MFU as null.
    """
    for key, acc in accelerators().items():
        if any(re.search(p, device_name, re.IGNORECASE) for p in acc.get("match", [])):
            return key
    return None


def peak_tflops(device_name: str, precision: str) -> tuple[float | None, str]:
    """Dense peak TFLOPS of a device at a precision, with the reason when unknown."""
    key = match_accelerator(device_name)
    if key is None:
        return None, f"no peak FLOPS in the catalog for device {device_name!r}"
    value = accelerators()[key].get("tflops", {}).get(precision)
    if value is None:
        return None, f"catalog has no {precision} peak for {key}"
    return float(value), f"{key} {precision} peak from {accelerators()[key]['source']}"


def links() -> dict[str, dict[str, Any]]:
    """All interconnects of hardware.toml (NVLink, PCIe, InfiniBand...), keyed by name,
    with their peak GB/s, latency and achievable fraction. Read here, below both the
    planner (which models with them) and `mgbench comm` (which compares with them)."""
    return load("hardware.toml")["links"]


def systems() -> dict[str, dict[str, Any]]:
    """All node types of hardware.toml (e.g. ``dgx-h100``): GPU, GPUs and NICs per node,
    and the names of their intra- and inter-node links."""
    return load("hardware.toml")["systems"]


def model_presets() -> dict[str, dict[str, Any]]:
    """All model shapes of models.toml, keyed by preset name."""
    return load("models.toml")["models"]


def model_shape(name: str) -> ModelShape:
    """The ModelShape of a preset; MgbenchError listing the presets otherwise."""
    presets = model_presets()
    if name not in presets:
        raise MgbenchError(
            f"unknown model preset {name!r}; choose one of: {', '.join(presets)} "
            "or give explicit dims {layers, hidden, heads, ffn_hidden, vocab}"
        )
    fields = {k: v for k, v in presets[name].items() if k != "source"}
    return ModelShape(name=name, **fields)
