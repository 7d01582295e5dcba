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


def _fits(patterns: list[str], device_name: str) -> bool:
    """Whether a ``match`` pattern of hardware.toml claims ``device_name``: anywhere in the
    name, but only from the start of one of its words (after a space, a hyphen or the
    name's start), so that "B200" claims "NVIDIA B200" and not "NVIDIA GB200", a
    different device the catalog does not know (it then gets no peak, rather than
    B200's). Only the start is anchored: patterns such as "A100.*SXM.*40" end inside a
    word ("SXM4-40GB")."""
    return any(re.search(rf"(?<![A-Za-z0-9])(?:{p})", device_name, re.IGNORECASE) for p in patterns)


def match_accelerator(device_name: str, memory_gib: float | None = None) -> str | None:
    """Catalog id of the accelerator a device is, from the name torch / NVML report and,
    where variants share a name, its total memory (GiB, as torch reports it).

    First every entry's ``match`` patterns, in file order (more specific entries come
    first: "H200 NVL" before "H200"); a name no pattern claims then goes to the entry
    whose ``match_by_memory`` names fit it and whose ``memory_gib`` range holds the
    device's memory (a bare "NVIDIA A100": 40 or 80 GB). Returns None for devices the
    catalog does not know (a CPU, a new GPU) and for a shared name whose memory is not
    given: callers then report peak-based figures such as MFU as null.
    """
    accs = accelerators()
    for key, acc in accs.items():
        if _fits(acc.get("match", []), device_name):
            return key
    if memory_gib is not None:
        for key, acc in accs.items():
            by_mem = acc.get("match_by_memory")
            if by_mem and by_mem["memory_gib"][0] <= memory_gib <= by_mem["memory_gib"][1] \
                    and _fits(by_mem["names"], device_name):
                return key
    return None


def peak_precision(precision: str, fp32_matmul: str = "ieee") -> str:
    """The catalog peak a config's MFU divides by: its precision, except fp32 whose matmuls
    ran on TF32 tensor cores (``fp32_matmul = "tf32"``), which reaches the tf32 peak."""
    return "tf32" if precision == "fp32" and fp32_matmul == "tf32" else precision


# fp8 training's MFU divides by the bf16 dense peak: only the blocks' linears run in
# float8 (torchao, strategies/fp8.py), and torchtitan and Megatron report fp8 MFU this way.
# The fp8 peak is the runner's HFU (hfu_pct) and prices the planner's float8 linears.
MFU_PEAK_OF = {"fp8": "bf16"}


def mfu_precision(precision: str) -> str:
    """The precision whose dense peak a config's MFU divides by (bf16 for fp8)."""
    return MFU_PEAK_OF.get(precision, precision)


def peak_tflops(device_name: str, precision: str, memory_gib: float | None = None,
                fp32_matmul: str = "ieee") -> tuple[float | None, str]:
    """Dense peak TFLOPS of a device at a precision, with the reason when unknown (or its
    source when known). ``memory_gib`` tells variants that share a name apart;
    ``fp32_matmul`` ("ieee" or "tf32") says how fp32 matmuls ran (see peak_precision)."""
    key = match_accelerator(device_name, memory_gib)
    if key is None:
        shared = [k for k, a in accelerators().items()
                  if a.get("match_by_memory") and _fits(a["match_by_memory"]["names"], device_name)]
        if shared and memory_gib is None:
            return None, (f"device name {device_name!r} is shared by {', '.join(shared)}, which differ in memory, "
                          "and the device's memory is unknown")
        if shared:
            return None, f"device {device_name!r} with {memory_gib:.1f} GiB fits none of {', '.join(shared)}"
        return None, f"no peak FLOPS in the catalog for device {device_name!r}"
    kind = peak_precision(precision, fp32_matmul)
    value = accelerators()[key].get("tflops", {}).get(kind)
    if value is None:
        return None, f"catalog has no {kind} peak for {key}"
    note = " (fp32 matmuls on TF32 tensor cores)" if kind != precision else ""
    return float(value), f"{key} {kind} peak{note} from {accelerators()[key]['source']}"


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
