"""Peak memory of one config on one rank.

On CUDA: the caching allocator's max allocated / reserved since the config started.
On CPU: the process's peak resident set size (VmHWM), which Linux lets us reset per
config by writing 5 to /proc/self/clear_refs; where that reset fails the figure is the
process lifetime peak and the method says so.
"""

from __future__ import annotations

import torch


def reset_peak(device: torch.device) -> str:
    """Start a new peak window; returns the method the matching read will use."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda_max_allocated"
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "cpu_peak_rss_per_rank"
    except OSError:
        return "cpu_process_lifetime_peak_rss"


def _vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def read_peak(device: torch.device) -> dict[str, float | None]:
    """Peak memory in GiB since the last reset_peak: allocated and reserved (CUDA) or RSS."""
    if device.type == "cuda":
        return {
            "mem_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "mem_reserved_peak_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        }
    rss = _vm_hwm_bytes()
    return {"mem_peak_gib": None if rss is None else rss / 2**30, "mem_reserved_peak_gib": None}
