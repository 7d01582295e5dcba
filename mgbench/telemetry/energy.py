"""Energy over a measured window.

NVIDIA: difference of the NVML total-energy counter (mJ since driver load, Volta and
newer), read at the synchronised window edges. Where the counter is not supported, a
background thread samples NVML power and integrates it (trapezoids). CPU: the RAPL
package counter under /sys/class/powercap when readable (it counts the whole socket,
not one rank, so only local rank 0 reads it). Anything else: energy is None with the
reason; never an estimate.
"""

from __future__ import annotations

import glob
import os
import re
import threading
import time
from typing import Any


def nvml_handle(nvml: Any, cuda_index: int) -> Any:
    """The NVML handle of a CUDA device. NVML numbers GPUs its own way and ignores
    CUDA_VISIBLE_DEVICES, so match by PCI address where torch reports it, else map the
    index through CUDA_VISIBLE_DEVICES."""
    try:
        import torch

        p = torch.cuda.get_device_properties(cuda_index)
        bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        return nvml.nvmlDeviceGetHandleByPciBusId_v2(bus)
    except Exception:  # older torch without PCI fields, or NVML without that call
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        index = cuda_index
        if visible and cuda_index < len(visible) and visible[cuda_index].strip().isdigit():
            index = int(visible[cuda_index])
        return nvml.nvmlDeviceGetHandleByIndex(index)


POWERCAP = "/sys/class/powercap"


def rapl_package_files(root: str = POWERCAP) -> list[str]:
    """The energy counters of the CPU packages: zones intel-rapl:N only. Their subzones
    (intel-rapl:N:M: core, uncore, dram) sit beside them in the same folder, and the core
    and uncore counts are part of the package's, so summing every zone would count them
    twice."""
    return sorted(f for f in glob.glob(os.path.join(root, "intel-rapl:*", "energy_uj"))
                  if re.fullmatch(r"intel-rapl:\d+", os.path.basename(os.path.dirname(f))))


class EnergyMeter:
    """start() / stop() around a window; stop() returns energy_j, window_s, method, reason."""

    def __init__(self, device_type: str, device_index: int, local_rank: int, power_sample_s: float = 0.1) -> None:
        self.device_type = device_type
        self.device_index = device_index
        self.local_rank = local_rank
        self.power_sample_s = power_sample_s
        self.method = "none"
        self.reason: str | None = None
        self._handle: Any = None
        self._rapl_files: list[str] = []
        self._setup()

    def _setup(self) -> None:
        if self.device_type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handle = nvml_handle(pynvml, self.device_index)
            except Exception as e:  # no NVML: say so in the record
                self.reason = f"NVML unavailable: {type(e).__name__}: {e}"
                return
            try:
                self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                self.method = "nvml_counter"
            except Exception:
                try:
                    self._nvml.nvmlDeviceGetPowerUsage(self._handle)
                    self.method = "nvml_power_sampling"
                except Exception as e:
                    self.reason = f"NVML has neither energy counter nor power reading: {e}"
            return
        if self.local_rank != 0:
            self.reason = "RAPL counts the whole CPU package; read by local rank 0 only"
            return
        files = rapl_package_files()
        readable = []
        for path in files:
            try:
                with open(path) as f:
                    int(f.read())
                readable.append(path)
            except (OSError, ValueError):
                pass
        if readable:
            self._rapl_files = readable
            self.method = "rapl"
        else:
            self.reason = (
                "no readable RAPL counter under /sys/class/powercap (absent in VMs/containers, "
                "or root-only)" if not files else "RAPL counters present but not readable (root-only?)"
            )

    def _read_rapl_uj(self) -> list[int]:
        vals = []
        for path in self._rapl_files:
            with open(path) as f:
                vals.append(int(f.read()))
        return vals

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.method == "nvml_counter":
            self._e0 = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        elif self.method == "rapl":
            self._e0 = self._read_rapl_uj()
        elif self.method == "nvml_power_sampling":
            self._samples: list[tuple[float, float]] = []
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            w = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            self._samples.append((time.perf_counter(), w))
            self._stop.wait(self.power_sample_s)

    def stop(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self._t0
        energy = None
        if self.method == "nvml_counter":
            energy = (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._e0) / 1000.0
        elif self.method == "rapl":
            e1 = self._read_rapl_uj()
            # The counter wraps; a negative difference means one wrap happened (rare in
            # a window of seconds), which we cannot size without max_energy_range_uj.
            diffs = [b - a for a, b in zip(self._e0, e1)]
            energy = sum(diffs) / 1e6 if all(d >= 0 for d in diffs) else None
        elif self.method == "nvml_power_sampling":
            self._stop.set()
            self._thread.join()
            s = self._samples
            if len(s) >= 2:
                energy = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))
                elapsed = s[-1][0] - s[0][0]
        return {
            "energy_j": energy,
            "window_s": elapsed,
            "energy_method": self.method,
            "energy_reason": None if energy is not None else (self.reason or "counter read failed"),
        }
