"""Energy over a measured window.

NVIDIA: difference of the NVML total-energy counter (mJ since driver load, Volta and
newer), read at the synchronised window edges, on the NVML device matched to this
rank's CUDA device (:func:`~mgbench.telemetry.nvml_device.nvml_handle`). Where the
counter is not supported, a background thread samples NVML power and integrates it
(trapezoids, with a reading at each window edge so the whole window is covered). CPU:
the RAPL package counter under /sys/class/powercap when readable (it counts the whole
socket, not one rank, so only local rank 0 reads it). Anything else: energy is None
with the reason; never an estimate.

Minimum window. NVML's counter moves in steps of about 100 ms (ml.energy, "Thermally
Stable Profiling for Accurate GPU Energy Measurement": "approximately every 100 ms"),
so each window edge is uncertain by up to one step; on A100 and H100 the power sensor
also averages only 25 ms of every 100 ms (Yang et al., "Part-time Power Measurements:
nvidia-smi's Lack of Attention", SC24), which only many periods average out. A window
therefore lasts at least ``max(NVML_MIN_WINDOW_S, WINDOW_UPDATES x the observed update
interval)`` (capped at MAX_MIN_WINDOW_S): 5 s = 50 steps of 100 ms, an edge error under
2/50 = 4%. The worker adds untimed training steps inside the window when the timed ones
are shorter (:func:`top_up_steps`); the record says how many steps the window held.
RAPL updates about every millisecond, so 50 updates is 50 ms and nothing is added in
practice. The update interval is probed once per process (:func:`update_interval`) and
recorded.
"""

from __future__ import annotations

import glob
import math
import os
import re
import threading
import time
from typing import Any, Callable

from .nvml_device import NvmlDeviceUnknown, mig_enabled, nvml_handle

NVML_MIN_WINDOW_S = 5.0  # 50 counter steps of ~100 ms; see the module docstring
WINDOW_UPDATES = 50  # counter updates a window must span: edge error <= 2 / 50
MAX_MIN_WINDOW_S = 30.0  # a counter updating once a second would otherwise ask 50 s per config
TOP_UP_MARGIN = 1.05  # aim 5% past the minimum: top-up steps run at about the timed steps' pace


POWERCAP = "/sys/class/powercap"


def rapl_package_files(root: str = POWERCAP) -> list[str]:
    """The energy counters of the CPU packages: zones intel-rapl:N only. Their subzones
    (intel-rapl:N:M: core, uncore, dram) sit beside them in the same folder, and the core
    and uncore counts are part of the package's, so summing every zone would count them
    twice."""
    return sorted(f for f in glob.glob(os.path.join(root, "intel-rapl:*", "energy_uj"))
                  if re.fullmatch(r"intel-rapl:\d+", os.path.basename(os.path.dirname(f))))


def update_interval(read: Callable[[], Any], timeout_s: float = 2.5, poll_s: float = 0.001) -> float | None:
    """Median time between changes of a counter or reading, from three changes seen by
    polling every ``poll_s``; None when it did not change three times in ``timeout_s``."""
    changes: list[float] = []
    t_end = time.perf_counter() + timeout_s
    last = read()
    while len(changes) < 3 and time.perf_counter() < t_end:
        time.sleep(poll_s)
        v = read()
        if v != last:
            changes.append(time.perf_counter())
            last = v
    if len(changes) < 3:
        return None
    gaps = sorted(b - a for a, b in zip(changes, changes[1:]))
    return gaps[len(gaps) // 2] if len(gaps) % 2 else (gaps[0] + gaps[1]) / 2


def nvml_method(nvml: Any, handle: Any) -> tuple[str | None, str | None]:
    """How energy is read on an NVML device: ``("nvml_counter", None)`` where the GPU
    has the total-energy counter (Volta and later), ``("nvml_power_sampling", None)``
    where it only reports power, ``(None, reason)`` where it has neither."""
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return "nvml_counter", None
    except Exception:
        try:
            nvml.nvmlDeviceGetPowerUsage(handle)
            return "nvml_power_sampling", None
        except Exception as e:
            return None, f"NVML has neither energy counter nor power reading: {e}"


def power_figures(energy_j: float | None, window_s: float | None, devices: int | None,
                  tokens: float | None) -> dict[str, float | None]:
    """What follows from energy over a window: mean power (all devices, and per device
    where ``devices`` is known) and energy per token. Null where an input is."""
    ok = energy_j is not None and window_s is not None and window_s > 0
    return {
        "power_w": energy_j / window_s if ok else None,  # type: ignore[operator]
        "power_w_per_device": energy_j / window_s / devices if ok and devices else None,  # type: ignore[operator]
        "energy_per_token_j": energy_j / tokens if energy_j is not None and tokens else None,
    }


def min_window(method: str, interval_s: float | None) -> float:
    """The shortest energy window for a method and its counter's update interval."""
    if method == "none":
        return 0.0
    floor = NVML_MIN_WINDOW_S if method.startswith("nvml") else 0.0
    if interval_s is None and method.startswith("nvml"):
        # The counter did not change 3 times while probed: it updates slower than the probe
        # could see, so the edge error is unknown and only the longest window bounds it.
        return MAX_MIN_WINDOW_S
    steps = WINDOW_UPDATES * interval_s if interval_s else 0.0
    return min(MAX_MIN_WINDOW_S, max(floor, steps))


def steps_to_fill(min_window_s: float, elapsed_s: float, steps_done: int, span_s: float | None = None) -> int:
    """More steps for a window of at least ``min_window_s``, ``elapsed_s`` of it gone, at
    the pace of ``steps_done`` steps in ``span_s`` seconds (default: in ``elapsed_s``)."""
    span = elapsed_s if span_s is None else span_s
    if steps_done <= 0 or elapsed_s <= 0 or span <= 0 or elapsed_s >= min_window_s:
        return 0
    return math.ceil((TOP_UP_MARGIN * min_window_s - elapsed_s) / (span / steps_done))


class EnergyMeter:
    """start() / stop() around a window; stop() returns energy_j, window_s, method, reason
    and the window's facts (steps, minimum, counter update interval, device match).
    ``nvml``: the NVML binding (default: pynvml)."""

    def __init__(self, device_type: str, device_index: int, local_rank: int, power_sample_s: float = 0.1,
                 nvml: Any = None) -> None:
        self.device_type = device_type
        self.device_index = device_index
        self.local_rank = local_rank
        self.power_sample_s = power_sample_s
        self.method = "none"
        self.reason: str | None = None
        self.device_match: str | None = None
        self.interval_s: float | None = None
        self._nvml = nvml
        self._handle: Any = None
        self._rapl_files: list[str] = []
        self._t0 = 0.0
        self._setup()
        if self.method != "none":
            self.interval_s = update_interval(self._reading)
        self.min_window_s = min_window(self.method, self.interval_s)

    def _setup(self) -> None:
        if self.device_type == "cuda":
            try:
                if self._nvml is None:
                    import pynvml

                    self._nvml = pynvml
                self._nvml.nvmlInit()
            except Exception as e:  # no NVML: say so in the record
                self.reason = f"NVML unavailable: {type(e).__name__}: {e}"
                return
            try:
                self._handle, self.device_match = nvml_handle(self._nvml, self.device_index)
            except NvmlDeviceUnknown as e:
                self.reason = f"no NVML device matches CUDA device {self.device_index}: {e}"
                return
            if mig_enabled(self._nvml, self._handle):
                self.reason = ("the GPU is split into MIG instances: NVML's energy and power cover the whole GPU, "
                               "shared with the other instances, not this rank's")
                return
            method, reason = nvml_method(self._nvml, self._handle)
            if method is None:
                self.reason = reason
            else:
                self.method = method
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

    def _power_w(self) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    def _reading(self) -> Any:
        """What the method reads (for the update-interval probe)."""
        if self.method == "nvml_counter":
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        if self.method == "nvml_power_sampling":
            return self._power_w()
        return self._read_rapl_uj()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.method == "nvml_counter":
            self._e0 = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        elif self.method == "rapl":
            self._e0 = self._read_rapl_uj()
        elif self.method == "nvml_power_sampling":
            # A reading at the window's first edge, and (in stop) at its last: the
            # trapezoids then cover the whole window, not just the span between the
            # background thread's first and last samples.
            self._samples: list[tuple[float, float]] = [(self._t0, self._power_w())]
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def elapsed(self) -> float:
        """Seconds since start()."""
        return time.perf_counter() - self._t0

    def _sample(self) -> None:
        while not self._stop.wait(self.power_sample_s):
            self._samples.append((time.perf_counter(), self._power_w()))

    def stop(self, steps: int | None = None) -> dict[str, Any]:
        """End the window; ``steps``: training steps it held (recorded as energy_steps)."""
        energy = None
        elapsed = time.perf_counter() - self._t0
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
            s.append((time.perf_counter(), self._power_w()))
            energy = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))
            elapsed = s[-1][0] - self._t0  # exactly the span integrated
        return {
            "energy_j": energy,
            "window_s": elapsed,
            "energy_method": self.method,
            "energy_reason": None if energy is not None else (self.reason or "counter read failed"),
            "energy_steps": steps,
            "energy_min_window_s": self.min_window_s,
            "energy_update_interval_s": self.interval_s,
            "energy_device_match": self.device_match,
        }


TOP_UP_ROUNDS = 4  # top-up rounds at most: the second, at the top-up steps' own pace, nearly always ends it


def fill_window(meter: EnergyMeter, steps_done: int, device: Any, run_steps: Callable[[int, int], None]) -> int:
    """Run untimed steps (``run_steps(first, count)``) inside the energy window until it
    lasts at least the meter's minimum; returns how many ran. The first round is sized at
    the timed steps' pace; each later one at the pace of the round before it, since
    top-up steps can run faster than timed ones (on an H200 a 1-rank DDP config with the
    profiler on filled 4.4 s of a 5 s minimum at the timed pace). Every rank runs the
    most any rank needs (:func:`top_up_steps`), so all run the same rounds."""
    extra = 0
    pace_steps, pace_s = steps_done, meter.elapsed()
    for _ in range(TOP_UP_ROUNDS):
        need = top_up_steps(meter, pace_steps, device, pace_s)
        if need <= 0:
            break
        start = meter.elapsed()
        run_steps(extra, need)
        extra += need
        pace_steps, pace_s = need, meter.elapsed() - start
    return extra


def top_up_steps(meter: EnergyMeter, steps_done: int, device: Any, span_s: float | None = None) -> int:
    """Untimed steps every rank runs inside the energy window so that it lasts at least
    the meter's minimum, at the pace of ``steps_done`` steps in ``span_s`` seconds (default:
    the window so far): the most any rank needs (collectives need every rank in every
    step), agreed with one all_reduce."""
    import torch
    import torch.distributed as dist

    need = torch.tensor([steps_to_fill(meter.min_window_s, meter.elapsed(), steps_done, span_s)], dtype=torch.int64,
                        device=device)
    dist.all_reduce(need, op=dist.ReduceOp.MAX)
    return int(need.item())
