"""What a run folder holds, typed and versioned: the :class:`Record` of one config, the
per-rank figures it is summarised from, and the migrations that read older folders.

A record on disk is one flat JSON object (records.jsonl): the config's parameters
(model dims as ``model_*``), then every declared field below. Each field says its unit
(in its name and in ``unit``) and what it means; a figure that could not be measured is
None with a ``*_reason`` field saying why. Records, manifests and comm rows carry
``schema_version``; :func:`migrate_record` / :func:`migrate_manifest` bring older ones
up to date (asv's ``api_version`` + ``update_to_N``) and a folder written by a newer
mgbench is refused with a message. Torch-free, so the launcher builds records for
skipped and failed configs without loading the rank side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .config import RunConfig, config_id
from .errors import MgbenchError
from .model_shape import ModelShape
from .record_values import fields_as_written
from .workloads import SPEC_RECORD_KEYS

SCHEMA_VERSION = 5
# A config key whose name is also a record figure is stored under another name in the
# flat record: the suite's tokens_per_step (what a user's command says one step trains)
# beside the measured tokens_per_step figure.
CONFIG_RENAMED = {"tokens_per_step": "config_tokens_per_step"}
STATUSES = ("ok", "checked", "oom", "timeout", "error", "skipped", "interrupted")
# The statuses of a config that ran and did not finish.
FAILED_STATUSES = ("error", "oom", "timeout")
# "checked": a negative control (inject = bug:...) ran its correctness window and nothing
# else. A deliberately broken config's speed is not a result, so it is not timed; its
# verdict (correct: false when the check caught the bug) is the whole record.


def figure(unit: str, help: str) -> Any:
    """A measured or derived figure: None until known."""
    return field(default=None, metadata={"unit": unit, "help": help})


@dataclass
class RankFigures:
    """One rank's raw figures for one config (all rounds merged), gathered by rank 0."""

    rank: int
    init_s: float
    warmup_s: float
    measured_s: float
    busy_s: float  # main-thread CPU time over the measured windows
    busy_steps: list[float]  # main-thread CPU time of each measured step
    windows: list[list[float]]  # step times of each measured window
    losses: list[float]  # global loss of every warm-up and measured step
    mem_method: str
    mem_peak_gib: float | None
    mem_reserved_peak_gib: float | None
    energy_j: float | None
    window_s: float  # wall time the energy meter covered
    energy_method: str
    energy_reason: str | None
    breakdown: dict[str, float] | None = None
    check: dict[str, Any] | None = None  # the correctness window's figures (the same on every rank)
    energy_steps: int | None = None  # training steps the energy window held (timed + top-up)
    energy_min_window_s: float | None = None  # the shortest window the meter's method allows
    energy_update_interval_s: float | None = None  # the meter's counter: observed time between updates
    energy_device_match: str | None = None  # how the meter found its device (NVML: PCI bus id, UUID, index)
    mem_init_peak_gib: float | None = None  # peak while building, placing and sharding the model (mem_method)
    mem_tracked: dict[str, int] | None = None  # tracked step: bytes per category at its peak, and "peak"
    mem_tracked_method: str | None = None
    mem_tracked_reason: str | None = None  # why mem_tracked is None
    mem_tracked_s: float | None = None  # wall time of the tracked step
    data_waits: list[float] | None = None  # data = "disk": the device's wait for each measured step's batch
    data_method: str | None = None  # data = "disk": how the batches were read
    data_host_waits: list[float] | None = None  # data = "disk": the host's wait for each measured step's batch
    data_wait_method: str | None = None  # data = "disk": how data_waits were measured (data_loading.GPU_STALL...)
    compile_counts: dict[str, Any] | None = None  # compile = true: num_recompiles, num_graph_breaks, their reason
    moe: dict[str, Any] | None = None  # MoE models: routing figures of the timed window (workloads/moe.finish_log)


@dataclass
class Record:
    """The result of one config: parameters, status, metrics with units, methods and the
    reasons for every null. Written by the worker (measured) or the launcher (skipped,
    failed, timed out, interrupted)."""

    config: RunConfig
    run_id: str
    status: str
    error: str | None = figure("", "why the config did not end ok (None when ok)")
    error_type: str | None = figure("", "exception type of the rank that failed first")
    skip_reason: str | None = figure("", "why the config could not run here")
    backend: str | None = figure("", "torch.distributed backend: gloo or nccl")
    torch_version: str | None = figure("", "torch of the ranks (None: not started)")
    started_at: str | None = figure("iso8601", "when the config's first round started")
    finished_at: str | None = figure("iso8601", "when its record was written")
    stderr_files: list[str] | None = figure("path", "each failed rank's stderr tail, relative to the run folder")
    samples_file: str | None = figure("path", "raw per-rank step times and losses, relative to the run folder")
    # step time: a step ends when its slowest rank ends (max over ranks, per step)
    step_time_s: float | None = figure("s", "median step time")
    step_time_p10_s: float | None = figure("s", "10th percentile step time")
    step_time_p90_s: float | None = figure("s", "90th percentile step time")
    step_time_mean_s: float | None = figure("s", "mean step time")
    step_time_stddev_s: float | None = figure("s", "standard deviation of step times")
    step_time_min_s: float | None = figure("s", "fastest step")
    step_time_max_s: float | None = figure("s", "slowest step")
    step_time_ci95_low_s: float | None = figure("s", "95% confidence interval of the median, low")
    step_time_ci95_high_s: float | None = figure("s", "95% confidence interval of the median, high")
    step_time_ci95_reason: str | None = figure("", "why the interval is null (too few measured steps)")
    step_times_s: list[float] | None = figure("s", "every measured step")
    num_steps_measured: int | None = figure("count", "measured steps over all windows and rounds")
    repeat_medians_s: list[float] | None = figure("s", "median of each measured window (compare tests these)")
    per_rank_step_time_median_s: list[float] | None = figure("s", "each rank's own median step time")
    # throughput and efficiency
    global_batch: int | None = figure("sequences", "sequences per optimizer step")
    tokens_per_step: int | None = figure("tokens", "tokens per optimizer step")
    tokens_per_s: float | None = figure("tokens/s", "tokens per second, all ranks")
    tokens_per_s_per_device: float | None = figure("tokens/s", "tokens per second per rank")
    samples_per_s: float | None = figure("sequences/s", "sequences per second (vision: images per second)")
    tokens_reason: str | None = figure("", "why the token figures are null (the vision workload counts images; a "
                                       "command that reported no tokens per step)")
    images_per_s: float | None = figure("images/s", "vision: images per second, all ranks")
    images_per_s_per_device: float | None = figure("images/s", "vision: images per second per rank")
    flops_per_image: float | None = figure("FLOP", "vision: model FLOPs per image, forward + backward (3 x the "
                                           "forward's 2 x multiply-accumulates of its convolutions and matmuls)")
    num_params: int | None = figure("count", "trainable parameters")
    flops_per_token: float | None = figure("FLOP", "model FLOPs per token, forward + backward (6N + 12Lhs)")
    model_tflops_per_device: float | None = figure("TFLOP/s", "model FLOPs per second per device")
    peak_tflops: float | None = figure("TFLOP/s", "the device's dense peak for this precision (catalog)")
    mfu_pct: float | None = figure("%", "model FLOPs utilisation")
    mfu_reason: str | None = figure("", "why MFU is null")
    hfu_pct: float | None = figure("%", "fp8 configs: model FLOPs against the device's dense fp8 peak (MFU uses the "
                                   "bf16 peak); no recomputation added")
    hfu_peak_tflops: float | None = figure("TFLOP/s", "the fp8 dense peak hfu_pct divides by (catalog)")
    hfu_reason: str | None = figure("", "why hfu_pct is null")
    fp8_speed_reason: str | None = figure("", "fp8 configs on CPU: why their speed says nothing about fp8 hardware")
    offload_reason: str | None = figure("", "offload = true: why no host-device transfer was measured (CPU ranks)")
    mfu_peak_precision: str | None = figure("", "the catalog peak MFU divides by: the config's precision, or tf32 "
                                            "for fp32 whose matmuls ran on TF32 tensor cores (tf32_matmul)")
    tf32_matmul: bool | None = figure("", "fp32 matmuls (a ResNet's: convolutions, cuDNN's setting) allowed on TF32 "
                                      "tensor cores (CUDA; None on CPU)")
    fp32_matmul_setting: str | None = figure("", "the torch setting tf32_matmul was read from, with its value "
                                             "(torch.backends.cuda.matmul.fp32_precision or "
                                             "torch.get_float32_matmul_precision())")
    device_memory_gib: float | None = figure("GiB", "the device's total memory (tells catalog variants that share "
                                             "a name apart; None on CPU)")
    device_name: str | None = figure("", "device the ranks ran on")
    # memory
    mem_peak_gib: float | None = figure("GiB", "training peak of the busiest rank, from the sharded model on "
                                        "(method: mem_method)")
    mem_peak_gib_per_rank: list[float | None] | None = figure("GiB", "training peak per rank")
    mem_reserved_peak_gib: float | None = figure("GiB", "training peak the CUDA allocator reserved")
    mem_method: str | None = figure("", "how mem_peak_gib / mem_init_peak_gib were read: cuda_max_allocated (the "
                                    "caching allocator's max allocated bytes); cpu_peak_rss_per_rank (the rank "
                                    "process's resident set size high-water mark, Linux VmHWM, reset per window: "
                                    "includes the interpreter, libraries and allocator slack); "
                                    "cpu_process_lifetime_peak_rss (VmHWM that could not be reset)")
    mem_init_peak_gib: float | None = figure("GiB", "peak of the busiest rank while the model was built, placed on "
                                             "the device and sharded (method: mem_method); the training peak "
                                             "window opens after it")
    mem_init_peak_gib_per_rank: list[float | None] | None = figure("GiB", "init peak per rank")
    # tracked memory: one extra untimed step under torch's tensor accounting (telemetry/memory.py)
    mem_tracked_peak_bytes: int | None = figure("B", "largest sum of live tensor bytes during one training step, "
                                                "busiest rank (torch MemTracker / FSDPMemTracker)")
    mem_tracked_peak_bytes_per_rank: list[int] | None = figure("B", "tracked peak per rank")
    mem_tracked_params_bytes: int | None = figure("B", "parameters (this rank's shards) at the busiest rank's "
                                                  "tracked peak; the mem_tracked_*_bytes add up to the peak")
    mem_tracked_gathered_params_bytes: int | None = figure("B", "FSDP's gathered (unsharded) parameters at the "
                                                           "tracked peak")
    mem_tracked_grads_bytes: int | None = figure("B", "gradients at the tracked peak")
    mem_tracked_optimizer_bytes: int | None = figure("B", "optimizer states at the tracked peak (and the optimizer "
                                                     "step's own temporaries, when the peak falls inside it)")
    mem_tracked_activations_bytes: int | None = figure("B", "tensors made in forward (and in recomputation) at "
                                                       "the tracked peak")
    mem_tracked_temporaries_bytes: int | None = figure("B", "tensors made in backward other than gradients "
                                                       "(activation gradients, workspaces) at the tracked peak")
    mem_tracked_comm_bytes: int | None = figure("B", "communication buffers at the tracked peak: FSDP all-gather / "
                                                "reduce-scatter, DDP gradient buckets, pipeline send/receive")
    mem_tracked_other_bytes: int | None = figure("B", "module buffers (rotary tables) at the tracked peak")
    mem_tracked_categories_per_rank: list[dict[str, int]] | None = figure("B", "per rank: bytes per category at "
                                                                          "its own tracked peak, and the peak")
    mem_tracked_method: str | None = figure("", "the tracker and what was added to what it saw")
    mem_tracked_reason: str | None = figure("", "why the tracked figures are null")
    mem_tracked_s: float | None = figure("s", "wall time of the tracked step, slowest rank: what tracking added to "
                                         "the config's run time")
    # phases
    init_s: float | None = figure("s", "build and shard the model (slowest rank)")
    warmup_s: float | None = figure("s", "untimed warm-up steps (slowest rank)")
    measured_s: float | None = figure("s", "timed windows (slowest rank)")
    # energy
    energy_j: float | None = figure("J", "energy over the measured windows (method: energy_method)")
    power_w: float | None = figure("W", "total power of all devices measured (the sum over GPUs, or over CPU "
                                   "packages), averaged over the window: energy_j / energy_window_s")
    power_w_per_device: float | None = figure("W", "power_w / the number of GPUs measured (GPU runs only)")
    energy_per_token_j: float | None = figure("J/token", "energy per trained token (energy_j / tokens of the "
                                             "num_energy_steps)")
    energy_window_s: float | None = figure("s", "wall time the energy counter covered")
    num_energy_steps: int | None = figure("count", "training steps inside the energy window: the timed steps plus "
                                      "untimed ones added to reach energy_min_window_s")
    energy_min_window_s: float | None = figure("s", "shortest energy window allowed (telemetry/energy.py "
                                               "min_window: its floor, updates per window and cap, and why)")
    energy_update_interval_s: float | None = figure("s", "observed time between updates of the energy counter "
                                                    "(slowest rank; None: not probed, or it did not change while probed)")
    energy_device_match: list[str | None] | None = figure("", "per rank: how its energy meter found its device "
                                                          "(NVML by PCI bus id, UUID or index)")
    energy_method: str | None = figure("", "nvml_counter | nvml_power_sampling | rapl | none")
    energy_reason: str | None = figure("", "why energy is null, and with it power_w, power_w_per_device and "
                                           "energy_per_token_j (all read from the same counter)")
    # losses and the correctness check
    losses: list[float] | None = figure("nats", "global loss of every warm-up and measured step")
    loss_first: float | None = figure("nats", "first step's loss")
    loss_last: float | None = figure("nats", "last step's loss")
    correct: bool | None = figure("", "same results as the single-process reference (None: not checked)")
    correct_reason: str | None = figure("", "what differed, by how much and against which tolerance; or why "
                                        "nothing was checked")
    check_mismatches: list[str] | None = figure("", "what differed: loss, grad_norm, params")
    lossy: bool | None = figure("", "gradient compression: checked with the looser lossy tolerance")
    check_data: str | None = figure("", "the check window's learnable data source")
    check_lr: float | None = figure("", "the check window's learning rate (config and reference alike)")
    check_losses: list[float] | None = figure("nats", "global loss of each check step")
    check_losses_ref: list[float] | None = figure("nats", "the reference's loss of each check step")
    loss_max_rel_diff: float | None = figure("ratio", "largest relative loss difference over the check steps")
    loss_tolerance: float | None = figure("ratio", "relative loss tolerance the check used")
    grad_norm: float | None = figure("", "global gradient L2 norm after check step 1 (before the optimizer)")
    grad_norm_ref: float | None = figure("", "the reference's")
    grad_norm_rel_diff: float | None = figure("ratio", "relative difference of the gradient norms")
    grad_norm_tolerance: float | None = figure("ratio", "its tolerance")
    param_norm: float | None = figure("", "global L2 norm of the weights after the check window")
    param_norm_ref: float | None = figure("", "the reference's")
    param_norm_rel_diff: float | None = figure("ratio", "relative difference of the weight norms")
    param_norm_tolerance: float | None = figure("ratio", "its tolerance")
    param_delta_norm: float | None = figure("", "global L2 norm of the weights' change since init")
    param_delta_norm_ref: float | None = figure("", "the reference's")
    param_delta_rel_diff: float | None = figure("ratio", "relative difference of the change norms")
    param_delta_tolerance: float | None = figure("ratio", "its tolerance")
    param_rel_diff: float | None = figure("ratio", "the larger of the two parameter differences")
    loss_ref: list[float] | None = figure("nats", "schema 1: the reference's losses over the checked steps")
    # mixture of experts (MoE models; timed window, whole global batch)
    moe_tokens_dropped_per_step: list[float] | None = figure("count", "per timed step: token-expert assignments "
                                                             "dropped by the capacity limit, all MoE layers (0 when "
                                                             "dropless)")
    moe_tokens_dropped_pct: float | None = figure("%", "dropped assignments / routed assignments over the timed "
                                                  "window")
    moe_load_imbalance_per_step: list[float] | None = figure("ratio", "per timed step: max / mean assignments per "
                                                             "expert (before drops), the mean over MoE layers; 1 is "
                                                             "perfectly balanced")
    moe_load_imbalance: float | None = figure("ratio", "max / mean assignments per expert, mean over timed steps and "
                                              "MoE layers")
    moe_load_imbalance_max: float | None = figure("ratio", "the worst MoE layer and step")
    moe_expert_compute: str | None = figure("", "how the experts' matmuls ran: grouped_mm (torch._grouped_mm) or "
                                            "loop (one matmul chain per local expert), with why")
    # context parallelism (strategy cp; strategies/context_parallel.py)
    cp_attention_impl: str | None = figure("", "cp: the attention form that ran: ring_allgather / ring_alltoall (torch's "
                                           "ring attention) or allgather_kv (K and V all-gathered, SDPA with a mask)")
    cp_sdpa_kernel: str | None = figure("", "cp: the SDPA kernel torch's selector picks for one rank's attention "
                                        "call in that form, asked on an empty probe of at most 128 tokens with the "
                                        "config's heads, dims and dtype, not read from the run "
                                        "(torch._fused_sdp_choice: FLASH_ATTENTION, EFFICIENT_ATTENTION, "
                                        "CUDNN_ATTENTION or MATH; on CPU FLASH_ATTENTION is its CPU flash kernel)")
    cp_attention_reason: str | None = figure("", "cp: why that form ran (cp_attention, the device, the kernel)")
    # pipelines
    pp_bubble_theoretical: float | None = figure("fraction", "schedule's idle fraction in theory")
    pp_bubble_measured: float | None = figure("fraction", "measured idle fraction (CPU ranks with cores of their own)")
    pp_bubble_per_rank: list[float] | None = figure("fraction", "measured idle fraction per rank")
    pp_bubble_reason: str | None = figure("", "why the measured bubble is null")
    pp_bubble_theoretical_reason: str | None = figure("", "why the theoretical bubble is null")
    pp_grad_sync: str | None = figure("", "pipelines with dp > 1: how the replicas' gradients were reduced: "
                                      "ddp_reducer, allreduce_after_schedule, fsdp_reduce_grad or "
                                      "fsdp_reduce_grad_unsharded (strategies/schedules.py GRAD_SYNC; None: no "
                                      "data parallelism)")
    # rank spread
    per_rank_busy_s: list[float] | None = figure("s", "median busy (main-thread CPU) time per step, per rank")
    rank_spread_pct: float | None = figure("%", "busiest vs least busy rank")
    straggler_ranks: list[int] | None = figure("", "ranks busier than 1.2x the least busy")
    rank_spread_reason: str | None = figure("", "why the spread is null")
    # data loading (data = "disk"; runner/data_loading.py)
    data_wait_s: float | None = figure("s", "time the device sat idle waiting for a step's batch (method: "
                                       "data_wait_method): on CPU ranks the training loop's wait, inside next() on "
                                       "the DataLoader plus issuing the host->device copy; on CUDA the GPU's stall, "
                                       "from CUDA events, not the host's wait; median over measured steps, slowest "
                                       "rank")
    data_wait_steps_s: list[float] | None = figure("s", "data wait of every measured step (max over ranks)")
    data_wait_per_rank_s: list[float] | None = figure("s", "each rank's median data wait per step")
    data_wait_fraction: float | None = figure("fraction", "data_wait_s / step_time_s")
    data_host_wait_s: float | None = figure("s", "time the host waited for a step's batch (inside next() on the "
                                            "DataLoader plus issuing its copy); median over measured steps, slowest "
                                            "rank. On CPU ranks data_wait_s itself; on CUDA more than it where the "
                                            "GPU still had queued work while the host waited")
    data_wait_method: str | None = figure("", "how data_wait_s was measured: host_wait (CPU ranks) or cuda_events "
                                          "(the GPU's idle time between finishing its queued work and the batch's "
                                          "copies), with what each counts (runner/data_loading.py)")
    input_bound: bool | None = figure("", "data_wait_fraction above INPUT_BOUND_FRACTION (0.1): the loader, not "
                                      "the model, sets the pace; judged on the device's wait, not the host's "
                                      "(None: data = random, or not measured on the device)")
    data_method: str | None = figure("", "how the batches were read: DataLoader settings, dataset, passes over it")
    data_reason: str | None = figure("", "why the data-wait figures are null")
    # torch.compile (compile = true; strategies/pieces.CompileCounts)
    num_recompiles: int | None = figure("count", "compile = true: compiles of a function after its first (dynamo's "
                                        "compile ids k/1, k/2, ...) from the config's build to the end of its timed "
                                        "steps, most of any rank, added over rounds; each config starts from a reset "
                                        "compiler. At torch._dynamo.config.recompile_limit (8) of one function, "
                                        "dynamo runs it eager from then on")
    num_graph_breaks: int | None = figure("count", "compile = true: graph breaks dynamo met over the same span "
                                          "(torch._dynamo.utils.counters['graph_break']; each compile counts its "
                                          "own), most of any rank, added over rounds")
    compile_counts_reason: str | None = figure("", "why num_recompiles / num_graph_breaks are null")
    # profiled breakdown (profile = true)
    breakdown_window_s: float | None = figure("s", "profiled step time")
    breakdown_compute_s: float | None = figure("s", "compute per profiled step")
    breakdown_comm_s: float | None = figure("s", "communication per profiled step")
    breakdown_overlapped_comm_s: float | None = figure("s", "communication hidden behind compute")
    breakdown_exposed_comm_s: float | None = figure("s", "communication not hidden behind compute")
    breakdown_idle_s: float | None = figure("s", "neither compute nor communication")
    breakdown_per_rank: list[dict[str, float]] | None = figure("", "the split per rank")
    comm_fraction: float | None = figure("fraction", "exposed communication / step")
    breakdown_method: str | None = figure("", "what was counted as compute and as communication")
    # the user's own command (workload = "command", runner/command.py), measured from outside
    command_argv: list[str] | None = figure("", "the argv mgbench ran: the command and args, under torchrun when "
                                            "mgbench launched a plain python script")
    exit_code: int | None = figure("", "the command's exit status (negative: ended by that signal)")
    wall_s: float | None = figure("s", "the command's wall time, launch to exit")
    step_source: str | None = figure("", "where step ends came from: step_file (mgbench.step() events) or "
                                     "step_pattern (log lines matching the regex, timed as the launcher read them)")
    num_steps_seen: int | None = figure("count", "finished steps the command reported, warm-up included")
    step_file_malformed: int | None = figure("count", "step file lines that could not be read (left out)")
    ranks_reported: int | None = figure("count", "ranks whose steps the step file holds; per-device figures divide "
                                        "by these")
    ranks_warning: str | None = figure("", "why ranks_reported is not nproc (None: it is, or no step file)")
    log_file: str | None = figure("path", "the command's stdout and stderr, relative to the run folder")
    stderr_tail: str | None = figure("", "the last lines of the command's stderr")
    mem_reason: str | None = figure("", "why mem_peak_gib is null")
    gpu_devices: list[str] | None = figure("", "the GPUs (NVML) a command's memory, power and energy were read "
                                           "from, and how they were tied to it")

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form: schema version, parameters (model dims as model_*), figures."""
        cfg = self.config.to_dict()
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        out.update({CONFIG_RENAMED.get(k, k): v for k, v in cfg.items() if k not in ("model", "skip_reason")})
        out.update({f"model_{k}": v for k, v in cfg["model"].items()})
        out["label"] = self.config.label
        for f in dataclasses.fields(self):
            if f.name != "config":
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_dict(cls, flat: dict[str, Any]) -> "Record":
        """A record read back (migrate it first): its config and its declared figures;
        anything undeclared is an error, so a misspelt field cannot pass silently."""
        cfg = config_from_record(flat)
        config_keys = ({CONFIG_RENAMED.get(f.name, f.name) for f in dataclasses.fields(RunConfig)} - {"skip_reason"}) \
            | {"label", "schema_version"}
        config_keys |= {f"model_{f.name}" for f in dataclasses.fields(ModelShape)} | set(SPEC_RECORD_KEYS)
        figures = {k: v for k, v in flat.items() if k not in config_keys}
        unknown = sorted(set(figures) - set(RECORD_FIELDS))
        if unknown:
            raise MgbenchError(f"record {flat.get('config_id')}: undeclared field(s) {', '.join(unknown)}")
        return cls(cfg, **figures)

    @classmethod
    def skipped(cls, cfg: RunConfig, run_id: str) -> "Record":
        """The record of a config that cannot run here."""
        return cls(cfg, run_id, "skipped", skip_reason=cfg.skip_reason, global_batch=batch_of(cfg),
                   backend=backend_of(cfg))

    @classmethod
    def failed(cls, cfg: RunConfig, run_id: str, status: str, error: str, **figures: Any) -> "Record":
        """The record of a config whose job did not finish it (error, oom, timeout, interrupted)."""
        if status not in STATUSES or status in ("ok", "checked", "skipped"):
            raise ValueError(status)
        return cls(cfg, run_id, status, error=error, **{"global_batch": batch_of(cfg), "backend": backend_of(cfg),
                                                        **figures})


RECORD_FIELDS = {f.name: f for f in dataclasses.fields(Record) if f.name != "config"}


def config_from_record(rec: dict[str, Any]) -> RunConfig:
    """The config a flat record was measured with (its parameters and model_* dims)."""
    params = fields_as_written(RunConfig, rec, renamed=CONFIG_RENAMED)
    params.pop("model", None)
    params["label_keys"] = tuple(params.get("label_keys") or ())
    from .workloads import spec_from_record  # model_* dims, or a Hugging Face / vision model

    return RunConfig(model=spec_from_record(rec), **params)


def identity_of_record(rec: dict[str, Any]) -> tuple:
    """The workload identity of the config a flat record was measured with: the same as
    :meth:`RunConfig.identity` of that config."""
    return config_from_record(rec).identity()


def backend_of(cfg: RunConfig) -> str | None:
    """The torch.distributed backend mgbench's ranks use (None: the user's command picks its own)."""
    if cfg.workload == "command":
        return None
    return "nccl" if cfg.device == "cuda" else "gloo"


def batch_of(cfg: RunConfig) -> int | None:
    """Sequences per optimizer step (None for a user's command: mgbench does not know them)."""
    return None if cfg.workload == "command" else cfg.global_batch


def control_verdict(rec: dict[str, Any]) -> str:
    """What a negative control's record (status "checked") says: whether the correctness
    check caught its injected bug. Not caught means the check cannot be trusted."""
    bug = rec.get("inject")
    if rec.get("correct") is False:
        return f"{bug} caught: " + "/".join(rec.get("check_mismatches") or ["results"]) + " differ from the reference"
    if rec.get("correct") is True:
        return f"{bug} NOT CAUGHT: the check passed a deliberately broken config, so it cannot be trusted here"
    return f"{bug} not judged: {rec.get('correct_reason')}"


# --- migrations: each brings version N-1 to N; applied in order on read ---------------

def _records_v0_to_v1(rec: dict[str, Any]) -> dict[str, Any]:
    return rec  # records written before versioning had the same fields


def _records_v1_to_v2(rec: dict[str, Any]) -> dict[str, Any]:
    # The runner's every-second-block checkpointing was called "selective", which is
    # the planner's name for Korthikanti et al.'s selective recompute.
    if rec.get("activation_checkpointing") == "selective":
        rec["activation_checkpointing"] = "every_2nd"
    # Labels left out workload fields (two configs differing only in grad_compression had
    # one label), and ids hashed an unresolved layout.
    _today_identity(rec)
    rec.setdefault("label_keys", [])
    if rec.get("correct") is not None and "check_data" not in rec:
        # Schema 1 compared losses on random tokens only, a check that could not fail
        # (a model that never trained passed it): say so beside its verdict.
        rec["check_data"] = "random tokens, loss only (schema 1; could not detect a frozen model)"
    return rec


def _records_v2_to_v3(rec: dict[str, Any]) -> dict[str, Any]:
    # Ids hashed every suite key, so each key added since changed every id; they now hash
    # the keys away from their defaults (config.config_id).
    return _today_identity(rec)


def _today_identity(rec: dict[str, Any]) -> dict[str, Any]:
    """Today's label and id of a record's config, so that `--resume` of an old folder
    finds its configs (records of a user's command or without a model are left as they are)."""
    if "model_layers" in rec and "strategy" in rec:
        cfg = config_from_record(rec)
        rec["label"] = cfg.label
        rec["config_id"] = config_id(cfg.params())
    return rec


def _records_v3_to_v4(rec: dict[str, Any]) -> dict[str, Any]:
    # Negative controls were timed and read "ok"; their timed steps ran the clean model
    # (the bug only ever reached the check window), so those figures were a clean config's
    # again. Their status is now "checked": figures kept as written, out of every view of
    # results (which read "ok" records).
    if rec.get("status") == "ok" and str(rec.get("inject", "none")).startswith("bug:"):
        rec["status"] = "checked"
    return rec


def _records_v4_to_v5(rec: dict[str, Any]) -> dict[str, Any]:
    # data = "disk" waits were the host's everywhere. On CPU ranks that is the device's
    # wait (kept, said so); on CUDA it is not the GPU's idle time (the GPU may have had
    # queued work all along), so it moves to data_host_wait_s and input_bound is not judged.
    if rec.get("data") != "disk" or rec.get("data_wait_s") is None:
        return rec
    rec["data_host_wait_s"] = rec["data_wait_s"]
    if rec.get("device") != "cuda":
        rec["data_wait_method"] = "host_wait (schema 4): the training loop's wait, on CPU ranks"
        return rec
    for k in ("data_wait_s", "data_wait_steps_s", "data_wait_per_rank_s", "data_wait_fraction", "input_bound"):
        rec[k] = None
    rec["data_wait_method"] = "host_wait (schema 4): the host's wait, not the GPU's idle time"
    rec["data_reason"] = ("schema 4 timed the host's wait on CUDA (now data_host_wait_s), which is not the GPU's idle "
                          "time: the GPU's wait was not measured and input_bound is not judged")
    return rec


RECORD_MIGRATIONS = {1: _records_v0_to_v1, 2: _records_v1_to_v2, 3: _records_v2_to_v3, 4: _records_v3_to_v4,
                     5: _records_v4_to_v5}


def _manifest_v1_to_v2(m: dict[str, Any]) -> dict[str, Any]:
    for sweep in (m.get("suite") or {}).get("sweeps") or []:
        ac = sweep.get("activation_checkpointing")
        if ac is not None:
            sweep["activation_checkpointing"] = ["every_2nd" if v == "selective" else v for v in ac]
    return m


# 4: unchanged (its counts by status are those written: negative controls under "ok").
# 5: unchanged (records only: data waits on CUDA, compile counts).
MANIFEST_MIGRATIONS = {1: lambda m: m, 2: _manifest_v1_to_v2, 3: lambda m: m, 4: lambda m: m, 5: lambda m: m}


def _migrate(obj: dict[str, Any], migrations: dict[int, Any], what: str) -> dict[str, Any]:
    version = obj.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise MgbenchError(f"{what} has schema_version {version}, newer than this mgbench reads ({SCHEMA_VERSION}): "
                           "it was written by a newer mgbench; upgrade mgbench (pip install -U mgbench)")
    for v in range(version + 1, SCHEMA_VERSION + 1):
        obj = migrations[v](obj)
    obj["schema_version"] = SCHEMA_VERSION
    return obj


def migrate_record(rec: dict[str, Any]) -> dict[str, Any]:
    """Bring a record of any known schema version up to SCHEMA_VERSION."""
    return _migrate(rec, RECORD_MIGRATIONS, "a record")


def migrate_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Bring a manifest of any known schema version up to SCHEMA_VERSION."""
    return _migrate(manifest, MANIFEST_MIGRATIONS, "the manifest")


# --- comm rows (comm.jsonl of `mgbench comm`) ---------------------------------------

# 1: rows carry schema_version. Version 0 (no field) rows have the same fields.
# 2: rows carry "kind": "collective", or "copy" for the copy-bandwidth rows (comm/copies.py),
#    which an older mgbench would read as collectives.
COMM_ROW_VERSION = 2


def migrate_comm_row(row: dict[str, Any], where: str = "comm row") -> dict[str, Any]:
    """Bring a row of any known version up to COMM_ROW_VERSION; refuse newer ones
    (their fields may mean something this mgbench does not know)."""
    version = row.get("schema_version", 0)
    if version > COMM_ROW_VERSION:
        raise MgbenchError(f"{where}: written by a newer mgbench (row schema {version} > {COMM_ROW_VERSION}); "
                           "upgrade mgbench")
    # Version 0 -> 1: only the field was added. 1 -> 2: every older row is a collective.
    row.setdefault("kind", "collective")
    row["schema_version"] = COMM_ROW_VERSION
    return row
