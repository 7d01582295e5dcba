"""The one declared schema of a benchmark config: :class:`RunConfig`.

Each field declares, beside its type and default, how a suite value is checked, its
help text, and its role:

- ``workload``: what is measured (model, strategy, layout, precision, ...). Two configs
  that differ in any workload field are different configs everywhere: `compare` keeps
  them apart and the label tells them apart. (The single-process reference depends on
  fewer keys, REFERENCE_KEYS: every strategy of one workload is checked against one.)
- ``procedure``: how it is measured (steps, rounds, seed, timeouts, fault injection).
  Runs that differ only here still compare config by config.
- ``derived``: computed by the suite expansion (parallel degrees, id, skip reason);
  never a suite key.

Everything else is derived from these declarations: the suite keys and their checks
(:data:`SWEEP_KEYS`), config identity (:meth:`RunConfig.identity`), the reference key's
inputs, the label, `mgbench run --help` and docs/suites.md's key table (:func:`keys_markdown`).
Adding a suite key is one field declaration here. Torch-free: the launcher, suites and
reports import it without loading the rank side.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from . import faults
from .errors import MgbenchError
from .model_shape import ModelShape
from .strategies import CP_ATTENTION, PIPELINED, STRATEGIES, ZERO_STAGE, schedules

Check = Callable[[Any], "str | None"]
WORKLOAD, PROCEDURE, DERIVED = "workload", "procedure", "derived"

# Each workload's implementation: gpt in workloads/gpt.py (and workloads/hf.py for
# Hugging Face configs), vision in workloads/vision.py, command in runner/command.py.
WORKLOADS = ("gpt", "vision", "command")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
# torchao float8 scaling recipes (precision = "fp8"; strategies/fp8.py).
FP8_RECIPES = ("tensorwise", "rowwise")
SCHEDULES = schedules.NAMES  # the pipeline schedule registry (strategies/schedules.py)
# The runner's activation checkpointing modes. "every_2nd" checkpoints every second block
# (torchtitan's layer-wise selective AC at frequency 2); it is not Korthikanti et al.'s
# selective recompute. The planner (`--recompute`, mgbench/layout.py RECOMPUTE) uses these names.
CHECKPOINTING = ("none", "every_2nd", "full")
DEVICES = ("auto", "cpu", "cuda")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
DATA_SOURCES = ("random", "disk")


# --- checks: each returns None when a suite value is acceptable, else why not ---------

def integer(min_value: int) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, int) or isinstance(v, bool):
            return f"must be an integer, got {v!r}"
        if v < min_value:
            return f"must be >= {min_value}, got {v}"
        return None

    return check


def choice(allowed: tuple[str, ...], renamed: dict[str, str] | None = None) -> Check:
    def check(v: Any) -> str | None:
        if v in allowed:
            return None
        if renamed and v in renamed:
            return f"{v!r} was renamed {renamed[v]!r}"
        hint = difflib.get_close_matches(str(v), allowed, n=1)
        more = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"{v!r} is not one of {', '.join(allowed)}{more}"

    return check


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _nproc(v: Any) -> str | None:
    if v in ("pow2", "pow2>=2", "all"):
        return None
    err = integer(1)(v)
    return f"{err} (or \"pow2\" / \"pow2>=2\" / \"all\" for the detected devices)" if err else None


def _model(v: Any) -> str | None:
    from .workloads import check_model  # presets, dims, hf: configs and vision models

    return check_model(v)


def _layout(v: Any) -> str | None:
    if v == "auto":
        return None
    if not isinstance(v, dict) or not v:
        return f"must be a table of degrees such as {{dp = 2, tp = 2}}, got {v!r}"
    for k, d in v.items():
        if k not in ("dp", "tp", "pp", "ep", "cp"):
            hint = difflib.get_close_matches(k, ("dp", "tp", "pp", "ep", "cp"), n=1)
            return (f"unknown degree {k!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                    + "; allowed: dp, tp, pp, ep, cp")
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            return f"degree {k} must be a positive integer, got {d!r}"
    return None


def _inject(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"must be a string such as \"oom@step=3,rank=1\" or \"none\", got {v!r}"
    try:
        faults.parse(v)
    except ValueError as e:
        return str(e)
    return None


# --- declarations ---------------------------------------------------------------------

def key(default: Any, check: Check, help: str, role: str = WORKLOAD, applies: Callable[[dict], bool] | None = None,
        identity: bool | None = None, label_when: str = "changed") -> Any:
    """A suite key: its default, check, help text and role.

    ``applies(params)`` says whether the key matters for a config; where it does not, the
    expansion pins it to its default, so it neither multiplies configs nor changes ids.
    ``identity`` overrides the role's rule (workload keys are identity, the rest not).
    ``label_when``: a workload key outside the label's fixed part is named in the label
    when it differs from its default ("changed") or only when it varies within the
    sweep ("varies": for keys whose default is resolved at expansion, such as device).
    """
    meta = {"check": check, "help": help, "role": role, "applies": applies, "label_when": label_when,
            "identity": role == WORKLOAD if identity is None else identity, "suite_key": True}
    return field(default=default, metadata=meta)  # defaults are immutable: str, int, bool


def derived(default: Any, help: str, identity: bool = False) -> Any:
    """A field the expansion computes (not a suite key)."""
    return field(default=default, metadata={"help": help, "role": DERIVED, "identity": identity, "suite_key": False})


def _pipelined(p: dict) -> bool:
    return p["strategy"] in PIPELINED


def is_hsdp(p: dict) -> bool:
    """Whether a config's data parallelism is HSDP (strategy hsdp, or pp+tp+dp with dp_mode hsdp)."""
    return p["strategy"] == "hsdp" or (p["strategy"] == "pp+tp+dp" and p["dp_mode"] == "hsdp")


# Strategies whose FSDP2 wrapping takes a CPUOffloadPolicy (offload = true).
OFFLOADABLE = ("fsdp", "fsdp_grad_op", "hsdp")


def _is_command(p: dict) -> bool:
    return p["workload"] == "command"


def _moe(p: dict) -> bool:
    """Whether the config's model has routed experts (the moe_* keys apply)."""
    from .workloads import model_spec

    if p["workload"] != "gpt":
        return False
    try:
        return bool(getattr(model_spec(p["workload"], p["model"]), "experts", 0))
    except MgbenchError:
        return False


def _capacity(v: Any) -> str | None:
    if v == "dropless" or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
        return None
    return f"must be \"dropless\" or a capacity factor > 0 such as 1.25, got {v!r}"


def _non_negative(v: Any) -> str | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
        return None
    return f"must be a number >= 0, got {v!r}"


def _shell_words(v: Any) -> str | None:
    """A command line or its arguments: a string shlex can split (quotes balanced)."""
    import shlex

    if not isinstance(v, str):
        return f"must be a string, got {v!r}"
    try:
        shlex.split(v)
    except ValueError as e:
        return f"cannot split {v!r} into words ({e}); balance its quotes"
    return None


def _regex(v: Any) -> str | None:
    import re

    if not isinstance(v, str):
        return f"must be a regular expression string, got {v!r}"
    try:
        re.compile(v)
    except re.error as e:
        return f"{v!r} is not a valid regular expression ({e})"
    return None


def _reads_tokens(p: dict) -> bool:
    return p["workload"] not in ("command", "vision")  # a command reads its own data; vision reads images


def _disk(p: dict) -> bool:
    return _reads_tokens(p) and p["data"] == "disk"


def _disk_workers(p: dict) -> bool:
    return _disk(p) and p["num_workers"] > 0


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) else f"must be a string (a folder path), got {v!r}"


@dataclass(frozen=True)
class RunConfig:
    """One point of a sweep: everything a rank needs to run it, one field per fact."""

    # what is measured
    workload: str = key("gpt", choice(WORKLOADS), "training workload: gpt (decoder LM: a preset, dims or a Hugging "
                        "Face config), vision (image classifier) or command (the user's own training launch line)")
    model: ModelShape | str = key(
        "tiny", _model, "preset name (see models.toml) or {layers, hidden, heads, ffn_hidden, vocab, ...}; "
        "\"hf:PATH/config.json\" (a Hugging Face config, PATH relative to the suite file's folder) or {hf = "
        "\"llama\", layers, hidden, ...} (needs mgbench[hf]); vision: resnet50, vit_b_16, resnet_tiny, vit_tiny")
    strategy: str = key("single", choice(tuple(STRATEGIES)), "parallelism strategy")
    nproc: int = key(1, _nproc, "ranks (devices) per config; \"pow2\" = 1, 2, 4 ... up to the devices found; "
                     "\"pow2>=2\" = the same from 2 (none on one device); \"all\" = the devices found")
    micro_batch: int = key(1, integer(1), "sequences per rank per micro-step")
    seq_len: int = key(128, integer(2), "tokens per sequence", applies=lambda p: p["workload"] != "vision")
    image_size: int = key(224, integer(8), "vision: images are image_size x image_size pixels, 3 channels",
                          applies=lambda p: p["workload"] == "vision")
    grad_accum: int = key(1, integer(1), "micro-batches per optimizer step (pipelines: the schedule's micro-batch count)")
    layout: Any = key("auto", _layout, "parallel degrees, e.g. {dp = 2, tp = 2}; \"auto\": the strategy's default",
                      identity=False)  # resolved into dp, tp, pp, which are identity
    dp_mode: str = key("ddp", choice(("ddp", "fsdp", "hsdp")), "data parallelism inside pp+tp+dp: ddp, fsdp, or "
                       "hsdp (FSDP sharded within groups of dp / replicas ranks, replicated across the groups)",
                       applies=lambda p: p["strategy"] == "pp+tp+dp")
    cp_attention: str = key("auto", choice(CP_ATTENTION), "cp: attention across the cp ranks: ring_allgather / "
                            "ring_alltoall (torch's ring attention, K and V all-gathered or passed rank to rank; "
                            "CUDA), allgather_kv (K and V all-gathered, SDPA with a causal mask), or auto (the ring "
                            "on CUDA where torch picks a flash, efficient or cuDNN kernel, else allgather_kv)",
                            applies=lambda p: p["strategy"] == "cp")
    replicas: int = key(2, integer(1), "hsdp: data-parallel replicas (the replicate dimension of the 2-D mesh); each "
                        "shards the model over dp / replicas ranks", applies=is_hsdp)
    offload: bool = key(False, boolean, "FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in host "
                        f"memory, copied to the device per use ({', '.join(OFFLOADABLE)}); on CPU ranks nothing moves",
                        applies=lambda p: p["strategy"] in OFFLOADABLE)
    pp_schedule: str = key("1f1b", choice(SCHEDULES), "pipeline schedule: gpipe, 1f1b, interleaved (1F1B), "
                           "interleaved_zb (zero bubble ZB1P), zbv (zero bubble ZB-V) or dualpipev (DualPipeV); zbv "
                           "and dualpipev hold two chunks per rank in a V",
                           applies=_pipelined)
    virtual_stages: int = key(2, integer(1), "model chunks per rank for the interleaved schedules",
                              applies=lambda p: _pipelined(p) and p["pp_schedule"] in schedules.VIRTUAL)
    precision: str = key("fp32", choice(PRECISIONS), "fp32, bf16 (autocast), fp16 (autocast + loss scaling) or fp8 "
                         "(torchao float8 linears under bf16 autocast; needs mgbench[fp8])")
    fp8_recipe: str = key("tensorwise", choice(FP8_RECIPES), "fp8 scaling: tensorwise (one scale per tensor; FSDP "
                          "all-gathers weights in fp8) or rowwise (one scale per row)",
                          applies=lambda p: p["precision"] == "fp8")
    activation_checkpointing: str = key(
        "none", choice(CHECKPOINTING, renamed={"selective": "every_2nd"}),
        "none, every_2nd (every second block recomputed) or full (every block)")
    compile: bool = key(False, boolean, "torch.compile each block")
    device: str = key("auto", choice(DEVICES), "cpu, cuda, or auto (cuda when present)", label_when="varies")
    grad_compression: str = key("none", choice(COMPRESSIONS),
                                "DDP communication hook compressing gradients (lossy: looser loss tolerance)")
    powersgd_rank: int = key(2, integer(1), "matrix rank of PowerSGD's low-rank gradient approximation",
                             applies=lambda p: p["grad_compression"] == "powersgd")
    # MoE models (workloads/moe.py)
    moe_capacity_factor: Any = key("dropless", _capacity, "MoE routing: \"dropless\" (every token reaches its top_k "
                                   "experts) or a capacity factor c: each expert takes at most ceil(c x tokens x "
                                   "top_k / experts) of a micro-batch's assignments, first choices first; the rest "
                                   "are dropped (the token keeps its residual)", applies=_moe)
    moe_aux_loss_coef: float = key(0.01, _non_negative, "MoE: weight of the load-balancing loss E x sum f_e P_e "
                                   "(Switch Transformer; 0.01 there) added to the training gradient; the reported "
                                   "loss is the LM loss", applies=_moe)
    # workload = "command": the user's own training launch (runner/command.py, docs/workloads.md)
    command: str = key("", _shell_words, "workload = \"command\": the launch line, run as given when it starts with "
                       "torchrun / accelerate / deepspeed, or (a plain `python script.py ...`) run under torchrun with "
                       "nproc ranks", applies=_is_command)
    args: str = key("", _shell_words, "arguments appended to command (a sweep axis: [\"--bs 8\", \"--bs 16\"])",
                    applies=_is_command)
    tokens_per_step: int = key(0, integer(0), "tokens one optimizer step trains, all ranks, for command configs whose "
                               "step events carry no tokens (0: not given)", applies=_is_command)
    step_pattern: str = key("", _regex, "regex matching one line of the command's output per finished step (when "
                            "the script cannot call mgbench.step()); a named group (?P<tokens>...) gives that step's "
                            "tokens", PROCEDURE, applies=_is_command)
    # data = "disk": the timed steps read a token dataset through a DataLoader (runner/data_loading.py)
    data: str = key("random", choice(DATA_SOURCES), "where the timed steps' tokens come from: random (made in "
                    "device memory before timing) or disk (a token dataset read through a torch DataLoader each "
                    "step; records data_wait_s and input_bound)", applies=_reads_tokens)
    data_path: str = key("", _text, "data = \"disk\": folder of a dataset made by `mgbench data make`; \"\": "
                         "mgbench generates one of the size the config reads into RESULTS_DIR/datasets/, once per "
                         "(seed, vocab, size)", PROCEDURE, applies=_disk)
    num_workers: int = key(0, integer(0), "data = \"disk\": DataLoader worker processes (0: read in the training "
                           "process)", applies=_disk)
    pin_memory: bool = key(False, boolean, "data = \"disk\": DataLoader pins batches in page-locked memory "
                           "(no effect without CUDA)", applies=_disk)
    prefetch_factor: int = key(2, integer(1), "data = \"disk\", num_workers > 0: batches each worker reads ahead",
                               applies=_disk_workers)
    persistent_workers: bool = key(False, boolean, "data = \"disk\", num_workers > 0: keep the workers between "
                                   "passes over the dataset (else each pass starts them again)",
                                   applies=_disk_workers)
    # how it is measured
    warmup_steps: int = key(3, integer(0), "untimed steps before the measured window (the correctness window's "
                            "steps, on the same model, count among them)", PROCEDURE)
    measured_steps: int = key(10, integer(2), "timed optimizer steps per repeat", PROCEDURE)
    repeats: int = key(1, integer(1), "measured windows per config", PROCEDURE)
    rounds: int = key(1, integer(1), "measure each config in this many rounds, interleaved with the other configs of "
                      "its torchrun job (round 1 of every config, then round 2, ...); each round rebuilds the model "
                      "and warms up again. For shared or noisy machines, whose speed drifts over minutes", PROCEDURE)
    seed: int = key(0, integer(0), "seed of the weights, the random tokens and the check window's learnable data",
                    PROCEDURE)
    check_steps: int = key(3, integer(0), "steps of the correctness window (the fresh model on learnable data, "
                           "before the timed steps; a model of its own when a bug is injected) whose loss, step-1 "
                           "gradient norm and final weights are checked against the single-process reference "
                           "(0: no check)", PROCEDURE)
    timeout_s: int = key(900, integer(1), "seconds a config (each round of it) may take before its job is stopped",
                         PROCEDURE)
    track_memory: bool = key(True, boolean, "after the timed window, one more step under torch's memory tracker: "
                             "peak bytes by category (CPU and CUDA); false skips it and its ~1.5 s import per "
                             "launch", PROCEDURE)
    profile: bool = key(False, boolean, "after the timed window, profile a few steps and split them into compute / "
                        "communication / idle", PROCEDURE)
    profile_steps: int = key(3, integer(1), "steps in the profiled window", PROCEDURE, applies=lambda p: p["profile"])
    inject: str = key("none", _inject, "fault injection for testing recovery: oom@step=S,rank=R | crash@... | "
                      "kill@... | hang@... | slow@rank=R,factor=F; or a training bug the correctness check must "
                      "catch: bug:freeze | bug:no_grad_sync | bug:grad_sum | bug:drop_micro_batch (such a config runs its "
                      "check window only: status checked)", PROCEDURE)
    # computed by the expansion
    dp: int = derived(1, "data-parallel degree", identity=True)
    tp: int = derived(1, "tensor-parallel degree", identity=True)
    pp: int = derived(1, "pipeline-parallel degree", identity=True)
    ep: int = derived(1, "expert-parallel degree (carved out of dp: experts sharded over ep ranks, replicated over "
                      "dp / ep)", identity=True)
    cp: int = derived(1, "context-parallel degree (each sample's sequence split over cp ranks; adds ranks: dp x cp)",
                      identity=True)
    label_keys: tuple[str, ...] = derived((), "procedure keys that vary within the sweep, shown in the label")
    skip_reason: str | None = derived(None, "why this config cannot run here (None: it can)")
    config_id: str = derived("", "stable id: strategy, ranks and a hash of every parameter")

    def __post_init__(self) -> None:
        # A suite names a preset or gives dims; a config always holds the typed model:
        # a ModelShape, or an HFModel / VisionModel (mgbench/workloads/__init__.py).
        from .workloads import model_spec

        object.__setattr__(self, "model", model_spec(self.workload, self.model))

    # -- derived facts ------------------------------------------------------------------
    @property
    def shape(self) -> ModelShape:
        """The decoder shape (a Hugging Face model's where its config maps onto one)."""
        shape = self.model if isinstance(self.model, ModelShape) else getattr(self.model, "shape", None)
        if shape is None:
            raise MgbenchError(f"model {self.model_name} is not a decoder LM: it has no ModelShape")
        return shape

    @property
    def model_name(self) -> str:
        return getattr(self.model, "name", None) or "custom"

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro-batch x micro-batches x data-parallel degree."""
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def pipelined(self) -> bool:
        return self.strategy in PIPELINED

    @property
    def zero_stage(self) -> int:
        """ZeRO stage of the data parallelism: the strategy's (registry), or 3 for
        pp+tp+dp whose replicas are FSDP-sharded (dp_mode = "fsdp")."""
        if self.strategy == "pp+tp+dp" and self.dp_mode in ("fsdp", "hsdp"):
            return 3
        return ZERO_STAGE.get(self.strategy, 0)

    def identity(self) -> tuple:
        """What makes two configs the same workload (compare matches on this)."""
        return tuple((k, _plain(getattr(self, k))) for k in IDENTITY_KEYS)

    def params(self) -> dict[str, Any]:
        """Every suite key and derived degree (model as a dict): what the id hashes. The
        layout only where it says more than the degrees it resolved to, so `layout =
        {dp = 2}` and "auto" on 2 data-parallel ranks are one config, not two."""
        d = {k: _plain(getattr(self, k)) for k in SWEEP_KEYS}
        d.update(dp=self.dp, tp=self.tp, pp=self.pp)
        if self.ep != 1:  # only where set, so the ids of configs without experts stay as they were
            d["ep"] = self.ep
        if self.cp != 1:  # likewise
            d["cp"] = self.cp
        if self.layout == "auto" or all(getattr(self, k) == v for k, v in self.layout.items()):
            del d["layout"]
        return d

    @property
    def label(self) -> str:
        """Short, readable and unique within a sweep: the core fields, then every other
        identity field away from its default, then the procedure keys that vary."""
        if self.workload == "command":
            return self._command_label()
        ac = "" if self.activation_checkpointing == "none" else f" ac={self.activation_checkpointing}"
        comp = " compile" if self.compile else ""
        lay = f" [dp={self.dp} tp={self.tp} pp={self.pp}]" if self.tp > 1 or self.pp > 1 else ""
        lay += f" [dp={self.dp} ep={self.ep}]" if self.ep > 1 else ""
        lay += f" [dp={self.dp} cp={self.cp}]" if self.cp > 1 else ""
        if is_hsdp(self.to_dict()):
            lay += f" {self.replicas}x{self.dp // self.replicas}"  # hsdp: replicas x shard
        if self.pipelined:
            lay += f" {self.pp_schedule}" + (f" v={self.virtual_stages}" if self.pp_schedule in schedules.VIRTUAL
                                             else "")
        model = self.model_name if self.model_name != "custom" else _dims_label(self.shape)
        size = f"img={self.image_size}" if self.workload == "vision" else f"s={self.seq_len}"
        core = (f"{self.strategy} n={self.nproc}{lay} {model} mb={self.micro_batch} "
                f"{size} ga={self.grad_accum} {self.precision}{ac}{comp}")
        extra = [k for k in SWEEP_KEYS if k not in LABEL_CORE and k in IDENTITY_KEYS
                 and FIELDS[k].metadata["label_when"] == "changed" and getattr(self, k) != DEFAULTS[k]]
        extra += [k for k in self.label_keys if k not in extra and k not in LABEL_CORE]
        return core + "".join(f" {k}={_label_value(k, getattr(self, k))}" for k in extra)

    def _command_label(self) -> str:
        """A command config's label: its launch line and args, then what else sets it apart."""
        core = f"command n={self.nproc}: {' '.join((self.command + ' ' + self.args).split())}"
        shown = ("workload", "nproc", "command", "args")
        extra = [k for k in COMMAND_KEYS if k not in shown and k in IDENTITY_KEYS
                 and FIELDS[k].metadata["label_when"] == "changed" and getattr(self, k) != DEFAULTS[k]]
        extra += [k for k in self.label_keys if k not in extra and k not in shown and k in COMMAND_KEYS]
        return core + "".join(f" {k}={_plain(getattr(self, k))}" for k in extra)

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["model"] = _plain(self.model)
        d["label_keys"] = list(self.label_keys)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        return cls(**{**d, "label_keys": tuple(d.get("label_keys", ()))})


def _dims_label(s: ModelShape) -> str:
    """A custom model in a label: every dim that can tell two custom models apart."""
    parts = [f"L{s.layers}", f"h{s.hidden}", f"a{s.heads}", f"f{s.ffn_hidden}", f"v{s.vocab}"]
    parts += [f"kv{s.kv_heads}"] if s.kv_heads != s.heads else []
    parts += [f"d{s.head_dim}"] if s.head_dim is not None else []
    parts += [s.mlp] if s.mlp != "swiglu" else []
    parts += ["tied"] if s.tie_embeddings else []
    return f"custom({' '.join(parts)})"


def _label_value(k: str, v: Any) -> Any:
    # A dataset folder by its name: its full path would swamp the label.
    return v.rstrip("/").rsplit("/", 1)[-1] if k == "data_path" and v else _plain(v)


def _plain(v: Any) -> Any:
    return v.to_dict() if hasattr(v, "to_dict") else v  # a model spec (ModelShape, HFModel, VisionModel)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# key -> (check, default, help): the suite schema, in declaration order.
SWEEP_KEYS: dict[str, tuple[Check, Any, str]] = {
    name: (f.metadata["check"], f.default, f.metadata["help"]) for name, f in FIELDS.items() if f.metadata.get("suite_key")
}
DEFAULTS = {k: v[1] for k, v in SWEEP_KEYS.items()}
IDENTITY_KEYS = tuple(name for name, f in FIELDS.items() if f.metadata.get("identity"))
PROCEDURE_KEYS = tuple(name for name, f in FIELDS.items() if f.metadata.get("role") == PROCEDURE)
# Fields the label's fixed part (RunConfig.label) prints; every other key is named in the
# label when it matters (see key()'s label_when). Layout is printed as its resolved degrees.
LABEL_CORE = ("strategy", "nproc", "dp", "tp", "pp", "layout", "pp_schedule", "virtual_stages", "model", "micro_batch",
              "seq_len", "image_size", "grad_accum", "precision", "activation_checkpointing", "compile")
# Keys that feed the single-process reference: what it computes depends on these (the
# reference runs no strategy and no fault, in one process, on the global batch;
# fp8_recipe: tensorwise and rowwise float8 training compute different numbers), and for
# fp8 also on whether the strategy gathers weights in bf16 (zero_stage, through
# strategies/fp8.weights_cast_from_gathered: runner/reference.check_key adds it).
REFERENCE_KEYS = ("workload", "model", "seq_len", "image_size", "micro_batch", "precision", "fp8_recipe", "seed",
                  "device", "moe_capacity_factor", "moe_aux_loss_coef")


# The keys that matter to a command config (workload = "command"): the user's command
# picks its own model, parallelism and precision, so every other key is pinned to its
# default there (it neither multiplies command configs nor changes their ids).
COMMAND_KEYS = ("workload", "command", "args", "tokens_per_step", "step_pattern", "nproc", "device", "warmup_steps",
                "timeout_s")


def applies(name: str, params: dict[str, Any]) -> bool:
    """Whether key ``name`` matters for a config with these parameters."""
    if params.get("workload") == "command" and name not in COMMAND_KEYS:
        return False
    rule = FIELDS[name].metadata.get("applies")
    return rule is None or rule(params)


def config_id(params: dict[str, Any]) -> str:
    """Stable id of a config: its strategy and size, then a hash of every parameter that
    is not at its declared default. A key added later with a default that keeps the old
    behaviour leaves every existing id as it was, so `--resume` of an older run folder
    finds its configs without a migration."""
    kept = {k: v for k, v in params.items() if k not in DEFAULTS or v != DEFAULTS[k]}
    blob = json.dumps(kept, sort_keys=True).encode()
    kind = "command" if params.get("workload") == "command" else params["strategy"]
    return f"{kind}-n{params['nproc']}-{hashlib.sha1(blob).hexdigest()[:10]}"


def keys_markdown() -> str:
    """docs/suites.md's table of suite keys, generated from the schema."""
    rows = ["| key | default | role | what it sets |", "|---|---|---|---|"]
    for name, (_, default, help_text) in SWEEP_KEYS.items():
        cell = help_text.replace("|", "\\|")  # a | inside a cell would end it
        rows.append(f"| `{name}` | `{json.dumps(default)}` | {FIELDS[name].metadata['role']} | {cell} |")
    return "\n".join(rows)


def keys_help() -> str:
    """`mgbench run --help`'s list of suite keys, generated from the schema."""
    lines = []
    for name, (_, default, help_text) in SWEEP_KEYS.items():
        lines.append(f"  {name} = {json.dumps(default)}: {help_text}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m mgbench.config: docs/suites.md's key table
    print(keys_markdown())
