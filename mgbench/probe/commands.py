"""Click command `probe` (thin: parsing and printing only)."""

from __future__ import annotations

import json

import click

from ..cli_options import DEVICE, JSON, RESULTS_DIR, options


@click.command()
@click.option("-o", "--output", default=None, metavar="PROFILE",
              help="Where to write the profile (default: RESULTS_DIR/profiles/<host>-<device>-<time>.json).")
@options(DEVICE)
@click.option("--dtype", "dtypes", default=None,
              help="Comma-separated GEMM/attention dtypes (default: float32 on CPU; bfloat16,float16,float32 on GPU).")
@click.option("--model", default=None,
              help="Preset whose layer GEMM shapes to time (default: the default suite's model on this device).")
@click.option("--layer-tokens", "tokens", type=click.IntRange(min=1), default=None,
              help="Tokens per micro-batch for those GEMM shapes (default: the default suite's).")
@click.option("--no-comm", is_flag=True, help="Skip the short collective run (its fit prices communication).")
@click.option("--max-ranks", type=click.IntRange(min=1), default=None, metavar="N",
              help="CPU: probe rank counts 1, 2, 4 ... up to N only (default: every count a CPU run may use). "
                   "A config with more ranks is priced from the largest probed count that ran at its thread count, "
                   "scaled by its share of the cores; where none did, it is not priced and the reason says so. "
                   "--max-ranks 1 is the quickest and prices single-rank configs.")
@options(RESULTS_DIR, JSON)
def probe(output, device, dtypes, model, tokens, no_comm, max_ranks, results_dir, as_json) -> None:  # type: ignore[no-untyped-def]
    """Measure this machine into a hardware profile for predict/plan/memory --hardware.

    \b
    Times the GEMMs of a transformer layer (per dtype; on CPU for a rank of a 1, 2, 4 ...
    rank run, in that many processes at once, since ranks share the cores), an
    elementwise pass (memory bandwidth), causal attention forward + backward, on CPU the
    per-op overhead, the step's non-matmul ops and each data-parallel strategy's
    framework cost per step (a tiny model, on one rank and at each probed rank count),
    copies on GPUs, and short all-reduce sweeps (alpha-beta fits; on CPU at each probed
    rank count above one). A minute or two on a 2-core VM.

    \b
    Examples:
      mgbench probe                                 # writes results/profiles/<host>-...json
      mgbench predict --hardware PROFILE --against RUN   # the model vs a measured run
    """
    from pathlib import Path

    from ..errors import MgbenchError
    from .profile import describe, write_profile
    from .run import default_path, probe as probe_fn

    if output:  # before minutes of measuring: the profile must have somewhere to go
        target = Path(output)
        if target.is_dir():
            raise MgbenchError(f"-o {output}: a folder; give the profile's file name, e.g. -o {target / 'box.json'}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            probe_file = target.with_name(f".{target.name}.probe")
            probe_file.write_text("")
            probe_file.unlink()
        except OSError as e:
            raise MgbenchError(f"-o {output}: cannot write there ({e.strerror or e}); give a writable place") from None
    prof = probe_fn(device=device, dtypes=dtypes.split(",") if dtypes else None, model=model, tokens=tokens,
                    comm=not no_comm, results_dir=results_dir, max_ranks=max_ranks,
                    progress=(lambda m: click.echo(m, err=True)))
    path = write_profile(prof, output or default_path(prof, results_dir))
    if as_json:
        click.echo(json.dumps({"path": str(path), **prof}, indent=2))
        return
    for line in describe(prof):
        click.echo(line)
    click.echo(f"profile: {path}")
