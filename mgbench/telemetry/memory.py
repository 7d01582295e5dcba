"""Peak memory of one config on one rank, three ways.

Device peaks, in windows (:func:`reset_peak` / :func:`read_peak`). On CUDA: the caching
allocator's max allocated / reserved since the window opened. On CPU: the process's
resident set size high-water mark (Linux VmHWM), which Linux lets us reset per window
by writing 5 to /proc/self/clear_refs; where that reset fails the figure is the process
lifetime peak and the method says so. RSS includes the interpreter, torch's libraries
and whatever the C allocator kept after frees: it bounds what a rank costs the host, it
does not say what the tensors need. The worker opens one window for building and
sharding the model (the init peak) and a new one for training, so sharded strategies'
training peaks do not include the unsharded model they were built from.

Tracked memory (:func:`track_step`): one training step run under torch's own tensor
accounting, ``torch.distributed._tools`` MemTracker (FSDPMemTracker for an FSDP-wrapped
model), which sees every tensor storage an op creates or frees and files it under
parameters, gradients, optimizer states, activations, temporaries (backward) and, for
FSDP, the gathered parameters and the all-gather / reduce-scatter buffers. The peak is
the largest sum of live tensor bytes during the step, with its split by category at
that moment. Every op passes through a Python hook while it runs, so the step is slow:
it is never one of the timed steps.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..errors import first_line

# What a tracked figure splits into (record fields mem_tracked_<category>_bytes).
TRACKED_CATEGORIES = ("params", "gathered_params", "grads", "optimizer", "activations", "temporaries", "comm",
                      "other")

# torch's reference types (MemTracker's _MemRefType and FSDPMemTracker's _FSDPRefType,
# by value) -> our category. "Other" is what track_external files plain tensors under:
# the only plain tensors we hand it are pipeline stages' send/receive buffers.
CATEGORY_OF_REFTYPE = {
    "Parameter": "params", "Sharded Param": "params",
    "Unsharded Param": "gathered_params",
    "Gradient": "grads", "Sharded Grad": "grads", "Unsharded Grad": "grads",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "comm", "Reduce Scatter": "comm", "Other": "comm",
    "Buffer": "other", "Inputs": "other",
}


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


# --- tracked memory -----------------------------------------------------------------

def track_step(step: Callable[[], Any], modules: list[nn.Module], optimizer: torch.optim.Optimizer,
               device: torch.device, schedule: Any = None) -> dict[str, Any]:
    """Run ``step()`` (one training step) under torch's memory tracker and return this
    rank's tracked peak: ``{"mem_tracked": {"peak": bytes, <category>: bytes, ...} | None,
    "mem_tracked_method": str, "mem_tracked_reason": str | None}``.

    ``modules``: the rank's wrapped model(s); ``optimizer``: its optimizer; ``schedule``:
    the pipeline schedule, if any. Run it after the warm-up, so the optimizer states
    exist and the step is a steady-state one. What existed before the step is handed to
    the tracker (parameters, buffers, optimizer states, pipeline buffers); DDP's
    gradient buckets live in C++ where the tracker cannot see them, so their bytes (read
    from DDP's logging data) are added to ``comm`` and to the peak: they are
    allocated for the model's whole life. The step's token ids, built before the step,
    are not counted (8 bytes per token).

    A step that fails under the tracker is reported as null with the reason; the
    caller's model may then be mid-step and should not be used again.
    """
    if any(_has_compiled(m) for m in modules):
        # Seen on torch 2.13: under the tracker's dispatch mode the compiled blocks run
        # eagerly (the figures came out identical to compile = false's, byte for byte).
        return _untracked("compile = true: under the tracker the compiled blocks run eagerly, so its figures "
                          "would be eager execution's, not the compiled code's")
    try:
        tracker, method = _tracker_for(modules, optimizer)
        for stage_buffer in pipeline_buffers(schedule):
            tracker.track_external(stage_buffer)
        with tracker:
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        snapshot = tracker.get_tracker_snapshot("peak")
    except Exception as e:  # a tracker failure must not cost the config its throughput figures
        return _untracked(f"torch's memory tracker failed on this step: {type(e).__name__}: {first_line(str(e))}")
    dev = next((d for d in snapshot if torch.device(d) == _full_device(device)), None)
    if dev is None:
        return _untracked(f"the tracker saw no tensor on {device} during the step")
    out = categorize(snapshot[dev])
    try:
        buckets = ddp_bucket_bytes(modules)
    except KeyError:
        return _untracked("DDP's gradient buckets hold memory the tracker cannot see, and this torch does not "
                          "report their sizes (no bucket_sizes in DDP's logging data)")
    out["comm"] += buckets
    out["peak"] += buckets
    if buckets:
        method += " + DDP gradient buckets (sizes from DDP's logging data)"
    return {"mem_tracked": out, "mem_tracked_method": method, "mem_tracked_reason": None}


def _untracked(reason: str) -> dict[str, Any]:
    return {"mem_tracked": None, "mem_tracked_method": None, "mem_tracked_reason": reason}


def _full_device(device: torch.device) -> torch.device:
    """Tensors' devices carry an index on CUDA ("cuda:0"); match the tracker's keys."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _has_compiled(module: nn.Module) -> bool:
    """Whether any submodule was compiled in place (``Module.compile``)."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def categorize(dev_snapshot: dict[Any, int]) -> dict[str, int]:
    """A tracker snapshot of one device (reference type -> bytes, plus "Total") as our
    categories; ``peak`` is the snapshot's total. A reference type this mgbench does not
    know (a newer torch) is counted under ``other``, so the categories still add up."""
    out = dict.fromkeys(TRACKED_CATEGORIES, 0)
    total = 0
    for key, nbytes in dev_snapshot.items():
        name = getattr(key, "value", key)
        if name == "Total":
            total = int(nbytes)
            continue
        out[CATEGORY_OF_REFTYPE.get(name, "other")] += int(nbytes)
    out["peak"] = total
    return out


def _forget_repeated_root(tracker: Any, module: nn.Module) -> None:
    """Let the tracker see the root module called again within one step.

    torch's trackers refuse a second top-level forward of a module ("does not support
    memory tracking for multiple iterative calls"): they expect one forward per tracked
    iteration, while a step here runs one per micro-batch (gradient accumulation, and
    every pipeline schedule). The refusal protects the per-module statistics, which we
    do not read; dropping the module's entry starts them over and leaves the global
    accounting (every live storage, the peak) untouched."""
    if module not in tracker.memory_tracking or tracker._mod_tracker.is_bw:
        return
    name = tracker._mod_tracker.get_known_fqn(module)
    if set(tracker._mod_tracker.parents) - {name} == {"Global"}:
        del tracker.memory_tracking[module]


def _global_peak_only(tracker: Any, peak_state: Any) -> None:
    """Replaces the trackers' ``_update_peak_stats``, which runs after every op: keep the
    global peak and its snapshot, skip the per-module peaks. Those walk every module
    the tracker has seen on every op (half the tracked step's time on a 4-layer model)
    and nothing here reads them."""
    for dev, snap in tracker._curr_mem_snap.items():
        if snap["Total"] > tracker._peak_mem.get(dev, 0):
            tracker._peak_mem[dev] = snap["Total"]
            tracker._peak_mem_snap[dev] = dict(snap)  # values are ints: a shallow copy is a copy


def _tracker_for(modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> tuple[Any, str]:
    """FSDPMemTracker when the rank's model is one FSDP root (it tells gathered
    parameters and collective buffers apart); MemTracker otherwise (pipeline stages,
    DDP, tensor parallelism, single)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    if len(modules) == 1 and isinstance(modules[0], FSDPModule):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        class StepFSDPMemTracker(FSDPMemTracker):
            _update_peak_stats = _global_peak_only

            def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
                inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

                def pre_forward(*args: Any, **kwargs: Any) -> Any:
                    _forget_repeated_root(self, fsdp_mod)
                    return inner(*args, **kwargs)

                return pre_forward

        tracker: Any = StepFSDPMemTracker(modules[0], _inner_optimizer(optimizer))
        return tracker, "torch FSDPMemTracker (one untimed step after the measured windows)"

    class StepMemTracker(MemTracker):
        _update_peak_stats = _global_peak_only

        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            _forget_repeated_root(self, module)
            super()._pre_fw_hook(module, inputs)

    tracker = StepMemTracker()
    tracker.track_external(*modules)
    opts = {id(o): o for o in (optimizer, _inner_optimizer(optimizer))}
    tracker.track_external(*opts.values())
    return tracker, "torch MemTracker (one untimed step after the measured windows)"


def _inner_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeroRedundancyOptimizer keeps its states in a local optimizer (``.optim``)."""
    inner = getattr(optimizer, "optim", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def ddp_bucket_bytes(modules: list[nn.Module]) -> int:
    """Bytes of the gradient buckets of every DDP wrapper among ``modules``.

    DDP's reducer (C++) allocates one flat tensor per bucket at construction, as large
    as the gradients it carries, and keeps it as long as the model lives (with the
    default gradient_as_bucket_view=False, beside the gradients themselves). The sizes
    are the reducer's own, from DDP's logging data (``bucket_sizes``, bytes per bucket),
    which costs no allocation; KeyError when this torch does not report them."""
    import re

    from torch.nn.parallel import DistributedDataParallel as DDP

    total = 0
    for m in modules:
        if isinstance(m, DDP):
            sizes = m._get_ddp_logging_data()["bucket_sizes"]
            total += sum(int(n) for n in re.findall(r"\d+", str(sizes)))
    return total


def pipeline_buffers(schedule: Any) -> list[torch.Tensor]:
    """The send/receive buffers of a pipeline schedule's stages on this rank: allocated
    at the schedule's first step (shape inference), reused by every later one."""
    if schedule is None:
        return []
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    out: list[torch.Tensor] = []
    for stage in stages:
        for infos in [*getattr(stage, "args_recv_info", {}).values(), *getattr(stage, "grad_recv_info", {}).values()]:
            for info in infos:
                buf = getattr(info, "buffer", None)
                if isinstance(buf, torch.Tensor):
                    out.append(buf)
    return out
