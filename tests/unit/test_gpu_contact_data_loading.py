"""Issue 30, item 3: on CUDA, data = "disk" must judge input_bound on the GPU's idle time
for want of a batch, not on the host's wait, which the GPU does not see while it still
has queued work. A fake GPU stream (work runs in the order queued, in host time) stands in
for CUDA and its events; the loader is a real DataLoader, slowed per sample."""

import time

import pytest
import torch

from mgbench import dataset
from mgbench.record import SCHEMA_VERSION, migrate_record
from mgbench.runner import data_loading
from mgbench.runner.data_loading import TokenShards, data_fields, loader_feed, measured_waits
from tests.factories import make_config, make_rank_figures, make_record

CPU = torch.device("cpu")
LOAD_S = 0.01  # per sample; a step reads two: the host waits ~20 ms per step


class FakeStream:
    """A GPU stream in host time: each piece of work starts when the host queues it or
    when the work before it ends, whichever is later; the host never waits for it."""

    def __init__(self):
        self.free_at = time.perf_counter()

    def launch(self, seconds):
        self.free_at = max(time.perf_counter(), self.free_at) + seconds

    def event(self):
        return FakeEvent(self)


class FakeEvent:
    """torch.cuda.Event on the fake stream: reached once the work queued before it is done."""

    def __init__(self, stream):
        self.stream, self.at = stream, None

    def record(self):
        self.at = self.stream.free_at = max(time.perf_counter(), self.stream.free_at)

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3  # ms, as torch's


class SlowShards(TokenShards):
    def __getitem__(self, i):
        time.sleep(LOAD_S)
        return super().__getitem__(i)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "d"
    dataset.generate(folder, tokens=700, vocab=256, seed=3, shard_tokens=300)
    return folder


def gpu_loop(monkeypatch, shards, compute_s, steps=6):
    """A CUDA training loop in miniature: each step reads its batch through the feed, then
    queues ``compute_s`` of work on the fake GPU and goes on without waiting for it.
    Returns the config, the feed and the measured steps."""
    stream = FakeStream()
    # raising=False: the code before the fix has no stall clock, and measured the host's wait
    monkeypatch.setattr(data_loading, "stall_clock", lambda device: data_loading.GpuStalls(stream.event),
                        raising=False)
    cfg = make_config(data="disk", seq_len=16, micro_batch=2)
    feed = loader_feed(cfg, 0, 1, CPU, data=SlowShards(shards, 16))
    for step in range(steps):
        feed.step(step)
        stream.launch(compute_s)
    return cfg, feed, range(1, steps)  # step 0: the loader's warm-up read


def test_a_host_wait_hidden_behind_queued_gpu_work_is_not_input_bound(monkeypatch, shards):
    # 60 ms of GPU work per step, 20 ms of loading: the GPU never runs out of work.
    cfg, feed, measured = gpu_loop(monkeypatch, shards, compute_s=0.06)
    host = [feed.waits[s] for s in measured]
    assert min(host) >= 2 * LOAD_S  # the host did wait ...
    out = data_fields(cfg, [measured_waits(feed, measured)], [feed.method], 0.06)
    assert out["data_wait_s"] < 0.005, out  # ... but the GPU did not (before: 20 ms, 33% of the step)
    assert out["input_bound"] is False
    out = data_fields(cfg, [measured_waits(feed, measured)], [feed.method], 0.06,
                      [data_loading.measured_host_waits(feed, measured)], [feed.wait_method])
    assert out["data_host_wait_s"] >= 2 * LOAD_S and out["data_wait_method"].startswith("cuda_events")
    assert out["input_bound"] is False


def test_a_gpu_that_runs_dry_waits_for_input(monkeypatch, shards):
    # 2 ms of GPU work per step, 20 ms of loading: the GPU idles ~18 ms per step.
    cfg, feed, measured = gpu_loop(monkeypatch, shards, compute_s=0.002)
    out = data_fields(cfg, [measured_waits(feed, measured)], [feed.method], 0.02)
    assert 0.5 * (2 * LOAD_S) <= out["data_wait_s"] <= max(feed.waits.values()) + 0.001, out
    assert out["input_bound"] is True


def test_cpu_ranks_keep_the_host_wait_and_say_so(shards):
    cfg = make_config(data="disk", seq_len=16, micro_batch=2)
    feed = loader_feed(cfg, 0, 1, CPU, data=SlowShards(shards, 16))
    for s in range(3):
        feed.step(s)
    assert feed.stalls is None and measured_waits(feed, [1, 2]) == [feed.waits[1], feed.waits[2]]
    out = data_fields(cfg, [measured_waits(feed, [1, 2])], [feed.method], 0.1)
    assert out["data_host_wait_s"] == out["data_wait_s"] and out["data_wait_method"].startswith("host_wait")


def test_the_worker_carries_host_waits_and_the_method_through_rounds():
    from mgbench.runner.worker import merge_rounds

    a = make_rank_figures(data_waits=[0.0, 0.001], data_host_waits=[0.02, 0.03], data_wait_method="cuda_events: x")
    b = make_rank_figures(data_waits=[0.002, 0.0], data_host_waits=[0.04, 0.05], data_wait_method="cuda_events: x")
    merged = merge_rounds([a, b])
    assert merged.data_host_waits == [0.02, 0.03, 0.04, 0.05] and merged.data_waits == [0.0, 0.001, 0.002, 0.0]


def as_schema_4(rec):
    """A record as schema 4 wrote it: without the fields schema 5 added."""
    flat = {k: v for k, v in rec.to_dict().items() if k not in SCHEMA_5_FIELDS}
    return {**flat, "schema_version": 4}


SCHEMA_5_FIELDS = ("data_host_wait_s", "data_wait_method", "num_recompiles", "num_graph_breaks",
                   "compile_counts_reason")


def test_schema_4_cuda_waits_were_the_hosts_and_are_not_judged():
    old = as_schema_4(make_record(make_config(data="disk", device="cuda", strategy="ddp", nproc=2), step_time_s=0.1,
                                  data_wait_s=0.05, data_wait_fraction=0.5, input_bound=True))
    rec = migrate_record(old)
    assert rec["data_host_wait_s"] == 0.05 and rec["data_wait_s"] is None and rec["input_bound"] is None
    assert "not the GPU's idle time" in rec["data_reason"]
    cpu = as_schema_4(make_record(make_config(data="disk"), step_time_s=0.1, data_wait_s=0.05,
                                  data_wait_fraction=0.5, input_bound=True))
    rec = migrate_record(cpu)  # on CPU ranks the host's wait is the device's: kept
    assert rec["data_wait_s"] == rec["data_host_wait_s"] == 0.05 and rec["input_bound"] is True
    assert rec["schema_version"] == SCHEMA_VERSION and rec["data_wait_method"].startswith("host_wait")
