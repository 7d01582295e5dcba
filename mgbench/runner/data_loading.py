"""Rank side of `data = "disk"`: the timed steps read their tokens from a dataset on disk
through a torch DataLoader, and the time the training loop waits for them is measured.

- :class:`TokenShards` maps sample ``i`` to ``seq_len + 1`` tokens of a memory-mapped
  shard (the layout of :mod:`mgbench.dataset`).
- :class:`RankBatchSampler` gives this data-parallel rank its part of every global batch,
  with the contract of :func:`mgbench.runner.training.rank_batches`: step ``s``'s global
  batch is ``global_batch`` samples, rank ``r`` takes rows ``[r * ga * mb, (r + 1) * ga * mb)``
  of it in micro-batches of ``mb``, so the ranks together read the global batch exactly once.
- A *feed* hands the training loop each step's micro-batches: :class:`MemoryFeed` the
  pre-built random batches (data = "random", nothing timed), :class:`LoaderFeed` the
  DataLoader's, timing each step's wait.
- :func:`data_fields` turns every rank's waits into the record's figures.

What counts as waiting: the device's idle time for want of a batch. On CPU ranks the
host runs the model, so the training thread's wait is that time. On CUDA it is not: the
host enqueues kernels and runs ahead, so while it waits for the loader the GPU may still
be busy with the previous step's queued work, and only a wait that outlasts that work
stalls it. A host-side timer would call a config input-bound whose GPU never stalled.
So on CUDA the wait is read from the GPU's own clock (:class:`GpuStalls`), and the
host's wait is kept beside it (data_host_wait_s).
"""

from __future__ import annotations

import bisect
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .. import dataset as dataset_files
from .. import stats
from ..config import RunConfig
from ..errors import MgbenchError
from .training import MicroBatch, batches_for

# A config is input-bound when the median step waits for data more than this share of the
# median step time. Why 10%: below it a faster loader would buy less than the step-to-step
# noise of a shared machine (a few %); above it, more workers, prefetching or pinned memory
# are worth trying before faster devices, since the devices would only wait longer.
INPUT_BOUND_FRACTION = 0.10

# How data_wait_s was measured (the record's data_wait_method), by device.
HOST_WAIT = ("host_wait: the training thread's time from asking the DataLoader for a step's first micro-batch to "
             "issuing its last one's copy to the device; on CPU ranks the host runs the model, so this is the "
             "device's idle time")
GPU_STALL = ("cuda_events: GPU time from the end of the work queued before the step asked for its batch (a CUDA "
             "event recorded then) to the end of the batch's copies (an event recorded after them): the GPU's "
             "idle time waiting for input, plus the copies on the compute stream; host waiting hidden behind "
             "queued GPU work is not counted (data_host_wait_s has it)")


class TokenShards(Dataset):
    """Samples of ``seq_len + 1`` tokens from a token dataset folder: sample ``i`` is
    ``tokens[j * seq_len : j * seq_len + seq_len + 1]`` of the shard holding it (``j``: its
    place in that shard), as int64. Shards are opened memory-mapped on first use in each
    process (DataLoader workers open their own; a memmap is not pickled to them)."""

    def __init__(self, path: str | Path, seq_len: int) -> None:
        self.path = Path(path)
        self.seq_len = seq_len
        self.index = dataset_files.read_index(self.path)
        counts = dataset_files.sample_counts(self.index, seq_len)
        self.starts = [0]
        for c in counts:
            self.starts.append(self.starts[-1] + c)
        self._maps: dict[int, np.ndarray] = {}
        # Test-only stand-in for slow storage (see mgbench.dataset): seconds slept per sample.
        self.read_delay_s = float(self.index.get(dataset_files.TEST_READ_DELAY, 0.0))

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, i: int) -> tuple[int, int]:
        """(shard, first token) of sample ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} of {len(self)}")
        shard = bisect.bisect_right(self.starts, i) - 1
        return shard, (i - self.starts[shard]) * self.seq_len

    def _shard(self, k: int) -> np.ndarray:
        if k not in self._maps:
            self._maps[k] = np.load(self.path / self.index["shards"][k]["file"], mmap_mode="r")
        return self._maps[k]

    def __getitem__(self, i: int) -> torch.Tensor:
        shard, lo = self.locate(i)
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        return torch.from_numpy(self._shard(shard)[lo : lo + self.seq_len + 1].astype(np.int64))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}


class RankBatchSampler(Sampler[list[int]]):
    """One pass over the dataset as this rank's micro-batches of sample indices.

    Each pass (epoch ``e``) reads the samples in a seeded order (a permutation drawn
    from ``(seed, e)``) and cuts it into global batches of ``micro_batch * grad_accum *
    dp_size`` samples, dropping the incomplete last one; of each, rank ``dp_rank`` gets
    its contiguous rows, ``grad_accum`` micro-batches of ``micro_batch``. Set ``epoch``
    before each pass."""

    def __init__(self, num_samples: int, seed: int, dp_rank: int, dp_size: int, micro_batch: int,
                 grad_accum: int) -> None:
        self.num_samples, self.seed = num_samples, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.micro_batch, self.grad_accum = micro_batch, grad_accum
        self.global_batch = micro_batch * grad_accum * dp_size
        self.epoch = 0
        if num_samples < self.global_batch:
            raise MgbenchError(f"the dataset holds {num_samples} samples, fewer than one global batch "
                               f"({self.global_batch}); make a bigger one")

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch

    def __len__(self) -> int:
        return self.steps_per_epoch * self.grad_accum

    def __iter__(self) -> Iterator[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
        rows = self.micro_batch * self.grad_accum
        for step in range(self.steps_per_epoch):
            mine = order[step * self.global_batch + self.dp_rank * rows:][:rows]
            for m in range(self.grad_accum):
                yield mine[m * self.micro_batch : (m + 1) * self.micro_batch].tolist()


class GpuStalls:
    """CUDA: the GPU's idle time waiting for each step's batch, from two CUDA events on the
    current stream. One is recorded when the step asks for its batch: the GPU reaches it
    when it has finished everything queued before (the previous step), or at once if it
    had already run out of work. The other is recorded after the batch's copies: the GPU
    reaches it when they are done, and not before the host enqueued them. The time between
    them is the stall the input caused: nothing when the loader's wait was hidden behind
    queued work (only the copies), the whole wait when the GPU was idle throughout.
    Events are read after the timed window (no sync per step); ``event`` makes one
    (torch.cuda.Event with timing; a stand-in in tests)."""

    method = GPU_STALL

    def __init__(self, event: Any = None) -> None:
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.marks: dict[int, tuple[Any, Any]] = {}

    def _now(self) -> Any:
        e = self.event()
        e.record()
        return e

    def asked(self) -> Any:
        """Mark the point where the step asks for its batch; returns the mark."""
        return self._now()

    def ready(self, step: int, asked: Any) -> None:
        """Mark the step's batch as copied (call after enqueueing its copies)."""
        self.marks[step] = (asked, self._now())

    def seconds(self, step: int) -> float:
        """The GPU's stall for ``step``'s batch (waits for the events: read after the window)."""
        asked, ready = self.marks[step]
        ready.synchronize()
        return asked.elapsed_time(ready) / 1e3


def stall_clock(device: torch.device) -> GpuStalls | None:
    """What times the device's wait for input: GPU events on CUDA; None where the host's
    own wait is the device's (CPU ranks)."""
    return GpuStalls() if device.type == "cuda" else None


class MemoryFeed:
    """data = "random": the batches :func:`rank_batches` built in device memory before
    timing; nothing is read while steps run, so no wait is recorded."""

    waits: dict[int, float] | None = None
    stalls: GpuStalls | None = None
    method: str | None = None
    wait_method: str | None = None
    warmup_reads = 0

    def __init__(self, batches: list[list[MicroBatch]]) -> None:
        self.batches = batches

    def step(self, step: int) -> list[MicroBatch]:
        return self.batches[step]

    @property
    def replay(self) -> list[list[MicroBatch]]:
        """Batches for the untimed steps after the window (energy top-up, profile, memory tracking)."""
        return self.batches

    def close(self) -> None:
        self.batches = []


class LoaderFeed:
    """data = "disk": each step's micro-batches from a DataLoader, with the time the host
    waited for them (``waits[step]``): from asking the iterator for the step's first
    micro-batch to its last one's host->device copy being issued. The copy is
    non-blocking, so a copy from pinned memory that overlaps with compute does not count
    as waiting: only what the host spent before it could start the step does. ``stalls``
    (CUDA): the GPU's idle time for the same batches (:class:`GpuStalls`), which is what
    :func:`measured_waits` reports there.

    A pass over the dataset that ends starts the next (a new epoch: new order, and new
    worker processes unless persistent_workers); that start-up is waited for too."""

    # Untimed steps that must read through the loader before the timed window, so its
    # first step does not pay for starting the workers (see worker.measure).
    warmup_reads = 1

    def __init__(self, loader: DataLoader, sampler: RankBatchSampler, grad_accum: int, device: torch.device,
                 method: str) -> None:
        self.loader, self.sampler = loader, sampler
        self.grad_accum, self.device = grad_accum, device
        self.settings = method
        self.waits: dict[int, float] = {}
        self.stalls = stall_clock(device)
        self.passes = 0
        self._it: Iterator[torch.Tensor] | None = None
        self._last: list[MicroBatch] | None = None

    def _next(self) -> torch.Tensor:
        while True:
            if self._it is None:
                self.sampler.epoch = self.passes
                self.passes += 1
                self._it = iter(self.loader)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None

    def step(self, step: int) -> list[MicroBatch]:
        asked = self.stalls.asked() if self.stalls is not None else None
        t0 = time.perf_counter()
        micro = []
        for _ in range(self.grad_accum):
            b = self._next().to(self.device, non_blocking=True)
            micro.append((b[:, :-1], b[:, 1:]))
        self.waits[step] = time.perf_counter() - t0
        if self.stalls is not None:
            self.stalls.ready(step, asked)
        self._last = micro
        return micro

    @property
    def method(self) -> str:
        return f"{self.settings}; {self.passes} pass(es) started over the warm-up and measured steps"

    @property
    def wait_method(self) -> str:
        """How :func:`measured_waits` measured the waits (the record's data_wait_method)."""
        return HOST_WAIT if self.stalls is None else self.stalls.method

    @property
    def replay(self) -> list[list[MicroBatch]]:
        """The last batch read, for the untimed steps after the window (energy top-up,
        profile, memory tracking): they measure the model, not the loader."""
        if self._last is None:
            raise RuntimeError("no batch read yet")
        return [self._last]

    def close(self) -> None:
        """Stop the workers (they would outlive the config otherwise, holding memory)."""
        self._it = None
        self._last = None
        self.loader = None  # type: ignore[assignment]  # persistent workers live as long as their loader


def loader_settings(cfg: RunConfig, device: torch.device) -> dict[str, Any]:
    """DataLoader keyword arguments for the config. pin_memory only where there is a
    device to copy to (torch warns and ignores it otherwise); prefetch_factor and
    persistent_workers only with workers (torch refuses them without)."""
    kw: dict[str, Any] = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory and device.type == "cuda"}
    if cfg.num_workers > 0:
        kw.update(prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers)
    return kw


def loader_feed(cfg: RunConfig, dp_rank: int, dp_size: int, device: torch.device,
                data: Dataset | None = None) -> LoaderFeed:
    """This rank's feed for a data = "disk" config: a DataLoader over ``data`` (default:
    the config's dataset folder, data_path)."""
    if data is None:
        if not cfg.data_path:
            raise MgbenchError("data = \"disk\" reached a rank without data_path: the launcher prepares it")
        data = TokenShards(cfg.data_path, cfg.seq_len)
        vocab = data.index["vocab"]
        if vocab > cfg.shape.vocab:
            raise MgbenchError(f"dataset {cfg.data_path} has vocab {vocab}, more than the model's {cfg.shape.vocab}")
    sampler = RankBatchSampler(len(data), cfg.seed, dp_rank, dp_size, cfg.micro_batch, cfg.grad_accum)
    kw = loader_settings(cfg, device)
    loader = DataLoader(data, batch_sampler=sampler, **kw)
    where = f"{cfg.data_path} ({len(data)} samples)" if cfg.data_path else f"{type(data).__name__} ({len(data)} samples)"
    pin = "" if kw["pin_memory"] == cfg.pin_memory else " (pin_memory = true has no effect without CUDA)"
    if getattr(data, "read_delay_s", 0):
        pin += (f"; reads slowed on purpose: {data.read_delay_s:g} s per sample ({dataset_files.TEST_READ_DELAY} in "  # type: ignore[attr-defined]
                "the dataset's index, a test's stand-in for slow storage)")
    method = (f"torch DataLoader({', '.join(f'{k}={v}' for k, v in kw.items())}){pin} over {where}, "
              f"{sampler.steps_per_epoch} step(s) per pass")
    return LoaderFeed(loader, sampler, cfg.grad_accum, device, method)


def step_feed(cfg: RunConfig, dp_rank: int, dp_size: int, device: torch.device, steps: int) -> MemoryFeed | LoaderFeed:
    """The data the training loop reads for ``steps`` steps: random batches built now
    (before timing), or a DataLoader over the dataset on disk."""
    if cfg.data == "disk":
        return loader_feed(cfg, dp_rank, dp_size, device)
    return MemoryFeed(batches_for(cfg, range(steps), dp_rank, dp_size, device))


def measured_waits(feed: MemoryFeed | LoaderFeed, steps: Sequence[int]) -> list[float] | None:
    """The measured steps' waits as the device saw them (None for in-memory data): the
    GPU's stalls on CUDA (read from its events: call after the window's sync), the host's
    waits on CPU ranks (see the module docstring)."""
    if feed.waits is None:
        return None
    if feed.stalls is not None:
        return [feed.stalls.seconds(s) for s in steps]
    return [feed.waits[s] for s in steps]


def measured_host_waits(feed: MemoryFeed | LoaderFeed, steps: Sequence[int]) -> list[float] | None:
    """The measured steps' waits as the host saw them (None for in-memory data)."""
    return None if feed.waits is None else [feed.waits[s] for s in steps]


def _slowest_median(per_rank_waits: list[list[float]]) -> tuple[float, list[float]]:
    """The slowest rank's median wait per step, and every rank's."""
    per_rank = [float(stats.summarize(w)["median"]) for w in per_rank_waits]
    return max(per_rank), per_rank


def data_fields(cfg: RunConfig, per_rank_waits: list[list[float] | None], methods: list[str | None],
                step_time_s: float, host_waits: list[list[float] | None] | None = None,
                wait_methods: list[str | None] | None = None) -> dict[str, Any]:
    """Record fields from every rank's per-step waits (:func:`measured_waits`: the
    device's): the median per step on each rank, the slowest rank's as data_wait_s, and
    input_bound against INPUT_BOUND_FRACTION of the median step time; the host's waits
    (:func:`measured_host_waits`; None: the same as ``per_rank_waits``, as on CPU ranks)
    as data_host_wait_s, and ``wait_methods`` (the feeds' wait_method) as
    data_wait_method. Null with the reason for in-memory data."""
    if cfg.data != "disk":
        return {"data_reason": "data = random: the batches are made in device memory before the timed window; "
                               "no step waits for data"}
    if any(w is None or not w for w in per_rank_waits):
        return {"data_reason": "a rank recorded no data waits"}
    wait, per_rank = _slowest_median(per_rank_waits)  # type: ignore[arg-type]
    hosts = per_rank_waits if host_waits is None else host_waits
    host_wait = None if any(not h for h in hosts) else _slowest_median(hosts)[0]  # type: ignore[arg-type]
    frac = wait / step_time_s if step_time_s > 0 else None
    return {
        "data_wait_s": wait,
        "data_wait_steps_s": [max(ws) for ws in zip(*per_rank_waits)],  # type: ignore[arg-type]
        "data_wait_per_rank_s": per_rank,
        "data_wait_fraction": frac,
        "data_host_wait_s": host_wait,
        "input_bound": None if frac is None else frac > INPUT_BOUND_FRACTION,
        "data_wait_method": (wait_methods or [None])[0] or HOST_WAIT,
        "data_method": methods[0],
        "data_reason": None if frac is not None else "step time is zero",
    }
