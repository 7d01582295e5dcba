"""The `mgbench` command line: thin click wrappers over functions tests can call."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import MgbenchError


class Group(click.Group):
    """Turns MgbenchError into one line on stderr and exit status 2 (no traceback
    unless --debug)."""

    def invoke(self, ctx: click.Context):  # type: ignore[no-untyped-def]
        try:
            return super().invoke(ctx)
        except MgbenchError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"mgbench: error: {e}", err=True)
            sys.exit(2)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(package_name="mgbench")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Benchmark and plan multi-GPU training.

    \b
    Examples:
      mgbench run                      # the default sweep, sized to this machine
      mgbench run smoke                # suites/smoke.toml: seconds, on CPU
      mgbench run my.toml --set nproc=[2,4] --set precision=bf16
      mgbench show                     # the newest run as a table
    """
    ctx.obj = {"debug": debug}


@main.command()
@click.argument("suite", required=False, default="default")
@click.option("--results-dir", default="results", show_default=True, help="Where run folders go.")
@click.option("--run-id", default=None, help="Name of the run folder (default: time + suite name).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a sweep key, TOML value: --set nproc=[1,2] --set strategy=fsdp.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Run on CPU ranks (gloo) or CUDA devices (NCCL).")
@click.option("--timeout", type=int, default=None, metavar="S",
              help="Seconds a config may run before it is stopped and recorded as timeout (suite key timeout_s).")
@click.option("--resume", default=None, metavar="RUN",
              help="Continue an interrupted or killed run (run id or folder): run only the configs it lacks.")
@click.option("--dry-run", is_flag=True, help="List the expanded configs and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON at the end.")
def run(suite: str, results_dir: str, run_id: str | None, overrides: tuple[str, ...], device: str,
        timeout: int | None, resume: str | None, dry_run: bool, as_json: bool) -> None:
    """Run a benchmark SUITE (a .toml path or a name in suites/; default: default).

    Expands the suite's sweep into configs, runs them through torchrun (one job per
    world size), checks each strategy's loss against a single-process reference, and
    writes results/<run_id>/ with manifest.json, records.jsonl and raw samples.

    \b
    Examples:
      mgbench run                          # CPU sweep without GPUs, GPU sweep with them
      mgbench run smoke --set nproc=[2]
      mgbench run suites/gpu.toml --results-dir /shared/results --timeout 600
      mgbench run --resume 20261121-093012-smoke-1a2b   # after Ctrl-C or a crash
    """
    from . import suite as suite_mod
    from .runner.launch import cpu_rank_limit, detect_devices, run_suite
    from .show import render

    kind, count = detect_devices()
    if device == "cpu":
        kind, count = "cpu", cpu_rank_limit()
    elif device == "cuda" and kind != "cuda":
        raise MgbenchError("--device cuda: no CUDA device is visible; use --device cpu")
    overrides = tuple(overrides) + ((f"timeout_s={timeout}",) if timeout is not None else ())
    if resume:
        from . import store

        if suite != "default" or overrides or run_id:
            raise MgbenchError("--resume continues a run as it was defined: give no SUITE, --set, --timeout or --run-id")
        s = suite_mod.suite_from_manifest(store.read_manifest(store.resolve_run(resume, results_dir)), kind)
    else:
        s = suite_mod.load_suite(suite, kind)
    if overrides:
        suite_mod.apply_overrides(s, list(overrides))
    if dry_run:
        configs = suite_mod.expand(s, kind, count)
        for c in configs:
            click.echo(f"{c.config_id}  {c.label}" + (f"  [skipped: {c.skip_reason}]" if c.skip_reason else ""))
        click.echo(f"{len(configs)} configs, {sum(c.skip_reason is None for c in configs)} runnable on {count} {kind} device(s)")
        return
    click.echo(f"suite {s.name} ({s.path}) on {count} {kind} device(s)", err=as_json)
    run_dir = run_suite(s, results_dir=results_dir, run_id=run_id, device_kind=kind, num_devices=count,
                        progress=lambda m: click.echo(m, err=as_json), resume=resume)
    if as_json:
        click.echo(render(run_dir, "json"))
    else:
        click.echo("")
        click.echo(render(run_dir, "table"))
        click.echo(f"\nresults: {run_dir}")
    from . import store

    if store.read_manifest(run_dir)["status"] == "interrupted":
        sys.exit(130)


@main.command()
@click.argument("run", required=False)
@click.option("--results-dir", default="results", show_default=True)
@click.option("--json", "fmt", flag_value="json", help="Full manifest and records as JSON.")
@click.option("--csv", "fmt", flag_value="csv", help="Records as CSV (one row per config).")
def show(run: str | None, results_dir: str, fmt: str | None) -> None:
    """Show a run's records (RUN: run id or folder; default: the newest run).

    \b
    Examples:
      mgbench show
      mgbench show 20261121-093012-smoke-1a2b --csv > smoke.csv
      mgbench show results/20261121-093012-smoke-1a2b --json | jq '.records[].mfu_pct'
    """
    from . import store
    from .show import render

    run_dir = store.resolve_run(run, results_dir) if run else store.latest_run(results_dir)
    click.echo(render(run_dir, fmt or "table"))


from .planner.commands import memory, plan, predict  # noqa: E402

main.add_command(memory)
main.add_command(predict)
main.add_command(plan)


if __name__ == "__main__":
    main()
