"""Issue 30, item 4: ``mgbench.step(tokens=<CUDA tensor>)`` must not read the tensor's
value synchronously (``.item()`` / ``__index__`` on a CUDA tensor waits for the GPU every
step). A fake CUDA tensor counts the reads that would synchronise; a fake event stands in
for the copy to the host landing."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mgbench import step_events
from mgbench.step_events import read_step_file

REPO = Path(__file__).resolve().parents[2]


class FakeEvent:
    """torch.cuda.Event: done once the test says the GPU got there (or on synchronize)."""

    done = False

    def __init__(self, *a, **kw):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def query(self):
        return FakeEvent.done

    def synchronize(self):
        FakeEvent.done = True


class FakeCudaTensor:
    """A one-element integer CUDA tensor: reading its value here would synchronise."""

    __module__ = "torch"  # what mgbench.step checks before importing torch
    syncs = 0

    class device:  # noqa: N801 (torch.device's attribute)
        type = "cuda"

    dtype = torch.int64

    def __init__(self, value):
        self.value = value

    def numel(self):
        return 1

    def detach(self):
        return self

    def __index__(self):
        FakeCudaTensor.syncs += 1
        return self.value

    item = __index__

    def to(self, device, non_blocking=False):
        assert device == "cpu" and non_blocking, "the copy to the host must be queued, not waited for"
        return torch.tensor(self.value)  # the host copy: reading it waits for nothing


@pytest.fixture
def step_file(tmp_path, monkeypatch):
    path = tmp_path / "steps.txt"
    monkeypatch.setenv(step_events.STEP_FILE_ENV, str(path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(step_events, "_pending", [], raising=False)  # a fresh queue per test
    monkeypatch.setattr(FakeEvent, "done", False)
    monkeypatch.setattr(FakeCudaTensor, "syncs", 0)
    return path


def lines_of(path):
    return path.read_text().splitlines() if path.exists() else []


def test_a_cuda_tensor_is_not_read_at_the_call_and_its_line_lands_once_the_copy_has(step_file):
    t0 = time.time_ns()
    step_events.step(tokens=FakeCudaTensor(512))
    t1 = time.time_ns()
    assert FakeCudaTensor.syncs == 0  # before: operator.index -> .item(), a device sync every step
    assert lines_of(step_file) == []  # the value is still on its way
    FakeEvent.done = True  # the GPU reached the copy
    time.sleep(0.002)
    step_events.step(tokens=FakeCudaTensor(256))  # a later call writes what is ready
    assert FakeCudaTensor.syncs == 0
    first, second = lines_of(step_file)
    t, n, rank = first.split()
    assert t0 <= int(t) <= t1 and (n, rank) == ("512", "1")  # timed at its own call, not when written
    assert int(second.split()[0]) > int(t) and second.split()[1:] == ["256", "1"]


def test_what_is_still_pending_is_written_at_exit_and_reads_back(step_file):
    for n in (100, 200):
        step_events.step(tokens=FakeCudaTensor(n))
    step_events.step(tokens=300)  # a plain int after pending tensors keeps its place
    assert lines_of(step_file) == []
    step_events.flush()  # what the exit handler runs: waits for the copies
    assert FakeCudaTensor.syncs == 0
    ends = read_step_file(lines_of(step_file))
    assert ends.tokens == [100, 200, 300] and ends.malformed == 0 and len(ends.ends_ns) == 3
    assert step_events._pending_at_exit  # registered once a CUDA count was deferred


def test_a_float_tensor_is_refused_at_the_call(step_file):
    class FloatTensor(FakeCudaTensor):
        __module__ = "torch"
        dtype = torch.float32

    with pytest.raises(TypeError, match="integer"):
        step_events.step(tokens=FloatTensor(1))
    assert step_events._pending == []


def test_ints_and_host_tensors_are_still_written_at_once_without_torch_for_ints(step_file):
    step_events.step(tokens=7)
    step_events.step(tokens=torch.tensor(9))  # a host tensor: no device to wait on
    assert [ln.split()[1] for ln in lines_of(step_file)] == ["7", "9"]
    code = "import mgbench, sys; mgbench.step(tokens=3); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={step_events.STEP_FILE_ENV: str(step_file.parent / "other.txt"), "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False"
