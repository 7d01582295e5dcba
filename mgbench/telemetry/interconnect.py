"""What connects the GPUs: NVLink per link, PCIe generation and width, the
`nvidia-smi topo -m` matrix, InfiniBand / RoCE ports, NCCL version and settings.
On a machine without GPUs it says so. Every probe is allowed to fail: a failure is
recorded as the reason, never as a guess.

Only the GPUs this process can use (CUDA_VISIBLE_DEVICES) are listed, each matched to
its NVML device (:mod:`mgbench.telemetry.nvml_device`). PCIe: the link trains down to
Gen1 when the GPU idles, so the current generation says little about the link; the
maximum the GPU and its slot can run at (nvmlDeviceGetMaxPcieLinkGeneration / Width) is
the link's, and both are kept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any


def _nvml() -> tuple[Any, str | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, None
    except Exception as e:  # no library or no driver
        return None, f"NVML unavailable: {type(e).__name__}: {e}"


PCIE_PROBES = {"pcie_gen": "nvmlDeviceGetCurrPcieLinkGeneration", "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
               "pcie_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
               "pcie_width_max": "nvmlDeviceGetMaxPcieLinkWidth"}


def gpu_links(nvml: Any = None) -> dict[str, Any]:
    """Per visible CUDA device: name, how its NVML device was matched, PCIe (current and
    max), NVLink links with their generation. ``nvml``: the binding (default: pynvml)."""
    import torch

    from .nvml_device import NvmlDeviceUnknown, nvlink_version, nvml_handle

    if nvml is None:
        nv, why = _nvml()
        if nv is None:
            return {"gpus": [], "reason": why}
    else:
        nv = nvml
    out = []
    try:
        for i in range(torch.cuda.device_count()):
            try:
                h, how = nvml_handle(nv, i)
            except NvmlDeviceUnknown as e:
                out.append({"index": i, "name": torch.cuda.get_device_name(i), "nvml_error": str(e)})
                continue
            g: dict[str, Any] = {"index": i, "name": _s(nv.nvmlDeviceGetName(h)), "nvml_match": how}
            for key, fn in PCIE_PROBES.items():
                try:
                    g[key] = getattr(nv, fn)(h)
                except Exception as e:
                    g.setdefault("pcie_error", f"{fn}: {e}")
            links = []
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(h, link)
                except Exception:
                    continue  # link index not present on this GPU
                entry: dict[str, Any] = {"link": link, "active": bool(state)}
                try:
                    enum = nv.nvmlDeviceGetNvLinkVersion(h, link)
                    entry["version"] = nvlink_version(enum)  # NVLink generation, e.g. "4.0"
                    entry["version_nvml_enum"] = enum
                except Exception:
                    pass
                links.append(entry)
            g["nvlinks"] = links
            g["nvlinks_active"] = sum(1 for x in links if x["active"])
            out.append(g)
    finally:
        if nvml is None:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass
    return {"gpus": out, "reason": None}


def summary(gpus: list[dict[str, Any]], ib: list[dict[str, Any]]) -> str:
    """One line: GPUs, active NVLink links and generation, PCIe link (max gen and width,
    the current one beside it when it differs), RDMA ports."""
    nv = sum(g.get("nvlinks_active", 0) for g in gpus)
    versions = sorted({x["version"] for g in gpus for x in g.get("nvlinks", []) if x["active"] and x.get("version")})
    parts = [f"{len(gpus)} GPU(s)"]
    gen = f" (NVLink {', '.join(versions)})" if versions else ""
    parts.append(f"{nv} active NVLink links{gen}" if nv else "no active NVLink")
    pcie = sorted({(g.get("pcie_gen_max"), g.get("pcie_width_max"), g.get("pcie_gen"), g.get("pcie_width"))
                   for g in gpus if g.get("pcie_gen_max") is not None}, key=str)
    if pcie:
        parts.append("PCIe " + ", ".join(
            f"gen{gm} x{wm}" + (f" (now gen{gc} x{wc}: idle links train down)" if (gc, wc) != (gm, wm) else "")
            for gm, wm, gc, wc in pcie))
    active_ib = [p for p in ib if (p["state"] or "").endswith("ACTIVE")]
    parts.append(f"{len(active_ib)} active RDMA port(s)" if ib else "no RDMA devices")
    return "; ".join(parts)


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def topo_matrix() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
        return out.stdout if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def infiniband(root: str = "/sys/class/infiniband") -> list[dict[str, Any]]:
    """Each RDMA port: device, port, state, rate (e.g. '400 Gb/sec (4X NDR)'), link layer."""
    ports = []
    base = Path(root)
    if not base.is_dir():
        return ports
    for dev in sorted(base.iterdir()):
        for port in sorted((dev / "ports").glob("*")):
            def read(name: str) -> str | None:
                try:
                    return (port / name).read_text().strip()
                except OSError:
                    return None
            ports.append({"device": dev.name, "port": port.name, "state": read("state"), "rate": read("rate"),
                          "link_layer": read("link_layer")})
    return ports


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def detect() -> dict[str, Any]:
    """Everything above, plus a one-line summary."""
    from .machine import gpu_device_nodes, nccl_version

    nccl = nccl_version()
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    ib = infiniband()
    if not gpu_device_nodes() or not _cuda_available():
        line = "no GPU interconnect: no CUDA device; CPU ranks talk over loopback TCP (gloo)"
        return {"summary": line, "gpus": [], "nvml_reason": None, "topo": None, "infiniband": ib,
                "nccl_version": None, "nccl_env": env}
    links = gpu_links()
    gpus = links["gpus"]
    return {"summary": summary(gpus, ib), "gpus": gpus, "nvml_reason": links["reason"], "topo": topo_matrix(),
            # nvidia-smi ignores CUDA_VISIBLE_DEVICES: the matrix shows every GPU of the host.
            "topo_scope": "every GPU of the host (nvidia-smi ignores CUDA_VISIBLE_DEVICES)",
            "infiniband": ib, "nccl_version": nccl, "nccl_env": env}
