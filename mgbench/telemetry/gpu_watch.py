"""GPU memory, power and energy of a user's command, read from outside through NVML
(``workload = "command"``). Torch-free: the launcher runs it, and loading torch there
would also put a CUDA context on every GPU.

A background thread samples every ``interval_s``: on each GPU, the command's processes
NVML lists (``nvmlDeviceGetComputeRunningProcesses``, matched against the command's
process tree read from /proc) and their memory, and the energy counter (or the power
reading where the GPU has no counter). A GPU counts as the command's when one of its
processes ran there. Where NVML lists none of them (a container with its own pid
namespace reports host pids), the GPUs are all visible ones when their number is the
config's ``nproc``; otherwise the figures are null with the reason, never a guess.

Energy over the measured window (between two step ends) comes from the samples around
its edges, linearly interpolated; the window must last at least
:func:`~mgbench.telemetry.energy.min_window` for the counter's update interval, else
energy is null with the reason (mgbench cannot add steps to a user's command).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..procs import descendants
from .energy import min_window, nvml_method, power_figures, update_interval
from .nvml_device import NvmlDeviceUnknown, _by_uuid_prefix, handle_by_cuda_number, visible_entries

GIB = 2**30


def _interp(series: list[tuple[int, float]], t: int) -> float | None:
    """The series' value at time ``t`` (ns), linear between the samples around it."""
    for (t0, v0), (t1, v1) in zip(series, series[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return None


def _integral(series: list[tuple[int, float]], a: int, b: int) -> float | None:
    """Trapezoid integral (value x seconds) of a sampled series over [a, b] ns."""
    va, vb = _interp(series, a), _interp(series, b)
    if va is None or vb is None:
        return None
    pts = [(a, va)] + [(t, v) for t, v in series if a < t < b] + [(b, vb)]
    return sum((t1 - t0) / 1e9 * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:]))


class GpuWatch:
    """start(pid) after launching the command, stop() after it ended, then
    figures(window) for the record. ``nvml``: the binding (default pynvml)."""

    def __init__(self, nproc: int, nvml: Any = None, interval_s: float = 0.1) -> None:
        self.nproc = nproc
        self.interval_s = interval_s
        self.reason: str | None = None
        self.energy_reason: str | None = None  # NVML is there, but neither energy nor power
        self._nvml = nvml
        self._handles: list[tuple[str, Any]] = []  # (how it is named, handle) of every GPU the command may see
        self.method = "none"
        self.update_s: float | None = None
        self._samples: dict[int, list[tuple[int, float]]] = {}
        self._peak: dict[int, int] = {}  # bytes of the command's processes, per GPU
        self._used: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inited = False  # nvmlInit succeeded: stop() pairs it with nvmlShutdown
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self._inited = True
            self._handles = self._visible()
        except Exception as e:  # no NVML, or a device it cannot name: say so in the record
            self.reason = f"NVML unavailable: {type(e).__name__}: {e}"

    def _visible(self) -> list[tuple[str, Any]]:
        """The GPUs CUDA_VISIBLE_DEVICES lets the command see (every GPU when unset)."""
        nv = self._nvml
        entries = visible_entries()
        if not entries:
            return [(f"NVML index {i}", nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
        out = []
        for e in entries:
            if e.isdigit():  # CUDA's number for it: NVML's only where the two orders agree
                h = handle_by_cuda_number(nv, int(e), f"CUDA_VISIBLE_DEVICES entry {e}:")
            elif e.startswith("GPU-"):  # a full UUID or the unambiguous prefix CUDA accepts
                h = _by_uuid_prefix(nv, e)
            else:  # MIG-...: NVML's power and energy are the whole GPU's, shared with other instances
                raise NvmlDeviceUnknown(f"CUDA_VISIBLE_DEVICES entry {e!r} is not a GPU index or GPU-UUID (a MIG "
                                        "instance?): the whole GPU's power and energy would not be the command's")
            out.append((f"NVML {'index' if e.isdigit() else 'UUID'} {e} (CUDA_VISIBLE_DEVICES)", h))
        return out

    def start(self, pid: int) -> None:
        """Begin sampling the GPUs for the process tree of ``pid``."""
        if not self._handles:
            self.reason = self.reason or "NVML sees no GPU"
            return
        self.probe()
        self._thread = threading.Thread(target=self._run, args=(pid,), daemon=True)
        self._thread.start()

    def probe(self) -> None:
        """Pick the energy method (the counter, else power sampling) and probe how often
        the first GPU's reading changes (it sets the shortest window energy is read over)."""
        nv, h0 = self._nvml, self._handles[0][1]
        method, self.energy_reason = nvml_method(nv, h0)
        if method is None:  # memory is still sampled
            return
        self.method = method
        read = nv.nvmlDeviceGetTotalEnergyConsumption if method == "nvml_counter" else nv.nvmlDeviceGetPowerUsage
        self.update_s = update_interval(lambda: read(h0), timeout_s=1.0)

    def _run(self, pid: int) -> None:
        while True:
            self.sample(pid)
            if self._stop.wait(self.interval_s):
                self.sample(pid)  # one more at the end: the window's last edge lies inside the samples
                return

    def sample(self, pid: int) -> None:
        """One reading of every GPU (public for tests)."""
        tree = {pid, *descendants(pid)}
        nv = self._nvml
        for i, (_, h) in enumerate(self._handles):
            t = time.time_ns()
            try:
                v = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0 if self.method == "nvml_counter" \
                    else nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # J, or W
                self._samples.setdefault(i, []).append((t, v))
            except Exception:
                pass
            try:
                mine = [p for p in nv.nvmlDeviceGetComputeRunningProcesses(h) if p.pid in tree]
            except Exception:
                continue
            if mine:
                self._used.add(i)
                used = sum(p.usedGpuMemory or 0 for p in mine)
                self._peak[i] = max(self._peak.get(i, 0), used)

    def stop(self) -> None:
        """End sampling and release NVML (each nvmlInit is counted; a sweep makes one per config)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._inited:
            self._inited = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # nothing to release then; the figures are already sampled
                pass

    def figures(self, t0_ns: int | None, t1_ns: int | None, tokens: float | None, steps: int) -> dict[str, Any]:
        """Record fields: memory over the whole run, energy and power over [t0, t1]."""
        out: dict[str, Any] = {"energy_method": "none", "energy_j": None}
        if self.reason:
            return {**out, "energy_reason": self.reason, "mem_reason": self.reason}
        if self._used:
            gpus, how = sorted(self._used), "ran one of the command's processes (NVML process list)"
        elif len(self._handles) == self.nproc:
            gpus, how = list(range(len(self._handles))), (
                f"all {self.nproc} visible GPUs (nproc = {self.nproc}): NVML listed none of the command's processes "
                "(a container's own pid namespace?)")
        else:
            why = (f"NVML listed none of the command's processes on the {len(self._handles)} visible GPU(s), and "
                   f"their number is not nproc ({self.nproc}): which GPUs the command used is unknown")
            return {**out, "energy_reason": why, "mem_reason": why}
        out["gpu_devices"] = [f"{self._handles[i][0]}: {how}" for i in gpus]
        if self._used:
            out.update(mem_peak_gib=max(self._peak[i] for i in gpus) / GIB, mem_method=(
                "nvml_process_used_sampled: the GPU memory NVML charged to the command's processes, summed per GPU, "
                f"highest sample (every {self.interval_s} s) on the busiest GPU; includes CUDA contexts and what "
                "the allocator reserved"))
        else:
            out["mem_reason"] = "NVML listed none of the command's processes, so their GPU memory is unknown"
        if self.energy_reason:
            return {**out, "energy_reason": self.energy_reason}
        out.update(energy_method=self.method, energy_update_interval_s=self.update_s,
                   energy_min_window_s=min_window(self.method, self.update_s))
        if t0_ns is None or t1_ns is None:
            return {**out, "energy_reason": "no measured window (too few steps)"}
        window = (t1_ns - t0_ns) / 1e9
        if window < out["energy_min_window_s"]:
            return {**out, "energy_reason": f"the measured window lasted {window:.2f} s, shorter than the "
                    f"{out['energy_min_window_s']:.1f} s an NVML reading needs (energy.py min_window): run more steps"}
        parts = []
        for i in gpus:
            s = self._samples.get(i, [])
            if self.method == "nvml_counter":
                a, b = _interp(s, t0_ns), _interp(s, t1_ns)
                parts.append(None if a is None or b is None else b - a)
            else:
                parts.append(_integral(s, t0_ns, t1_ns))
        if any(p is None for p in parts):
            return {**out, "energy_reason": "the NVML samples do not cover the measured window"}
        energy = sum(parts)  # type: ignore[arg-type]
        out.update(energy_j=energy, energy_window_s=window, num_energy_steps=steps, energy_reason=None,
                   **power_figures(energy, window, len(gpus), tokens))
        return out
