"""Click commands `memory`, `predict` and `plan` (thin: parsing and printing only)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .. import catalog
from ..cli_options import (AGAINST, CALIBRATION_GROUP, HARDWARE, DIM_NAMES, GPU, JSON, MODEL_GROUP, PLAN_HTML, PRICES,
                           SYSTEM, SYSTEM_FILE,
                           LARGEST_LAYER, TRACE, TRACE_STRATEGY, deferred_command, layout_group, moe_group,
                           moe_options_from, overlap_option, plan_field, plan_group, plan_options_from)
from ..errors import MgbenchError
from ..model_shape import ModelShape, default_ffn_hidden

# planner/hardware.py's GIB, not imported from there: the CLI starts without the planner
# (test_cli_options: importing the CLI does not load it).
GIB = 2**30


def resolve_shape(model: str | None, params: float | None, dims: dict[str, Any],
                  hf_config: str | None = None) -> ModelShape | None:
    """The model of `memory`, `predict` and `plan`: a preset, a Hugging Face config.json
    (dims given beside it override its values), --params alone, or dims."""
    given = {k: v for k, v in dims.items() if v is not None}
    if sum(x is not None for x in (model, params, hf_config)) + (bool(given) and hf_config is None) != 1:
        raise MgbenchError("give exactly one of --model NAME, --hf PATH/config.json, --params N, or --layers/--hidden/"
                           "--heads/--vocab (with optional --ffn-hidden/--kv-heads/--head-dim/--mlp/--experts/...)")
    if model:
        return catalog.model_shape(model)
    if params is not None:
        if not 0 < params < float("inf"):  # NaN too
            raise MgbenchError(f"--params must be a positive finite count, got {params}")
        return None
    if hf_config is not None:
        import dataclasses

        from ..hf_config import shape_from_file

        shape = shape_from_file(hf_config)
        return dataclasses.replace(shape, **given) if given else shape
    if "ffn_hidden" not in given and "hidden" in given:
        given["ffn_hidden"] = default_ffn_hidden(given["hidden"], given.get("mlp", "swiglu"))
    return ModelShape.from_dict({"name": "custom", **given})


def _layout(kw: dict[str, Any]):
    from ..layout import Layout

    return Layout(num_gpus=kw["num_gpus"], tp=kw["tp"], pp=kw["pp"], zero=kw["zero"], micro_batch=kw["micro_batch"],
                  seq_len=kw["seq_len"], global_batch=kw["global_batch"], precision=kw["precision"],
                  recompute=kw["recompute"], sequence_parallel=kw["sequence_parallel"],
                  flash_attention=not kw["no_flash_attention"], schedule=kw["schedule"],
                  virtual_stages=kw["virtual_stages"], ep=kw["ep"], cp=kw["cp"], replicas=kw["replicas"],
                  offload=kw["offload"], pp_last_layers=kw["pp_last_layers"], fp8_recipe=kw["fp8_recipe"],
                  fp8_attention=kw["fp8_attention"], etp=kw["etp"], optimizer=kw["optimizer"])


def _dims(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: kw.pop(k) for k in DIM_NAMES}


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


# Options are made on first use (deferred): the layout's come from the planner's modules,
# which load numpy, and importing the CLI should not.
@deferred_command(lambda: [*MODEL_GROUP, *layout_group(), plan_field("stack"), *moe_group(), LARGEST_LAYER, HARDWARE,
                           TRACE, TRACE_STRATEGY, JSON])
def memory(model, hf_config, params, as_json, largest_layer_params, hardware_profile, trace, trace_strategy, stack,  # type: ignore[no-untyped-def]
           **kw) -> None:
    """Memory per GPU: model states per ZeRO stage, activations, transient peaks, allowance.

    --stack sets what differs between training stacks: the bytes weights, gradients and
    optimizer states are kept in, and how the loss holds the logits (full fp32 logits in
    torchtitan and Hugging Face, Megatron's fused vocab-parallel loss, the runner's chunks);
    --state-bytes sets a recipe's own bytes where it differs from its stack's (Megatron-
    Bridge's performance recipes reduce gradients in bf16: 2,2,12).

    With --trace, also run the real workload and strategy code on fake tensors and a fake
    process group at this world size (nothing is allocated: seconds on a laptop, even for
    llama3-70b on 64 ranks), train two steps, and compare the tracked peak with the model.

    \b
    Examples:
      mgbench memory --params 7.5e9 --num-gpus 64 --zero 3 --stack deepspeed   # ZeRO paper: 1.9 GB of model states
      mgbench memory --model llama3-8b --seq-len 8192 --tp 2 --sequence-parallel --recompute every_2nd --num-gpus 2
      mgbench memory --model llama3-70b --zero 3 --num-gpus 64 --seq-len 8192 --trace
      mgbench memory --model gpt2-small --micro-batch 8 --seq-len 1024 --hardware PROFILE   # fits this machine?
      mgbench memory --model qwen3-30b-a3b --num-gpus 8 --ep 8 --micro-batch 4 --zero 1 --state-bytes 2,2,12   # bf16 grads
    """
    from ..planner.predict import memory as memory_fn
    from ..planner.stack import parse_state_bytes
    from ..probe.profile import STACK as PROFILE_STACK

    shape = resolve_shape(model, params, _dims(kw), hf_config)
    moe = moe_options_from(kw)
    if trace and hardware_profile:
        raise MgbenchError("--trace compares the model with a traced run; --hardware checks the fit on a machine: give one")
    from click.core import ParameterSource

    stack_given = click.get_current_context().get_parameter_source("stack") == ParameterSource.COMMANDLINE
    state_bytes = parse_state_bytes(kw["state_bytes"])
    if state_bytes is not None and (trace or hardware_profile):
        raise MgbenchError(f"--state-bytes sets a recipe's own bytes a parameter; {'--trace' if trace else '--hardware'} "
                           "prices memory as mgbench's runner holds it (fp32 states): drop one of them")
    if trace:
        if stack_given and stack != PROFILE_STACK:  # the runner's own holdings are the mgbench stack's
            raise MgbenchError(f"--trace runs mgbench's own runner, which holds memory its own way (fp32 states, its "
                               f"saved tensors), so --stack {stack} would change nothing: drop one of them")
        _memory_trace(shape, _layout(kw), trace_strategy, as_json)
        return
    if hardware_profile and stack_given and stack != PROFILE_STACK:
        raise MgbenchError(f"--hardware PROFILE prices memory as mgbench's runner holds it on that machine, so --stack "
                           f"{stack} would change nothing: drop one of them")
    if trace_strategy:
        raise MgbenchError("--strategy chooses what --trace runs; add --trace")
    if largest_layer_params is not None and shape is not None:
        raise MgbenchError("--largest-layer-params is for --params; with a model shape the layers are known")
    if largest_layer_params is not None:
        if not 0 < largest_layer_params <= params:  # NaN too
            raise MgbenchError(f"--largest-layer-params {largest_layer_params:g}: a layer's parameters, above 0 and at "
                               f"most the model's --params {params:g}")
        if kw["zero"] < 3:
            raise MgbenchError("--largest-layer-params sizes ZeRO-3's gathered layer; add --zero 3")
    if shape is None and kw["pp_last_layers"] is not None:
        raise MgbenchError(f"--pp-last-layers {kw['pp_last_layers']} needs the model's layers: give --model or its "
                           "dimensions instead of --params")
    from ..probe.profile import holds_cuda_context, read_profile

    profile = read_profile(hardware_profile) if hardware_profile else None
    fixed = holds_cuda_context(profile)
    res = memory_fn(shape, _layout(kw), params=params, largest_layer_params=largest_layer_params,
                    stack=PROFILE_STACK if hardware_profile else stack, margin=kw["memory_margin"], fixed=fixed,
                    moe=moe, state_bytes=state_bytes)
    from ..planner.memory_validation import stack_memory_notes

    res["notes"] += stack_memory_notes(shape, PROFILE_STACK if hardware_profile else stack)
    if profile is not None:
        from ..probe.profile import memory_budget

        res.update(memory_budget(profile, kw["num_gpus"]))
        res["fits"] = None if res["device_memory_bytes"] is None else res["total_bytes"] <= res["device_memory_bytes"]
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    if shape is not None:
        click.echo(_shape_line(shape))
    rows = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "gathered_params_bytes",
            "temporaries_bytes", "fixed_bytes", "allowance_bytes")
    for k in rows:
        click.echo(f"{k.replace('_bytes', ''):<16} {_gb(res[k]):>14}  ({res[k] / GIB:,.2f} GiB)")
    click.echo(f"{'= total':<16} {_gb(res['total_bytes']):>14}  ({res['total_bytes'] / GIB:,.2f} GiB)")
    if shape is None:
        held_as = PROFILE_STACK if hardware_profile else stack
        click.echo("(model states only" + (", and ZeRO-3's gathered layer" if largest_layer_params is not None else "")
                   + f", as the {held_as} stack holds them (--stack): give --model or dims for activations)")
    if res.get("fits") is not None:
        click.echo(f"budget           {_gb(res['device_memory_bytes']):>14}  ({res['device_memory_bytes'] / GIB:,.2f} GiB, "
                   f"{res['budget_source']}): "
                   f"{'fits' if res['fits'] else 'DOES NOT FIT'}")
    elif "budget_source" in res:
        click.echo(f"budget           {res['budget_source']}: fit not known")
    if res.get("host_bytes"):
        click.echo(f"{'host (offload)':<16} {_gb(res['host_bytes']):>14}  ({res['host_bytes'] / GIB:,.2f} GiB), "
                   "not in the device total")
    for n in res.get("notes", []):
        click.echo(f"note: {n}")


def _shape_line(shape: ModelShape) -> str:
    """The model as built: vocabulary padding, MLA, MoE, MTP and local attention said where
    they apply."""
    vocab = (f"vocab {shape.vocab} (built as {shape.padded_vocab}, padded to a multiple of {shape.vocab_multiple})"
             if shape.padded_vocab != shape.vocab else f"vocab {shape.vocab}")
    attn = (f"{shape.heads} heads, MLA (kv rank {shape.kv_lora_rank}, q rank {shape.q_lora_rank or '-'}, "
            f"q/k {shape.qk_head_dim} v {shape.v_dim} per head)" if shape.is_mla
            else f"{shape.heads} heads ({shape.kv_heads} kv, head dim {shape.dim_head})")
    extra = []
    if shape.is_moe:
        extra.append(f"{shape.experts} experts of {shape.moe_ffn_hidden}, top {shape.top_k}"
                     + (f", {shape.shared_experts} shared" if shape.shared_experts else "")
                     + (f", {shape.dense_layers} dense layers first" if shape.dense_layers else "")
                     + (f", MoE every {shape.moe_interval} layers ({shape.moe_layers} of {shape.layers})"
                        if shape.moe_interval > 1 else ""))
    if shape.mtp_layers:
        extra.append(f"{shape.mtp_layers} MTP module(s)")
    if shape.sliding_window:
        extra.append(f"{shape.num_local_layers} local layers (window {shape.sliding_window})")
    return (f"{shape.name}: {shape.layers} layers, hidden {shape.hidden}, {attn}, MLP {shape.ffn_hidden} {shape.mlp}, "
            f"{vocab}, " + "".join(f"{e}, " for e in extra) + parameter_counts(shape))


def parameter_counts(shape: ModelShape) -> str:
    """The model's parameters as published counts split them: the MTP modules apart from
    the main model (DeepSeek-V3: 671B + 11.6B), and the active count with and without the
    input embedding (a lookup, which reports of active parameters leave out)."""
    g = 1e9
    total, mtp = shape.num_params(), shape.num_mtp_params()
    out = f"{total / g:.3g}B parameters" + (f" ({(total - mtp) / g:.3g}B + {mtp / g:.3g}B in the MTP module(s))"
                                             if mtp else "")
    if shape.is_moe:
        act, emb = shape.num_active_params(), shape.num_embedding_params()
        act_mtp = shape.num_mtp_params(active=True)
        out += (f", {act / g:.3g}B active ({(act - emb - act_mtp) / g:.3g}B without the input embedding"
                + (" and the MTP module(s)" if act_mtp else "") + ")")
    return out


def _memory_trace(shape: ModelShape | None, layout: Any, strategy: str | None, as_json: bool) -> None:
    from ..planner.predict import model_notes, validate
    from ..planner.trace import runner_config, trace_memory

    if shape is None:
        raise MgbenchError("--trace builds the model: give --model NAME or its dims, not --params")
    if layout.pp_last_layers is not None:
        raise MgbenchError(f"--trace runs the runner's own pipeline split (every stage ceil(layers / pp)): "
                           f"--pp-last-layers {layout.pp_last_layers} is priced without --trace")
    validate(layout, shape)
    res = trace_memory(runner_config(shape, layout, strategy))
    res["notes"] = [*model_notes(shape), *res.get("notes", [])]
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    t = res["traced"]
    click.echo(_shape_line(shape))
    click.echo(f"traced: {res['config']} (rank 0, two training steps on fake tensors, {t['num_ops']:,} ops, "
               f"built in {t['build_s']:.1f} s, traced in {t['trace_s']:.1f} s)")
    click.echo(f"{'':16} {'model':>14} {'traced':>14}")
    for k in ("params", "grads", "optimizer", "activations", "temporaries"):
        click.echo(f"{k:<16} {_gb(res[k + '_bytes']):>14} {_gb(t['categories'][k]):>14}")
    click.echo(f"{'= total':<16} {_gb(res['total_bytes']):>14} {_gb(t['peak_bytes']):>14}   "
               f"error {res['error_pct']:+.1f}%")
    click.echo(f"peak: model at {res['analytic_peak_phase'].replace('_', ' ')}; trace at {t['peak_at']}")
    click.echo(f"the same config on a GPU (model): {_gb(res['cuda_total_bytes'])}")
    for n in res["notes"]:
        click.echo(f"  - {n}")


@deferred_command(lambda: [*MODEL_GROUP, *layout_group(), SYSTEM, SYSTEM_FILE, GPU, HARDWARE, AGAINST, overlap_option(),
                           plan_field("stack"), *moe_group(), *CALIBRATION_GROUP, JSON])
def predict(model, hf_config, params, as_json, system, system_file, gpu, hardware_profile, against_run, overlap, stack, calibrate_run, comm_run,  # type: ignore[no-untyped-def]
            results_dir, **kw) -> None:
    """Predict step time, tokens/s, MFU and memory of one layout.

    \b
    Examples:
      mgbench predict --model llama3-8b --system dgx-h100 --num-gpus 8 --zero 3 --micro-batch 2 --seq-len 8192
      mgbench predict --model gpt3-175b --gpu a100-sxm-80gb --num-gpus 1024 --tp 8 --pp 8 --global-batch 1536 --recompute full
      mgbench predict --calibrate RUN      # fit to a measured run; residuals and leave-one-out errors
      mgbench predict --hardware PROFILE --against RUN   # this machine's probe vs a run measured on it
      mgbench predict --hardware PROFILE --model gpt2-small --num-gpus 1 --micro-batch 8 --seq-len 1024
      #   (a CPU probe measures fp32: add --precision fp32)
      mgbench predict --model llama3-70b --gpu a100-sxm-80gb --num-gpus 64 --zero 3 --seq-len 8192 --stack torchtitan
    """
    from ..planner import calibrate, hardware, perf
    from ..planner import stack as stacks
    from ..planner.predict import predict as predict_fn
    from ..planner.search import field_problem, schedule_label

    for name, value in (("overlap", overlap), ("seq_len", kw["seq_len"])):  # plan's fields, plan's bounds
        if (problem := field_problem(name, value)) is not None:
            raise MgbenchError(problem)
    dims = _dims(kw)
    moe = moe_options_from(kw)
    profile = None
    stack = None if stack == stacks.DEFAULT_STACK else stack  # given only when it is another
    if system_file and len(system_file) == 1 and system is None and gpu is None and not calibrate_run:
        system = system_file[0]  # --system-file's only system (it is loaded: cli_options.SYSTEM_FILE)
    if hardware_profile:
        from ..probe.profile import read_profile

        if system or gpu or calibrate_run or comm_run or stack or kw["state_bytes"]:
            raise MgbenchError("--hardware PROFILE replaces --system/--gpu/--calibrate/--comm/--stack/--state-bytes (a "
                               "profile measures this machine's kernels and mgbench's runner's memory; a stack scales "
                               "the catalog's efficiency): give one of them")
        profile = read_profile(hardware_profile)
        if against_run:
            from ..probe.profile import write_profile
            from ..planner.against import against_run as against_fn
            from ..planner.against import record_validation

            res = against_fn(profile, against_run, results_dir)
            entry = record_validation(profile, res)
            if entry is not None:  # it now sets this profile's prediction intervals
                write_profile({**profile, "validation": entry}, hardware_profile)
            res["recorded_in_profile"] = entry is not None
            _print_against(res, as_json)
            return
    elif against_run:
        raise MgbenchError("--against RUN needs --hardware PROFILE (write one with `mgbench probe`)")
    over: dict[str, Any] = {}
    if calibrate_run:
        fit = calibrate.fit_run(calibrate_run, results_dir)
        if system is None and gpu is None:
            # No target hardware: report the fit on the run's own machine.
            _print_calibration(fit, as_json)
            return
        over = calibrate.hardware_overrides(fit, kw["precision"])
        if gpu is None and system is None:
            gpu = over["gpu"]
    shape = resolve_shape(model, params, dims, hf_config)
    if shape is None:
        raise MgbenchError("predict needs the model's shape: --model NAME or explicit dims, not --params")
    from ..planner.resolve import resolve
    from ..probe.profile import holds_cuda_context

    links = None
    if comm_run:
        comm = calibrate.comm_links(comm_run, results_dir)
        target = over.get("gpu") or gpu or (hardware.systems()[system]["gpu"] if system in hardware.systems() else None)
        if target is not None and comm["gpu"] != target:
            raise MgbenchError(f"--comm {comm_run} measured {comm['gpu']}, but the prediction is for {target}")
        links = comm["fields"]
    hw = resolve(precision=kw["precision"], system=system, gpu=gpu, profile=profile, ranks=kw["num_gpus"],
                 calibration=over.get("hardware"), links=links, stack=stack, offload=kw["offload"])
    if overlap is None and profile is not None:
        from ..probe.profile import overlap as profile_overlap

        overlap = profile_overlap(profile, kw["num_gpus"], perf.DEFAULT_OVERLAP)
    host_ops, host_notes = _counted_ops(shape, _layout(kw), hw, profile) or (None, [])
    res = predict_fn(shape, hw, _layout(kw), overlap=overlap if overlap is not None else over.get("overlap", perf.DEFAULT_OVERLAP),
                     host_ops=host_ops, margin=kw["memory_margin"], moe=moe,
                     state_bytes=stacks.parse_state_bytes(kw["state_bytes"]),
                     fixed=holds_cuda_context(profile))  # probe/profile.py: none on a probed CPU
    res["notes"] = list(res.get("notes", [])) + host_notes
    res["notes"] += _moe_ignored(shape, moe)
    from ..planner.memory_validation import stack_memory_notes

    res["notes"] += stack_memory_notes(shape, stack)
    res["notes"] += _lever_notes(shape, moe, hw.system, kw["ep"])
    if profile is None and not calibrate_run and (carried := stacks.carried_note(stack)) is not None:
        res["notes"].append(carried)
    from ..planner import uncertainty
    from ..planner.moe import moe_class

    run_stack = stack or stacks.DEFAULT_STACK
    moe_cls = moe_class(shape, moe, hw.system, kw["ep"], offload=kw["offload"], stack=run_stack)
    reg = (uncertainty.with_moe(uncertainty.calibrated(fit), moe_cls) if calibrate_run
           else uncertainty.regime(hw.gpu, kw["pp"] > 1, profile, stack=run_stack, moe=moe_cls))
    res.update(uncertainty.intervals(res["step_time_s"], res["tokens_per_s_per_gpu"], reg))
    if res["breakdown"].get("host_optimizer_s"):
        from ..planner import host_step

        res["interval_reasons"] = [*res["interval_reasons"],
                                   *host_step.unchecked(shape.is_moe, kw["optimizer"],
                                                        float(res["breakdown"]["host_optimizer_s"]),
                                                        float(res["step_time_s"]))]
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    b = res["breakdown"]
    click.echo(f"{shape.name} on {kw['num_gpus']}x {hw.gpu} ({hw.system}), tp={kw['tp']} pp={kw['pp']} "
               f"zero={kw['zero']} mb={kw['micro_batch']} gb={res['global_batch']} s={kw['seq_len']}"
               + "".join(f" {k}={kw[k]}" for k in ("cp", "ep", "etp") if kw[k] > 1)
               + (f" hsdp={kw['replicas']}" if kw["replicas"] > 1 else "") + (" offload" if kw["offload"] else "")
               + (f" {kw['optimizer']}" if kw["optimizer"] != "adamw" else "")
               + (f" fp8 ({res['assumptions']['fp8_recipe']} recipe)" if kw["precision"] == "fp8" else "")
               + (" with FP8 attention" if kw["fp8_attention"] else "")
               + (" schedule=" + schedule_label({"schedule": kw["schedule"], "virtual_stages": kw["virtual_stages"],
                                                 "pp_last_layers": kw.get("pp_last_layers")}) if kw["pp"] > 1 else ""))
    click.echo(f"step time      {res['step_time_s']:.3f} s  (compute {b['compute_s']:.3f}, bubble {b['bubble_s']:.3f}, "
               f"exposed comm {b['exposed_comm_s']:.3f}"
               + (f", MoE per-layer time {b['moe_host_s']:.3f}" if b.get("moe_host_s") else "")
               + (f", EFA proxy notify wait {b['moe_efa_notify_s']:.3f}" if b.get("moe_efa_notify_s") else "")
               + (f", optimizer {b['optimizer_s']:.3f}" if b.get("optimizer_s") else "")
               + (f", host optimizer step {b['host_optimizer_s']:.3f}" if b.get("host_optimizer_s") else "") + ")")
    lo, hi = res["step_time_s_interval"]
    click.echo(f"interval       {lo:.3f} to {hi:.3f} s ({res['regime']}: {'; '.join(res['interval_reasons'])})")
    click.echo(f"throughput     {res['tokens_per_s']:,.0f} tokens/s, {res['tokens_per_s_per_gpu']:,.0f} per GPU")
    click.echo(f"per GPU        {res['model_tflops_per_gpu']:.1f} model TFLOP/s, MFU {100 * res['mfu']:.1f}%")
    if profile is None and not calibrate_run:
        click.echo(f"stack          {hw.stack} (efficiency {hw.stack_eff:.3f} of the calibration stack's; --stack)")
    click.echo(f"memory         {_gb(res['memory']['total_bytes'])} of {_gb(res['device_memory_bytes'])} "
               f"({res['device_memory_bytes'] / GIB:,.0f} GiB): "
               f"{'fits' if res['fits'] else 'DOES NOT FIT'}")
    if not res["fits"]:
        units = "ranks" if profile is not None else "GPUs"
        split = "--tp, --pp, --ep" if shape.is_moe else "--tp, --pp"
        click.echo("               " + ("fits with one change (memory only; predict it for its step time): "
                                        + "; ".join(res["fit_hints"]) if res["fit_hints"] else
                                        "no single change of --zero, --recompute or --micro-batch makes it fit: "
                                        f"more {units}, or more model parallelism ({split})"))
    extra = {k: b[k] for k in ("ep_comm_s", "cp_comm_s", "offload_s")
             if b.get(k)}  # MoE host time and the optimizer's: the step line
    if extra:
        click.echo("new axes       " + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f} s"
                                                  for k, v in extra.items()))
    if res["memory"].get("host_bytes"):
        click.echo(f"host memory    {_gb(res['memory']['host_bytes'])} per GPU (offloaded model states)")
    for n in res.get("notes", []):
        click.echo(f"note: {n}")


def _counted_ops(shape: Any, layout: Any, hw: Any, profile: Any = None) -> tuple[dict[str, float], list[str]] | None:
    """A probed CPU profile prices a step's non-matmul ops one by one: count them by
    tracing one step of the runner config the layout describes (planner/opcount.py),
    with notes on what the probe left unpriced (against.counted_ops). None when the
    hardware does not price them (catalog, GPU or older profiles)."""
    if hw.ew_bw is None:
        return None
    if layout.pp_last_layers is not None:  # the runner splits blocks evenly: its ops would be another layout's
        raise MgbenchError(f"--pp-last-layers {layout.pp_last_layers} with a probed CPU profile: its ops are counted "
                           "by tracing the runner, which splits the blocks evenly; give it without --hardware")
    from ..planner.against import counted_ops
    from ..planner.predict import validate
    from ..planner.trace import runner_config

    validate(layout, shape)  # as predict will, before the runner's trace divides by its degrees

    return counted_ops(runner_config(shape, layout), hw, profile)


def _print_against(res: dict[str, Any], as_json: bool) -> None:
    from tabulate import tabulate

    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(f"run {res['run']} predicted from the profile of {res['profile_device']} ({res['method']})")
    click.echo(tabulate([[r["label"], f"{r['measured_s']:.4f}"]
                         + ([f"{r['predicted_s']:.4f}", f"{r['error_pct']:+.1f}%"] if r["predicted_s"] is not None
                            else ["-", r["reason"]]) for r in res["rows"]],
                        headers=["config", "measured s", "predicted s", "error"]))
    for r in res["rows"]:
        if r.get("note"):
            click.echo(f"note: {r['label']}: {r['note']}")
    if res["mape"] is None:
        click.echo("no config could be predicted (reasons above)")
    else:
        click.echo(f"mean |error| {res['mape']:.1f}% over {res['num_predicted']} of {len(res['rows'])} configs, "
                   f"max {res['max_abs_error_pct']:.1f}%")
    click.echo("recorded in the profile: its predictions' intervals now use this error" if res["recorded_in_profile"]
               else "not recorded in the profile (the run was measured on another machine, or nothing was predicted)")


def _print_calibration(fit: dict[str, Any], as_json: bool) -> None:
    from tabulate import tabulate

    if as_json:
        click.echo(json.dumps(fit, indent=2))
        return
    click.echo(f"calibration on {fit['device_name']} from {fit['num_configs']} measured configs")
    for g in fit["compute_groups"]:  # one compute rate per (precision, compile) group
        rate = g["achieved_flops_per_s"]
        click.echo(f"  achieved compute   {rate / 1e12:.3f} TFLOP/s ({fit['flops_scope']})" if rate else
                   "  achieved compute   - (the fit attributes no time to compute)",
                   nl=False)
        click.echo(f"  [{g['precision']}, compile={g['compile']}, {g['num_configs']} configs]"
                   if len(fit["compute_groups"]) > 1 else "")
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


@deferred_command(lambda: [*MODEL_GROUP, *plan_group(), *moe_group(), SYSTEM_FILE, *PRICES, HARDWARE, *CALIBRATION_GROUP,
                           PLAN_HTML, JSON])
def plan(model, hf_config, params, system_file, prices_file, price_overrides, hardware_profile, calibrate_run, comm_run,  # type: ignore[no-untyped-def]
         results_dir, html_file, as_json, **kw) -> None:
    """Recommend hardware, GPU count and layout to train MODEL on TOKENS: time, cost, energy.

    \b
    Examples:
      mgbench plan --model llama3-70b --tokens 1.5e13 --deadline-days 60
      mgbench plan --model llama3-8b --tokens 1e12 --systems dgx-a100,dgx-h100 --max-gpus 512 --price h100-sxm=2.1
      mgbench plan --model llama3-8b --tokens 1e12 --spot --preemption-rate 0.05 --restart-minutes 30 --json
      mgbench plan --model llama3-8b --tokens 1e12 --stack torchtitan      # an FSDP2 stack's published efficiency
      mgbench plan --model gpt2-small --tokens 1e9 --seq-len 1024 --hardware PROFILE   # this machine, 1..N ranks
      #   (a CPU probe measures fp32: add --precision fp32)
      mgbench plan --hf PATH/config.json --tokens 1e12                   # a Hugging Face model, read on disk
      mgbench plan --model llama3-8b --tokens 1e12 --html plan.html     # a page with the plots, to show others
      mgbench plan --model llama3-8b --tokens 1e12 --own dgx-h100:64    # on GPUs you already own
      mgbench plan --layers 36 --hidden 2880 --heads 64 --kv-heads 8 --head-dim 64 --vocab 201088 \\
                   --experts 128 --top-k 4 --ffn-hidden 2880 --tokens 1e12      # your own dims
    """
    from tabulate import tabulate

    from ..planner import calibrate, cost
    from ..planner.search import plan as plan_fn
    from ..planner.search import schedule_label

    dims = _dims(kw)
    shape = resolve_shape(model, params, dims, hf_config)
    if shape is None:
        raise MgbenchError("plan needs the model's shape: --model NAME, --hf PATH or dims, not --params")
    opts = plan_options_from(kw)
    opts.moe = moe_options_from(kw)
    if hardware_profile:
        from ..probe.profile import read_profile

        if opts.systems or calibrate_run or comm_run:
            raise MgbenchError("--hardware PROFILE plans on the probed machine: drop --systems/--calibrate/--comm")
        from ..planner.stack import DEFAULT_STACK

        if opts.stack != DEFAULT_STACK or opts.state_bytes:
            raise MgbenchError("--hardware PROFILE replaces --stack and --state-bytes (a profile measures this machine's "
                               "kernels and prices memory as mgbench's runner holds it; a stack scales the catalog's "
                               "efficiency): give one of them")
        opts.profile = read_profile(hardware_profile)
    if calibrate_run:
        fit = calibrate.fit_run(calibrate_run, results_dir)
        opts.calibration = calibrate.plan_overrides(fit, opts.systems, opts.precision)
        from ..planner.uncertainty import calibrated

        opts.calibration_regime = calibrated(fit)
    if comm_run:
        from ..planner.hardware import systems as all_systems

        links = calibrate.comm_links(comm_run, results_dir)
        opts.links = {name: links["fields"] for name, s in all_systems().items() if s["gpu"] == links["gpu"]}
    # Progress of a long search on a terminal's stderr only: a log or a pipe reading both
    # streams (--json into a parser) gets the answer alone.
    tell = (lambda m: click.echo(m, err=True)) if sys.stderr.isatty() else None
    res = plan_fn(shape, opts, cost.Prices(prices_file, list(price_overrides)), progress=tell)
    for line in _moe_ignored(shape, opts.moe):
        res["reasons"].append(line)
    if res.get("recommendation") is not None:  # the lead, as `mgbench predict` takes it
        res["recommendation"]["predict_command"] = predict_command(
            res["recommendation"], opts, _model_args(model, hf_config, dims),
            hardware_profile=hardware_profile, calibrate_run=calibrate_run, comm_run=comm_run, results_dir=results_dir)
    if html_file:
        from ..report.plan_page import build_plan_report

        try:
            written = build_plan_report(res, html_file)
        except OSError as e:
            raise MgbenchError(f"--html {html_file}: cannot write the report ({e.strerror})") from None
        click.echo(f"plan report: {written}", err=as_json)
    if as_json:
        click.echo(json.dumps(res, indent=2, default=float))
        return
    rows = [[r["system"], r["num_gpus"] if r["billed_gpus"] == r["num_gpus"] else f"{r['num_gpus']} (bills {r['billed_gpus']})",
             f"{r['tp']}/{r['pp']}/{r['dp']}/{r['cp']}/{r['ep']}",
             f"{r['zero']}{'+off' if r['offload'] else ''}", r["micro_batch"], r["recompute"],
             schedule_label(r) or "-", f"{r['days']:.1f}", f"{r['gpu_hours']:,.0f}", "-" if r["cost_usd"] is None else f"{r['cost_usd']:,.0f}",
             "-" if r["usd_per_million_tokens"] is None else f"{r['usd_per_million_tokens']:.3f}",
             "-" if r["energy_kwh"] is None else f"{r['energy_kwh']:,.0f}", f"{100 * r['mfu']:.0f}",
             f"{r['memory_per_gpu_bytes'] / 1e9:.0f}"]
            for r in res["ranked"]]
    click.echo(tabulate(rows, headers=["system", "GPUs", "tp/pp/dp/cp/ep", "ZeRO", "mb", "recompute", "schedule",
                                       "days", "GPU-h",
                                       "USD", "USD/Mtok", "kWh", "MFU%", "GB/GPU"]))
    recipe = res["assumptions"].get("fp8_recipe")
    click.echo(f"\n{res['num_candidates']:,} candidate layouts evaluated in {res['elapsed_s']:.2f} s, "
               f"{res['num_feasible']:,} fit and divide, {res['num_meeting_constraints']} (system, GPUs) options meet the constraints"
               + (f"; FP8 casts priced under the {recipe} recipe (--fp8-recipe)" if recipe else "")
               + ("; attention in FP8 (--fp8-attention)" if res["assumptions"].get("fp8_attention") else ""))
    click.echo("\nrecommendation:" if res["recommendation"] else "\nno recommendation:")
    for line in res["reasons"]:
        click.echo(f"  - {line}")
    if res["recommendation"] is not None:
        click.echo(f"  - the lead alone, as predict prices it (its point estimate, memory and notes): "
                   f"{res['recommendation']['predict_command']}")
    for o in res.get("ownership", []):
        click.echo(_ownership_line(o))
    flips = res.get("flips") or {}
    if flips.get("why"):
        click.echo("\nwhat would change the answer:")
        for line in flips["why"]:
            click.echo(f"  - {line}")
    if res["pareto"]:
        click.echo("time/cost Pareto front: " + "; ".join(
            f"{r['num_gpus']}x {r['gpu']} ({r['system']}) {r['days']:.1f} d USD {r['cost_usd']:,.0f}"
            for r in res["pareto"]))
    missing = {s: src for s, src in res["prices"].items() if src.startswith("no ")}
    if missing:
        click.echo(f"no price for {', '.join(missing)} (cost shown as '-'):")
        for src in missing.values():  # each says which name --price takes for it
            click.echo(f"  - {src}")


def _model_args(model: str | None, hf_config: str | None, dims: dict[str, Any]) -> list[str]:
    """The model options a plan was given, as predict takes them."""
    import shlex

    out = [f"--model {shlex.quote(model)}"] if model else []
    if hf_config:
        out.append(f"--hf {shlex.quote(hf_config)}")
    for name, value in dims.items():
        flag = f"--{name.replace('_', '-')}"
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out.append(f"{flag} {value}")
    return out


def predict_command(row: dict[str, Any], opts: Any, model_args: list[str], *, hardware_profile: str | None = None,
                    calibrate_run: str | None = None, comm_run: str | None = None,
                    results_dir: str = "results") -> str:
    """The `mgbench predict` line that prices a plan's row alone: its layout
    (search.layout_of_row: sequence parallelism wherever tp > 1, the global batch the
    plan's tokens per step make), and the plan's options that predict shares (precision,
    FP8 recipe, stack, overlap, memory margin, MoE options, hardware)."""
    import dataclasses
    import shlex

    from ..planner.moe import MoeOptions
    from ..planner.search import PlanOptions, layout_of_row

    lay = layout_of_row(row, opts)
    defaults = {f.name: f.default for f in dataclasses.fields(PlanOptions)}
    out = ["mgbench predict", *model_args]
    if hardware_profile:
        out.append(f"--hardware {shlex.quote(hardware_profile)}")
    else:
        source = str(catalog.systems().get(row["system"], {}).get("source", ""))
        if source.startswith("--system-file "):
            out.append(f"--system-file {shlex.quote(source[len('--system-file '):])}")
        out.append(f"--system {row['system']}")
    for flag, value in (("--calibrate", calibrate_run), ("--comm", comm_run)):
        if value:
            out.append(f"{flag} {shlex.quote(value)}")
    if (calibrate_run or comm_run) and results_dir != "results":
        out.append(f"--results-dir {shlex.quote(results_dir)}")
    out += [f"--num-gpus {lay.num_gpus}", f"--tp {lay.tp}", f"--pp {lay.pp}"]
    out += [f"--{k} {getattr(lay, k)}" for k in ("cp", "ep", "etp") if getattr(lay, k) > 1]
    out += [f"--zero {lay.zero}", f"--micro-batch {lay.micro_batch}", f"--global-batch {lay.batch}",
            f"--seq-len {lay.seq_len}", f"--recompute {lay.recompute_name}", f"--precision {lay.precision}"]
    if lay.fp8_recipe:
        out.append(f"--fp8-recipe {lay.fp8_recipe}")
    if lay.fp8_attention:
        out.append("--fp8-attention")
    if lay.sequence_parallel:
        out.append("--sequence-parallel")
    if lay.pp > 1:
        out.append(f"--schedule {lay.schedule}" + (f" --virtual-stages {lay.virtual_stages}"
                                                   if lay.virtual_stages > 1 else ""))
        if lay.pp_last_layers is not None:
            out.append(f"--pp-last-layers {lay.pp_last_layers}")
    if lay.offload:
        out.append("--offload")
    for name in ("stack", "overlap", "memory_margin", "optimizer"):
        if getattr(opts, name) != defaults[name] and not (name == "stack" and hardware_profile):
            out.append(f"--{name.replace('_', '-')} {getattr(opts, name)}")
    if opts.state_bytes:
        out.append(f"--state-bytes {','.join(opts.state_bytes)}")
    for f in dataclasses.fields(MoeOptions):
        value = getattr(opts.moe, f.name)
        if value != f.default:
            flag = f"--moe-{f.name.replace('_', '-')}"
            out.append(flag if value is True else f"{flag} {','.join(value) if isinstance(value, tuple) else value}")
    return " ".join(out)


def _lever_notes(shape: Any, moe: Any, system: str | None = None, ep: int | None = None) -> list[str]:
    """For an MoE model: how the planner did on the model's published runs
    (moe_validation.model_record_note), how its all-to-all price did against nccl-tests
    where the run's EP uses NCCL's all-to-all (collective_validation.a2a_record_note) and,
    where the run sets a dispatcher other than all-to-all or CUDA graphs, how the published
    A/B pairs of that option bear out the model (planner/moe_pairs.py)."""
    if not shape.is_moe or moe is None:
        return []
    from ..planner.moe_pairs import evidence_notes

    return evidence_notes(shape, moe, system=system, ep=ep)


def _moe_ignored(shape: Any, moe: Any) -> list[str]:
    """The line predict and plan add where --moe-* options were given for a dense model."""
    if shape.is_moe or moe == type(moe)():
        return []
    return [f"--moe-* options ignored: {shape.name} has no experts"]


def _ownership_line(o: dict[str, Any]) -> str:
    """One system's buy-versus-rent answer in a sentence or two."""
    if o.get("null_reason"):
        return f"buy versus rent, {o['system']}: unknown ({o['null_reason']})"
    parts = (f"buy versus rent, {o['system']}: owned USD {o['owned_usd_per_gpu_hour']:.2f} per GPU-hour at "
             f"{100 * o['utilisation']:.0f}% utilisation (server {o['capex_usd_per_gpu_hour']:.2f} + hosting "
             f"{o['hosting_usd_per_gpu_hour']:.2f} + energy {o['energy_usd_per_gpu_hour']:.2f})")
    tiers = []
    for tier, rent in o["rent"].items():
        if rent is None:
            continue
        u, m = o["break_even_utilisation"][tier], o["break_even_months"][tier]
        tiers.append(f"{tier.replace('_', ' ')} USD {rent:.2f}: " + (
            "owning never catches up" if u is None
            else f"owning is cheaper from {100 * u:.0f}% utilisation, paid back after {m:.0f} months" if m is not None
            else f"owning is cheaper from {100 * u:.0f}% utilisation; at {100 * o['utilisation']:.0f}% it does not pay "
                 "back within its write-off period"))
    shaky = (f" (the server price is a {o['server_price_confidence']}-confidence figure: check it with "
             f"--server-price {o['system']}=USD)" if o.get("server_price_confidence") in ("low", "low-medium") else "")
    return parts + ("; against renting " + "; ".join(tiers) if tiers else "; no rental price known") + shaky
