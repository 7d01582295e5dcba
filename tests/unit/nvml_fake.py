"""A fake NVML for CPU tests: a host of GPUs answering through nvidia-ml-py's own
function names, checked against the installed pynvml on construction (a fake with a
name the binding lacks would prove nothing), and raising pynvml's own errors. Also a
fake of torch.cuda.get_device_properties' result, whose fields torch 2.13 has."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    pci: str  # NVML's form: 00000000:1b:00.0
    uuid: str  # GPU-...
    name: str = "NVIDIA H100 80GB HBM3"
    power_w: float = 300.0
    energy_update_s: float = 0.1  # the counter moves in steps of this
    has_counter: bool = True
    pcie: tuple[int, int, int, int] = (1, 16, 5, 16)  # current gen, current width, max gen, max width
    nvlink_enum: int | None = 6  # NVML_NVLINK_VERSION_4_0
    nvlinks: int = 18
    mig: bool = False


@dataclass
class FakeProps:
    """What torch.cuda.get_device_properties returns, for the fields mgbench reads."""

    name: str
    pci_domain_id: int
    pci_bus_id: int
    pci_device_id: int
    uuid: str  # torch prints CUDA's UUID without NVML's "GPU-" prefix
    total_memory: int = 80 * 2**30


def props_of(gpu: FakeGpu) -> FakeProps:
    dom, bus, dev = gpu.pci.split(":")[0], gpu.pci.split(":")[1], gpu.pci.split(":")[2].split(".")[0]
    return FakeProps(gpu.name, int(dom, 16), int(bus, 16), int(dev, 16), gpu.uuid.removeprefix("GPU-"))


def _unsupported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


@dataclass
class FakeNVML:
    """NVML of a host with ``gpus`` in NVML (PCI) order. Handles are the GPUs' indices."""

    gpus: list[FakeGpu]
    pci_lookup: bool = True  # False: nvmlDeviceGetHandleByPciBusId fails (as with an old driver)
    uuid_lookup: bool = True
    calls: list[str] = field(default_factory=list)

    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __post_init__(self) -> None:
        missing = [n for n in dir(type(self)) if n.startswith("nvml") and not hasattr(pynvml, n)]
        assert not missing, f"the fake NVML uses names pynvml does not have: {missing}"
        self._t0 = time.perf_counter()

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self.calls.append(f"index {i}")
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> int:
        self.calls.append(f"pci {bus}")
        if not self.pci_lookup:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        for i, g in enumerate(self.gpus):
            if g.pci.lower() == bus.lower():
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        self.calls.append(f"uuid {uuid}")
        if not self.uuid_lookup:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return i
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [int(self.gpus[h].mig), int(self.gpus[h].mig)]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        g = self.gpus[h]
        if not g.has_counter:
            raise _unsupported()
        # mJ at the last update: the counter moves only every energy_update_s.
        ticks = int((time.perf_counter() - self._t0) / g.energy_update_s)
        return int(ticks * g.energy_update_s * g.power_w * 1000)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        # mW, with 1 mW of noise that changes at each sensor update (as a real reading does)
        g = self.gpus[h]
        return int(g.power_w * 1000) + int((time.perf_counter() - self._t0) / g.energy_update_s) % 2

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].pcie[3]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= self.gpus[h].nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        if self.gpus[h].nvlink_enum is None:
            raise _unsupported()
        return self.gpus[h].nvlink_enum


def host(n: int, **kw: Any) -> list[FakeGpu]:
    """n GPUs on consecutive PCI buses, in NVML's (PCI) order."""
    return [FakeGpu(pci=f"00000000:{0x18 + 0x10 * i:02x}:00.0", uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", **kw)
            for i in range(n)]


def install_cuda(monkeypatch: Any, visible: list[FakeGpu]) -> None:
    """torch.cuda as a process that sees ``visible`` (in CUDA's order) would find it."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props_of(visible[i]))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: visible[i].name)
