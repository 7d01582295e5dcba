"""Token datasets on disk: a seeded generator, the index that describes one, and the
cache of generated datasets in the results store. Torch-free (numpy, imported only
to generate), so the launcher prepares datasets before any rank starts.

A dataset is a folder:

    index.json            {"format": "mgbench-tokens", "version", "vocab", "dtype", "tokens",
                           "shard_tokens", "seed", "shards": [{"file", "tokens"}], "generator"}
    shard-00000.npy ...   1-D arrays of token ids (uint16 when the vocabulary fits, else
                          uint32), read memory-mapped (numpy.load(mmap_mode="r"))

An index may also carry ``test_read_delay_s`` (:data:`TEST_READ_DELAY`): seconds the reader
sleeps per sample. Only tests write it, to make a config input-bound on purpose; a
record read from such a dataset says so in its data_method. Nothing else sets it.

index.json is written last, so a folder without it is not (yet) a dataset. A dataset is
generated in a sibling temporary folder and renamed into place, so an interrupted
generation leaves nothing half-written under the name asked for.

Samples: the training side (mgbench.runner.data_loading) reads sample ``i`` as
``seq_len + 1`` consecutive tokens of one shard, consecutive samples overlapping by one
token (the next-token target of a sample's last position is the next sample's first
input), never across a shard boundary: :func:`sample_counts` says how many each shard holds.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .errors import MgbenchError
from .procs import sigterm_raises

if TYPE_CHECKING:
    from .config import RunConfig

FORMAT = "mgbench-tokens"
VERSION = 1
INDEX = "index.json"
TEST_READ_DELAY = "test_read_delay_s"
# 16 Mi tokens (32 MiB at uint16) per shard: big enough that a shard boundary is rare
# within a step, small enough that one shard's file is quick to write and to page in.
DEFAULT_SHARD_TOKENS = 1 << 24
# Tokens drawn per call to the generator. Fixed, so that a seed gives the same tokens
# whatever the dataset's size (numpy's bounded-integer draws depend on how a stream is
# split into calls); also bounds the memory a large shard needs while it is written.
CHUNK_TOKENS = 1 << 22

Progress = Callable[[int, int], None]  # (tokens written, tokens in all)


def token_dtype(vocab: int) -> str:
    """The smallest unsigned type that holds every token id below ``vocab``."""
    return "uint16" if vocab <= 1 << 16 else "uint32"


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.npy"


def _check_sizes(tokens: int, vocab: int, shard_tokens: int, seed: int) -> None:
    if tokens < 2:
        raise MgbenchError(f"--tokens must be at least 2 (one input and its target), got {tokens}")
    if vocab < 2 or vocab > 1 << 32:
        raise MgbenchError(f"--vocab must be between 2 and 2**32, got {vocab}")
    if shard_tokens < 2:
        raise MgbenchError(f"--shard-tokens must be at least 2, got {shard_tokens}")
    if seed < 0:
        raise MgbenchError(f"--seed must be >= 0, got {seed}")


def describe_index(tokens: int, vocab: int, seed: int, shard_tokens: int) -> dict[str, Any]:
    """The index a dataset of these parameters has (what :func:`generate` writes)."""
    _check_sizes(tokens, vocab, shard_tokens, seed)
    sizes = [shard_tokens] * (tokens // shard_tokens) + ([tokens % shard_tokens] if tokens % shard_tokens else [])
    return {
        "format": FORMAT, "version": VERSION, "vocab": vocab, "dtype": token_dtype(vocab), "tokens": tokens,
        "shard_tokens": shard_tokens, "seed": seed,
        "shards": [{"file": shard_name(i), "tokens": n} for i, n in enumerate(sizes)],
        "generator": f"uniform token ids in [0, vocab): numpy.random.default_rng([seed, shard]).integers, "
                     f"{CHUNK_TOKENS} tokens per call",
    }


def read_index(path: str | Path) -> dict[str, Any]:
    """The index of the dataset in folder ``path``; MgbenchError naming the problem when
    the folder is not a complete dataset of this format."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise MgbenchError(f"{folder} is a file, not a dataset folder: give the folder `mgbench data make` wrote")
    if not folder.is_dir():
        raise MgbenchError(f"dataset folder {folder} not found: make one with `mgbench data make {folder} "
                           "--tokens N --vocab V`, or leave data_path out to have mgbench generate one")
    try:
        index = json.loads((folder / INDEX).read_text())
    except FileNotFoundError:
        raise MgbenchError(f"{folder} is not an mgbench token dataset (no {INDEX}); make one with "
                           f"`mgbench data make DIR --tokens N --vocab V`") from None
    except (OSError, ValueError) as e:
        raise MgbenchError(f"{folder / INDEX} cannot be read ({e}); regenerate the dataset") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise MgbenchError(f"{folder / INDEX} is not an mgbench token dataset index (format != {FORMAT!r})")
    if index.get("version") != VERSION:
        raise MgbenchError(f"{folder}: dataset format version {index.get('version')}, this mgbench reads "
                           f"{VERSION}; regenerate it with `mgbench data make`")
    # A hand-edited or truncated index: one line naming the field, not a KeyError later.
    shards = index.get("shards")
    fields_ok = isinstance(index.get("vocab"), int) and isinstance(shards, list) and shards and all(
        isinstance(s, dict) and isinstance(s.get("file"), str) and isinstance(s.get("tokens"), int) for s in shards)
    if not fields_ok:
        raise MgbenchError(f"{folder / INDEX} lacks a valid vocab or shards list ([{{\"file\", \"tokens\"}}, ...]); "
                           "regenerate the dataset with `mgbench data make`")
    for shard in shards:
        if not (folder / shard["file"]).is_file():
            raise MgbenchError(f"{folder}: shard {shard['file']} listed in {INDEX} is missing; regenerate the dataset")
        if (problem := _shard_problem(folder / shard["file"], shard["tokens"], index.get("dtype"))) is not None:
            raise MgbenchError(f"{folder / shard['file']}: {problem}, not what {INDEX} says; regenerate the dataset "
                               "(`mgbench data make ... --force`)")
    return index


def _shard_problem(path: Path, tokens: int, dtype: Any) -> str | None:
    """What is wrong with a shard file against its index entry (its .npy header's dtype and
    length, and the file's size: a truncated or replaced file), or None. Token values are
    not read: that would page in the whole dataset."""
    import numpy as np

    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            reader = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if reader is None:
                return f"a .npy file of format {version}, which this mgbench does not read"
            shape, fortran, have = reader(f)
            data_at = f.tell()
    except (OSError, ValueError) as e:
        return f"not a readable .npy array ({e})"
    if dtype is not None and have != np.dtype(dtype):
        return f"holds {have} tokens where the index says {dtype}"
    if fortran or shape != (tokens,):
        return f"holds an array of shape {shape} where the index says ({tokens},)"
    size = path.stat().st_size
    if size != data_at + tokens * have.itemsize:
        return f"is {size:,} bytes where {tokens:,} tokens take {data_at + tokens * have.itemsize:,} (truncated?)"
    return None


def sample_counts(index: dict[str, Any], seq_len: int) -> list[int]:
    """Samples of ``seq_len + 1`` tokens each shard holds (stride ``seq_len``, within the shard)."""
    return [max(0, (s["tokens"] - 1) // seq_len) for s in index["shards"]]


def tokens_for_samples(samples: int, seq_len: int, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> int:
    """The fewest tokens a dataset of ``shard_tokens``-token shards needs to hold
    ``samples`` samples of ``seq_len + 1`` tokens (see :func:`sample_counts`)."""
    if shard_tokens < seq_len + 1:
        raise MgbenchError(f"shards of {shard_tokens} tokens cannot hold one sample of seq_len + 1 = {seq_len + 1}")
    per_shard = (shard_tokens - 1) // seq_len
    full, rest = divmod(max(samples, 1), per_shard)
    if rest == 0:  # the last shard need only hold its samples, not be full
        full, rest = full - 1, per_shard
    return full * shard_tokens + rest * seq_len + 1


def is_dataset(path: str | Path) -> bool:
    return (Path(path) / INDEX).is_file()


def generate(path: str | Path, tokens: int, vocab: int, seed: int = 0, shard_tokens: int = DEFAULT_SHARD_TOKENS,
             progress: Progress | None = None, force: bool = False) -> dict[str, Any]:
    """Write a seeded token dataset to folder ``path``; returns its index.

    The same (tokens, vocab, seed, shard_tokens) always give the same files. An existing
    folder is accepted when empty, returned as is when it already holds this very
    dataset, and otherwise refused (``force`` replaces an existing *dataset*, never a
    folder that is not one)."""
    import numpy as np  # here, not at the top: `mgbench` commands that never generate need not load it

    want = describe_index(tokens, vocab, seed, shard_tokens)
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise MgbenchError(f"{folder} exists and is not a folder; choose another path")
        if is_dataset(folder):
            try:
                have = read_index(folder)
            except MgbenchError as e:  # a damaged dataset: written again only with force
                if not force:
                    raise MgbenchError(f"{e}; `mgbench data make` rewrites it with --force") from None
                have = None
            if have == want:
                return have
            if not force:
                keys = ("tokens", "vocab", "seed", "shard_tokens")
                diff = ", ".join(f"{k} {have.get(k)} (asked {want[k]})" for k in keys if have.get(k) != want[k]) \
                    or "other settings in its index"
                raise MgbenchError(f"{folder} holds another dataset ({diff}); choose another folder or pass --force "
                                   "to replace it")
        elif any(folder.iterdir()):
            raise MgbenchError(f"{folder} exists and is not an mgbench dataset (no {INDEX}); refusing to write into "
                               "it: choose a new or empty folder")
    if (blocking := next((a for a in folder.parents if a.exists()), None)) is not None and not blocking.is_dir():
        raise MgbenchError(f"{folder}: {blocking} is a file, not a folder; choose another path")
    folder.parent.mkdir(parents=True, exist_ok=True)
    _check_room(folder, tokens * np.dtype(want["dtype"]).itemsize)
    tmp = folder.parent / f".{folder.name}.partial-{secrets.token_hex(4)}"
    tmp.mkdir()  # (not mkdtemp: its 0700 would make the dataset private to its writer)
    try:
        with sigterm_raises(_Terminated):  # the partial folder is removed below, then the signal acts
            done = 0
            for i, shard in enumerate(want["shards"]):
                rng = np.random.default_rng([seed, i])
                # Plain writes, not a memory map: a full disk is then an OSError (one line),
                # where writing through a map kills the process with SIGBUS.
                with open(tmp / shard["file"], "wb") as out:
                    np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(
                        np.dtype(want["dtype"])), "fortran_order": False, "shape": (shard["tokens"],)})
                    for lo in range(0, shard["tokens"], CHUNK_TOKENS):
                        hi = min(lo + CHUNK_TOKENS, shard["tokens"])
                        out.write(rng.integers(0, vocab, size=hi - lo, dtype=want["dtype"]).tobytes())
                        done += hi - lo
                        if progress is not None:
                            progress(done, tokens)
            (tmp / INDEX).write_text(json.dumps(want, indent=2) + "\n")
            if folder.exists():  # empty, or a dataset being replaced with force
                shutil.rmtree(folder)
            os.replace(tmp, folder)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, _Terminated):  # the partial folder is gone: now act on the signal as before
            import signal

            signal.raise_signal(signal.SIGTERM)
        raise
    return want


# Room kept free beyond a dataset's own bytes: the file system's own blocks, and whatever
# else writes there meanwhile.
SPARE_BYTES = 64 << 20


def _check_room(folder: Path, nbytes: int) -> None:
    """MgbenchError where the file system ``folder`` goes on has less free space than a
    dataset of ``nbytes`` bytes needs (:data:`SPARE_BYTES` more), before anything is written."""
    free = shutil.disk_usage(folder.parent).free
    if nbytes + SPARE_BYTES > free:
        raise MgbenchError(f"{folder}: the dataset needs {nbytes / 2**30:.2f} GiB and {folder.parent.resolve()} has "
                           f"{free / 2**30:.2f} GiB free; free some space, write it elsewhere, or ask for fewer tokens")


class _Terminated(BaseException):
    """SIGTERM, raised as an exception while a dataset is written (so that its partial folder
    is removed) and delivered again once it is."""


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (a file beside the dataset): nodes or launches that
    share a results folder generate a cached dataset once, the others wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached(datasets_dir: str | Path, samples: int, seq_len: int, vocab: int, seed: int,
           progress: Callable[[str], None] | None = None) -> Path:
    """A generated dataset with at least ``samples`` samples of ``seq_len + 1`` tokens,
    in ``datasets_dir``: made once per (seed, vocab, size), then reused."""
    tokens = tokens_for_samples(samples, seq_len)
    folder = Path(datasets_dir) / f"tokens-v{vocab}-n{tokens}-seed{seed}"
    with _locked(folder.with_name(folder.name + ".lock")):
        if is_dataset(folder):
            read_index(folder)  # complete and readable
            return folder
        if progress is not None:
            progress(f"generating a {tokens:,}-token dataset (vocab {vocab}, seed {seed}) in {folder}")
        generate(folder, tokens, vocab, seed)
    return folder


def prepare_configs(configs: "list[RunConfig]", datasets_dir: str | Path,
                    progress: Callable[[str], None] | None = None) -> "list[RunConfig]":
    """The configs with every data = "disk" one's dataset in place, before any rank starts.

    A config that names a dataset (data_path) has it checked (a complete dataset, token
    ids the model can embed, at least one global batch); one that does not gets a
    generated dataset of the size its warm-up and measured steps read, from the cache
    (:func:`cached`). Either way its data_path becomes the absolute folder, so the ranks
    find it and the record says what was read. Bad input raises MgbenchError before the
    run starts."""
    from dataclasses import replace

    out = []
    for cfg in configs:
        if cfg.data != "disk" or cfg.skip_reason is not None:
            out.append(cfg)
            continue
        steps = cfg.warmup_steps + cfg.repeats * cfg.measured_steps
        if cfg.data_path:
            folder = Path(cfg.data_path).expanduser().resolve()
            index = read_index(folder)
            samples = sum(sample_counts(index, cfg.seq_len))
            if index["vocab"] > cfg.shape.vocab:
                raise MgbenchError(f"data_path {cfg.data_path}: token ids up to {index['vocab'] - 1}, but the model "
                                   f"({cfg.model_name}) embeds {cfg.shape.vocab}; make the dataset with --vocab "
                                   f"{cfg.shape.vocab} or less")
            if samples < cfg.global_batch:
                raise MgbenchError(f"data_path {cfg.data_path}: {samples} samples of seq_len + 1 = {cfg.seq_len + 1} "
                                   f"tokens, fewer than one global batch ({cfg.global_batch}); make a bigger dataset")
        else:
            folder = cached(datasets_dir, steps * cfg.global_batch, cfg.seq_len, cfg.shape.vocab, cfg.seed,
                            progress).resolve()
        out.append(replace(cfg, data_path=str(folder)))
    return out
