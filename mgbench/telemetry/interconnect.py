"""What connects the GPUs: NVLink per link, PCIe generation and width, the
`nvidia-smi topo -m` matrix, InfiniBand / RoCE ports, NCCL version and settings.
On a machine without GPUs it says so. Every probe is allowed to fail: a failure is
recorded as the reason, never as a guess."""

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


def gpu_links() -> dict[str, Any]:
    nv, why = _nvml()
    if nv is None:
        return {"gpus": [], "reason": why}
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i, "name": _s(nv.nvmlDeviceGetName(h))}
            try:
                g["pcie_gen"] = nv.nvmlDeviceGetCurrPcieLinkGeneration(h)
                g["pcie_width"] = nv.nvmlDeviceGetCurrPcieLinkWidth(h)
                g["pcie_gen_max"] = nv.nvmlDeviceGetMaxPcieLinkGeneration(h)
                g["pcie_width_max"] = nv.nvmlDeviceGetMaxPcieLinkWidth(h)
            except Exception as e:
                g["pcie_error"] = str(e)
            links = []
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(h, link)
                except Exception:
                    continue  # link index not present on this GPU
                entry: dict[str, Any] = {"link": link, "active": bool(state)}
                try:
                    entry["version"] = nv.nvmlDeviceGetNvLinkVersion(h, link)
                except Exception:
                    pass
                links.append(entry)
            g["nvlinks"] = links
            g["nvlinks_active"] = sum(1 for x in links if x["active"])
            out.append(g)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return {"gpus": out, "reason": None}


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


def detect() -> dict[str, Any]:
    """Everything above, plus a one-line summary."""
    import torch

    from .machine import nccl_version

    nccl = nccl_version()
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    ib = infiniband()
    if not torch.cuda.is_available():
        summary = "no GPU interconnect: no CUDA device; CPU ranks talk over loopback TCP (gloo)"
        return {"summary": summary, "gpus": [], "nvml_reason": None, "topo": None, "infiniband": ib,
                "nccl_version": None, "nccl_env": env}
    links = gpu_links()
    gpus = links["gpus"]
    nv = sum(g.get("nvlinks_active", 0) for g in gpus)
    pcie = {(g.get("pcie_gen"), g.get("pcie_width")) for g in gpus if "pcie_gen" in g}
    parts = [f"{len(gpus)} GPU(s)"]
    parts.append(f"{nv} active NVLink links" if nv else "no active NVLink")
    if pcie:
        parts.append("PCIe " + ", ".join(f"gen{g} x{w}" for g, w in sorted(pcie)))
    active_ib = [p for p in ib if (p["state"] or "").endswith("ACTIVE")]
    parts.append(f"{len(active_ib)} active RDMA port(s)" if ib else "no RDMA devices")
    return {"summary": "; ".join(parts), "gpus": gpus, "nvml_reason": links["reason"], "topo": topo_matrix(),
            "infiniband": ib, "nccl_version": nccl, "nccl_env": env}
