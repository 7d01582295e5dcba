"""One layout, one answer: the functions behind `mgbench memory` and `mgbench predict`."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import MgbenchError
from ..layout import LIMITS, RECOMPUTE, RUNNER_RECOMPUTE, Layout, flag_of
from ..model_shape import ModelShape
from . import layout_rules, layout_time, perf
from . import optimizer as optimizer_terms
from .hardware import Hardware
from .memory import SCHEDULES, STATE_BYTES, held_state_bytes, memory_per_gpu
from ..probe.profile import STACK as PROFILE_STACK

# --state-bytes under fp32: fp32 training keeps every state in fp32 (memory.STATE_BYTES).
FP32_STATE_BYTES = ("--state-bytes sets a 16-bit recipe's bytes a parameter; --precision fp32 keeps weights, gradients "
                    f"and optimizer states in fp32 ({','.join(f'{x:g}' for x in STATE_BYTES['fp32'])}): drop one of them")
# The components (they add up to total_bytes) and the model-states subtotal.
MEMORY_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes", "activations_bytes",
               "gathered_params_bytes", "temporaries_bytes", "fixed_bytes", "allowance_bytes", "reserved_bytes",
               "total_bytes")


def validate(layout: Layout, shape: ModelShape | None) -> None:
    """One check for every degree: each problem names the degrees and the GPU count."""
    L = layout
    for name in ("num_gpus", "tp", "pp", "micro_batch", "seq_len", "virtual_stages", "ep", "cp", "replicas", "etp"):
        if getattr(L, name) < 1:
            raise MgbenchError(f"{flag_of(name)} must be >= 1, got {getattr(L, name)}")
    for name, limit in LIMITS.items():
        if (v := getattr(L, name)) is not None and v > limit:
            raise MgbenchError(f"{flag_of(name)} must be at most {limit:,} (the largest the planner takes), got {v}")
    if L.zero not in (0, 1, 2, 3):
        raise MgbenchError(f"--zero must be 0, 1, 2 or 3, got {L.zero}")
    if L.recompute not in RECOMPUTE:
        raise MgbenchError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {L.recompute!r}")
    if L.schedule not in SCHEDULES:
        raise MgbenchError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {L.schedule!r}")
    if (why := layout_rules.virtual_stages_problem(L.schedule, L.virtual_stages)) is not None:
        raise MgbenchError(why)
    if L.ep > 1 and (shape is None or not shape.is_moe):
        raise MgbenchError(f"--ep {L.ep} shards routed experts: give an MoE model (--model mixtral-8x7b, "
                           "qwen3-30b-a3b, deepseek-v3, or --experts/--top-k with dims)")
    if L.etp > 1 and (shape is None or not shape.is_moe):
        raise MgbenchError(f"--etp {L.etp} splits routed experts: give an MoE model (--model mixtral-8x7b, "
                           "qwen3-30b-a3b, deepseek-v3, or --experts/--top-k with dims)")
    if L.cp > 1 and shape is None:
        raise MgbenchError("--cp splits each sequence's activations: give --model NAME or dims, not --params")
    # The rules plan's search keeps (planner/layout_rules.py): the two accept and refuse the
    # same layouts. The planner, like Megatron, lets tp exceed the kv heads (they are then
    # replicated).
    masks = layout_rules.rules(shape, L)
    # Degrees that do not divide the GPUs leave no data-parallel degree to say the rest with.
    broken = ["divides"] if not bool(masks["divides"]) else [name for name, ok in masks.items() if not bool(ok)]
    if broken:
        raise MgbenchError("; ".join(layout_rules.MESSAGES[name](L, shape) for name in broken))


def model_notes(shape: ModelShape | None) -> list[str]:
    """What the model's source holds that no figure here counts (ModelShape.left_out)."""
    return [f"model {shape.name}: not priced: {shape.left_out}"] if shape is not None and shape.left_out else []


def runner_notes(shape: ModelShape | None, layout: Layout) -> list[str]:
    """What the planner prices here that `mgbench run` cannot measure, one line each."""
    notes = []
    if layout.recompute_priced_only:
        stack = {"selective": "Megatron-LM / NeMo", "op": "torchtitan"}[layout.recompute]
        notes.append(f"--recompute {layout.recompute} is priced as {stack} run it; mgbench's runner "
                     f"checkpoints {', '.join(RUNNER_RECOMPUTE)} only, so no run of its own can check this figure")
    why = None if shape is None else shape.runner_problem()
    if why:
        notes.append(f"model {shape.name}: {why}")
    return notes


def pipeline_notes(layout: Layout) -> list[str]:
    """A pipeline given fewer micro-batches a step than stages: priced as given (its
    first stage holds that many in flight, and most of the step is bubble), said in one
    line, since a missing --global-batch gives one micro-batch a data-parallel rank."""
    if layout.pp > 1 and layout.num_micro < layout.pp:
        return [f"{layout.num_micro} micro-batch(es) a step on {layout.pp} pipeline stages: the first stage holds "
                f"that many in flight and most of the step is bubble; a real run gives --global-batch "
                f"{layout.micro_batch * layout.dp * layout.pp} or more (pp micro-batches a data-parallel rank)"]
    return []


def _floats(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_floats(v) if isinstance(v, dict) else float(v)) for k, v in d.items()}


def memory(shape: ModelShape | None, layout: Layout, params: float | None = None,
           largest_layer_params: float | None = None, stack: str | None = None,
           margin: float | None = None, fixed: bool = True, moe: Any = None,
           state_bytes: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """Bytes per GPU for `mgbench memory` (model states, and the ZeRO-3 working set when
    ``largest_layer_params`` is given, when only ``params`` is known), as ``stack`` (None:
    the default) holds them (planner/stack.py memory_of), with ``margin`` (None: the
    default allowance) kept free; ``fixed``: a GPU process's fixed costs counted (False for
    CPU ranks); ``state_bytes``: a run's own bytes of weights, gradients and optimizer
    states a parameter, where its recipe differs from the stack's default."""
    from .memory import ALLOWANCE_FRACTION
    from .stack import memory_of

    validate(layout, shape)
    if state_bytes is not None and layout.precision == "fp32":
        raise MgbenchError(FP32_STATE_BYTES)
    if moe is not None and moe.fused_grouped_mlp:  # memory names no GPU: the precision alone
        layout_time.check_fused_grouped_mlp(None, stack, layout.precision, layout.fp8_recipe)
    kw = memory_of(stack, state_bytes)
    m = memory_per_gpu(shape, params=params, num_micro=layout.num_micro, **layout.model_kwargs(),
                       largest_layer_params=largest_layer_params, **kw,
                       margin=ALLOWANCE_FRACTION if margin is None else margin, fixed=fixed, moe=moe)
    out = {k: float(m[k]) for k in MEMORY_KEYS}
    # Offloaded model states: in host memory, not in the device total.
    out["host_bytes"] = float(m["host_bytes"])
    out["notes"] = (model_notes(shape) + runner_notes(shape, layout)
                    + (pipeline_notes(layout) if shape is not None else []))
    if shape is None and layout.zero >= 3 and largest_layer_params is None:
        out["notes"] += ["ZeRO-3's gathered working set is not counted: the largest layer is unknown with --params; "
                        "give --largest-layer-params N (DeepSpeed's estimator takes the same)"]
    if layout.optimizer != "adamw" and state_bytes is None:
        out["notes"].append(optimizer_terms.STATE_BYTES_NOTE.format(optimizer=layout.optimizer,
                                                                   held=held_state_bytes(layout.precision,
                                                                                         kw["state_bytes"])[2]))
    out["layout"] = layout.as_dict()
    # The bytes a parameter the states were counted at (fp32 training: fp32 everything).
    out["state_bytes"] = list(held_state_bytes(layout.precision, kw["state_bytes"]))
    out["stack"] = stack or "megatron-lm (default)"
    return out


def fit_hints(shape: ModelShape | None, layout: Layout, device_bytes: float, runner: bool = False,
              **memory_kw: Any) -> list[str]:
    """The single changes that bring a layout that does not fit within ``device_bytes``,
    as ``--flag value (memory)``: the lowest further ZeRO stage that fits, the recompute
    mode that fits with the fewest FLOPs run again (perf.hardware_flops_per_token; ``runner``:
    those mgbench's runner runs only, for a probed machine), micro-batch 1 at the same
    global batch. Memory only (their step time is predict's to say). ``memory_kw``:
    :func:`memory`'s (stack, margin, fixed, moe, state_bytes)."""
    modes = [r for r in RECOMPUTE if r not in ("none", layout.recompute) and (not runner or r in RUNNER_RECOMPUTE)]
    if shape is not None:
        modes.sort(key=lambda r: float(perf.hardware_flops_per_token(shape, layout.seq_len, RECOMPUTE.index(r))))
    groups = [[(f"--zero {z}", {"zero": z}) for z in range(int(layout.zero) + 1, 4)],
              [(f"--recompute {r}", {"recompute": r}) for r in modes]]
    if layout.micro_batch > 1:
        batch = int(layout.batch)
        groups.append([(f"--micro-batch 1 --global-batch {batch}", {"micro_batch": 1, "global_batch": batch})])
    out = []
    for group in groups:  # the first change of each kind that fits
        for flag, change in group:
            try:
                need = memory(shape, dataclasses.replace(layout, **change), **memory_kw)["total_bytes"]
            except MgbenchError:  # a change the layout's other degrees refuse
                continue
            if need <= device_bytes:
                out.append(f"{flag} ({need / 1e9:,.2f} GB)")
                break
    return out


def predict(shape: ModelShape, hw: Hardware, layout: Layout, overlap: float = perf.DEFAULT_OVERLAP,
            host_ops: dict[str, float] | None = None, margin: float | None = None,
            moe: Any = None, state_bytes: tuple[float, float, float] | None = None,
            fixed: bool = True) -> dict[str, Any]:
    """Step time, throughput, MFU, memory and whether it fits, for `mgbench predict`
    (``host_ops``: the layout's counted non-matmul ops, for a probed CPU Hardware; ``moe``:
    how an MoE model routes and moves its tokens, planner/moe.py MoeOptions, None: its
    defaults; ``state_bytes``: the run's own bytes a parameter of weights, gradients and
    optimizer states where its recipe differs from the stack's: :func:`memory`; ``fixed``:
    a GPU process's fixed memory counted, False on a probed CPU, as plan's
    search.holds_cuda_context)."""
    from .stack import memory_of

    validate(layout, shape)
    # The offloaded shard's bytes a parameter: the run's as it holds them.
    held = held_state_bytes(layout.precision, memory_of(hw.stack, state_bytes)["state_bytes"])
    out = layout_time.step_time(shape, hw, global_batch=layout.batch, overlap=overlap, host_ops=host_ops,
                                moe=moe, offload_state_bytes=held, optimizer=layout.optimizer,
                                **layout.model_kwargs())
    notes = out.pop("notes")
    recipe = out.pop("fp8_recipe")
    res = _floats(out)
    mem = memory(shape, layout, stack=hw.stack, margin=margin, fixed=fixed, moe=moe, state_bytes=state_bytes)
    res["notes"] = notes + mem.pop("notes")
    res["memory"] = mem
    res["fits"] = mem["total_bytes"] <= hw.memory_bytes
    res["device_memory_bytes"] = hw.memory_bytes
    res["fit_hints"] = [] if res["fits"] else fit_hints(shape, layout, hw.memory_bytes, runner=hw.stack == PROFILE_STACK,
                                                         stack=hw.stack, margin=margin, fixed=fixed, moe=moe,
                                                         state_bytes=state_bytes)
    res["system"], res["gpu"] = hw.system, hw.gpu
    res["global_batch"] = layout.batch
    res["assumptions"] = {"matmul_eff": hw.compute_eff, "elementwise_passes": hw.elementwise_passes,
                          "overlap": overlap, "peak_tflops": hw.peak_tflops, "mfu_peak": f"{hw.peak_tflops:g} TFLOP/s "
                          f"({layout_time.hardware_precision(layout.precision)})"}
    if layout.precision == "fp8":
        res["assumptions"]["fp8_peak_tflops"] = layout_time.fp8_peak_tflops(hw)
        res["assumptions"]["fp8_recipe"] = recipe  # the one the casts were priced under
    if hw.ew_bw is not None and host_ops is not None:
        res["assumptions"].update(op_overhead_s=hw.op_overhead_s, elementwise_bytes_per_s=hw.ew_bw,
                                  host_ops=host_ops["ops"], host_bytes=host_ops["bytes"])
    return res
