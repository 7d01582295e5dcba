"""Command-line options, each declared once and shared by every command that takes it.

An option is an :class:`Opt` (its flags and click settings, help text included);
commands stack the ones they take with :func:`options`. Groups bundle the options that
travel together: model shape, parallel layout, prices, calibration, device and cluster.

`plan`'s search and cost options are not written here at all: they are generated from
the fields of :class:`~mgbench.planner.search.PlanOptions` (help text in each field's
metadata), so a field added there is an option of `plan`, and a `--plan-*` option of
`report`, with no edit here. `--seq-len`, `--precision` and `--overlap` of `memory` and
`predict` come from the same fields, so their defaults cannot drift from `plan`'s.

Options that need the planner's modules (which load numpy) are made on first use by a
:class:`DeferredCommand`, so importing the CLI stays as light as before.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

import click

from .config import DEVICES

if TYPE_CHECKING:
    from .planner.search import PlanOptions

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Opt:
    """One command-line option: click's declarations and settings."""

    decls: tuple[str, ...]
    settings: Mapping[str, Any]

    def but(self, **changes: Any) -> Opt:
        """The same option with some settings changed (e.g. required=True or default=None).

        Not for the help text: that is written once, in the declaration."""
        if "help" in changes:
            raise ValueError("an option's help is declared once; do not override it")
        return Opt(self.decls, {**self.settings, **changes})

    def prefixed(self, prefix: str) -> Opt:
        """The same option under `--PREFIX-NAME` (short flags dropped), e.g. `report --plan-model`."""
        decls = []
        for d in self.decls:
            if d.startswith("--"):
                decls.append(f"--{prefix}-{d[2:]}")
            elif not d.startswith("-"):  # an explicit parameter name
                decls.append(f"{prefix.replace('-', '_')}_{d}")
        return Opt(tuple(decls), self.settings)

    @property
    def flag(self) -> str:
        """The long flag, e.g. '--seq-len'."""
        return next(d for d in self.decls if d.startswith("--"))

    def param(self) -> click.Option:
        """The click Option object (what the `click.option` decorator would attach)."""
        return click.Option(list(self.decls), **self.settings)

    def __call__(self, f: F) -> F:
        return click.option(*self.decls, **self.settings)(f)


def opt(*decls: str, **settings: Any) -> Opt:
    """Declare an option: the same arguments as `click.option`."""
    return Opt(decls, settings)


def options(*opts: Opt) -> Callable[[F], F]:
    """Decorate a command with `opts`; --help lists them in the order given."""
    def decorate(f: F) -> F:
        for o in reversed(opts):
            f = o(f)
        return f

    return decorate


class DeferredCommand(click.Command):
    """A click command whose options are made on first use (parsing, --help,
    introspection) instead of at import.

    `plan`'s options come from PlanOptions and the layout choices from planner.memory;
    both modules load numpy (about 0.3 s), which `mgbench status` or each node's
    `mgbench run` should not pay for. `deferred` returns the Opts; they follow any
    declared with decorators (e.g. arguments)."""

    def __init__(self, *args: Any, deferred: Callable[[], Sequence[Opt]], **kwargs: Any) -> None:
        self._deferred: Callable[[], Sequence[Opt]] | None = deferred
        super().__init__(*args, **kwargs)

    @property
    def params(self) -> list[click.Parameter]:  # type: ignore[override]
        if self._deferred is not None:
            make, self._deferred = self._deferred, None
            self._params.extend(o.param() for o in make())
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        self._params = value


def deferred_command(make: Callable[[], Sequence[Opt]], group: click.Group | None = None, **attrs: Any
                     ) -> Callable[[Callable[..., Any]], click.Command]:
    """`@click.command` (or `@group.command`) whose options `make()` returns, on first use."""
    factory = group.command if group is not None else click.command
    return factory(cls=DeferredCommand, deferred=make, **attrs)


# --- generated from a dataclass's fields ---------------------------------------------

def _unwrap_optional(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _split_commas(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _with_default(help_text: str, value: Any) -> str:
    """Help text ending in click's `[default: X]`, written here because click prints a
    float's full repr (1.9733046...e-05) where three digits are what a reader wants."""
    if value is None or value is False or value == ():
        return help_text
    shown = f"{value:.3g}" if isinstance(value, float) else str(value)
    return f"{help_text}  [default: {shown}]"


def field_option(cls: type, name: str) -> Opt:
    """The option of one dataclass field: `--field-name`, help/choices/metavar from its
    metadata, type and default from its annotation and default. A field without a
    default is a required option; a `list[str]` field takes comma-separated values; a
    `bool` field is a flag."""
    f = next(x for x in dataclasses.fields(cls) if x.name == name)
    meta = f.metadata
    tp = _unwrap_optional(typing.get_type_hints(cls)[name])
    settings: dict[str, Any] = {"help": meta.get("help", "")}
    if f.default is not dataclasses.MISSING:
        settings["default"] = f.default
        settings["help"] = _with_default(settings["help"], f.default)
    else:
        settings["required"] = True
    if tp is bool:
        settings["is_flag"] = True
    elif typing.get_origin(tp) in (list, tuple):
        settings["callback"] = _split_commas
        if settings.get("default") in ((), []):
            settings["default"] = None  # click reads an empty tuple default as a value; the field keeps its own
    elif "choices" in meta:
        settings["type"] = click.Choice(list(meta["choices"]))
    else:
        settings["type"] = tp
    if "metavar" in meta:
        settings["metavar"] = meta["metavar"]
    return Opt((f"--{name.replace('_', '-')}", name), settings)


def dataclass_options(cls: type, prefix: str | None = None, required: bool = True) -> list[Opt]:
    """One option per field of `cls`, in field order, except fields whose metadata says
    another option sets them ("set_by"). With a `prefix` each is `--PREFIX-NAME`;
    `required=False` makes fields without a default optional (None when not given)."""
    out = []
    for f in dataclasses.fields(cls):
        if "set_by" in f.metadata:
            continue
        o = field_option(cls, f.name)
        if not required and o.settings.get("required"):
            o = o.but(required=False)
        out.append(o.prefixed(prefix) if prefix else o)
    return out


def dataclass_from_options(cls: type, kw: dict[str, Any], prefix: str | None = None, **extra: Any) -> Any:
    """Build `cls` from a command's keyword arguments, popping the options
    :func:`dataclass_options` generated (so `kw` keeps only the command's others)."""
    pre = f"{prefix.replace('-', '_')}_" if prefix else ""
    values = {f.name: kw.pop(pre + f.name) for f in dataclasses.fields(cls) if "set_by" not in f.metadata}
    return cls(**values, **extra)


def plan_group(prefix: str | None = None, required: bool = True) -> list[Opt]:
    """`plan`'s search and cost options, one per PlanOptions field."""
    from .planner.search import PlanOptions

    return dataclass_options(PlanOptions, prefix, required)


def prefixed_flags(message: str, prefix: str, opts: Sequence[Opt]) -> str:
    """``message`` (an error written for the unprefixed command) with each of ``opts``'
    long flags as the prefixed command takes it: `report`'s plan errors say
    `--plan-tokens`, not plan's own `--tokens`."""
    import re

    names = sorted((o.flag[2:] for o in opts), key=len, reverse=True)  # --seq-len before --seq
    pattern = re.compile(r"(?<![\w-])--(" + "|".join(map(re.escape, names)) + r")(?![\w-])")
    return pattern.sub(lambda m: f"--{prefix}-{m.group(1)}", message)


def plan_options_from(kw: dict[str, Any], prefix: str | None = None) -> PlanOptions:
    """The PlanOptions that :func:`plan_group`'s options collected (popped from `kw`)."""
    from .planner.search import PlanOptions

    return dataclass_from_options(PlanOptions, kw, prefix)


def moe_group() -> list[Opt]:
    """`--moe-*`: how an MoE model routes and moves its tokens, one per MoeOptions field."""
    from .planner.moe import MoeOptions

    return dataclass_options(MoeOptions, "moe")


def moe_options_from(kw: dict[str, Any]) -> Any:
    """The MoeOptions :func:`moe_group`'s options collected (popped from `kw`); a bad value
    is an MgbenchError (one line, exit status 2)."""
    from .planner.moe import MoeOptions

    return dataclass_from_options(MoeOptions, kw, "moe")


def plan_field(name: str) -> Opt:
    """The option of one PlanOptions field, for commands that share it with `plan`."""
    from .planner.search import PlanOptions

    return field_option(PlanOptions, name)


# --- output ---------------------------------------------------------------------------

JSON = opt("--json", "as_json", is_flag=True, help="Machine-readable output: JSON on stdout.")
PLAN_HTML = opt("--html", "html_file", metavar="FILE",
                help="Also write the plan as a self-contained HTML page: the time/cost front with intervals, the "
                     "options per accelerator, the lead layout's memory, buy versus rent.")


# --- model and layout (memory, predict, plan) -----------------------------------------

MODEL = opt("--model", help="Model preset (see mgbench/data/models.toml), e.g. llama3-8b.")
HF = opt("--hf", "hf_config", metavar="PATH",
         help="A Hugging Face config.json (or its folder), read on disk: llama, mistral, mixtral, qwen2, qwen3, "
              "qwen3_moe, gemma/gemma2/gemma3, gpt2, gpt_oss, phi3, deepseek_v2/v3 (of a multimodal config its "
              "language model; the vision tower is named as not priced). Dims given beside it override it.")
PARAMS = opt("--params", type=float, help="Parameter count only (model states, no activations), e.g. 7.5e9.")
DIMS = (
    opt("--layers", type=int, help="Custom model: transformer blocks (with --hidden, --heads, --ffn-hidden, --vocab)."),
    opt("--hidden", type=int, help="Custom model: hidden size."),
    opt("--heads", type=int, help="Custom model: attention heads."),
    opt("--kv-heads", type=int, help="Custom model: key/value heads (grouped-query attention; default: --heads)."),
    opt("--head-dim", type=int, help="Custom model: width of one head when it is not hidden / heads "
                                     "(gpt-oss: 64 on hidden 2880; Gemma, Qwen3)."),
    opt("--ffn-hidden", type=int,
        help="Custom model: MLP hidden size (default: 4h for gelu; 8h/3 rounded up to 256 for swiglu, as Llama)."),
    opt("--vocab", type=int, help="Custom model: vocabulary size."),
    opt("--mlp", type=click.Choice(["swiglu", "geglu", "gelu", "squared_relu"]),
        help="Custom model: MLP kind; swiglu and geglu have three matrices, gelu and squared_relu two "
             "(default: swiglu)."),
    opt("--tie-embeddings", is_flag=True, default=None,
        help="Custom model: the output projection shares the embedding's weights (GPT-2 style)."),
    opt("--parallel-block", is_flag=True, default=None,
        help="Custom model: attention and MLP read the same normed input (GPT-J, PaLM)."),
    opt("--sliding-window", type=int, help="Custom model: local layers attend to this many tokens (with --global-every)."),
    opt("--global-every", type=int, help="Custom model: every k-th layer is global, the others local "
                                         "(Gemma 2: 2, Gemma 3: 6; 0: all local)."),
    opt("--experts", type=int, help="Custom MoE model: routed SwiGLU experts per layer (with --top-k; "
                                    "expert width --expert-ffn-hidden, default --ffn-hidden)."),
    opt("--top-k", type=int, help="Custom MoE model: experts each token is routed to."),
    opt("--expert-ffn-hidden", type=int, help="Custom MoE model: width of one routed expert."),
    opt("--shared-experts", type=int, help="Custom MoE model: experts every token uses (DeepSeek: 1 or 2)."),
    opt("--dense-layers", type=int, help="Custom MoE model: leading layers with a dense MLP (DeepSeek-V3: 3)."),
    opt("--moe-interval", type=int, help="Custom MoE model: past the dense ones, every k-th layer an MoE layer "
                                         "and the rest dense (Llama 4 Maverick: 2; default 1, all)."),
    opt("--expert-bias", is_flag=True, default=None,
        help="Custom MoE model: the experts' linears carry biases, the second one's weighted by the router (gpt-oss)."),
    opt("--glu-clamp", type=float, help="Custom MoE model: the experts' gated-MLP inputs are clamped to +-this "
                                        "(gpt-oss's swiglu_limit: 7). Priced, like --expert-bias, as the elementwise "
                                        "passes Megatron-Core runs for gpt-oss's quick-GEGLU outside its fused kernel "
                                        "(see --moe-fused-grouped-mlp); a SwiGLU whose kernel clamps inside would be "
                                        "overpriced."),
    opt("--kv-lora-rank", type=int, help="Custom model, multi-head latent attention (DeepSeek): keys and values "
                                         "compressed to this rank (with --qk-nope-head-dim, --qk-rope-head-dim, "
                                         "--v-head-dim)."),
    opt("--q-lora-rank", type=int, help="Custom model, MLA: queries compressed to this rank (default: not)."),
    opt("--qk-nope-head-dim", type=int, help="Custom model, MLA: per-head q/k width without rotary."),
    opt("--qk-rope-head-dim", type=int, help="Custom model, MLA: per-head rotary q/k width."),
    opt("--v-head-dim", type=int, help="Custom model, MLA: per-head value width."),
    opt("--mtp-layers", type=int, help="Custom model: multi-token-prediction modules trained beside the model "
                                       "(DeepSeek-V3: 1)."),
)
DIM_NAMES = tuple(o.flag[2:].replace("-", "_") for o in DIMS)

SYSTEM = opt("--system", help="Catalog system, e.g. dgx-h100.")
GPU = opt("--gpu", help="Catalog accelerator, e.g. h100-sxm (placed in the first system that has it).")


def _use_system_file(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """--system-file: the file's hardware joins the catalog while this command runs (its
    systems then answer to --system / --systems by name); the command receives their names.
    A bad file stops the command with one line per problem (MgbenchError: exit status 2)."""
    if value is None:
        return None
    from . import catalog

    names = catalog.use_system_file(value)
    ctx.call_on_close(catalog.clear_system_file)
    return names


SYSTEM_FILE = opt("--system-file", "system_file", metavar="PATH", callback=_use_system_file,
                  help="TOML file of your own hardware with hardware.toml's keys: [systems.NAME] (gpu, gpus_per_node, "
                       "intra_link, inter_link, nics_per_node) and optionally [accelerators.NAME] and [links.NAME] "
                       "(an accelerator's memory_gb is read as GiB, as vendors label it: an H100's 80 is "
                       "80 GiB); its systems are then usable by name (the only one is the default for predict).")
# One option group for every command that takes a model (memory, predict, plan): a test
# checks that each has all of them.
MODEL_GROUP = (MODEL, HF, PARAMS, *DIMS)


def layout_group() -> list[Opt]:
    """The parallel layout of `memory` and `predict`: degrees, batch, precision, recompute.
    --seq-len and --precision are plan's (PlanOptions fields); the choices are the
    planner's own constants."""
    from .layout import RECOMPUTE, flag_of
    from .planner.memory import SCHEDULES
    from .planner.search import VIRTUAL_STAGES_HELP

    return [
        plan_field("seq_len"),
        opt("--micro-batch", type=int, default=1, show_default=True, help="Sequences per micro-batch."),
        opt("--global-batch", type=int, default=None, help="Sequences per step (default: micro-batch x dp)."),
        opt("--num-gpus", type=int, default=1, show_default=True, help="GPUs in the layout."),
        opt("--tp", type=int, default=1, show_default=True, help="Tensor-parallel degree."),
        opt("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel degree."),
        opt("--zero", type=int, default=0, show_default=True, help="ZeRO stage 0-3 over the data-parallel group."),
        plan_field("precision"),
        plan_field("fp8_recipe"),
        plan_field("fp8_attention"),
        opt("--recompute", type=click.Choice(list(RECOMPUTE)), default=RECOMPUTE[0], show_default=True,
            help="Activation recomputation: every_2nd recomputes every second block, full every block (the "
                 "runner's modes); selective recomputes each block's core attention (Megatron-LM / NeMo's default), "
                 "op is torchtitan's op-level selective checkpointing (half the matmuls and the elementwise ops "
                 "recomputed); those two are priced, not measurable by the runner."),
        opt("--sequence-parallel", is_flag=True, help="Shard norms and dropout over the tensor-parallel group."),
        opt("--no-flash-attention", is_flag=True,
            help="Attention scores are materialised (5 a s^2 b bytes per layer)."),
        opt("--schedule", type=click.Choice(list(SCHEDULES)), default=SCHEDULES[0], show_default=True,
            help="Pipeline schedule; zero-bubble: interleaved_zb, zbv, dualpipev."),
        opt("--virtual-stages", type=int, default=1, show_default=True, help=VIRTUAL_STAGES_HELP),
        opt("--pp-last-layers", type=int, default=None, metavar="K",
            help="Blocks on the last pipeline stage, which also runs the output layer: the others share the rest "
                 "(Megatron-LM's --decoder-last-pipeline-num-layers, or a pipeline layout that lightens the last "
                 "stage). Default: every stage ceil(layers / pp), Megatron-LM's default split."),
        opt("--ep", type=int, default=1, show_default=True,
            help="Expert-parallel degree (MoE models): routed experts sharded over ep of the data-parallel ranks."),
        opt("--etp", type=int, default=1, show_default=True,
            help="Expert tensor-parallel degree (MoE models): each routed expert split over etp ranks, its "
                 "ep x etp ranks carved from tp x dp x cp (Megatron-Core's expert_tensor_parallel_size, which "
                 "defaults to the tp degree there; 1 here: whole experts, MoE parallel folding). Priced: weights "
                 "and gradient traffic / etp, an all-gather and a reduce-scatter of the routed rows a layer pass."),
        opt("--cp", type=int, default=1, show_default=True,
            help="Context-parallel degree: each sequence split over cp ranks (K/V all-gathered per layer)."),
        opt(flag_of("replicas"), "replicas", type=int, default=1, show_default=True, metavar="REPLICAS",
            help="HSDP (with --zero 3): shard over dp x cp / REPLICAS ranks, replicate across REPLICAS groups."),
        plan_field("offload"),
        plan_field("optimizer"),
        plan_field("memory_margin"),
        plan_field("state_bytes"),
    ]


# `mgbench memory --trace`: run the real model and strategy on fake tensors.
TRACE = opt("--trace", is_flag=True,
            help="Also build the model and strategy for real on fake tensors (nothing is allocated) at this world "
                 "size, train two steps, and report the tracked peak per category next to the model's.")
LARGEST_LAYER = opt("--largest-layer-params", type=float, default=None, metavar="N",
                    help="With --params under ZeRO-3: parameters of the largest layer, gathered whole (twice: "
                         "computed and prefetched) on every GPU; the input DeepSpeed's estimator takes.")
TRACE_STRATEGY = opt("--strategy", "trace_strategy", default=None, metavar="NAME",
                     help="With --trace: the runner strategy to trace (default: the one the layout describes, "
                          "e.g. fsdp for --zero 3).")


def overlap_option() -> Opt:
    """predict's --overlap: plan's field, but unset by default so a --calibrate fit can supply it."""
    return plan_field("overlap").but(default=None)


# --- prices and calibration (predict, plan, report's plan section) --------------------

PRICES_FILE = opt("--prices", "prices_file", help="TOML file of prices ([on_demand.NAME] usd = ...).")
PRICE = opt("--price", "price_overrides", multiple=True, metavar="NAME=USD",
            help="USD per GPU-hour for an accelerator or system, e.g. h100-sxm=2.1 or b200:spot=3 (repeatable).")
PRICES = (PRICES_FILE, PRICE)

RESULTS_DIR = opt("--results-dir", default="results", show_default=True,
                  help="Folder of run folders (on a cluster: one every node mounts).")
CALIBRATE = opt("--calibrate", "calibrate_run",
                help="A measured run: fit the model's efficiencies to it (on its GPU) and use them.")
COMM_RUN = opt("--comm", "comm_run",
               help="A `mgbench comm` run: its measured link bandwidth and latency replace the catalog's for its GPU.")


HARDWARE = opt("--hardware", "hardware_profile", metavar="PROFILE",
               help="A profile written by `mgbench probe`: predict with this machine's measured throughputs "
                    "instead of catalog constants.")
AGAINST = opt("--against", "against_run", metavar="RUN",
              help="With --hardware: predict every ok config of this measured run and report the errors.")

# --calibrate RUN, --comm RUN and the --results-dir they are looked up in.
CALIBRATION_GROUP = (CALIBRATE, COMM_RUN, RESULTS_DIR)


# --- device and cluster (run, comm, slurm) ---------------------------------------------

DEVICE = opt("--device", type=click.Choice(list(DEVICES)), default="auto", show_default=True,
             help="CPU ranks (gloo) or CUDA devices (NCCL); auto: CUDA where the ranks run has it (this machine; "
                  "for `mgbench slurm`, the compute nodes: CUDA).")
RUN_ID = opt("--run-id", default=None,
             help="Name of the run folder (default: time + what runs); the same on every node.")
NNODES = opt("--nnodes", type=int, default=1, show_default=True,
             help="Nodes in a multi-node launch (the same command on each node).")
NODE_RANK = opt("--node-rank", type=int, default=0, show_default=True,
                help="This node's rank; node 0 writes the results.")
RDZV_ENDPOINT = opt("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                    help="c10d rendezvous endpoint (usually node 0's address).")
NPROC_PER_NODE = opt("--nproc-per-node", type=int, default=None,
                     help="Ranks per node (default: GPUs per node; CPU ranks without GPUs).")
CLUSTER = (NNODES, NODE_RANK, RDZV_ENDPOINT)
OVERRIDES = opt("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                help="Override a sweep key, TOML value: --set nproc=[1,2] --set strategy=fsdp.")
METRIC = opt("--metric", default="tokens_per_s", show_default=True, help="Record field compared between two runs.")


def cluster_options(f: F) -> F:
    """--nnodes, --node-rank, --rdzv-endpoint: one launch per node, meeting at node 0."""
    return options(*CLUSTER)(f)
