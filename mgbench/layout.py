"""One parallel layout: the degrees, schedule, ZeRO stage and recompute of a training run.

A :class:`Layout` is what the runner's configs, `mgbench memory` / `predict` and `plan`'s
search all speak (in the spirit of torchtitan's ``ParallelDims``): the GPU count and the
degrees tp, pp, cp, ep (dp is what is left: ``num_gpus / (tp x pp x cp)``; ep is carved
out of dp, as Megatron-Core and torchtitan do it, and adds no ranks), the pipeline
schedule and its virtual stages, the ZeRO stage, recompute, micro-batch and batch.

Its fields may be numpy arrays: `plan`'s search holds millions of candidate layouts as
one vectorised Layout, and the properties below (dp, batch, num_micro, fsdp_enabled ...)
answer per row. Code asks these properties, never strategy names; the runner's strategy
names are converted to and from a Layout through the registry (strategies/__init__.py)
by :func:`for_strategy`, :meth:`Layout.from_config` and :meth:`Layout.runner_strategy`.

Rank order: pp-major, then dp, then cp, then tp (tp ranks are neighbours, so they share a
node first). Torch-free: the suite validator and the planner read it without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from .strategies import BY_NAME as STRATEGIES
from .strategies.schedules import VIRTUAL, chunks_per_rank

# Activation recomputation, one name everywhere (its index is the planner's integer form).
# The runner's checkpointing modes (mgbench.config.CHECKPOINTING): every_2nd checkpoints
# blocks 0, 2, 4, ... of each model chunk, full every block. selective is Megatron-LM's
# and NeMo's default (--recompute-granularity selective): each block's core attention
# (q.k, softmax, dropout, the weighted sum of values) runs again in backward and saves
# nothing (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", section 4, table 2: 34 s b h instead of s b h (34 + 5 a s / h) per
# layer). op is torchtitan's op-level selective activation checkpointing
# (activation_checkpoint.mode = "selective", selective_ac_option = "op"; its integer
# option 2 is every_2nd): every block is checkpointed, but the outputs of attention and of
# every second matmul are saved, so backward recomputes the other matmuls and the cheap
# elementwise ops. Its mm counter runs on across calls, and a block has an odd number of
# matmuls (7 for SwiGLU), so which half is saved alternates: priced as half of each
# block's matmul outputs saved and half of its matmul forward recomputed. The planner
# prices selective and op; the runner does not run them.
RECOMPUTE = ("none", "every_2nd", "full", "selective", "op")
# The optimizers the planner prices (planner/optimizer.py): AdamW, the default and the runner's,
# and Muon.
OPTIMIZERS = ("adamw", "muon")
RUNNER_RECOMPUTE = ("none", "every_2nd", "full")

# The largest value of each of a layout's numbers the planner takes. Products of them (GPUs
# x batch x sequence) stay exact in int64 far below these, and no published run comes
# near: 2^20 GPUs (or any parallel degree), 2^16 sequences a micro-batch, 2^36 a step (at
# least the most GPUs x the largest micro-batch, so a suggested batch is one it takes),
# 2^24 tokens a sequence.
MAX_DEGREE = 2 ** 20
MAX_MICRO_BATCH = 2 ** 16
LIMITS = {"num_gpus": MAX_DEGREE, "tp": MAX_DEGREE, "pp": MAX_DEGREE, "ep": MAX_DEGREE, "cp": MAX_DEGREE,
          "etp": MAX_DEGREE, "replicas": MAX_DEGREE, "virtual_stages": MAX_DEGREE, "micro_batch": MAX_MICRO_BATCH,
          "global_batch": MAX_DEGREE * MAX_MICRO_BATCH, "seq_len": 2 ** 24}
# The flag a layout field is given with where it is not the field's name.
FLAGS = {"replicas": "--hsdp"}


def flag_of(name: str) -> str:
    """The command-line flag of a layout field ("seq_len" -> "--seq-len", "replicas" -> "--hsdp")."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def optimizer_problem(name: Any) -> str | None:
    """Why ``name`` is not an optimizer the planner prices (:data:`OPTIMIZERS`), or None."""
    return None if name in OPTIMIZERS else f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}"


def fp8_recipe_problem(precision: str, recipe: str | None) -> str | None:
    """Why an FP8 scaling recipe cannot go with ``precision`` (one only goes with fp8), in
    one line; None where it can."""
    if recipe is not None and precision != "fp8":
        return (f"--fp8-recipe {recipe} applies to --precision fp8 (this layout trains in {precision}): drop it, "
                "or add --precision fp8")
    return None


def fp8_attention_problem(precision: str, fp8_attention: Any, recipe: str | None = None,
                          flash: Any = True) -> str | None:
    """Why FP8 attention cannot go with ``precision``, the FP8 ``recipe`` (resolved; None:
    not known yet) or materialised attention (``flash`` False), in one line; None where it
    can. Transformer Engine runs it in its fused kernel only, under an FP8 recipe that passes
    it fp8_dpa, which Megatron-Core's blockwise one does not."""
    if not bool(fp8_attention):
        return None
    if precision != "fp8":
        return (f"--fp8-attention applies to --precision fp8 (this layout trains in {precision}): drop it, "
                "or add --precision fp8")
    if recipe == "blockwise":
        return ("--fp8-attention: Transformer Engine runs no FP8 attention under the blockwise recipe "
                "(Megatron-Core passes it no fp8_dpa): drop it, or give --fp8-recipe mxfp8, tensorwise or delayed")
    if not bool(np.all(flash)):
        return "--fp8-attention runs in the fused attention kernel: drop it, or drop --no-flash-attention"
    return None


def joined_problems(problems: list[str]) -> str:
    """Layout.runner_problems' lines as one: their shared "layout ... on world size N: "
    said once ("layout X: tp=3 does not divide the 4 attention heads; ... the 2 kv heads")."""
    if not problems:
        return ""
    head = problems[0].split(": ", 1)[0] + ": "
    if len(problems) > 1 and all(p.startswith(head) for p in problems):
        return head + "; ".join(p[len(head):] for p in problems)
    return "; ".join(problems)


@dataclass(frozen=True)
class Layout:
    """Degrees and knobs of one parallel layout (or, with array fields, of many)."""

    num_gpus: Any = 1
    tp: Any = 1
    pp: Any = 1
    cp: Any = 1  # context parallelism: each sequence split over cp ranks (adds ranks)
    ep: Any = 1  # expert parallelism, carved out of dp (adds none)
    zero: Any = 0  # ZeRO stage of the data parallelism: 0 (DDP), 1, 2, 3 (FSDP)
    micro_batch: Any = 1
    seq_len: int = 2048
    global_batch: Any = None  # sequences per step; None: one micro-batch per data-parallel rank
    precision: str = "bf16"
    recompute: Any = "none"  # a RECOMPUTE name, or its index (arrays in the search)
    sequence_parallel: Any = False
    flash_attention: bool = True
    schedule: str = "1f1b"
    virtual_stages: int = 1
    replicas: Any = 1  # HSDP: ZeRO-3 shards over dp x cp / replicas ranks, replicated across (1: plain)
    offload: Any = False  # FSDP2 CPU offload of weights, gradients and optimizer states (ZeRO-3)
    # Blocks on the last pipeline stage where the run sets them to make room for the output
    # layer (Megatron-LM --decoder-last-pipeline-num-layers, a pipeline layout string); the
    # other stages share the rest. None: every stage ceil(layers / pp). Priced, not run.
    pp_last_layers: Any = None
    # Expert tensor parallelism (MoE): each routed expert split over etp ranks, its
    # expert-parallel group ep x etp ranks of a stage's tp x dp x cp (Megatron-Core's
    # expert_tensor_parallel_size, whose default is the tp degree; 1, the planner's
    # default, is its MoE parallel folding with whole experts). Priced, not run.
    etp: Any = 1
    # The FP8 scaling recipe under precision fp8 (planner/perf.py FP8_RECIPES): what casting
    # costs. None: the stack's (planner/stack.py fp8_recipe). Priced, not run.
    fp8_recipe: str | None = None
    # Attention's scores and values in FP8 under precision fp8 (Transformer Engine's
    # fp8_dpa, Megatron-Bridge's fp8_dot_product_attention): priced at the FP8 / BF16
    # kernel-time ratio measured on the GPU (planner/layout_time.py). Priced, not run.
    fp8_attention: bool = False
    # The optimizer (:data:`OPTIMIZERS`; planner/optimizer.py): what its own step costs beyond an
    # elementwise update (Muon's Newton-Schulz iterations; under offload its states' copies).
    # Priced, not run: the runner trains with AdamW.
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        why = optimizer_problem(self.optimizer) or fp8_recipe_problem(self.precision, self.fp8_recipe) or fp8_attention_problem(
            self.precision, self.fp8_attention, self.fp8_recipe, self.flash_attention)
        if why is not None:
            from .errors import MgbenchError

            raise MgbenchError(why)

    @classmethod
    def of(cls, *, dp: int = 1, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1, **knobs: Any) -> "Layout":
        """A layout from its degrees (dp included) rather than its GPU count."""
        return cls(num_gpus=dp * tp * pp * cp, tp=tp, pp=pp, ep=ep, cp=cp, **knobs)

    @classmethod
    def from_config(cls, cfg: Any) -> "Layout":
        """The layout a runner config (:class:`mgbench.config.RunConfig`) trains with: its
        degrees, and from the strategy registry its ZeRO stage (config.zero_stage) and
        whether it is sequence parallel; HSDP's replicas where its data parallelism is HSDP."""
        strategy = STRATEGIES[cfg.strategy]
        hsdp = cfg.strategy == "hsdp" or (strategy.pipelined and cfg.dp_mode == "hsdp" and strategy.degrees)
        return cls.of(dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep, cp=cfg.cp, zero=cfg.zero_stage,
                      micro_batch=cfg.micro_batch, seq_len=cfg.seq_len, global_batch=cfg.global_batch,
                      precision=cfg.precision, recompute=cfg.activation_checkpointing,
                      sequence_parallel=strategy.sequence_parallel, schedule=cfg.pp_schedule,
                      virtual_stages=cfg.virtual_stages if cfg.pp_schedule in VIRTUAL else 1,
                      replicas=cfg.replicas if hsdp else 1, offload=bool(cfg.offload),
                      fp8_recipe=cfg.fp8_recipe if cfg.precision == "fp8" else None)

    @classmethod
    def from_published(cls, row: dict[str, Any]) -> "Layout":
        """The layout of a published training row (data/accelerator_runs.toml and
        data/published_moe_runs.toml share the keys): degrees as published, tp, pp, cp, ep
        1 where absent, sequence parallel with tp unless the row says otherwise, CPU offload
        where it says so, fused attention unless it says ``flash_attention = false``."""
        return cls(num_gpus=row["num_gpus"], tp=row.get("tp", 1), pp=row.get("pp", 1), cp=row.get("cp", 1),
                   ep=row.get("ep", 1), zero=row["zero"], micro_batch=row["micro_batch"], seq_len=row["seq"],
                   global_batch=row["global_batch"], precision=row["precision"], recompute=row["recompute"],
                   sequence_parallel=row.get("sequence_parallel", row.get("tp", 1) > 1),
                   schedule=row.get("schedule", "1f1b"),
                   virtual_stages=row.get("virtual_stages", 1), replicas=row.get("replicas", 1),
                   pp_last_layers=row.get("pp_last_layers"), fp8_recipe=row.get("fp8_recipe"), etp=row.get("etp", 1),
                   optimizer=row.get("optimizer", "adamw"),
                   fp8_attention=bool(row.get("fp8_attention", False)), offload=bool(row.get("offload", False)),
                   flash_attention=bool(row.get("flash_attention", True)))

    # -- derived degrees -------------------------------------------------------------------
    @property
    def dp(self) -> Any:
        """Data-parallel ranks: the GPUs left over tp x pp x cp."""
        return self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def world(self) -> Any:
        return self.num_gpus

    @property
    def batch(self) -> Any:
        """Sequences per step."""
        return self.global_batch if self.global_batch is not None else self.micro_batch * self.dp

    @property
    def num_micro(self) -> Any:
        """Micro-batches per step on each data-parallel rank (gradient accumulation)."""
        return self.batch // (self.micro_batch * self.dp)

    @property
    def recompute_index(self) -> Any:
        """recompute as its index in RECOMPUTE (the planner's models take the index)."""
        return RECOMPUTE.index(self.recompute) if isinstance(self.recompute, str) else self.recompute

    @property
    def recompute_name(self) -> str:
        """recompute as its name (a scalar layout's)."""
        return self.recompute if isinstance(self.recompute, str) else RECOMPUTE[int(self.recompute)]

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks each pipeline rank holds (schedule registry: virtual stages, or 2 in a V)."""
        return chunks_per_rank(self.schedule, self.virtual_stages)

    # -- what is enabled: ask these, not strategy names. Plain comparisons, so that they
    # answer per row where the fields are arrays (numpy compares elementwise).
    @property
    def tp_enabled(self) -> Any:
        return self.tp > 1

    @property
    def pipelined(self) -> Any:
        return self.pp > 1

    @property
    def cp_enabled(self) -> Any:
        return self.cp > 1

    @property
    def ep_enabled(self) -> Any:
        return self.ep > 1

    @property
    def fsdp_enabled(self) -> Any:
        """Parameters sharded over the data-parallel ranks (ZeRO-3: FSDP2's fully_shard)."""
        return self.zero == 3

    @property
    def hsdp_enabled(self) -> Any:
        return self.replicas > 1

    @property
    def recompute_priced_only(self) -> bool:
        """A recompute mode the planner prices but the runner cannot run (scalar layouts)."""
        return self.recompute_name not in RUNNER_RECOMPUTE

    # -- the forms the models and the runner take ---------------------------------------------
    def degrees(self) -> dict[str, Any]:
        """Every degree by name, as a runner config's fields take them (``replace(cfg, **layout.degrees())``)."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep, "cp": self.cp}

    def model_kwargs(self) -> dict[str, Any]:
        """The layout as the planner's models take it (layout_time.step_time and
        memory.memory_per_gpu: the same keywords), arrays where the layout holds them."""
        return dict(seq=self.seq_len, micro_batch=self.micro_batch, tp=self.tp, pp=self.pp, dp=self.dp,
                    zero=self.zero, precision=self.precision, recompute=self.recompute_index,
                    sp=self.sequence_parallel, flash=self.flash_attention, schedule=self.schedule,
                    virtual_stages=self.virtual_stages, ep=self.ep, cp=self.cp, replicas=self.replicas,
                    offload=self.offload, pp_last_layers=self.pp_last_layers, fp8_recipe=self.fp8_recipe,
                    fp8_attention=self.fp8_attention, etp=self.etp)

    def take(self, index: Any) -> "Layout":
        """The rows ``index`` (a mask or indices) of a vectorised layout; scalars stay."""
        return dataclasses.replace(self, **{f.name: np.asarray(getattr(self, f.name))[index]
                                            for f in dataclasses.fields(self) if _vector(getattr(self, f.name))})

    def row(self, i: int) -> "Layout":
        """Row ``i`` of a vectorised layout as a scalar layout (names for recompute)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out = {k: (np.asarray(v)[i].item() if _vector(v) else v) for k, v in fields.items()}
        out["recompute"] = RECOMPUTE[out["recompute"]] if not isinstance(out["recompute"], str) else out["recompute"]
        return Layout(**out)

    def describe(self) -> str:
        ep = f" (ep={self.ep})" if self.ep > 1 else ""
        cp = f" x cp={self.cp}" if self.cp > 1 else ""
        return f"dp={self.dp}{ep} x tp={self.tp} x pp={self.pp}{cp}"

    def as_dict(self) -> dict[str, Any]:
        """A scalar layout for JSON: its degrees and knobs, dp included."""
        return {"num_gpus": self.num_gpus, "tp": self.tp, "pp": self.pp, "dp": self.dp, "zero": self.zero,
                "micro_batch": self.micro_batch, "precision": self.precision, "recompute": self.recompute_name,
                "ep": self.ep, "cp": self.cp, "hsdp_replicas": self.replicas, "offload": bool(self.offload),
                "schedule": self.schedule, "pp_last_layers": self.pp_last_layers, "fp8_recipe": self.fp8_recipe,
                "fp8_attention": bool(self.fp8_attention), "etp": self.etp, "optimizer": self.optimizer}

    # -- the runner's rules and strategy names ---------------------------------------------------
    def runner_problems(self, world: int, *, layers: int | None = None, heads: int | None = None,
                        kv_heads: int | None = None, ffn_hidden: int | None = None, vocab: int | None = None,
                        virtual_stages: int = 1, num_microbatches: int | None = None,
                        experts: int | None = None, seq_len: int | None = None) -> list[str]:
        """Everything that stops mgbench's runner from running this layout on ``world``
        ranks ([] when none): stricter than the planner's rules (planner/layout_rules.py),
        because the runner's tensor parallelism splits kv heads, the MLP and the
        vocabulary evenly rather than replicating them."""
        where = f"layout {self.describe()} on world size {world}"
        out = [f"{where}: {name} must be >= 1" for name in ("tp", "pp", "ep", "cp") if getattr(self, name) < 1]
        if self.optimizer != "adamw":
            out.append(f"{where}: optimizer={self.optimizer}: the runner trains with AdamW (other optimizers are "
                       "priced by the planner, not run)")
        if self.etp != 1:
            out.append(f"{where}: etp={self.etp}: the runner's experts are whole on their rank (expert tensor "
                       "parallelism is priced by the planner, not run)")
        if self.dp < 1 and not out:
            out.append(f"{where}: dp must be >= 1")
        if out:
            return out
        if self.num_gpus != world:
            out.append(f"{where}: degrees multiply to {self.num_gpus}, not {world}; choose degrees whose product "
                       f"dp x tp x pp x cp is {world}")
        if self.dp % self.ep:
            out.append(f"{where}: ep={self.ep} does not divide dp={self.dp} (experts are sharded over ep of the "
                       "data-parallel ranks)")
        if experts is not None and self.ep > 1 and experts % self.ep:
            out.append(f"{where}: ep={self.ep} does not divide the {experts} experts")
        if seq_len is not None and self.cp > 1 and seq_len % (2 * self.cp):
            out.append(f"{where}: cp={self.cp} needs seq_len divisible by 2 x cp = {2 * self.cp} (each rank takes "
                       f"two of 2 x cp equal chunks, for causal load balance); seq_len is {seq_len}")
        for what, count in (("{} attention heads", heads), ("{} kv heads", kv_heads), ("MLP width {}", ffn_hidden),
                            ("vocabulary {}", vocab)):
            if count is not None and count % self.tp:
                out.append(f"{where}: tp={self.tp} does not divide the {what.format(count)}")
        if layers is not None and self.pp * virtual_stages > layers:
            out.append(f"{where}: pp={self.pp} x {virtual_stages} virtual stage(s) exceeds the {layers} layers")
        if num_microbatches is not None and self.pp > 1 and num_microbatches < self.pp:
            out.append(f"{where}: {num_microbatches} micro-batches cannot fill {self.pp} pipeline stages; "
                       f"set grad_accum >= {self.pp}")
        return out

    def runner_strategy(self) -> tuple[str | None, str | None]:
        """The runner strategy (registry name) that trains this layout, or None and why
        none does. Pipelines are pp (or pp+tp+dp with DDP replicas, FSDP ones under
        ZeRO-3), tensor parallelism is tp / tp_sp (one replica) or fsdp+tp, context and
        expert parallelism are cp / ep / fsdp+ep, data parallelism the registry's entry
        of the layout's ZeRO stage (HSDP: hsdp), one GPU single."""
        dp = self.dp
        if self.pp > 1:
            if self.tp == 1 and dp == 1:
                return "pp", None
            if dp > 1 and self.zero in (1, 2):
                return None, (f"the runner's pipelines replicate stages with DDP (--zero 0) or FSDP (--zero 3), not "
                              f"ZeRO-{self.zero}: give --zero 0 or 3, or --strategy")
            return "pp+tp+dp", None
        if self.tp > 1:
            if dp == 1:
                return ("tp_sp" if self.sequence_parallel else "tp"), None
            if self.zero != 3 or self.sequence_parallel:
                return None, (f"tensor parallelism with {dp} data-parallel replicas runs as fsdp+tp (ZeRO-3, no "
                              "sequence parallelism) in the runner: give --zero 3 without --sequence-parallel")
            return "fsdp+tp", None
        if self.cp > 1:
            return ("cp", None) if self.zero == 0 else (None, "the runner's context parallelism replicates with DDP: "
                                                              "give --zero 0")
        if self.ep > 1:
            name = next((s.name for s in STRATEGIES.values() if s.prepare == "expert_parallel"
                         and s.zero_stage == self.zero), None)
            return (name, None) if name else (None, "the runner's expert parallelism replicates with DDP (--zero 0) "
                                                    "or FSDP (--zero 3)")
        if self.num_gpus == 1:
            return "single", None
        if self.hsdp_enabled:
            return "hsdp", None
        name = next(s.name for s in STRATEGIES.values() if s.degrees is None and s.zero_stage == self.zero
                    and s.name != "hsdp")
        return name, None


def for_strategy(strategy: str, nproc: int, layout: dict[str, int] | None) -> tuple[Layout | None, str | None]:
    """The degrees a runner strategy runs with on ``nproc`` ranks: from the suite's
    ``layout`` where given, otherwise the strategy's registry defaults. Returns (layout, problem)."""
    s = STRATEGIES[strategy]
    lay = dict(layout or {})
    if s.degrees == ():
        if nproc != 1:
            return None, f"strategy {strategy} runs one process, not {nproc}; use ddp/fsdp for more ranks"
        return Layout.of(), None
    if s.degrees is None:
        if lay and set(lay) - {"dp"}:
            return None, (f"strategy {strategy} is data parallel only; layout {lay} names other degrees (use fsdp+tp "
                          "or pp+tp+dp)")
        return Layout.of(dp=nproc), None
    extra = set(lay) - set(s.degrees)
    if extra:
        return None, (f"strategy {strategy} takes degrees {', '.join(s.degrees)}; layout also names "
                      f"{', '.join(sorted(extra))}")
    deg = {"dp": 1, "tp": 1, "pp": 1, "ep": 1, "cp": 1, **dict(s.defaults), **lay}
    if s.fills not in lay:
        others = 1
        for k in s.degrees:
            if k not in (s.fills, "ep"):  # ep is carved out of dp: it adds no ranks
                others *= deg[k]
        deg[s.fills] = max(1, nproc // others)
    if "ep" in s.degrees and "ep" not in lay:
        deg["ep"] = deg["dp"]  # every data-parallel rank holds its own share of the experts
    return Layout.of(**deg), None


def _vector(x: Any) -> bool:
    return isinstance(x, np.ndarray)
