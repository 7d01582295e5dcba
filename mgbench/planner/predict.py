"""One layout, one answer: the functions behind `mgbench memory` and `mgbench predict`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import MgbenchError
from ..model_shape import ModelShape
from . import layout_rules, layout_time, perf
from .hardware import Hardware
from .memory import RECOMPUTE, RUNNER_RECOMPUTE, SCHEDULES, VIRTUAL_SCHEDULES, memory_per_gpu

# The components (they add up to total_bytes) and the model-states subtotal.
MEMORY_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes", "activations_bytes",
               "gathered_params_bytes", "temporaries_bytes", "fixed_bytes", "allowance_bytes", "reserved_bytes",
               "total_bytes")


@dataclass(frozen=True)
class Layout:
    """Degrees and knobs of one parallel layout."""

    num_gpus: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    seq_len: int = 2048
    global_batch: int | None = None  # sequences per step; default: one micro-batch per DP rank
    precision: str = "bf16"
    recompute: str = "none"
    sequence_parallel: bool = False
    flash_attention: bool = True
    schedule: str = "1f1b"
    virtual_stages: int = 1
    ep: int = 1  # expert parallelism, carved out of dp
    cp: int = 1  # context parallelism: each sequence split over cp ranks
    replicas: int = 1  # HSDP: ZeRO-3 shards over dp x cp / replicas ranks, replicated across (1: plain)
    offload: bool = False  # FSDP2 CPU offload of weights, gradients and optimizer states (ZeRO-3)

    @property
    def dp(self) -> int:
        return self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.micro_batch * self.dp

    @property
    def num_micro(self) -> int:
        return self.batch // (self.micro_batch * self.dp)


def layout_of(cfg: Any) -> Layout:
    """The planner's Layout of a runner config (:class:`mgbench.config.RunConfig`)."""
    return Layout(num_gpus=cfg.nproc, tp=cfg.tp, pp=cfg.pp, zero=cfg.zero_stage, micro_batch=cfg.micro_batch,
                  seq_len=cfg.seq_len, global_batch=cfg.global_batch, precision=cfg.precision,
                  recompute=cfg.activation_checkpointing, sequence_parallel=cfg.strategy == "tp_sp",
                  schedule=cfg.pp_schedule,
                  virtual_stages=cfg.virtual_stages if cfg.pp_schedule in VIRTUAL_SCHEDULES else 1,
                  ep=cfg.ep, replicas=cfg.replicas if cfg.strategy == "hsdp" or (
                      cfg.strategy == "pp+tp+dp" and cfg.dp_mode == "hsdp") else 1,
                  offload=bool(cfg.offload))


def validate(layout: Layout, shape: ModelShape | None) -> None:
    """One check for every degree: each problem names the degrees and the GPU count."""
    L = layout
    for name in ("num_gpus", "tp", "pp", "micro_batch", "seq_len", "virtual_stages", "ep", "cp", "replicas"):
        if getattr(L, name) < 1:
            raise MgbenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(L, name)}")
    if L.zero not in (0, 1, 2, 3):
        raise MgbenchError(f"--zero must be 0, 1, 2 or 3, got {L.zero}")
    if L.recompute not in RECOMPUTE:
        raise MgbenchError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {L.recompute!r}")
    if L.schedule not in SCHEDULES:
        raise MgbenchError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {L.schedule!r}")
    if L.ep > 1 and (shape is None or not shape.is_moe):
        raise MgbenchError(f"--ep {L.ep} shards routed experts: give an MoE model (--model mixtral-8x7b, "
                           "qwen3-30b-a3b, deepseek-v3, or --experts/--top-k with dims)")
    if L.cp > 1 and shape is None:
        raise MgbenchError("--cp splits each sequence's activations: give --model NAME or dims, not --params")
    # The rules plan's search keeps (planner/layout_rules.py): the two accept and refuse the
    # same layouts. The planner, like Megatron, lets tp exceed the kv heads (they are then
    # replicated).
    masks = layout_rules.rules(shape, num_gpus=L.num_gpus, tp=L.tp, pp=L.pp, cp=L.cp, ep=L.ep, zero=L.zero,
                               micro_batch=L.micro_batch, global_batch=L.batch, seq_len=L.seq_len,
                               schedule=L.schedule, virtual_stages=L.virtual_stages, replicas=L.replicas,
                               offload=L.offload)
    # Degrees that do not divide the GPUs leave no data-parallel degree to say the rest with.
    broken = ["divides"] if not bool(masks["divides"]) else [name for name, ok in masks.items() if not bool(ok)]
    if broken:
        raise MgbenchError("; ".join(layout_rules.MESSAGES[name](L, shape) for name in broken))


def runner_notes(shape: ModelShape | None, layout: Layout) -> list[str]:
    """What the planner prices here that `mgbench run` cannot measure, one line each."""
    notes = []
    if layout.recompute not in RUNNER_RECOMPUTE:
        stack = {"selective": "Megatron-LM / NeMo", "op": "torchtitan"}[layout.recompute]
        notes.append(f"--recompute {layout.recompute} is priced as {stack} run it; mgbench's runner "
                     f"checkpoints {', '.join(RUNNER_RECOMPUTE)} only, so no run of its own can check this figure")
    why = None if shape is None else shape.runner_problem()
    if why:
        notes.append(f"model {shape.name}: {why}")
    return notes


def _floats(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_floats(v) if isinstance(v, dict) else float(v)) for k, v in d.items()}


def memory(shape: ModelShape | None, layout: Layout, params: float | None = None,
           largest_layer_params: float | None = None, stack: str | None = None,
           margin: float | None = None, fixed: bool = True) -> dict[str, Any]:
    """Bytes per GPU for `mgbench memory` (model states, and the ZeRO-3 working set when
    ``largest_layer_params`` is given, when only ``params`` is known), as ``stack`` (None:
    the default) holds them (planner/stack.py memory_of), with ``margin`` (None: the
    default allowance) kept free; ``fixed``: a GPU process's fixed costs counted (False for
    CPU ranks)."""
    from .memory import ALLOWANCE_FRACTION
    from .stack import memory_of

    validate(layout, shape)
    m = memory_per_gpu(shape, params=params, seq=layout.seq_len, micro_batch=layout.micro_batch,
                       num_micro=layout.num_micro, tp=layout.tp, pp=layout.pp, dp=layout.dp, zero=layout.zero,
                       precision=layout.precision, recompute=RECOMPUTE.index(layout.recompute),
                       sp=layout.sequence_parallel, flash=layout.flash_attention, schedule=layout.schedule,
                       virtual_stages=layout.virtual_stages, largest_layer_params=largest_layer_params,
                       ep=layout.ep, cp=layout.cp, replicas=layout.replicas, offload=layout.offload,
                       **memory_of(stack), margin=ALLOWANCE_FRACTION if margin is None else margin, fixed=fixed)
    out = {k: float(m[k]) for k in MEMORY_KEYS}
    # Offloaded model states: in host memory, not in the device total.
    out["host_bytes"] = float(m["host_bytes"])
    out["notes"] = runner_notes(shape, layout)
    if shape is None and layout.zero >= 3 and largest_layer_params is None:
        out["notes"] += ["ZeRO-3's gathered working set is not counted: the largest layer is unknown with --params; "
                        "give --largest-layer-params N (DeepSpeed's estimator takes the same)"]
    out["layout"] = {"num_gpus": layout.num_gpus, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
                     "zero": layout.zero, "micro_batch": layout.micro_batch, "precision": layout.precision,
                     "recompute": layout.recompute, "ep": layout.ep, "cp": layout.cp, "hsdp_replicas": layout.replicas,
                     "offload": layout.offload, "schedule": layout.schedule}
    out["stack"] = stack or "megatron-lm (default)"
    return out


def predict(shape: ModelShape, hw: Hardware, layout: Layout, overlap: float = perf.DEFAULT_OVERLAP,
            host_ops: dict[str, float] | None = None, margin: float | None = None) -> dict[str, Any]:
    """Step time, throughput, MFU, memory and whether it fits, for `mgbench predict`
    (``host_ops``: the layout's counted non-matmul ops, for a probed CPU Hardware)."""
    validate(layout, shape)
    out = layout_time.step_time(shape, hw, seq=layout.seq_len, global_batch=layout.batch,
                                micro_batch=layout.micro_batch, tp=layout.tp, pp=layout.pp, dp=layout.dp,
                                zero=layout.zero, recompute=RECOMPUTE.index(layout.recompute),
                                precision=layout.precision, schedule=layout.schedule,
                                virtual_stages=layout.virtual_stages, overlap=overlap, sp=layout.sequence_parallel,
                                flash=layout.flash_attention, ep=layout.ep, cp=layout.cp, replicas=layout.replicas,
                                offload=layout.offload, host_ops=host_ops)
    notes = out.pop("notes")
    res = _floats(out)
    mem = memory(shape, layout, stack=hw.stack, margin=margin, fixed=hw.ew_bw is None)  # a probed CPU: no CUDA
    res["notes"] = notes + mem.pop("notes")
    res["memory"] = mem
    res["fits"] = mem["total_bytes"] <= hw.memory_bytes
    res["device_memory_bytes"] = hw.memory_bytes
    res["system"], res["gpu"] = hw.system, hw.gpu
    res["global_batch"] = layout.batch
    res["assumptions"] = {"matmul_eff": hw.compute_eff, "elementwise_passes": hw.elementwise_passes,
                          "overlap": overlap, "peak_tflops": hw.peak_tflops, "mfu_peak": f"{hw.peak_tflops:g} TFLOP/s "
                          f"({layout_time.hardware_precision(layout.precision)})"}
    if layout.precision == "fp8":
        res["assumptions"]["fp8_peak_tflops"] = layout_time.fp8_peak_tflops(hw)
    if hw.ew_bw is not None and host_ops is not None:
        res["assumptions"].update(op_overhead_s=hw.op_overhead_s, elementwise_bytes_per_s=hw.ew_bw,
                                  host_ops=host_ops["ops"], host_bytes=host_ops["bytes"])
    return res
