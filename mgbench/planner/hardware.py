"""Resolve systems, GPUs and links from the catalog into the numbers the models use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalog
# Read in catalog.py, which `mgbench comm` shares; the planner's modules take them from here.
from ..catalog import links, systems
from ..errors import MgbenchError

GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """What the performance model needs to know about one node type."""

    system: str
    gpu: str
    gpus_per_node: int
    peak_tflops: float  # at the plan's precision
    memory_bytes: float
    tdp_w: float
    intra_bw: float  # bytes/s one direction per GPU, after bw_eff
    intra_alpha_s: float
    inter_bw: float  # bytes/s per GPU across nodes, after bw_eff
    inter_alpha_s: float
    max_power_kw: float | None
    compute_eff: float  # achievable fraction of peak for training matmuls (see planner_defaults)
    mem_bw: float  # bytes/s of device memory
    elementwise_passes: float  # memory passes over activation bytes per step (see planner_defaults)
    # The software stack's achieved fraction of what the calibration stack (Megatron-LM)
    # gets from the same kernels (planner/stack.py, data/stacks.toml): compute time / this.
    stack_eff: float = 1.0
    stack: str = "megatron-lm"
    # Fraction of peak the flash-attention kernel reaches on this GPU's generation
    # (hardware.toml [planner] flash_attention_fraction); None: not recorded, attention's
    # scores and values are priced as layer GEMMs (planner/perf.py flash_attention_s).
    attn_eff: float | None = None
    # Probed CPU profiles only (probe/profile.py): a step's unfused non-matmul work priced
    # op by op (planner/perf.py, host terms). None/0 elsewhere: the catalog's two-term
    # roofline (elementwise_passes) stands.
    op_overhead_s: float = 0.0  # fixed cost per aten op (dispatch, autograd, allocation)
    ew_bw: float | None = None  # bytes/s unfused elementwise ops get at the workload's sizes
    attn_points: tuple[tuple[float, float], ...] | None = None  # (seq, causal SDPA fwd+bwd FLOP/s), by seq


def planner_defaults() -> dict[str, Any]:
    """The planner's calibrated defaults of hardware.toml (efficiencies, memory passes)."""
    return catalog.load("hardware.toml")["planner"]


def compute_efficiency(gpu: str) -> float:
    """Default achievable fraction of dense peak for training matmuls (see hardware.toml):
    the calibrated A100 value scaled by the GPU's best-matmul fraction (MAMF) relative
    to the A100's, or the A100 value where no MAMF figure is recorded."""
    d = planner_defaults()
    mamf = d["mamf_fraction"]
    return float(d["matmul_eff"]) * mamf.get(gpu, mamf[d["calibrated_gpu"]]) / mamf[d["calibrated_gpu"]]


def attention_efficiency(gpu: str) -> float | None:
    """The flash-attention kernel's fraction of dense peak on ``gpu`` (hardware.toml
    [planner] flash_attention_fraction); None where no figure is recorded."""
    frac = planner_defaults().get("flash_attention_fraction", {}).get(gpu)
    return None if frac is None else float(frac)


def _link(name: str) -> dict[str, Any]:
    if name not in links():
        raise MgbenchError(f"unknown link {name!r}; known: {', '.join(links())}")
    return links()[name]


def catalog_system(hw: Hardware) -> str:
    """The catalog system ``hw`` was resolved from (its label is ``SYSTEM[GPU]`` when a
    system was given another GPU: :func:`resolve`)."""
    return hw.system.split("[")[0]


def resolve(system: str | None = None, gpu: str | None = None, precision: str = "bf16",
            compute_eff: float | None = None, comm_eff_scale: float = 1.0) -> Hardware:
    """Hardware for a catalog system (``dgx-h100``) or a bare GPU (``h100-sxm``, placed
    in the first system that uses it). Both given and the system holds another GPU:
    that system's node size and links with this GPU, named ``SYSTEM[GPU]`` so every
    output says so (its wall power, measured for its own GPUs, is then unknown)."""
    if system is None and gpu is None:
        raise MgbenchError("name a --system (e.g. dgx-h100) or a --gpu (e.g. h100-sxm)")
    if system is None:
        catalog.accelerator(gpu)  # validates the name
        system = next((k for k, s in systems().items() if s["gpu"] == gpu), None)
        if system is None:
            raise MgbenchError(f"no system in the catalog uses {gpu}; pass --system")
    if system not in systems():
        raise MgbenchError(f"unknown system {system!r}; known: {', '.join(systems())}")
    s = systems()[system]
    label = system
    if gpu is not None and gpu != s["gpu"]:
        catalog.accelerator(gpu)  # validates the name
        s = {**s, "gpu": gpu, "max_power_kw": None}
        label = f"{system}[{gpu}]"
    acc = catalog.accelerator(s["gpu"])
    peak = acc["tflops"].get(precision)
    if peak is None:
        raise MgbenchError(f"catalog has no {precision} peak for {s['gpu']}; choose another --precision")
    intra, inter = _link(s["intra_link"]), _link(s["inter_link"])
    nic_share = s["nics_per_node"] / s["gpus_per_node"]
    return Hardware(
        system=label,
        gpu=s["gpu"],
        gpus_per_node=s["gpus_per_node"],
        peak_tflops=float(peak),
        memory_bytes=float(acc["memory_gb"]) * GB,
        tdp_w=float(acc["tdp_w"]),
        intra_bw=intra["peak_gbps"] * GB * intra["bw_eff"] * comm_eff_scale,
        intra_alpha_s=intra["alpha_us"] * 1e-6,
        inter_bw=inter["peak_gbps"] * GB * inter["bw_eff"] * nic_share * comm_eff_scale,
        inter_alpha_s=inter["alpha_us"] * 1e-6,
        max_power_kw=s.get("max_power_kw"),
        compute_eff=compute_eff if compute_eff is not None else compute_efficiency(s["gpu"]),
        mem_bw=float(acc["mem_bw_tbps"]) * 1e12,
        elementwise_passes=float(planner_defaults()["elementwise_passes"]),
        attn_eff=attention_efficiency(s["gpu"]),
    )
