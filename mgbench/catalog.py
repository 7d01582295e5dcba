"""Loads the data files in mgbench/data: accelerators, links, systems and model shapes.

The TOML files are the one place for each hardware figure and model shape; this module
only reads them and answers questions such as "what is the bf16 peak of this device?".
"""

from __future__ import annotations

import datetime
import functools
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import MgbenchError
from .model_shape import ModelShape


@functools.cache
def load(name: str) -> dict[str, Any]:
    """One data file of mgbench/data, parsed (cached)."""
    text = resources.files("mgbench.data").joinpath(name).read_text()
    return tomllib.loads(text)


# A user's own hardware (--system-file), merged over hardware.toml's tables for this
# process: {"accelerators": {...}, "links": {...}, "systems": {...}}. Empty unless
# use_system_file() loaded one; clear_system_file() empties it again.
_USER: dict[str, dict[str, dict[str, Any]]] = {"accelerators": {}, "links": {}, "systems": {}}


def _hardware_table(kind: str) -> dict[str, dict[str, Any]]:
    """hardware.toml's ``kind`` table, with the user's --system-file entries after it."""
    base = load("hardware.toml")[kind]
    extra = _USER[kind]
    return {**base, **extra} if extra else base


def accelerators() -> dict[str, dict[str, Any]]:
    """All accelerators of hardware.toml (and of a --system-file), keyed by catalog id
    (e.g. ``h100-sxm``)."""
    return _hardware_table("accelerators")


def closest(name: str, known: Any) -> list[str]:
    """The catalog names a mistyped ``name`` most likely meant: the same name in another
    case, names that contain it (p5 -> aws-p5), then close spellings (h100sxm -> h100-sxm)."""
    import difflib

    known = list(known)
    same = [k for k in known if k.lower() == name.lower()]
    within = [k for k in known if name.lower() in k.lower() and k not in same] if len(name) >= 2 else []
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.6)
    return list(dict.fromkeys(same + within + close))[:3]


def unknown_name(kind: str, name: str, known: Any) -> str:
    """The one line for a name the catalog lacks: what it is not, what it may have meant,
    and every name it holds."""
    known = list(known)
    hint = closest(name, known)
    return (f"unknown {kind} {name!r}" + (f"; did you mean {' or '.join(hint)}?" if hint else "")
            + f" (known: {', '.join(known)})")


def accelerator(key: str) -> dict[str, Any]:
    """One accelerator by catalog id; MgbenchError naming the valid ids otherwise."""
    acc = accelerators()
    if key not in acc:
        raise MgbenchError(unknown_name("accelerator", key, acc))
    return acc[key]


def accelerator_vendor(key: str | None) -> str | None:
    """The vendor (hardware.toml ``vendor``: "nvidia", "amd") of accelerator ``key``; None
    where the catalog does not hold it (a probed device, no GPU) or it states none."""
    return accelerators().get(key, {}).get("vendor") if key is not None else None


def _accelerator_flag(key: str, name: str) -> bool | None:
    """An accelerator's optional flag ``name``: hardware.toml states it for the parts that
    have the feature, so its other entries lack it (False); None for a --system-file's
    accelerator that does not say (unknown)."""
    v = accelerator(key).get(name)
    if v is not None:
        return bool(v)
    return False if key in load("hardware.toml")["accelerators"] else None


def accelerator_mx_formats(key: str) -> bool | None:
    """Whether accelerator ``key``'s tensor cores take MX block-scaled operands
    (``mx_formats``: Blackwell, CDNA 4); None where a --system-file part does not say."""
    return _accelerator_flag(key, "mx_formats")


def accelerator_fp8_any_layout(key: str) -> bool | None:
    """Whether accelerator ``key``'s FP8 GEMMs take operands in any layout (not only TN),
    so that Transformer Engine's per-tensor FP8 makes no transposed copy for backward
    (``fp8_any_layout``: the compute capability 10.x parts); None where a --system-file
    part does not say."""
    return _accelerator_flag(key, "fp8_any_layout")


def accelerator_peak(key: str, precision: str) -> float | None:
    """The dense datasheet peak (TFLOP/s) of catalog accelerator ``key`` at ``precision``;
    None where its source publishes none. MgbenchError for an unknown id."""
    v = (accelerator(key).get("tflops") or {}).get(precision)
    return None if v is None else float(v)


def accelerator_tdp(key: str) -> float:
    """The sourced TDP (W) of catalog accelerator ``key``; NaN where hardware.toml has none
    (unknown, so energy is unknown rather than borrowed or free)."""
    v = accelerator(key).get("tdp_w")
    return float("nan") if v is None else float(v)


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
    value = accelerator_peak(key, kind)
    if value is None:
        return None, f"catalog has no {kind} peak for {key}"
    note = " (fp32 matmuls on TF32 tensor cores)" if kind != precision else ""
    return value, f"{key} {kind} peak{note} from {accelerators()[key]['source']}"


def links() -> dict[str, dict[str, Any]]:
    """All interconnects of hardware.toml (NVLink, PCIe, InfiniBand...), keyed by name,
    with their peak GB/s, latency and achievable fraction. Read here, below both the
    planner (which models with them) and `mgbench comm` (which compares with them). A link
    with ``bw_eff_from`` (no measurement of its own) takes that link's ``bw_eff``."""
    table = _hardware_table("links")
    out = {}
    for name, link in table.items():
        src = link.get("bw_eff_from")
        if src is not None:
            if src not in table or "bw_eff" not in table[src]:
                raise MgbenchError(f"hardware.toml: link {name}'s bw_eff_from names {src!r}, which has no bw_eff of "
                                   "its own")
            link = {**link, "bw_eff": table[src]["bw_eff"]}
        out[name] = link
    return out


def systems() -> dict[str, dict[str, Any]]:
    """All node types of hardware.toml and of a --system-file (e.g. ``dgx-h100``): GPU,
    GPUs and NICs per node, and the names of their intra- and inter-node links."""
    return _hardware_table("systems")


# What a --system-file entry must hold (key -> kind) and may hold, per table: the keys
# hardware.toml's own entries carry. "count" is a positive integer, "positive" a number
# above zero, "fraction" a number in (0, 1], "non-negative" a number of at least zero.
_REQUIRED = {
    "systems": {"gpu": "accelerator", "gpus_per_node": "count", "intra_link": "link", "inter_link": "link",
                "nics_per_node": "count"},
    "accelerators": {"tflops": "peaks", "memory_gb": "positive", "mem_bw_tbps": "positive"},
    "links": {"peak_gbps": "positive", "bw_eff": "fraction", "alpha_us": "non-negative"},
}
_OPTIONAL = {
    "systems": {"name": "text", "host_link": "link", "max_power_kw": "positive", "source": "text",
                "retrieved": "date", "cloud": "text"},
    "accelerators": {"name": "text", "match": "patterns", "vendor": "text", "tdp_w": "positive", "form": "text",
                     "source": "text", "retrieved": "date", "mx_formats": "flag", "fp8_any_layout": "flag"},
    "links": {"name": "text", "source": "text", "eff_source": "text", "alpha_source": "text", "retrieved": "date",
              "a2a_peer_us": "non-negative", "a2a_peer_source": "text"},
}
PEAK_PRECISIONS = ("bf16", "fp16", "fp8", "tf32", "fp32")


def is_number(v: Any) -> bool:
    """Whether a value read from TOML or JSON is a number (true and false are not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_value(where: str, key: str, kind: str, v: Any, known: dict[str, set[str]]) -> str | None:
    """One line saying what is wrong with ``v`` as a value of kind ``kind``; None if it is fine."""
    at = f"{where} {key}"
    if kind == "text":
        return None if isinstance(v, str) else f"{at} must be a string, got {v!r}"
    if kind == "flag":
        return None if isinstance(v, bool) else f"{at} must be true or false, got {v!r}"
    if kind == "date":  # "2026-11-26" as hardware.toml writes it, or a bare TOML date
        return None if isinstance(v, (str, datetime.date)) else f"{at} must be a date, got {v!r}"
    if kind in ("accelerator", "link"):
        if not isinstance(v, str):
            return f"{at} must be a string naming {'an' if kind == 'accelerator' else 'a'} {kind}, got {v!r}"
        table = "accelerators" if kind == "accelerator" else "links"
        if v in known[table]:
            return None
        example = "h100-sxm" if kind == "accelerator" else "nvlink4"
        return (f"{at}: unknown {'gpu' if kind == 'accelerator' else 'link'} {v!r} (a hardware.toml {kind} such as "
                f"{example}, or one of this file's [{table}.NAME])")
    if kind == "count":
        if not isinstance(v, int) or isinstance(v, bool):
            return f"{at} must be a whole number, got {v!r}"
        return None if v > 0 else f"{at} must be positive, got {v}"
    if kind in ("positive", "fraction", "non-negative"):
        if not is_number(v):
            return f"{at} must be a number, got {v!r}"
        if kind == "positive" and v <= 0:
            return f"{at} must be positive, got {v}"
        if kind == "fraction" and not 0 < v <= 1:
            return f"{at} must be a fraction in (0, 1], got {v}"
        if kind == "non-negative" and v < 0:
            return f"{at} cannot be negative, got {v}"
        return None
    if kind == "peaks":
        if not isinstance(v, dict) or not v:
            return f"{at} must be a table of dense TFLOPS, e.g. {{ bf16 = 989.0 }}"
        for prec, peak in v.items():
            if prec not in PEAK_PRECISIONS:
                return f"{at}: unknown precision {prec!r} (known: {', '.join(PEAK_PRECISIONS)})"
            if not is_number(peak) or peak <= 0:
                return f"{at}.{prec} must be a positive number of TFLOPS, got {peak!r}"
        return None
    if kind == "patterns":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            return f"{at} must be a list of regular expressions (strings), got {v!r}"
        for pat in v:
            try:
                re.compile(pat)
            except re.error as e:
                return f"{at}: {pat!r} is not a regular expression ({e})"
        return None
    raise AssertionError(kind)


def check_system_file(data: dict[str, Any], origin: str = "--system-file") -> list[str]:
    """Every problem of a --system-file's parsed TOML, one line each (empty: usable): an
    unknown table, an entry that is not a table, a name the catalog already has, a missing
    or unknown key, a value of the wrong type or not positive, an unknown gpu or link (the
    file's own accelerators and links count), and a file without a system."""
    problems: list[str] = []
    for top in data:
        if top not in _REQUIRED:
            problems.append(f"unknown table [{top}]: a system file holds [systems.NAME], and optionally "
                            "[accelerators.NAME] and [links.NAME]")
    tables = {kind: data.get(kind, {}) for kind in _REQUIRED}
    for kind, table in tables.items():
        if not isinstance(table, dict):
            problems.append(f"[{kind}] must be a table of named entries ([{kind}.NAME])")
            tables[kind] = {}
    known = {kind: set(load("hardware.toml")[kind]) | set(tables[kind]) for kind in ("accelerators", "links")}
    for kind in ("accelerators", "links", "systems"):
        for name, entry in tables[kind].items():
            where = f"[{kind}.{name}]"
            if name in load("hardware.toml")[kind]:
                problems.append(f"{where}: the catalog already has a {kind[:-1]} {name!r}; give yours another name")
                continue
            if not isinstance(entry, dict):
                problems.append(f"{where} must be a table of keys, got {entry!r}")
                continue
            for key, kind_of in _REQUIRED[kind].items():
                if key not in entry:
                    problems.append(f"{where} missing key {key!r}")
                else:
                    problems.append(_check_value(where, key, kind_of, entry[key], known) or "")
            for key, value in entry.items():
                if key in _REQUIRED[kind]:
                    continue
                if key not in _OPTIONAL[kind]:
                    allowed = ", ".join([*_REQUIRED[kind], *_OPTIONAL[kind]])
                    problems.append(f"{where} unknown key {key!r} (keys: {allowed})")
                else:
                    problems.append(_check_value(where, key, _OPTIONAL[kind][key], value, known) or "")
    problems = [p for p in problems if p]
    if not tables["systems"] and not problems:
        problems.append(f"no [systems.NAME] table: {origin} must define at least one system")
    return problems


def use_system_file(path: str) -> list[str]:
    """Load a user's own hardware (a TOML file with hardware.toml's [systems.*] and,
    optionally, [accelerators.*] and [links.*] tables and keys) into the catalog for this
    process, replacing any file loaded before, and return the names of its systems, which
    `--system`/`--systems` then accept. Every problem is reported at once, one line each,
    as an MgbenchError (the CLI's exit status 2), and nothing is loaded."""
    origin = f"--system-file {path}"
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise MgbenchError(f"{origin}: file not found") from None
    except OSError as e:
        raise MgbenchError(f"{origin}: cannot read it ({e.strerror})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MgbenchError(f"{origin}: malformed TOML: {e}") from None
    problems = check_system_file(data, origin)
    if len(problems) == 1:  # one line, as every other bad input
        raise MgbenchError(f"{origin}: {problems[0]}")
    if problems:  # several: a line each, so that none is lost in one long line
        raise MgbenchError(f"{origin}: {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))
    clear_system_file()
    for kind in _USER:
        for name, entry in data.get(kind, {}).items():
            # A figure from the user's file names it as its source unless it names one.
            _USER[kind][name] = {"source": origin, **entry}
    return list(data["systems"])


def clear_system_file() -> None:
    """Forget a --system-file's hardware: the catalog is hardware.toml's alone again."""
    for table in _USER.values():
        table.clear()


def model_presets() -> dict[str, dict[str, Any]]:
    """All model shapes of models.toml, keyed by preset name."""
    return load("models.toml")["models"]


def model_shape(name: str) -> ModelShape:
    """The ModelShape of a preset; MgbenchError listing the presets otherwise."""
    presets = model_presets()
    if name not in presets:
        if "/" in name or name.endswith(".json") or name.startswith("hf:"):  # a config's path, not a preset
            path = name.removeprefix("hf:")
            raise MgbenchError(f"{name!r} is not a model preset: a Hugging Face config is read with --hf {path} on the "
                               f"command line (model = \"hf:{path}\" in a suite)")
        hint = closest(name, presets)
        raise MgbenchError(
            f"unknown model preset {name!r}" + (f"; did you mean {' or '.join(hint)}?" if hint else ".")
            + f" Choose one of: {', '.join(presets)}, or give explicit dims (--layers --hidden --heads --vocab on "
            "the command line; {layers, hidden, heads, ffn_hidden, vocab} in a suite)"
        )
    fields = {k: v for k, v in presets[name].items() if k != "source"}
    return ModelShape(name=name, **fields)
