"""Click commands `memory`, `predict` and `plan` (thin: parsing and printing only)."""

from __future__ import annotations

import json
from typing import Any

import click

from .. import catalog
from ..cli_options import (CALIBRATION_GROUP, DIM_NAMES, GPU, JSON, MODEL, MODEL_GROUP, PRICES, SYSTEM,
                           deferred_command, layout_group, overlap_option, plan_group, plan_options_from)
from ..errors import MgbenchError
from ..model_shape import ModelShape

GIB = 2**30


def resolve_shape(model: str | None, params: float | None, dims: dict[str, Any]) -> ModelShape | None:
    given = {k: v for k, v in dims.items() if v is not None}
    if sum(x is not None and x != {} for x in (model, params, given or None)) != 1:
        raise MgbenchError("give exactly one of --model NAME, --params N, or --layers/--hidden/--heads/--ffn-hidden/--vocab")
    if model:
        return catalog.model_shape(model)
    if params is not None:
        if params <= 0:
            raise MgbenchError("--params must be positive")
        return None
    return ModelShape.from_dict({"name": "custom", **given})


def _layout(kw: dict[str, Any]):
    from .predict import Layout

    return Layout(num_gpus=kw["num_gpus"], tp=kw["tp"], pp=kw["pp"], zero=kw["zero"], micro_batch=kw["micro_batch"],
                  seq_len=kw["seq_len"], global_batch=kw["global_batch"], precision=kw["precision"],
                  recompute=kw["recompute"], sequence_parallel=kw["sequence_parallel"],
                  flash_attention=not kw["no_flash_attention"], schedule=kw["schedule"],
                  virtual_stages=kw["virtual_stages"])


def _dims(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: kw.pop(k) for k in DIM_NAMES}


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


# Options are made on first use (deferred): the layout's come from the planner's modules,
# which load numpy, and importing the CLI should not.
@deferred_command(lambda: [*MODEL_GROUP, *layout_group(), JSON])
def memory(model, params, as_json, **kw) -> None:  # type: ignore[no-untyped-def]
    """Memory per GPU: model states per ZeRO stage, activations, allowance.

    \b
    Examples:
      mgbench memory --params 7.5e9 --num-gpus 64 --zero 3     # ZeRO paper: 1.9 GB
      mgbench memory --model llama3-8b --seq-len 8192 --tp 2 --sequence-parallel --recompute selective
    """
    from .predict import memory as memory_fn

    shape = resolve_shape(model, params, _dims(kw))
    res = memory_fn(shape, _layout(kw), params=params)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes", "activations_bytes",
              "allowance_bytes", "total_bytes"):
        click.echo(f"{k.replace('_bytes', ''):<14} {_gb(res[k]):>14}  ({res[k] / GIB:,.2f} GiB)")
    if shape is None:
        click.echo("(model states only: give --model or dims for activations)")


@deferred_command(lambda: [*MODEL_GROUP, *layout_group(), SYSTEM, GPU, overlap_option(),
                           *CALIBRATION_GROUP, JSON])
def predict(model, params, as_json, system, gpu, overlap, calibrate_run, comm_run, results_dir, **kw) -> None:  # type: ignore[no-untyped-def]
    """Predict step time, tokens/s, MFU and memory of one layout.

    \b
    Examples:
      mgbench predict --model llama3-8b --system dgx-h100 --num-gpus 8 --zero 3 --micro-batch 2 --seq-len 8192
      mgbench predict --model gpt3-175b --gpu a100-sxm-80gb --num-gpus 1024 --tp 8 --pp 8 --global-batch 1536 --recompute full
      mgbench predict --calibrate RUN      # fit to a measured run; residuals and leave-one-out errors
    """
    from . import calibrate, hardware, perf
    from .predict import predict as predict_fn

    dims = _dims(kw)
    over: dict[str, Any] = {}
    if calibrate_run:
        fit = calibrate.fit_run(calibrate_run, results_dir)
        if system is None and gpu is None:
            # No target hardware: report the fit on the run's own machine.
            _print_calibration(fit, as_json)
            return
        over = calibrate.hardware_overrides(fit)
        if gpu is None and system is None:
            gpu = over["gpu"]
    shape = resolve_shape(model, params, dims)
    if shape is None:
        raise MgbenchError("predict needs the model's shape: --model NAME or explicit dims, not --params")
    hw = hardware.resolve(system=system, gpu=gpu, precision=kw["precision"], **over.get("hardware", {}))
    if comm_run:
        import dataclasses

        links = calibrate.comm_links(comm_run, results_dir)
        if links["gpu"] != hw.gpu:
            raise MgbenchError(f"--comm {comm_run} measured {links['gpu']}, but the prediction is for {hw.gpu}")
        hw = dataclasses.replace(hw, **links["fields"])
    res = predict_fn(shape, hw, _layout(kw), overlap=overlap if overlap is not None else over.get("overlap", perf.DEFAULT_OVERLAP))
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    b = res["breakdown"]
    click.echo(f"{shape.name} on {kw['num_gpus']}x {hw.gpu} ({hw.system}), tp={kw['tp']} pp={kw['pp']} "
               f"zero={kw['zero']} mb={kw['micro_batch']} gb={res['global_batch']} s={kw['seq_len']}")
    click.echo(f"step time      {res['step_time_s']:.3f} s  (compute {b['compute_s']:.3f}, bubble {b['bubble_s']:.3f}, "
               f"exposed comm {b['exposed_comm_s']:.3f})")
    click.echo(f"throughput     {res['tokens_per_s']:,.0f} tokens/s, {res['tokens_per_s_per_gpu']:,.0f} per GPU")
    click.echo(f"per GPU        {res['model_tflops_per_gpu']:.1f} model TFLOP/s, MFU {100 * res['mfu']:.1f}%")
    click.echo(f"memory         {_gb(res['memory']['total_bytes'])} of {_gb(res['device_memory_bytes'])}: "
               f"{'fits' if res['fits'] else 'DOES NOT FIT'}")


def _print_calibration(fit: dict[str, Any], as_json: bool) -> None:
    from tabulate import tabulate

    if as_json:
        click.echo(json.dumps(fit, indent=2))
        return
    flops = fit["achieved_flops_per_s"]
    click.echo(f"calibration on {fit['device_name']} from {fit['num_configs']} measured configs")
    click.echo(f"  achieved compute   {flops / 1e12:.3f} TFLOP/s ({fit['flops_scope']})" if flops else "  achieved compute   -")
    if fit["compute_eff"] is not None:
        click.echo(f"  compute efficiency {100 * fit['compute_eff']:.1f}% of peak")
    bw = fit["comm_bytes_per_s"]
    click.echo(f"  collective bandwidth {bw / 1e9:.2f} GB/s" if bw else "  collective bandwidth: not resolvable (bytes cost nothing measurable next to per-call costs)")
    click.echo(f"  latency per ring step {fit['alpha_s_per_step'] * 1e3:.3f} ms, per collective call "
               f"{fit['seconds_per_collective_call'] * 1e3:.3f} ms, overlap {fit['overlap']:.1f}")
    click.echo(tabulate([[r["label"], f"{r['measured_s']:.4f}", f"{r['fitted_s']:.4f}", f"{r['residual_pct']:+.1f}%",
                          *((f"{r['loo_predicted_s']:.4f}", f"{r['loo_error_pct']:+.1f}%")
                            if r["loo_predicted_s"] is not None else ("-", "-"))] for r in fit["rows"]],
                        headers=["config", "measured s", "fitted s", "residual", "leave-one-out s", "LOO error"]))
    loo = fit["loo_mean_abs_error_pct"]
    click.echo(f"mean |residual| {fit['fit_mean_abs_error_pct']:.1f}%, mean |leave-one-out error| "
               + (f"{loo:.1f}% over {fit['loo_predicted_configs']} of {fit['num_configs']} configs" if loo is not None
                  else "- (no held-out fit attributed time to any term)"))


@deferred_command(lambda: [MODEL.but(required=True), *plan_group(), *PRICES, *CALIBRATION_GROUP, JSON])
def plan(model, prices_file, price_overrides, calibrate_run, comm_run, results_dir, as_json, **kw) -> None:  # type: ignore[no-untyped-def]
    """Recommend hardware, GPU count and layout to train MODEL on TOKENS: time, cost, energy.

    \b
    Examples:
      mgbench plan --model llama3-70b --tokens 1.5e13 --deadline-days 60
      mgbench plan --model llama3-8b --tokens 1e12 --systems dgx-a100,dgx-h100 --max-gpus 512 --price h100-sxm=2.1
      mgbench plan --model llama3-8b --tokens 1e12 --spot --preemption-rate 0.05 --restart-minutes 30 --json
    """
    from tabulate import tabulate

    from . import calibrate, cost
    from .search import plan as plan_fn

    opts = plan_options_from(kw)
    if calibrate_run:
        fit = calibrate.fit_run(calibrate_run, results_dir)
        opts.calibration = calibrate.plan_overrides(fit, opts.systems)
    if comm_run:
        from .hardware import systems as all_systems

        links = calibrate.comm_links(comm_run, results_dir)
        opts.links = {name: links["fields"] for name, s in all_systems().items() if s["gpu"] == links["gpu"]}
    res = plan_fn(catalog.model_shape(model), opts, cost.Prices(prices_file, list(price_overrides)))
    if as_json:
        click.echo(json.dumps(res, indent=2, default=float))
        return
    rows = [[r["system"], r["num_gpus"], f"{r['tp']}/{r['pp']}/{r['dp']}", r["zero"], r["micro_batch"], r["recompute"],
             f"{r['days']:.1f}", f"{r['gpu_hours']:,.0f}", "-" if r["cost_usd"] is None else f"{r['cost_usd']:,.0f}",
             "-" if r["usd_per_million_tokens"] is None else f"{r['usd_per_million_tokens']:.3f}",
             f"{r['energy_kwh']:,.0f}", f"{100 * r['mfu']:.0f}", f"{r['memory_per_gpu_bytes'] / 1e9:.0f}"]
            for r in res["ranked"]]
    click.echo(tabulate(rows, headers=["system", "GPUs", "tp/pp/dp", "ZeRO", "mb", "recompute", "days", "GPU-h",
                                       "USD", "USD/Mtok", "kWh", "MFU%", "GB/GPU"]))
    click.echo(f"\n{res['num_candidates']:,} candidate layouts evaluated in {res['elapsed_s']:.2f} s, "
               f"{res['num_feasible']:,} fit and divide, {res['num_meeting_constraints']} (system, GPUs) options meet the constraints")
    click.echo("\nrecommendation:" if res["recommendation"] else "\nno recommendation:")
    for line in res["reasons"]:
        click.echo(f"  - {line}")
    if res["pareto"]:
        click.echo("time/cost Pareto front: " + "; ".join(
            f"{r['num_gpus']}x {r['gpu']} {r['days']:.1f} d USD {r['cost_usd']:,.0f}" for r in res["pareto"]))
    missing = [s for s, src in res["prices"].items() if src.startswith("no ")]
    if missing:
        click.echo(f"no price for: {', '.join(missing)} (cost shown as '-'; pass --price GPU=USD)")
