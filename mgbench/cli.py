"""The `mgbench` command line: thin click wrappers over functions tests can call."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from .cli_options import (DEVICE, JSON, METRIC, MODEL, NPROC_PER_NODE, OVERRIDES, PRICES, RESULTS_DIR, RUN_ID,
                          cluster_options, deferred_command, options, plan_group, plan_options_from,
                          prefixed_flags)
from .collectives import DTYPES as COMM_DTYPES, NAMES as COLLECTIVE_NAMES
from .errors import MgbenchError
from .record import FAILED_STATUSES


# click >= 8.2 raises this for a group run without a command (it shows the help); older
# clicks print the help themselves.
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class Group(click.Group):
    """Turns MgbenchError into one line on stderr and exit status 2 (no traceback
    unless --debug); click's own usage errors (an unknown option, a value of the wrong
    type or range, a missing argument) likewise, as one line naming the --help to read."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        try:
            return super().main(*args, **{**kwargs, "standalone_mode": False})
        except NO_ARGS_IS_HELP as e:  # `mgbench` alone: the help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "mgbench"
            click.echo(f"mgbench: error: {e.format_message()} (see `{where} --help`)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"mgbench: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("mgbench: interrupted", err=True)
            sys.exit(130)

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


class RunCommand(click.Command):
    """`run`, whose --help names the built-in suites: listed when the help is shown, since
    the suite module loads numpy, which importing the CLI should not."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from .suite import builtin_suites

        if builtin_suites():  # none where installed without the source checkout's suites/
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(f"Built-in suites (SUITE by name): {', '.join(builtin_suites())}.")
        super().format_epilog(ctx, formatter)


@main.command(cls=RunCommand)
@click.argument("suite", required=False, default="default")
@options(RESULTS_DIR, RUN_ID, OVERRIDES, DEVICE)
@click.option("--timeout", type=click.IntRange(min=1), default=None, metavar="S",
              help="Seconds a config may run before it is stopped and recorded as timeout (suite key timeout_s).")
@click.option("--resume", default=None, metavar="RUN",
              help="Continue an interrupted or killed run (run id or folder): run only the configs it lacks.")
@click.option("--dry-run", is_flag=True, help="List the expanded configs and exit.")
@cluster_options
@options(NPROC_PER_NODE)
@click.option("--from-slurm", is_flag=True, help="Take --nnodes/--node-rank/--rdzv-endpoint from the Slurm allocation (SLURM_*).")
@click.option("--no-report", is_flag=True, help="Do not write the HTML report at the end.")
@click.option("--no-projection", is_flag=True,
              help="Do not close with the projection (catalog hardware, and the model checked against this "
                   "machine; the default suite probes the machine first when it has no profile).")
@click.option("--reports-dir", default="reports", show_default=True, help="Where the HTML report goes.")
@click.option("--strict", is_flag=True,
              help="Exit 1 when a config ends in error, oom or timeout, or computes a loss that differs from the "
                   "single-process reference (for CI). Without it such configs are recorded with their reason and "
                   "the sweep exits 0: a failed config is a result.")
@options(JSON)
def run(suite: str, results_dir: str, run_id: str | None, overrides: tuple[str, ...], device: str,
        timeout: int | None, resume: str | None, dry_run: bool, nnodes: int, node_rank: int,
        rdzv_endpoint: str | None, nproc_per_node: int | None, from_slurm: bool, no_report: bool,
        no_projection: bool, reports_dir: str, strict: bool, as_json: bool) -> None:
    """Run a benchmark SUITE (a .toml path or a name in suites/; default: default).

    Expands the suite's sweep into configs, runs them through torchrun (one job per
    world size), checks each strategy's loss against a single-process reference, and
    writes results/<run_id>/ with manifest.json, records.jsonl and raw samples.

    Exit status: 0 when the sweep finished (configs that failed are recorded, with
    --strict exit 1); 2 when nothing could run (every config skipped: their reasons are
    printed, no run folder is written); 130 when interrupted (resume with --resume).

    \b
    Examples:
      mgbench run                          # CPU sweep without GPUs, GPU sweep with them
      mgbench run smoke --set nproc=[2]
      mgbench run suites/gpu.toml --results-dir /shared/results --timeout 600
      mgbench run --resume 20261121-093012-smoke-1a2b   # after Ctrl-C or a crash
      # two nodes, same command on each (node-rank 0 and 1), results on a shared filesystem:
      mgbench run smoke --run-id exp1 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500
    """
    from . import store
    from . import suite as suite_mod
    from .launching import check_cluster_args, cpu_rank_limit, detect_devices
    from .runner.launch import WRITE_REFUSED, run_suite
    from .show import render

    if run_id is not None:  # before anything is written (a probe, a dataset): '../x' names no run folder
        store.check_run_id(run_id)
    check_cluster_args(nnodes, node_rank, rdzv_endpoint, nproc_per_node)
    kind, count = detect_devices()
    if device == "cpu":
        kind, count = "cpu", cpu_rank_limit()
    elif device == "cuda" and kind != "cuda":
        raise MgbenchError("--device cuda: no CUDA device is visible; use --device cpu")
    overrides = tuple(overrides) + ((f"timeout_s={timeout}",) if timeout is not None else ())
    cluster = None
    if from_slurm:
        from .cluster import slurm_cluster

        cluster = slurm_cluster(nproc_per_node or count, run_id or resume or "mgbench")
    elif nnodes > 1 or rdzv_endpoint:
        from .launching import Cluster

        if nnodes < 2 or not rdzv_endpoint:
            raise MgbenchError("a multi-node launch needs --nnodes N >= 2 and --rdzv-endpoint HOST[:PORT] (with --node-rank)")
        if not (run_id or resume):
            raise MgbenchError("a multi-node launch needs the same --run-id on every node (or --resume RUN)")
        cluster = Cluster(nnodes, node_rank, rdzv_endpoint, nproc_per_node or count, run_id or resume or "mgbench")
    if resume:
        if suite != "default" or overrides or run_id:
            raise MgbenchError("--resume continues a run as it was defined: give no SUITE, --set, --timeout or --run-id")
        resumed = store.read_manifest(store.resolve_run(resume, results_dir))
        if resumed.get("status") == "complete":  # not an error: the run asked for is there, whole (exit 0)
            if as_json:
                import json as _json

                click.echo(_json.dumps({"run_id": resumed["run_id"], "status": "complete", "resumed": False,
                                        "reason": "nothing to resume: the run is complete"}, indent=2))
            else:
                click.echo(f"nothing to resume: run {resumed['run_id']} is complete (`mgbench show {resumed['run_id']}`)")
            return
        # Two launchers in one run folder record every config twice and time each other's
        # load: a run whose mgbench process is alive on this host is refused (the first node
        # of a multi-node launch only: every node resumes the one run together).
        from .procs import process_alive

        if (resumed.get("status") == "running" and process_alive(resumed)
                and (cluster is None or cluster.node_rank == 0)):
            rid, pid = resumed["run_id"], resumed["pid"]
            raise MgbenchError(f"run {rid} is running (mgbench process {pid} on this host): wait for it "
                               f"(`mgbench status {rid}`), or stop it (kill -INT {pid}) and then resume")
        s = suite_mod.suite_from_manifest(resumed)
    else:
        s = suite_mod.load_suite(suite, kind)
    if overrides:
        suite_mod.apply_overrides(s, list(overrides))
    configs = suite_mod.expand(s, kind, count)
    # A dry run answers as the run would: a sweep with nothing runnable is an error in both.
    nothing_to_run = None
    if not resume and configs and all(c.skip_reason for c in configs):
        reasons = list(dict.fromkeys(c.skip_reason for c in configs))
        nothing_to_run = MgbenchError(
            f"nothing to run: every one of the {len(configs)} configs is skipped on {count} {kind} device(s) "
            f"({'; '.join(reasons[:3])}{'; ...' if len(reasons) > 3 else ''}); change the sweep (--set) and check "
            "it with --dry-run")
    # What a resume would leave alone (as the launcher decides it).
    recorded = store.recorded_configs(store.read_records(store.resolve_run(resume, results_dir))) \
        if resume and dry_run else {}
    if dry_run and as_json:
        import json as _json

        if nothing_to_run is not None:  # stdout stays empty rather than holding JSON for an error
            raise nothing_to_run
        click.echo(_json.dumps({"suite": s.name, "device_kind": kind, "num_devices": count, "configs": [
            {"config_id": c.config_id, "label": c.label, "skip_reason": c.skip_reason,
             **({"recorded": recorded.get(c.config_id)} if resume else {})} for c in configs]}, indent=2))
        return
    if dry_run:
        for c in configs:
            click.echo(f"{c.config_id}  {c.label}" + (f"  [skipped: {c.skip_reason}]" if c.skip_reason else "")
                       + (f"  [recorded: {recorded[c.config_id]}]" if c.config_id in recorded else ""))
        if nothing_to_run is not None:
            raise nothing_to_run
        runnable = [c for c in configs if c.skip_reason is None]
        click.echo(f"{len(configs)} configs, {len(runnable)} runnable on {count} {kind} device(s)"
                   + (f"; {sum(c.config_id in recorded for c in runnable)} of them recorded, so a resume runs "
                      f"{sum(c.config_id not in recorded for c in runnable)}" if resume else ""))
        return
    if nothing_to_run is not None:
        raise nothing_to_run
    if not no_report and Path(reports_dir).exists() and not Path(reports_dir).is_dir():  # found now, not after the sweep
        raise MgbenchError(f"--reports-dir {reports_dir} is a file: give a folder for the report, or --no-report")
    click.echo(f"suite {s.name} ({s.path}) on {count} {kind} device(s)", err=as_json)
    if s.name == "default" and not resume and not no_projection and cluster is None:
        _probe_once(kind, results_dir, lambda m: click.echo(m, err=as_json))
    run_dir = run_suite(s, results_dir=results_dir, run_id=run_id, device_kind=kind, num_devices=count,
                        progress=lambda m: click.echo(m, err=as_json), resume=resume, cluster=cluster)
    if cluster is not None and not cluster.leader:
        click.echo(f"node {cluster.node_rank} done; node 0 writes the results: {run_dir}", err=as_json)
        return
    proj = None
    if not no_projection:  # once, for the terminal and the report
        from .planner.projection import projection

        proj = projection(run_dir, results_dir)
    if as_json:
        click.echo(render(run_dir, "json"))
    else:
        click.echo("")
        click.echo(render(run_dir, "table"))
        if proj is not None:
            from .planner.projection import lines

            click.echo("")
            for line in lines(proj):
                click.echo(line)
        click.echo(f"\nresults: {run_dir}")
    if not no_report:
        from .report.html import build

        path = Path(reports_dir) / f"{run_dir.name}.html"
        try:
            path = build([run_dir], path, results_dir, projection=proj if proj is not None else False)
        except OSError as e:
            if e.errno not in WRITE_REFUSED:
                raise
            raise MgbenchError(f"{path}: {e.strerror.lower()} while writing the report; the run is complete in "
                               f"{run_dir}: free space (or make {reports_dir} writable) and write the report with "
                               f"`mgbench report {run_dir.name}`") from None
        click.echo(f"report: {path}", err=as_json)

    if store.read_manifest(run_dir)["status"] == "interrupted":
        sys.exit(130)
    recs = store.latest_records(store.read_records(run_dir))
    failed = [r for r in recs if r["status"] in FAILED_STATUSES]
    wrong = [r for r in recs if r["status"] == "ok" and r.get("correct") is False]
    if failed or wrong:
        kinds = [(s, sum(r["status"] == s for r in failed)) for s in FAILED_STATUSES] + [("wrong result", len(wrong))]
        counts = ", ".join(f"{n} {s}" for s, n in kinds if n)
        click.echo(f"{len(failed) + len(wrong)} config(s) failed ({counts}): their reasons are in the table and in "
                   f"{run_dir / 'records.jsonl'}" + ("" if strict else "; --strict makes that exit 1"), err=True)
        if strict:
            sys.exit(1)


def _probe_once(kind: str, results_dir: str, progress) -> None:  # type: ignore[no-untyped-def]
    """Probe this machine before the default run when no profile of it exists yet, so the
    run can close by checking the model's prediction against what it measured. Done
    first, so the run stays the newest folder; a failed probe costs only the check."""
    import socket

    from .store import profiles_dir

    if list(profiles_dir(results_dir).glob(f"{socket.gethostname()}-{kind}-*.json")):
        return
    from .probe.run import probe_in_child

    progress("probing this machine first (once; `mgbench probe` redoes it, --no-projection skips it)")
    try:
        # In a child process: probing in this one would leave a CUDA context and the
        # probe's cached memory on GPU 0 through the whole run (probe_in_child says why).
        path = probe_in_child(kind, results_dir, lambda m: progress(f"  probe: {m}"))
        progress(f"  profile: {path}")
    except MgbenchError as e:
        progress(f"  probe failed ({e}); the run goes on without the check against this machine")


@main.command()
@click.argument("run", required=False)
@options(RESULTS_DIR)
@click.option("--json", "as_json", is_flag=True, help="Full manifest and records as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Records as CSV (one row per config).")
def show(run: str | None, results_dir: str, as_json: bool, as_csv: bool) -> None:
    """Show a run's records (RUN: run id or folder; default: the newest run).

    \b
    Examples:
      mgbench show
      mgbench show 20261121-093012-smoke-1a2b --csv > smoke.csv
      mgbench show results/20261121-093012-smoke-1a2b --json | jq '.records[].mfu_pct'
    """
    from . import store
    from .show import render

    if as_json and as_csv:
        raise MgbenchError("--json and --csv are two formats of one output: give one of them")
    fmt = "json" if as_json else "csv" if as_csv else None
    run_dir = store.resolve_run(run, results_dir) if run else store.latest_run(results_dir)
    if store.read_manifest(run_dir).get("kind") == "comm":  # a `mgbench comm` sweep: its own table
        if fmt is not None:
            raise MgbenchError(f"{run_dir.name} is a `mgbench comm` run: --json and --csv show training records; its "
                               f"rows are in {run_dir / 'comm.jsonl'} (and `mgbench report {run_dir.name}`)")
        from .comm.run import render as render_comm

        click.echo(render_comm(run_dir))
        return
    click.echo(render(run_dir, fmt or "table"))


# Or plan here: `plan`'s own options under --plan-*, generated from the same PlanOptions
# fields, so the defaults (--plan-top, --plan-seq-len, ...) are plan's. Made on first use
# (deferred) because the planner's modules load numpy.
@deferred_command(lambda: [MODEL.prefixed("plan"), *plan_group(prefix="plan", required=False),
                           *(o.prefixed("plan") for o in PRICES)], group=main)
@click.argument("runs", nargs=-1, required=True)
@click.option("-o", "--output", default=None, help="HTML file (default: reports/<first run>.html).")
@options(RESULTS_DIR, METRIC)
@click.option("--plan", "plan_file", help="A plan saved with `mgbench plan --json > plan.json`, shown as a section.")
def report(runs: tuple[str, ...], output: str | None, results_dir: str, metric: str, plan_file: str | None,
           plan_model: str | None, plan_prices_file: str | None, plan_price_overrides: tuple[str, ...],
           **plan_kw: Any) -> None:
    """Write one self-contained HTML report for RUNS (ids or folders).

    Works offline: plotly.js is inlined once. With two runs it also compares them.

    \b
    Examples:
      mgbench report 20261121-093012-default-1a2b
      mgbench report BASE NEW -o reports/compare.html
      mgbench report RUN --plan-model llama3-70b --plan-tokens 1.5e13
      mgbench report RUN --plan-model llama3-8b --plan-tokens 1e12 --plan-spot --plan-price b200=5.5
    """
    import json as _json

    from click.core import ParameterSource

    from .report.compare import check_metric, compare_runs
    from .report.html import build

    check_metric(metric)  # as compare does, whether or not two runs make a comparison section
    # --plan-* options only act with --plan-model and --plan-tokens (and not beside a saved
    # --plan): refused rather than silently dropped.
    ctx = click.get_current_context()
    plan_given = [p.opts[0] for p in ctx.command.params if p.name and p.name.startswith("plan_")
                  and p.name != "plan_file" and ctx.get_parameter_source(p.name) is not ParameterSource.DEFAULT]
    if plan_file and plan_given:
        raise MgbenchError(f"give either --plan {plan_file} (a saved plan) or {', '.join(plan_given)} (a new plan), "
                           "not both")
    if plan_given and not (plan_model and plan_kw["plan_tokens"]):
        raise MgbenchError(f"{', '.join(plan_given)}: a plan section needs --plan-model and --plan-tokens, which go "
                           "together (e.g. --plan-model llama3-8b --plan-tokens 1e12)")
    from . import store

    paths = [store.resolve_run(r, results_dir) for r in runs]
    # The report's tables and figures tell runs apart by the id their manifest holds: two
    # folders with one id (a copied folder, or two results folders) would merge.
    ids = [store.read_manifest(p)["run_id"] if store.RunDir(p).manifest.is_file() else None for p in paths]
    if twice := sorted({i for i in ids if i is not None and ids.count(i) > 1}):
        folders = ", ".join(str(p) for p, i in zip(paths, ids) if i in twice)
        raise MgbenchError(f"{folders} hold the same run id ({', '.join(twice)}); a report tells runs apart by id: "
                           "report them apart, or give one a new id in its manifest.json")
    plan_data = None
    if plan_file:
        try:
            plan_data = _json.loads(Path(plan_file).read_text())
        except (OSError, ValueError) as e:
            raise MgbenchError(f"--plan {plan_file}: cannot read a plan JSON ({e})") from None
        missing = [k for k in ("ranked", "recommendation", "reasons", "assumptions")
                   if not isinstance(plan_data, dict) or k not in plan_data]
        if missing:
            raise MgbenchError(f"--plan {plan_file}: not a plan (no {', '.join(missing)}); save one with "
                               "`mgbench plan ... --json > plan.json`")
    elif plan_model or plan_kw["plan_tokens"]:
        from . import catalog
        from .planner.cost import Prices
        from .planner.search import plan as plan_fn

        try:
            plan_data = plan_fn(catalog.model_shape(plan_model), plan_options_from(plan_kw, prefix="plan"),
                                Prices(plan_prices_file, list(plan_price_overrides)))
        except MgbenchError as e:  # plan's words name plan's flags; here they are --plan-*
            raise MgbenchError(prefixed_flags(str(e), "plan", [MODEL, *plan_group(), *PRICES])) from None
    rows = None
    if len(paths) == 2:
        try:
            rows = compare_runs(str(paths[0]), str(paths[1]), results_dir, metric)
        except MgbenchError as e:  # different suites: a report of both, without a comparison
            click.echo(f"note: no comparison section: {e}", err=True)
    target = Path(output) if output else Path("reports") / f"{paths[0].name}.html"
    if target.is_dir():
        raise MgbenchError(f"-o {target}: a folder; give the page's file name, e.g. -o {target / (paths[0].name + '.html')}")
    try:
        out = build(paths, target, results_dir, plan_data, rows)
    except OSError as e:
        if not _writing_to(e, target):  # a run's file could not be read: not -o's fault
            raise MgbenchError(f"{e.filename}: cannot read it ({e.strerror or e})") from None
        raise MgbenchError(f"{target}: cannot write the report ({e.strerror or e}); give -o a writable place") from None
    click.echo(f"report: {out}")


def _writing_to(err: OSError, target: Path) -> bool:
    """Whether ``err`` came from writing the report at ``target`` (the page, its temporary
    file beside it, or a folder on its way) rather than from reading the runs."""
    if not err.filename:
        return True
    where = Path(str(err.filename)).resolve()
    folder = target.resolve().parent
    return where.parent == folder or where == folder or where in folder.parents


@main.command()
@click.argument("base")
@click.argument("new")
@options(RESULTS_DIR, METRIC)
@click.option("--threshold", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Smallest change (%) that counts, when also significant.")
@click.option("--fail-on", "gates", multiple=True, metavar="METRIC:-N%",
              help="Exit 1 if METRIC gets significantly worse by more than N%, e.g. tokens_per_s:-5%, or if a "
                   "config that measured it in BASE does not in NEW (oom, error, timeout, interrupted, or not run).")
@options(JSON)
def compare(base: str, new: str, results_dir: str, metric: str, threshold: float, gates: tuple[str, ...],
            as_json: bool) -> None:
    """Compare two runs of the same suite config by config.

    A change is flagged (better / worse) only when it is significant (Mann-Whitney U,
    p < 0.05) AND at least --threshold percent; otherwise `~`. A run of fewer than 5
    measured steps cannot be tested: p is `-` and the threshold alone decides. Peak memory and energy per
    token are one value per run: no test applies, the threshold alone decides. The test runs on the medians
    of the measured windows when each run has 5 or more (suite keys `rounds` x `repeats`),
    else on raw step times, whose p-values are optimistic because neighbouring steps share
    the machine's current speed. On a shared or noisy machine measure with `rounds = 5`:
    rounds are interleaved across configs, so a slow spell hits all of them alike.
    A config whose results were correct and now differ from the reference, or a negative
    control whose bug was caught and now is not, fails the comparison (exit 1) whatever
    the metric says.

    \b
    Examples:
      mgbench compare BASE_RUN NEW_RUN
      mgbench compare BASE_RUN NEW_RUN --fail-on tokens_per_s:-5%    # CI gate: exit 1 on a regression
    """
    import json as _json

    from tabulate import tabulate

    from .report.compare import compare_runs, gate_failures, parse_gate

    parsed = [parse_gate(g) for g in gates]
    rows = compare_runs(base, new, results_dir, metric, threshold)
    failures: list[str] = []
    for g in parsed:
        g_rows = rows if g.metric == metric else compare_runs(base, new, results_dir, g.metric, threshold)
        failures += gate_failures(g_rows, [g])
    # Wrong results are a regression whatever the speed and whatever the gates.
    wrong = [f"{r['label']}: {r['correct_change']}" for r in rows if r["correct_change"]]
    if as_json:
        click.echo(_json.dumps({"rows": rows, "gate_failures": failures, "correctness_regressions": wrong}, indent=2))
    else:
        def fmt(v, f):  # type: ignore[no-untyped-def]
            return "-" if v is None else format(v, f)

        click.echo(tabulate([[r["label"], fmt(r["base"], ",.4g"), fmt(r["new"], ",.4g"), fmt(r["change_pct"], "+.1f"),
                              fmt(r["p_value"], ".3g"), r["verdict"]] for r in rows],
                            headers=["config", f"base {metric}", f"new {metric}", "change %", "p", "verdict"]))
        bases = sorted({r["p_basis"] for r in rows if r.get("p_basis")})
        for b in bases:
            click.echo(f"p: {b}" if b.startswith("no test") else f"p from {b}")
        for f in failures:
            click.echo(f"GATE FAILED: {f}")
        for w in wrong:
            click.echo(f"CORRECTNESS REGRESSED: {w}")
    if failures or wrong:
        sys.exit(1)


@main.command()
@click.option("--nproc", type=int, default=None,
              help="Ranks (default: every GPU present; 2 CPU ranks without GPUs). One GPU measures copy "
                   "bandwidth only: collectives need 2 or more ranks.")
@options(DEVICE)
# The default is named in the help, not shown by click: a list without spaces would be
# wrapped mid-word.
@click.option("--collectives", default=",".join(COLLECTIVE_NAMES),
              help="Comma-separated collectives to measure (the registry in mgbench/collectives.py; default: all "
                   f"of {', '.join(COLLECTIVE_NAMES)}).")
@click.option("--dtype", "dtypes", default="float32", show_default=True, help=f"Comma-separated: {','.join(COMM_DTYPES)}.")
@click.option("--min-bytes", type=click.IntRange(min=1), default=None,
              help="Smallest message (default: 4 KiB on CPU, 8 KiB on GPU).")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              help="Largest message (default: 4 MiB on CPU, 1 GiB on GPU).")
@click.option("--factor", type=click.IntRange(min=2), default=None, help="Size step multiplier (default 4).")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Untimed iterations per size.")
@click.option("--iters", type=click.IntRange(min=1), default=None, help="Timed iterations per size.")
@click.option("--link", default=None, help="Catalog link to compare busbw with (default: the detected one).")
@options(RESULTS_DIR, RUN_ID)
@click.option("--timeout", type=click.IntRange(min=1), default=900, show_default=True,
              help="Seconds before the sweep is stopped.")
@cluster_options
@options(JSON)
def comm(nproc, device, collectives, dtypes, min_bytes, max_bytes, factor, warmup, iters, link, results_dir,
         run_id, timeout, nnodes, node_rank, rdzv_endpoint, as_json) -> None:  # type: ignore[no-untyped-def]
    """Measure collectives like nccl-tests: time, algbw, busbw, #wrong, alpha-beta fit;
    on GPUs also copy bandwidth (device to device, host to device and back, pinned and
    pageable).

    Also records the detected interconnect (NVLink, PCIe, InfiniBand, NCCL) in the run's
    manifest, and stores the sweep as a run that reports and the planner can load.

    \b
    Examples:
      mgbench comm --nproc 4                      # CPU: gloo over loopback
      mgbench comm --nproc 8 --dtype bfloat16     # 8 GPUs over NCCL
      mgbench comm --nproc 2 --collectives all_reduce --min-bytes 1048576 --link nvlink4
      # 2 nodes x 8 GPUs; also measures intra-node and inter-node groups apart:
      mgbench comm --nproc 8 --nnodes 2 --node-rank R --rdzv-endpoint node0:29500 --run-id c1
    """
    import json as _json

    from .comm.run import check_link, default_nproc, render, run_comm
    from .store import load_comm_fits, load_comm_rows
    from .launching import check_cluster_args, cpu_rank_limit, detect_devices

    # Checked before the sweep: a bad value would otherwise cost the whole measurement.
    check_cluster_args(nnodes, node_rank, rdzv_endpoint)
    if link is not None:
        check_link(link)
    kind, count = detect_devices()
    if device == "cpu" or (device == "auto" and kind == "cpu"):
        kind, count = "cpu", cpu_rank_limit()
    elif device == "cuda" and kind != "cuda":
        raise MgbenchError("--device cuda: no CUDA device is visible; use --device cpu")
    nproc = default_nproc(kind, count) if nproc is None else nproc
    if nproc < 1 or nproc > count:
        raise MgbenchError(f"--nproc {nproc}: this machine allows 1 to {count} {kind} rank(s)")
    cluster = None
    if nnodes > 1:
        from .launching import Cluster

        if not rdzv_endpoint or not run_id:
            raise MgbenchError("multi-node comm needs --rdzv-endpoint HOST[:PORT] and the same --run-id on every node")
        cluster = Cluster(nnodes, node_rank, rdzv_endpoint, nproc, run_id)
    run_dir = run_comm(nproc, kind, [c.strip() for c in collectives.split(",") if c.strip()],
                       [d.strip() for d in dtypes.split(",") if d.strip()], results_dir, run_id, timeout,
                       progress=lambda m: click.echo(m, err=as_json), cluster=cluster, min_bytes=min_bytes,
                       max_bytes=max_bytes, factor=factor, warmup=warmup, iters=iters)
    if cluster is not None and not cluster.leader:
        click.echo(f"node {node_rank} done; node 0 writes the results: {run_dir}")
        return
    if as_json:
        from . import store

        fits = load_comm_fits(run_dir)
        click.echo(_json.dumps({"run_dir": str(run_dir), "interconnect": store.read_manifest(run_dir)["interconnect"],
                                "rows": load_comm_rows(run_dir), "fits": fits}, indent=2))
    else:
        click.echo(render(run_dir, link))
        click.echo(f"\nresults: {run_dir}")


@main.command()
@click.argument("suite", required=False, default="default")
@click.option("--nodes", type=int, required=True, help="Nodes to allocate.")
@click.option("--gpus-per-node", type=int, required=True, help="GPUs per node (on CPU-only clusters: CPU ranks per node).")
@click.option("--partition", default=None)
@click.option("--time", "time_limit", default=None, help="Slurm time limit, e.g. 02:00:00.")
@click.option("--account", default=None)
@click.option("--cpus-per-gpu", type=int, default=None,
              help="Cores per rank; the job asks for this x --gpus-per-node per node (default: 4 per GPU, 1 per CPU rank).")
@click.option("--mem", default=None, help="Slurm memory per node, e.g. 256G (default for GPU jobs: 0 = all of it).")
@options(DEVICE, OVERRIDES, RESULTS_DIR, RUN_ID)
@click.option("--submit", is_flag=True, help="Submit with sbatch and print the job id.")
def slurm(suite: str, nodes: int, gpus_per_node: int, partition: str | None, time_limit: str | None,
          account: str | None, cpus_per_gpu: int | None, mem: str | None, device: str, overrides: tuple[str, ...],
          results_dir: str, run_id: str | None, submit: bool) -> None:
    """Write (and with --submit, submit) a Slurm batch job that runs SUITE on NODES nodes.

    The script runs one `mgbench run --from-slurm` per node through srun; torchrun starts
    the ranks and they meet at the first node. The run folder is created now, so
    `mgbench status RUN` can follow the job. --device auto means GPUs (the compute nodes',
    whatever this login node has); give --device cpu for a CPU-only cluster.

    \b
    Examples:
      mgbench slurm smoke --nodes 2 --gpus-per-node 8 --partition gpu --time 01:00:00 --submit
      mgbench status RUN
      # inside an allocation you already hold (salloc -N 2):
      srun --ntasks-per-node=1 mgbench run smoke --run-id exp1 --from-slurm --nproc-per-node 8
    """
    from . import store
    from . import suite as suite_mod
    from .cluster import sbatch_script, submit as submit_job
    from .runner.launch import create_run

    if nodes < 1 or gpus_per_node < 1:
        raise MgbenchError("--nodes and --gpus-per-node must be >= 1")
    if cpus_per_gpu is not None and cpus_per_gpu < 1:
        raise MgbenchError(f"--cpus-per-gpu {cpus_per_gpu}: give at least 1 core per rank")
    if mem is not None:
        from .cluster import check_mem

        check_mem(mem)
    if time_limit is not None:
        from .cluster import check_time

        check_time(time_limit)
    # The job runs on the compute nodes, not here: a login node without GPUs must not make
    # it a CPU job. "auto" asks for GPUs; a CPU-only cluster says --device cpu.
    kind = "cuda" if device == "auto" else device
    s = suite_mod.load_suite(suite, kind)
    if overrides:
        suite_mod.apply_overrides(s, list(overrides))
    run_dir, manifest = create_run(s, results_dir, run_id, kind, nodes * gpus_per_node, status="written")
    script = run_dir.sbatch
    script.write_text(sbatch_script(run_dir.path, s.name, nodes, gpus_per_node, kind, partition, time_limit, account,
                                    cpus_per_gpu=cpus_per_gpu, mem=mem))
    manifest["slurm"] = {"nodes": nodes, "gpus_per_node": gpus_per_node, "script": run_dir.relative(script),
                         "job_id": None}
    store.write_manifest(run_dir, manifest)  # "written": nothing is queued until sbatch says so
    if submit:
        try:
            manifest["slurm"]["job_id"] = submit_job(script)
        except MgbenchError as e:
            # The folder stays "written", as without --submit: its script can still be
            # submitted by hand (where sbatch runs, or once fixed). Said here, since it is
            # now the newest run for show/status and holds its run id.
            raise MgbenchError(f"{e}; nothing was queued: {run_dir} stays written (as without --submit): submit it "
                               f"with `sbatch {script}`, or remove it (rm -r {run_dir}) to reuse the run id") from None
        manifest["status"] = "submitted"
        store.write_manifest(run_dir, manifest)
    click.echo(f"run folder: {run_dir}\nbatch script: {script}\nranks: {kind}, {gpus_per_node} a node"
               + (" (--device auto asks the compute nodes for GPUs; --device cpu for a CPU-only cluster)"
                  if device == "auto" else ""))
    if submit:
        click.echo(f"submitted job {manifest['slurm']['job_id']}; follow it with: mgbench status {run_dir.name}")
    else:
        click.echo(f"submit with: sbatch {script}")


@main.command()
@click.argument("run", required=False)
@options(RESULTS_DIR, JSON)
def status(run: str | None, results_dir: str, as_json: bool) -> None:
    """The state of a run (RUN: run id or folder; default: the newest run): its Slurm
    job (squeue / sacct) and its records so far. A run whose manifest still says
    running but whose mgbench process on this host is gone reads "dead".

    \b
    Examples:
      mgbench status
      mgbench status 20261121-093012-smoke-1a2b
    """
    import json as _json
    from collections import Counter

    from . import store
    from .cluster import job_state
    from .procs import run_status as run_status_of

    run_dir = store.resolve_run(run, results_dir) if run else store.latest_run(results_dir)
    m = store.read_manifest(run_dir)
    job = (m.get("slurm") or {}).get("job_id")
    state, waits_for = job_state(job) if job else (None, None)
    recs = store.latest_records(store.read_records(run_dir))
    counts = Counter(r["status"] for r in recs)
    run_status, status_reason = run_status_of(m)
    running = []  # what the ranks are on now: the progress files the workers keep (runner/worker.mark_started)
    if run_status == "running":
        import time as _t

        done = {r["config_id"] for r in recs}
        for f in store.RunDir(run_dir).progress_files():
            cur = store.read_progress(f)
            if cur is not None and cur.get("config_id") not in done:
                running.append({"config_id": cur.get("config_id"), "seconds": round(_t.time() - cur["started"], 1),
                                "round": cur.get("round"), "rounds": cur.get("rounds")})
    out = {"run_id": m["run_id"], "status": run_status, "status_reason": status_reason, "slurm_job": job,
           "slurm_state": state, "slurm_reason": waits_for,
           "num_configs": m.get("num_configs"), "recorded": sum(counts.values()), "counts": dict(counts),
           "running": running}
    if as_json:
        click.echo(_json.dumps(out, indent=2))
        return
    click.echo(f"run {out['run_id']}: {out['status']}" + (f" ({status_reason})" if status_reason else "")
               + (f", Slurm job {job}: {state}" if job else "")
               + (f" (waiting for {waits_for}: `squeue -j {job} --start` estimates when it starts)" if waits_for else ""))
    if m.get("kind") == "comm":
        click.echo(f"a `mgbench comm` sweep: `mgbench show {out['run_id']}` prints its table")
        return
    click.echo(f"{out['recorded']} of {out['num_configs']} configs recorded: "
               + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none yet"))
    for r in running:
        click.echo(f"running now: {r['config_id']}, {r['seconds']:.0f} s so far"
                   + (f" (round {r['round']} of {r['rounds']})" if (r.get("rounds") or 1) > 1 else ""))


from .config import keys_help  # noqa: E402
from .commands.planning import memory, plan, predict  # noqa: E402
from .probe.commands import probe  # noqa: E402
from .data_commands import data  # noqa: E402

# The suite keys, generated from the config schema (mgbench/config.py), so --help
# cannot drift from what suites accept. \b keeps click from rewrapping the list.
run.epilog = "\b\nSuite keys (in a [sweep] table or with --set KEY=VALUE; default after '='):\n" + keys_help()

main.add_command(memory)
main.add_command(predict)
main.add_command(plan)
main.add_command(probe)
main.add_command(data)


if __name__ == "__main__":
    main()
