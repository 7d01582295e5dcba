"""Token datasets on disk (mgbench.dataset, `mgbench data make`): sizes, determinism,
the index, refusals, the cache, and the launcher's preparation of data = "disk" configs."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from mgbench import dataset
from mgbench.cli import main
from mgbench.data_commands import Count
from mgbench.errors import MgbenchError
from tests.factories import make_config


def shard_arrays(folder, index):
    return [np.load(folder / s["file"]) for s in index["shards"]]


def test_generate_writes_the_asked_size_in_shards_with_its_index(tmp_path):
    folder = tmp_path / "d"
    index = dataset.generate(folder, tokens=1000, vocab=300, seed=7, shard_tokens=300)
    assert [s["tokens"] for s in index["shards"]] == [300, 300, 300, 100]
    on_disk = json.loads((folder / "index.json").read_text())
    assert on_disk == index
    assert (on_disk["format"], on_disk["vocab"], on_disk["dtype"], on_disk["tokens"], on_disk["seed"],
            on_disk["shard_tokens"]) == ("mgbench-tokens", 300, "uint16", 1000, 7, 300)
    arrays = shard_arrays(folder, index)
    assert [a.shape for a in arrays] == [(300,), (300,), (300,), (100,)]
    assert all(a.dtype == np.uint16 for a in arrays)
    allv = np.concatenate(arrays)
    assert allv.max() < 300 and allv.min() >= 0 and len(np.unique(allv)) > 200  # uniform over the vocab
    # memory-mapped reading works on the shards as written
    assert np.array_equal(np.load(folder / "shard-00000.npy", mmap_mode="r")[:10], arrays[0][:10])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no partial folder left beside it
    assert dataset.generate(tmp_path / "big", tokens=10, vocab=70000)["dtype"] == "uint32"


def test_same_seed_same_tokens_another_seed_others(tmp_path):
    a = dataset.generate(tmp_path / "a", 1000, 256, seed=1, shard_tokens=300)
    dataset.generate(tmp_path / "b", 1000, 256, seed=1, shard_tokens=300)
    dataset.generate(tmp_path / "c", 1000, 256, seed=2, shard_tokens=300)
    dataset.generate(tmp_path / "small", 400, 256, seed=1, shard_tokens=300)
    sa, sb, sc = (np.concatenate(shard_arrays(tmp_path / n, a)) for n in "abc")
    assert np.array_equal(sa, sb)
    assert not np.array_equal(sa, sc)
    # A shard's tokens depend on (seed, shard) only: a smaller dataset is a prefix.
    assert np.array_equal(np.load(tmp_path / "small" / "shard-00000.npy"), np.load(tmp_path / "a" / "shard-00000.npy"))


def test_refuses_a_folder_that_is_not_a_dataset_and_keeps_it(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(MgbenchError, match="not an mgbench dataset"):
        dataset.generate(folder, 100, 10)
    with pytest.raises(MgbenchError, match="not an mgbench dataset"):
        dataset.generate(folder, 100, 10, force=True)  # force never replaces a non-dataset
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    dataset.generate(tmp_path / "empty", 100, 10)  # an empty folder is fine
    assert dataset.is_dataset(tmp_path / "empty")


def test_an_existing_dataset_is_reused_refused_or_replaced(tmp_path):
    folder = tmp_path / "d"
    dataset.generate(folder, 100, 10)
    stamp = (folder / "shard-00000.npy").stat().st_mtime_ns
    dataset.generate(folder, 100, 10)  # the same dataset: nothing written
    assert (folder / "shard-00000.npy").stat().st_mtime_ns == stamp
    with pytest.raises(MgbenchError, match=r"another dataset \(tokens 100 \(asked 200\)"):
        dataset.generate(folder, 200, 10)
    assert dataset.generate(folder, 200, 10, force=True)["tokens"] == 200
    assert dataset.read_index(folder)["tokens"] == 200


@pytest.mark.parametrize("samples, seq_len, shard", [(1, 8, 100), (12, 8, 100), (13, 8, 100), (40, 16, 64), (7, 3, 4)])
def test_tokens_for_samples_is_the_least_that_holds_them(tmp_path, samples, seq_len, shard):
    tokens = dataset.tokens_for_samples(samples, seq_len, shard)
    have = dataset.describe_index(tokens, 10, 0, shard)
    fewer = dataset.describe_index(tokens - 1, 10, 0, shard)
    assert sum(dataset.sample_counts(have, seq_len)) >= samples > sum(dataset.sample_counts(fewer, seq_len))


def test_read_index_names_what_is_wrong(tmp_path):
    with pytest.raises(MgbenchError, match="not found"):
        dataset.read_index(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    with pytest.raises(MgbenchError, match="no index.json"):
        dataset.read_index(tmp_path / "x")
    dataset.generate(tmp_path / "d", 100, 10)
    os.remove(tmp_path / "d" / "shard-00000.npy")
    with pytest.raises(MgbenchError, match="shard-00000.npy .* missing"):
        dataset.read_index(tmp_path / "d")
    # a truncated or hand-edited index: one line, not a KeyError when the shards are read
    (tmp_path / "y").mkdir()
    for broken in ({}, {"shards": [{"file": "shard-00000.npy"}]}, {"vocab": 10, "shards": "x"}):
        (tmp_path / "y" / "index.json").write_text(json.dumps({"format": "mgbench-tokens", "version": 1, **broken}))
        with pytest.raises(MgbenchError, match="lacks a valid vocab or shards list"):
            dataset.read_index(tmp_path / "y")


def test_cache_generates_once_per_size(tmp_path):
    said = []
    a = dataset.cached(tmp_path, samples=10, seq_len=8, vocab=256, seed=0, progress=said.append)
    stamp = (a / "index.json").stat().st_mtime_ns
    b = dataset.cached(tmp_path, samples=10, seq_len=8, vocab=256, seed=0, progress=said.append)
    c = dataset.cached(tmp_path, samples=10, seq_len=8, vocab=256, seed=1, progress=said.append)
    assert a == b != c and (a / "index.json").stat().st_mtime_ns == stamp
    assert len(said) == 2 and "generating" in said[0]
    assert sum(dataset.sample_counts(dataset.read_index(a), 8)) >= 10


def test_prepare_configs_generates_or_checks_each_disk_dataset(tmp_path):
    disk = make_config(data="disk", seq_len=16, micro_batch=2, warmup_steps=1, measured_steps=4)
    random_cfg = make_config()
    out = dataset.prepare_configs([disk, random_cfg], tmp_path / "datasets")
    assert out[1] == random_cfg
    got = out[0]
    assert got.config_id == disk.config_id and got.data_path.startswith(str((tmp_path / "datasets").resolve()))
    index = dataset.read_index(got.data_path)
    assert index["vocab"] == disk.shape.vocab and sum(dataset.sample_counts(index, 16)) >= 5 * 2
    # a given dataset is checked, not regenerated
    dataset.generate(tmp_path / "wide", 1000, vocab=disk.shape.vocab + 1)
    dataset.generate(tmp_path / "short", 20, vocab=10)
    with pytest.raises(MgbenchError, match="embeds 256"):
        dataset.prepare_configs([make_config(data="disk", data_path=str(tmp_path / "wide"))], tmp_path)
    with pytest.raises(MgbenchError, match="fewer than one global batch"):
        dataset.prepare_configs([make_config(data="disk", seq_len=16, micro_batch=2,
                                             data_path=str(tmp_path / "short"))], tmp_path)
    with pytest.raises(MgbenchError, match="not found"):
        dataset.prepare_configs([make_config(data="disk", data_path=str(tmp_path / "typo"))], tmp_path)


def test_cli_make_json_and_bad_input_is_one_line_exit_2(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["data", "make", str(tmp_path / "d"), "--tokens", "2k", "--vocab", "256", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["tokens"] == 2000 and out["bytes"] > 4000 and out["shards"][0]["file"] == "shard-00000.npy"
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a").write_text("x")
    for args in (["--tokens", "1", "--vocab", "10"], ["--tokens", "100", "--vocab", "1"]):
        r = runner.invoke(main, ["data", "make", str(tmp_path / "e"), *args])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and "mgbench: error:" in r.output, r.output
    r = runner.invoke(main, ["data", "make", str(tmp_path / "junk"), "--tokens", "100", "--vocab", "10"])
    assert r.exit_code == 2 and "not an mgbench dataset" in r.output
    r = runner.invoke(main, ["data", "make", str(tmp_path / "e"), "--tokens", "lots", "--vocab", "10"])
    assert r.exit_code == 2 and "not a count" in r.output
    for count in ("inf", "nan", "1.5"):  # float() reads the first two: not counts, and no OverflowError traceback
        r = runner.invoke(main, ["data", "make", str(tmp_path / "e"), "--tokens", count, "--vocab", "10"])
        assert r.exit_code == 2 and "not a whole number" in r.output, r.output
    assert Count().convert("9007199254740993", None, None) == 9007199254740993  # exact, not rounded through float


def test_a_disk_config_without_a_warm_up_step_is_skipped_saying_why():
    # The loader's start-up (workers, first reads) belongs in a warm-up step, not the timed window.
    from mgbench.suite import expand, parse_suite

    configs = expand(parse_suite('[sweep]\ndata = "disk"\nwarmup_steps = [0, 1]\n'), "cpu", 4)
    why = {c.warmup_steps: c.skip_reason for c in configs}
    assert "needs warmup_steps >= 1" in why[0] and why[1] is None


def _partials(folder):
    return [p.name for p in folder.iterdir() if ".partial-" in p.name]


def test_a_dataset_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    """An audit filled a disk: `data make` wrote 71 GB without looking, and through a memory
    map a full disk killed it with SIGBUS, leaving the partial folder."""
    free = 100 << 20
    monkeypatch.setattr(dataset.shutil, "disk_usage", lambda p: type("Usage", (), {"free": free})())
    # 60 M uint16 tokens: 120 MB (0.11 GiB), more than 100 MiB free
    r = CliRunner().invoke(main, ["data", "make", str(tmp_path / "ds"), "--tokens", "60M", "--vocab", "256"])
    assert r.exit_code == 2 and "the dataset needs 0.11 GiB" in r.output and "GiB free" in r.output, r.output
    assert not (tmp_path / "ds").exists() and _partials(tmp_path) == []
    # One that fits is written.
    dataset.generate(tmp_path / "small", 1000, 256, 0, 500)
    assert dataset.read_index(tmp_path / "small")["tokens"] == 1000


def test_a_write_that_fails_midway_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real_open = open

    class Full:  # a file on a disk that fills after the header
        def __init__(self, path, mode):
            self.f, self.writes = real_open(path, mode), 0

        def write(self, b):
            self.writes += 1
            if self.writes > 2:
                raise OSError(28, "No space left on device")
            return self.f.write(b)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(dataset, "open", lambda path, mode="r": Full(path, mode) if "b" in mode else real_open(path, mode),
                        raising=False)
    monkeypatch.setattr(dataset, "CHUNK_TOKENS", 100)
    r = CliRunner().invoke(main, ["data", "make", str(tmp_path / "ds"), "--tokens", "10000", "--vocab", "256"])
    assert r.exit_code == 2 and "cannot write the dataset (No space left on device)" in r.output, r.output
    assert not (tmp_path / "ds").exists() and _partials(tmp_path) == []


def test_sigterm_while_writing_removes_the_partial_folder_and_still_ends_the_process(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys; from mgbench import dataset; "
            "dataset.generate(sys.argv[1], 3_000_000_000, 256, 0)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "big")])
    try:
        deadline = time.time() + 60
        while not _partials(tmp_path) and time.time() < deadline:
            time.sleep(0.05)
        assert _partials(tmp_path), "generation never started"
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == -signal.SIGTERM  # ended by the signal, as before
    finally:
        p.kill()
    assert _partials(tmp_path) == [] and not (tmp_path / "big").exists()


@pytest.mark.parametrize("damage, says", [
    (lambda f: f.write_bytes(f.read_bytes()[:1000]), "truncated?"),
    (lambda f: np.save(f, np.zeros(500, dtype=np.float32)), "holds float32 tokens where the index says uint16"),
    (lambda f: np.save(f, np.zeros(499, dtype=np.uint16)), "holds an array of shape (499,)"),
    (lambda f: f.write_bytes(b"not an array at all"), "not a readable .npy array"),
])
def test_a_damaged_shard_is_named_before_launch_and_data_make_says_so(tmp_path, damage, says):
    """Damaged shards went unseen until a rank read them (a raw mmap ValueError recorded as a
    config error), a float32 shard trained on token 0 as "ok", and `data make` called the
    damaged folder fine ("nothing written")."""
    ds = tmp_path / "ds"
    dataset.generate(ds, 1000, 256, 0, 500)
    damage(ds / "shard-00000.npy")
    with pytest.raises(MgbenchError, match="shard-00000.npy: .*regenerate the dataset"):
        dataset.read_index(ds)
    r = CliRunner().invoke(main, ["data", "make", str(ds), "--tokens", "1000", "--vocab", "256", "--shard-tokens", "500"])
    assert r.exit_code == 2 and says in r.output and "--force" in r.output, r.output
    r = CliRunner().invoke(main, ["data", "make", str(ds), "--tokens", "1000", "--vocab", "256", "--shard-tokens", "500",
                                  "--force"])
    assert r.exit_code == 0, r.output
    assert dataset.read_index(ds)["tokens"] == 1000
