"""Machine and software fingerprint stored in every run manifest."""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import socket
import subprocess
from typing import Any

# Device nodes a GPU driver creates (NVIDIA's, AMD ROCm's KFD, WSL's GPU paravirtualisation),
# also inside containers given GPUs. With none of them no CUDA/HIP device can be visible, so
# the launcher can say "CPU" without importing torch (2 s of CPU per `mgbench run`).
GPU_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def gpu_device_nodes() -> bool:
    """Whether this host has a GPU driver's device node (see GPU_DEVICE_NODES). False means
    no GPU for certain; True means torch must be asked."""
    return any(glob.glob(pattern) for pattern in GPU_DEVICE_NODES)


def torch_version() -> str | None:
    """The installed torch's version, read from its package metadata (no import)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _ram_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _git_sha() -> str | None:
    """The git sha of the mgbench source tree, when it is a checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if out.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def gpus() -> list[dict[str, Any]]:
    """Name, memory and PCI address of each CUDA device this process can use (those of
    CUDA_VISIBLE_DEVICES; empty on a CPU-only machine), numbered as CUDA numbers them."""
    if not gpu_device_nodes():
        return []
    import torch

    from .nvml_device import pci_bus_id

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        g: dict[str, Any] = {"index": i, "name": p.name, "memory_gib": p.total_memory / 2**30}
        try:
            g["pci_bus_id"] = pci_bus_id(p)
        except AttributeError:  # a torch without the PCI fields
            pass
        out.append(g)
    return out


def nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no driver: unknown, not an error
        return None


def nccl_version() -> str | None:
    """NCCL version torch was built with, when CUDA is present."""
    if not gpu_device_nodes():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # a CUDA build without NCCL: unknown
        return None


def _torch_cuda() -> str | None:
    import torch

    return torch.version.cuda


def fingerprint() -> dict[str, Any]:
    """Hostname, CPU, RAM, GPUs, driver, CUDA/torch/NCCL versions and interconnect summary.
    On a host without GPU device nodes torch is not imported: its version comes from its
    package metadata, and the CUDA version it was built for is null (no CUDA here)."""
    from .. import __version__

    gpu_list = gpus()
    nccl = nccl_version()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "gpus": gpu_list,
        "gpu_count": len(gpu_list),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_name": gpu_list[0]["name"] if gpu_list else None,
        "nvidia_driver": nvidia_driver() if gpu_list else None,
        "cuda": _torch_cuda() if gpu_list else None,
        "cuda_reason": None if gpu_list else "no CUDA device here: the CUDA version torch was built for is not read "
                                             "(torch is not imported on a host without GPU device nodes)",
        "torch": torch_version(),
        "nccl": nccl,
        "mgbench": __version__,
        "git_sha": _git_sha(),
        # One line here; the manifest's "interconnect" holds the detail (telemetry/interconnect.py).
        "interconnect": "cuda devices (NCCL)" if gpu_list else "none: CPU ranks on one host (gloo over loopback)",
    }
