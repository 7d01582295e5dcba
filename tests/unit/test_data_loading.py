"""Rank side of data = "disk" (mgbench.runner.data_loading): sample -> tokens against the
memmap by hand, each rank's part of every global batch, wait-time accounting and the
input-bound flag (slow on purpose, and not), and how show and the report flag it."""

import json
import time

import numpy as np
import pandas as pd
import pytest
import torch

from mgbench import dataset, show
from mgbench.report.html import warnings
from mgbench.runner import data_loading
from mgbench.runner.data_loading import (INPUT_BOUND_FRACTION, RankBatchSampler, TokenShards, data_fields,
                                         loader_feed, measured_waits)
from tests.factories import make_config, make_record, make_run

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """700 tokens in shards of 300, 300, 100 (vocab 256)."""
    folder = tmp_path_factory.mktemp("data") / "d"
    dataset.generate(folder, tokens=700, vocab=256, seed=3, shard_tokens=300)
    return folder


def test_sample_i_is_seq_len_plus_1_tokens_of_its_shard(shards):
    data = TokenShards(shards, seq_len=16)
    # by hand: (300 - 1) // 16 = 18 samples in each full shard, (100 - 1) // 16 = 6 in the last
    assert len(data) == 18 + 18 + 6
    raw = [np.load(shards / f"shard-0000{k}.npy") for k in range(3)]
    for i, shard, first in [(0, 0, 0), (1, 0, 16), (17, 0, 272), (18, 1, 0), (35, 1, 272), (36, 2, 0), (41, 2, 80)]:
        got = data[i]
        assert got.dtype == torch.int64 and got.shape == (17,)
        assert got.tolist() == raw[shard][first:first + 17].tolist(), i
    assert data[1][0] == data[0][-1]  # consecutive samples share one token: input of one, target of the last
    with pytest.raises(IndexError):
        data[42]


def test_each_rank_reads_its_own_rows_of_every_global_batch():
    mb, ga, dp, n = 2, 2, 2, 41
    samplers = [RankBatchSampler(n, seed=5, dp_rank=r, dp_size=dp, micro_batch=mb, grad_accum=ga) for r in range(dp)]
    assert samplers[0].steps_per_epoch == 5 and len(samplers[0]) == 5 * ga  # 41 // 8, the partial batch dropped
    for epoch in (0, 1):
        for s in samplers:
            s.epoch = epoch
        per_rank = [list(s) for s in samplers]
        order = np.random.default_rng([5, epoch]).permutation(n)
        seen = []
        for step in range(5):
            # rank r's ga micro-batches of step s are rows [r*ga*mb, (r+1)*ga*mb) of the global batch
            got = [i for r in range(dp) for m in per_rank[r][step * ga:(step + 1) * ga] for i in m]
            assert got == order[step * 8:(step + 1) * 8].tolist()
            assert all(len(m) == mb for r in range(dp) for m in per_rank[r][step * ga:(step + 1) * ga])
            seen += got
        assert len(set(seen)) == len(seen) == 40  # no sample twice within a pass
    samplers[0].epoch = 0  # each pass reads in a new order
    first = list(samplers[0])
    samplers[0].epoch = 1
    assert list(samplers[0]) != first


class SlowShards(TokenShards):
    """Reads like TokenShards but sleeps per sample: a loader too slow for the model."""

    delay_s = 0.02

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return super().__getitem__(i)


def run_loop(cfg, data, steps=6, compute_s=0.005):
    """A training loop in miniature: read each step through the feed, then 'compute'."""
    feed = loader_feed(cfg, 0, 1, CPU, data=data)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        micro = feed.step(step)
        time.sleep(compute_s)
        times.append(time.perf_counter() - t0)
    assert len(micro) == cfg.grad_accum and micro[0][0].shape == (cfg.micro_batch, cfg.seq_len)
    waits = measured_waits(feed, range(1, steps))  # step 0: the warm-up read
    return feed, waits, sorted(times[1:])[len(times[1:]) // 2]


def test_a_slow_dataset_makes_the_config_input_bound(shards):
    cfg = make_config(data="disk", seq_len=16, micro_batch=2)
    feed, waits, step = run_loop(cfg, SlowShards(shards, 16), compute_s=0.005)
    out = data_fields(cfg, [waits], [feed.method], step)
    assert out["data_wait_s"] >= 2 * SlowShards.delay_s  # two samples read per step
    assert out["data_wait_steps_s"] == waits and len(waits) == 5
    assert out["data_wait_fraction"] > INPUT_BOUND_FRACTION and out["input_bound"] is True
    assert out["data_reason"] is None and "DataLoader(num_workers=0" in out["data_method"]


def test_a_fast_dataset_is_not_input_bound(shards):
    cfg = make_config(data="disk", seq_len=16, micro_batch=2)
    feed, waits, step = run_loop(cfg, TokenShards(shards, 16), compute_s=0.03)
    out = data_fields(cfg, [waits], [feed.method], step)
    assert out["input_bound"] is False and out["data_wait_s"] < 0.01, out


def test_slowest_rank_sets_the_wait_and_each_step_takes_its_max():
    cfg = make_config(data="disk", strategy="ddp", nproc=2)
    out = data_fields(cfg, [[0.001, 0.002, 0.003], [0.010, 0.001, 0.020]], ["m", "m"], step_time_s=0.1)
    assert out["data_wait_per_rank_s"] == [0.002, 0.010] and out["data_wait_s"] == 0.010
    assert out["data_wait_steps_s"] == [0.010, 0.002, 0.020]
    assert out["input_bound"] is False  # 10% is not above 10%
    assert data_fields(cfg, [[0.011], [0.0]], ["m", "m"], 0.1)["input_bound"] is True


def test_random_data_has_no_wait_figures_and_says_why():
    out = data_fields(make_config(), [None], [None], 0.1)
    assert out == {"data_reason": out["data_reason"]} and "data = random" in out["data_reason"]


def test_a_pass_that_ends_starts_the_next_and_is_counted(tmp_path):
    folder = tmp_path / "one-step"
    dataset.generate(folder, tokens=2 * 16 + 1, vocab=256)  # exactly one global batch of 2 at seq 16
    cfg = make_config(data="disk", seq_len=16, micro_batch=2, data_path=str(folder))
    feed = loader_feed(cfg, 0, 1, CPU)
    batches = [feed.step(s) for s in range(3)]
    assert feed.passes == 3 and "3 pass(es)" in feed.method and "1 step(s) per pass" in feed.method
    assert sorted(batches[0][0][0][:, 0].tolist()) == sorted(batches[2][0][0][:, 0].tolist())  # same samples again
    assert feed.replay == [batches[-1]]


def test_test_read_delay_in_the_index_slows_reads_and_is_said(tmp_path):
    folder = tmp_path / "slow"
    dataset.generate(folder, tokens=200, vocab=256)
    index = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps({**index, dataset.TEST_READ_DELAY: 0.01}))
    cfg = make_config(data="disk", seq_len=16, micro_batch=2, data_path=str(folder), pin_memory=True)
    feed = loader_feed(cfg, 0, 1, CPU)
    feed.step(0)
    assert feed.waits[0] >= 0.02
    assert "slowed on purpose" in feed.method and "no effect without CUDA" in feed.method


def test_show_and_report_flag_input_bound_configs(tmp_path):
    cfg = make_config(data="disk", num_workers=2)
    slow = make_record(cfg, step_time_s=0.1, data_wait_s=0.05, data_wait_fraction=0.5, input_bound=True)
    fast_cfg = make_config(data="disk")
    fast = make_record(fast_cfg, step_time_s=0.1, data_wait_s=0.001, data_wait_fraction=0.01, input_bound=False)
    run = make_run(tmp_path, "r", [slow, fast], suite={"name": "s"}, status="complete")
    text = show.render(run.path)
    assert text.count("INPUT-BOUND") == 1 and "50 ms 50% INPUT-BOUND" in text
    assert f"{cfg.config_id}: input-bound: waits 50 ms per step" in text and fast_cfg.config_id + ": input" not in text
    df = pd.DataFrame([slow.to_dict(), fast.to_dict()])
    flagged = [w for w in warnings(df) if "input-bound" in w]
    assert len(flagged) == 1 and flagged[0].startswith(cfg.label) and "num_workers" in flagged[0]


def test_the_threshold_is_what_the_record_says():
    from mgbench.record import RECORD_FIELDS

    assert f"({INPUT_BOUND_FRACTION:g})" in RECORD_FIELDS["input_bound"].metadata["help"]
    assert data_loading.MemoryFeed([]).waits is None


def test_rounds_add_up_their_data_waits():
    from mgbench.runner.worker import merge_rounds
    from tests.factories import make_rank_figures

    a = make_rank_figures(windows=[[0.1, 0.1]], data_waits=[0.01, 0.02], data_method="m")
    b = make_rank_figures(windows=[[0.1, 0.1]], data_waits=[0.03, 0.04], data_method="m")
    assert merge_rounds([a, b]).data_waits == [0.01, 0.02, 0.03, 0.04]
    assert merge_rounds([a, make_rank_figures()]).data_waits is None  # random data: no waits
