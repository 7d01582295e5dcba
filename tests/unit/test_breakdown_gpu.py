"""The GPU split of a profiled step, from torch.profiler FunctionEvents as torch 2.13 builds
them from kineto: every event on the GPU timeline carries DeviceType.CUDA, and kineto's
activity type tells kernels, memcpys and memsets from annotation ranges and waits."""

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from mgbench.telemetry.breakdown import GPU_WORK, from_profile, is_gpu_work


class Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def gpu_event(name, start, end, activity, annotation=False):
    return FunctionEvent(id=0, name=name, thread=7, start_us=start, end_us=end, device_type=DeviceType.CUDA,
                         activity_type=activity, is_user_annotation=annotation)


def test_fsdp_annotation_ranges_are_not_compute():
    """FSDP2 wraps its all-gather in record_function("FSDP::all_gather"), which the
    profiler mirrors onto the GPU timeline as a range spanning the wait for the NCCL
    kernel. Counted as compute, it hid the exposed communication completely (exposed
    0 us, comm_fraction 0)."""
    events = [
        gpu_event("ampere_bf16_gemm", 0, 40, "kernel"),
        gpu_event("FSDP::all_gather", 40, 100, "gpu_user_annotation", annotation=True),
        gpu_event("ncclDevKernel_AllGather_RING_LL", 50, 90, "kernel"),
        gpu_event("Memcpy HtoD (Pinned -> Device)", 90, 95, "gpu_memcpy"),
        gpu_event("Memset (Device)", 95, 96, "gpu_memset"),
        gpu_event("cudaStreamWaitEvent", 96, 100, "cuda_sync"),
    ]
    out = from_profile(Profile(events), None, (0, 100), on_gpu=True)
    assert out["compute_s"] * 1e6 == pytest.approx(46)  # 40 gemm + 5 memcpy + 1 memset
    assert out["comm_s"] * 1e6 == pytest.approx(40)
    assert out["exposed_comm_s"] * 1e6 == pytest.approx(40)  # nothing computes while it runs
    assert out["idle_s"] * 1e6 == pytest.approx(14)  # 40..50 and 96..100: annotation and wait, not work


def test_gpu_work_is_kernels_copies_and_fills_only():
    assert set(GPU_WORK) == {"kernel", "gpu_memcpy", "gpu_memset"}
    assert is_gpu_work(gpu_event("k", 0, 1, "kernel"))
    assert not is_gpu_work(gpu_event("FSDP::all_gather", 0, 1, "gpu_user_annotation", annotation=True))
    assert not is_gpu_work(gpu_event("sync", 0, 1, "cuda_sync"))
    assert not is_gpu_work(FunctionEvent(id=0, name="aten::mm", thread=1, start_us=0, end_us=1))  # CPU side
    # A torch whose events lack the activity type: annotation ranges still left out.
    old = gpu_event("FSDP::all_gather", 0, 1, None, annotation=True)
    assert not is_gpu_work(old) and is_gpu_work(gpu_event("k", 0, 1, None))


def test_profiler_labels_annotations_as_this_code_expects():
    """On CPU the same labels come from the real profiler: a record_function range is a
    user annotation (its GPU mirror is 'gpu_user_annotation'), ops are 'cpu_op'."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("FSDP::all_gather"):
            torch.ones(4).sum()
    kinds = {e.name: (e.activity_type, e.is_user_annotation) for e in prof.events()}
    assert kinds["FSDP::all_gather"] == ("user_annotation", True)
    assert kinds["aten::sum"] == ("cpu_op", False)
