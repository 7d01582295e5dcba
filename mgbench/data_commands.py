"""Click group `data` (thin: parsing and printing; the work is in mgbench.dataset)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from . import dataset
from .errors import MgbenchError

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


class Count(click.ParamType):
    """A count such as 1000000, 1_000_000, 10M or 2.5G (decimal suffixes k, M, G)."""

    name = "N"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().replace("_", "").replace(",", "")
        scale = _SUFFIXES.get(text[-1:].lower(), 1)
        number = text[:-1] if scale != 1 else text
        try:
            # An integer exactly (a float would round counts above 2**53); 2.5G through float.
            n: float = int(number) * scale if number.lstrip("+-").isdigit() else float(number) * scale
        except ValueError:
            self.fail(f"{value!r} is not a count: give an integer, or one with k / M / G (e.g. 50M)", param, ctx)
        if not math.isfinite(n) or n != int(n):  # inf and nan are not counts (int() of them would raise)
            self.fail(f"{value!r} is not a whole number of tokens", param, ctx)
        return int(n)


@click.group()
def data() -> None:
    """Token datasets on disk for `data = "disk"` configs.

    \b
    A config with data = "disk" reads its tokens through a torch DataLoader instead of
    random tokens in memory, and records how long each step waited for data
    (data_wait_s) and whether that makes it input-bound. Without data_path, `mgbench run`
    generates the dataset it needs itself (RESULTS_DIR/datasets/); `data make` writes one
    of a size you choose, e.g. larger than memory, to point data_path at.
    """


@data.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--tokens", type=Count(), required=True, help="Tokens in the dataset (e.g. 1000000, 50M, 2G).")
@click.option("--vocab", type=Count(), required=True,
              help="Token ids are drawn uniformly from [0, VOCAB); at most the model's vocab (tiny: 256).")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same tokens.")
@click.option("--shard-tokens", type=Count(), default=dataset.DEFAULT_SHARD_TOKENS, show_default=True,
              help="Tokens per .npy shard file (a sample never crosses a shard).")
@click.option("--force", is_flag=True, help="Replace FOLDER when it holds another mgbench dataset (never a folder "
                                            "that is not one).")
@click.option("--json", "as_json", is_flag=True, help="Print the dataset's index as JSON.")
def make(folder: Path, tokens: int, vocab: int, seed: int, shard_tokens: int, force: bool, as_json: bool) -> None:
    """Write a seeded token dataset to FOLDER: memory-mapped .npy shards + index.json.

    \b
    Token ids are uniform random in [0, VOCAB), uint16 when VOCAB <= 65536 (else uint32),
    from numpy's default_rng seeded with (SEED, shard): the same arguments always give the
    same files. FOLDER must be new, empty, or hold this same dataset (then nothing is
    written); it is written beside FOLDER and renamed into place when complete.

    \b
    Examples:
      mgbench data make data/tok-50M --tokens 50M --vocab 256
      mgbench run smoke --set strategy=ddp --set nproc=2 --set data=disk \\
          --set data_path=data/tok-50M --set num_workers=[0,2]
      mgbench show            # data wait per step, input-bound configs flagged
    """
    reporter = _Progress(tokens) if tokens > dataset.CHUNK_TOKENS else None  # on stderr: --json stays clean
    try:
        index = dataset.generate(folder, tokens, vocab, seed, shard_tokens, progress=reporter, force=force)
    except OSError as e:  # a read-only place, a full disk: one line
        raise MgbenchError(f"{folder}: cannot write the dataset ({e.strerror or e}); give a writable folder") from None
    size = sum((folder / s["file"]).stat().st_size for s in index["shards"])
    if as_json:
        click.echo(json.dumps({"path": str(folder), "bytes": size, **index}, indent=2))
        return
    click.echo(f"{folder}: {index['tokens']:,} tokens in {len(index['shards'])} shard(s) of {index['dtype']}, "
               f"vocab {index['vocab']}, seed {index['seed']}, {size / 2**20:,.1f} MiB")
    click.echo(f"use it: --set data=disk --set data_path={folder}   (or in a suite: data = \"disk\", "
               f"data_path = \"{folder}\")")


class _Progress:
    """A line on stderr at every 10% of a large dataset written."""

    def __init__(self, total: int) -> None:
        self.total, self.shown = total, 0

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // total
        if pct >= self.shown + 10 or done == total:
            self.shown = pct - pct % 10
            click.echo(f"  {pct:3d}%  {done:,} / {total:,} tokens", err=True)
