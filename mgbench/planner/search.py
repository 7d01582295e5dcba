"""`mgbench plan`: search system x GPUs x TP x PP x DP x ZeRO x micro-batch x recompute
x context parallelism (long sequences) x expert parallelism (MoE models) x CPU offload
(with --offload).

Every candidate is evaluated at once with numpy (memory.py and perf.py take arrays),
one system at a time. Layouts that do not divide or do not fit in memory are dropped;
the rest get days, GPU-hours, cost and energy; the best layout per (system, GPU count)
forms the ranked table and the time-vs-cost Pareto front.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import catalog
from ..errors import MgbenchError
from ..layout import LIMITS, OPTIMIZERS, RECOMPUTE, Layout, fp8_attention_problem, fp8_recipe_problem
from ..model_shape import ModelShape
from ..strategies.schedules import VIRTUAL, too_few_chunks, v_shaped
from . import cost, decision, hardware, host_step, layout_rules, layout_time, ownership, perf, stack
from .predict import FP32_STATE_BYTES, model_notes
from .uncertainty import NO_MOE_RUN
from .moe import MoeOptions, moe_class
from .memory import (ALLOWANCE_FRACTION, SCHEDULES, STATE_BYTES, check_margin, held_state_bytes,
                     memory_per_gpu)
from ..probe.profile import STACK as profile_stack
from ..probe.profile import holds_cuda_context
from .optimizer import NS_STEPS
from .perf import FP8_RECIPES

TP_CHOICES = (1, 2, 4, 8)
PP_CHOICES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)
ZERO_CHOICES = (0, 1, 2, 3)
MICRO_BATCH_CHOICES = (1, 2, 4, 8)
# Context parallelism is searched from this sequence length on: below it a K/V all-gather
# per layer buys activation memory the other axes already free (torchtitan's CP tables
# start at 32K tokens). A search-cost choice, stated in the output.
CP_MIN_SEQ = 16384
CP_CHOICES = (1, 2, 4, 8, 16)
# Expert-parallel degrees for MoE models (DeepSeek-V3 trained with 64; Megatron-Bridge's
# GB200 recipes run 64 inside one NVL72 domain; 128 and 256 spread 256-expert models one or
# two experts a GPU). Degrees the model's experts do not divide are dropped.
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# --schedule searched: what plan tries for every pipelined candidate, (schedule, virtual
# stages). 1F1B and Megatron-LM's interleaved 1F1B, the schedules the stacks it serves run
# by default (Megatron-LM, NeMo, torchtitan's Interleaved1F1B); the zero-bubble ones are
# asked for by name.
SEARCHED = "searched"
SEARCHED_SCHEDULES = (("1f1b", 1), ("interleaved", 2), ("interleaved", 4))
# --pp-split's fixed choices: the blocks split evenly over the stages (Megatron-LM's
# default), or the last stage lightened for the output layer (perf.balanced_last_layers).
EVEN, BALANCED = "even", "balanced"
# --virtual-stages, as predict, memory and plan take it (cli_options.layout_group).
VIRTUAL_STAGES_HELP = "Model chunks per pipeline rank (interleaved, interleaved_zb; zbv and dualpipev hold two)."


# Defaults of the buy-versus-rent assumptions (data/ownership.toml [defaults], sourced there).
_OWN = catalog.load("ownership.toml")["defaults"]


@dataclass(frozen=True)
class Bound:
    """The values a number option takes: from ``low`` (excluded when ``low_open``) to
    ``high``, finite. A PlanOptions field's metadata "bounds" (checked by
    :func:`check_bounds`, before anything is priced)."""

    low: float
    high: float = math.inf
    low_open: bool = False

    def describe(self) -> str:
        def num(x: float) -> str:  # 16777216 as "16,777,216", not "1.67772e+07"
            return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"

        if self.high == math.inf:
            return "positive" if (self.low, self.low_open) == (0, True) else f"{num(self.low)} or more"
        return (f"{'above' if self.low_open else 'from'} {num(self.low)} {'and at most' if self.low_open else 'to'} "
                f"{num(self.high)}")

    def problem(self, flag: str, value: Any) -> str | None:
        """One line where ``value`` (None: not given) is outside the bound."""
        if value is None:
            return None
        v = float(value)
        if not math.isfinite(v):
            return f"{flag} must be a finite number, {self.describe()}, got {value}"
        if (v > self.low if self.low_open else v >= self.low) and v <= self.high:
            return None
        return f"{flag} must be {self.describe()}, got {value}"


# The most GPUs plan searches. Its candidate arrays grow with the GPU counts: one 8-GPU-node
# system searched to this many took about 40 s and 4.6 GB at its peak on the project's
# 2-core VM (a review's measurement, 2026-11-29), so the cap keeps a search inside a
# laptop's memory. predict prices one layout and takes up to layout.MAX_DEGREE GPUs.
MAX_PLAN_GPUS = 131072

POSITIVE = Bound(0.0, low_open=True)
NON_NEGATIVE = Bound(0.0)
AT_LEAST_ONE = Bound(1.0)
FRACTION = Bound(0.0, 1.0)


@dataclass
class PlanOptions:
    """What `mgbench plan` searches and the cost assumptions it prices with.

    Each field's metadata is its command-line option (mgbench/cli_options.py builds
    `plan`'s options and `report`'s --plan-* options from these fields): "help" is the
    option's help text, "choices" its allowed values, "metavar" its placeholder,
    "bounds" the :class:`Bound` of a number's values, and "set_by" names the option that
    fills a field which is not an option itself. A field added here is an option of
    `plan` with no other edit.
    """

    tokens: float = field(metadata={"bounds": POSITIVE, "help": "Training tokens, e.g. 1.5e13."})
    seq_len: int = field(default=4096, metadata={"bounds": Bound(1.0, LIMITS["seq_len"]),
                                                 "help": "Sequence length in tokens."})
    global_batch_tokens: int = field(
        default=4 * 2**20,  # 4M tokens per step, a common large-model batch
        metadata={"bounds": Bound(1.0, LIMITS["global_batch"] * LIMITS["seq_len"]),
                  "help": "Tokens per optimizer step (global batch x sequence length)."})
    systems: list[str] | None = field(
        default=None, metadata={"help": "Comma-separated catalog systems (default: all).", "metavar": "A,B,..."})
    max_gpus: int = field(default=4096, metadata={"bounds": Bound(1.0, MAX_PLAN_GPUS),
                                                  "help": "Largest GPU count considered."})
    precision: str = field(
        default="bf16",
        metadata={"help": "Training precision: the peak FLOP/s used and the bytes per value.",
                  "choices": tuple(STATE_BYTES)})
    fp8_recipe: str | None = field(
        default=None, metadata={"help": "FP8 scaling recipe under --precision fp8, for what casting each linear's "
                                        "operands costs: delayed (Megatron-Core's default), "
                                        "tensorwise (per-tensor current scaling: Megatron-Bridge's FP8-CS, "
                                        "torchao's default), rowwise (torchao), mxfp8 (parts with mx_formats in hardware.toml: "
                                        "Blackwell, CDNA 4), blockwise "
                                        "(DeepSeek-V3's 1 x 128 tiles). Default: the --stack's.",
                                "choices": FP8_RECIPES})
    fp8_attention: bool = field(
        default=False, metadata={"help": "Attention's scores and values in FP8 too under --precision fp8 (Transformer "
                                         "Engine's fp8_dpa, Megatron-Bridge's fp8_dot_product_attention: its 26.06 "
                                         "recipes on Blackwell Ultra set it), priced at the FP8 / BF16 fused-attention "
                                         "time measured on the GPU (efficiency.toml [fp8_attention]); a GPU without "
                                         "that measurement is refused."})
    schedule: str = field(
        default=SEARCHED, metadata={"help": "Pipeline schedule of the pipelined candidates: 'searched' (default) tries "
                                            "1F1B and interleaved 1F1B with 2 and 4 virtual stages and keeps each "
                                            "layout's best; or one schedule for all (zero-bubble: interleaved_zb, "
                                            "zbv, dualpipev).",
                                    "choices": (SEARCHED, *SCHEDULES)})
    virtual_stages: int = field(default=1, metadata={"bounds": AT_LEAST_ONE, "help": VIRTUAL_STAGES_HELP + " With a named --schedule."})
    pp_split: str = field(default=SEARCHED, metadata={
        "help": "How pipelined candidates split their blocks: 'even' gives every stage ceil(layers / pp), "
                "Megatron-LM's default; 'balanced' lightens the last stage to make room for the output layer, as "
                "Megatron-LM's --decoder-last-pipeline-num-layers and its recipes' layouts do (the plan shows "
                "'last=K', the blocks to give it); 'searched' (default) prices both and keeps each layout's better.",
        "choices": (SEARCHED, BALANCED, EVEN)})
    offload: bool = field(default=False, metadata={
        "help": "FSDP2 CPU offload with ZeRO-3: weights, gradients and optimizer states in host memory, copied over "
                "the host link (plan: considered beside no offload for ZeRO-3 layouts)."})
    optimizer: str = field(default=OPTIMIZERS[0], metadata={
        "help": "The optimizer: what its own step costs beyond an elementwise update. muon prices its Newton-Schulz "
                f"iterations ({NS_STEPS} a step on every block matrix, at the GEMM rate, shared by a replica's GPUs) "
                "and, under CPU offload, its gradient, momentum and weight copied to the GPU and back; the runner "
                "runs adamw only.",
        "choices": OPTIMIZERS})
    deadline_days: float | None = field(
        default=None, metadata={"bounds": POSITIVE, "help": "Keep only options that finish within this many days."})
    budget_usd: float | None = field(
        default=None, metadata={"bounds": POSITIVE, "help": "Keep only options that cost at most this many USD."})
    spot: bool = field(default=False, metadata={"help": "Spot prices and preemptions."})
    checkpoint_minutes: float = field(
        default=60.0, metadata={"bounds": POSITIVE, "help": "Minutes between checkpoints (a failure loses half of one, on average)."})
    failure_rate: float = field(
        default=cost.FAILURE_RATE_PER_GPU_HOUR,
        metadata={"bounds": NON_NEGATIVE, "help": "Failures per GPU-hour (default from Llama 3's 54-day report)."})
    restart_minutes: float = field(
        default=cost.RESTART_MINUTES,
        metadata={"bounds": NON_NEGATIVE, "help": "Minutes to detect a failure, reschedule and reload a checkpoint (an assumption)."})
    checkpoint_write_minutes: float = field(
        default=cost.CHECKPOINT_WRITE_MINUTES,
        metadata={"bounds": NON_NEGATIVE, "help": "Minutes the job stalls per checkpoint save (an assumption)."})
    preemption_rate: float = field(
        default=cost.SPOT_PREEMPTIONS_PER_NODE_HOUR,
        metadata={"bounds": NON_NEGATIVE, "help": "Spot preemptions per node-hour, when on spot (an assumption)."})
    power_fraction: float = field(
        default=cost.POWER_FRACTION_OF_TDP,
        metadata={"bounds": Bound(0.0, 1.0, low_open=True), "help": "Average GPU power as a fraction of TDP (an assumption)."})
    pue: float = field(
        default=cost.PUE, metadata={"help": "Facility power usage effectiveness (an assumption)."})
    overlap: float = field(
        default=perf.DEFAULT_OVERLAP,
        metadata={"bounds": FRACTION, "help": "Fraction of the data-parallel communication window hidden behind backward."})
    top: int = field(default=20, metadata={"bounds": AT_LEAST_ONE, "help": "Rows of the ranked table."})
    premium: float = field(
        default=decision.PREMIUM,
        metadata={"help": "Without a deadline or budget, plan leads with the fastest option costing at most this "
                          "fraction more than the cheapest (0: the cheapest)."})
    own: str | None = field(
        default=None, metadata={"help": "Plan on GPUs you already own, SYSTEM:COUNT (e.g. dgx-h100:64): that system "
                                        "only, at most COUNT GPUs; cost is the marginal energy (the servers are paid "
                                        "for); the fastest layout leads.", "metavar": "SYSTEM:COUNT"})
    server_price: list[str] | None = field(
        default=None, metadata={"help": "Your price for a whole server, SYSTEM=USD (comma-separated), instead of "
                                        "data/ownership.toml's.", "metavar": "SYSTEM=USD,..."})
    depreciation_years: float = field(
        default=_OWN["depreciation_years"], metadata={"help": "Years an owned server is written off over (buy versus rent)."})
    utilisation: float = field(
        default=_OWN["utilisation"],
        metadata={"help": "Share of its hours an owned server trains (buy versus rent; an assumption)."})
    electricity_usd_per_kwh: float = field(
        default=_OWN["electricity_usd_per_kwh"], metadata={"help": "Electricity price at the facility (buy versus rent)."})
    hosting_usd_per_kw_month: float = field(
        default=_OWN["hosting_usd_per_kw_month"],
        metadata={"help": "Colocation: space, power and cooling capacity per kW of server per month, electricity "
                          "not included (buy versus rent)."})
    memory_margin: float = field(
        default=ALLOWANCE_FRACTION,
        metadata={"help": "Memory kept free beyond what is counted, as a fraction of it (allocator fragmentation "
                          "and workspaces; a stated margin, not a measurement): lower to run closer to the edge."})
    state_bytes: list[str] | None = field(
        default=None, metadata={"help": stack.STATE_BYTES_HELP, "metavar": "W,G,O"})
    stack: str = field(
        default=stack.DEFAULT_STACK,
        metadata={"help": "Software stack whose published runs set the achieved efficiency "
                          "(mgbench/data/stacks.toml; a stack with no measured run is refused with the reason).",
                  "choices": tuple(stack.stacks())})
    # How an MoE model routes and moves its tokens (planner/moe.py MoeOptions).
    moe: MoeOptions = field(default_factory=MoeOptions, metadata={"set_by": "--moe-dispatcher"})  # and every --moe-*
    # A hardware profile (`mgbench probe`): plan on the probed machine instead of catalog systems.
    profile: dict[str, Any] = field(default_factory=dict, metadata={"set_by": "--hardware"})
    calibration: dict[str, Any] = field(default_factory=dict, metadata={"set_by": "--calibrate"})
    # The calibrated systems' interval regime (uncertainty.calibrated of the same fit).
    calibration_regime: dict[str, Any] = field(default_factory=dict, metadata={"set_by": "--calibrate"})
    # system -> measured Hardware link fields
    links: dict[str, dict[str, float]] = field(default_factory=dict, metadata={"set_by": "--comm"})

    @property
    def sequences(self) -> int:
        """The sequences a step holds (--global-batch-tokens / --seq-len, at least one): the
        batch every layout's micro-batch x dp must divide."""
        return max(1, self.global_batch_tokens // self.seq_len)


def field_problem(name: str, value: Any) -> str | None:
    """The one-line problem of a PlanOptions field's value outside its bounds (None: in
    them, or a field without bounds): for commands that share the field's option."""
    f = next(x for x in dataclasses.fields(PlanOptions) if x.name == name)
    b = f.metadata.get("bounds")
    return None if b is None else b.problem(f"--{name.replace('_', '-')}", value)


def check_bounds(opts: PlanOptions) -> None:
    """MgbenchError naming every option outside its bounds, and a step of fewer tokens
    than one sequence, before anything is priced (a NaN, a negative rate or a zero
    interval would otherwise surface as a traceback or an absurd figure)."""
    problems = [p for f in dataclasses.fields(PlanOptions) if (p := field_problem(f.name, getattr(opts, f.name)))]
    try:
        if stack.parse_state_bytes(opts.state_bytes) is not None and opts.precision == "fp32":
            problems.append(FP32_STATE_BYTES)
    except MgbenchError as e:
        problems.append(str(e))
    if not problems and opts.global_batch_tokens < opts.seq_len:
        problems.append(f"--global-batch-tokens {opts.global_batch_tokens} is less than one sequence (--seq-len "
                        f"{opts.seq_len}): give {opts.seq_len} or more")
    if problems:
        raise MgbenchError("; ".join(problems))


def largest_prime_factor(n: int) -> int:
    """The largest prime dividing ``n`` (1 for 1)."""
    largest, p = 1, 2
    while p * p <= n:
        while n % p == 0:
            n, largest = n // p, p
        p += 1
    return n if n > 1 else largest


def batch_note(opts: PlanOptions) -> str | None:
    """A line where the step's sequences shut out most GPU counts: every layout's micro-
    batch x dp must divide them (Megatron-LM's rule, layout_rules "batch"), and a batch
    whose power-of-two part is below 256 with an odd factor above 7 has few such
    divisors. The nearest batches on either side whose odd part is 7 or less (2^a x 1, 3,
    5 or 7, at least 256 sequences) are named. None for a batch without the problem."""
    B = opts.sequences
    largest = largest_prime_factor(B)
    if largest <= 7 or B & -B >= 256:  # B & -B: its power-of-two part
        return None

    def opens(n: int) -> bool:
        return n >= 256 and largest_prime_factor(n) <= 7 and n & -n >= 32

    lo = next((n for n in range(B - 1, 255, -1) if opens(n)), None)
    hi = next(n for n in range(B + 1, 4 * B + 512) if opens(n))
    near = " or ".join(f"{n} sequences (--global-batch-tokens {n * opts.seq_len})" for n in (lo, hi) if n)
    return (f"the step's {B} sequences (--global-batch-tokens {opts.global_batch_tokens} / --seq-len {opts.seq_len}) "
            f"have the factor {largest}, and micro-batch x dp must divide them: most GPU counts are shut out; "
            f"{near} open them")


def gpu_counts(gpus_per_node: int, max_gpus: int) -> np.ndarray:
    """Partial nodes by powers of two, then whole nodes up to max_gpus; where a node is
    not a power of two (a GB200 NVL72 rack of 72), also multiples of its largest power of
    two, that many GPUs of each node: a batch of 2^k sequences splits over no multiple of
    72, and NVIDIA's GB200 runs use 64, 128, 256 GPUs (Megatron-Bridge's tables)."""
    small = [1 << k for k in range(gpus_per_node.bit_length()) if (1 << k) < gpus_per_node]
    whole = list(range(gpus_per_node, max_gpus + 1, gpus_per_node))
    part = 1 << (gpus_per_node.bit_length() - 1)  # the largest power of two <= gpus_per_node
    spread = list(range(2 * part, max_gpus + 1, part)) if part != gpus_per_node else []
    return np.array(sorted({n for n in small + whole + spread if n <= max_gpus}), dtype=np.int64)


def extra_axes(shape: ModelShape, opts: PlanOptions) -> tuple[list[int], list[int], list[bool]]:
    """The values of the axes searched beyond the classic ones: context-parallel degrees
    (from CP_MIN_SEQ tokens on, those splitting the sequence into 2 cp equal chunks),
    expert-parallel degrees (MoE models: those dividing the experts) and offload (with
    --offload)."""
    cps = [c for c in CP_CHOICES if c == 1 or (opts.seq_len >= CP_MIN_SEQ and opts.seq_len % (2 * c) == 0)]
    eps = [e for e in EP_CHOICES if e == 1 or (shape.is_moe and shape.experts % e == 0)]
    return cps, eps, [False, True] if opts.offload else [False]


def _grid(*axes: np.ndarray) -> list[np.ndarray]:
    return [g.ravel() for g in np.meshgrid(*axes, indexing="ij")]


def evaluate_system(shape: ModelShape, system: str, opts: PlanOptions, prices: cost.Prices,
                    kept: dict[Any, Any] | None = None) -> tuple[dict[str, np.ndarray], int]:
    """All candidates of one system; returns the feasible ones (columns) and the count
    evaluated. ``kept``: a dict :func:`kept_layouts` may reuse across the systems of one
    plan (their layouts differ only by GPUs a node); never across plans (it is keyed on
    the GPU counts and GPUs a node only, the shape and options being the plan's)."""
    from .resolve import resolve

    hw = resolve(precision=opts.precision, system=system, calibration=opts.calibration.get(system),
                 links=opts.links.get(system), stack=None if opts.stack == stack.DEFAULT_STACK else opts.stack,
                 offload=opts.offload)
    return evaluate_hardware(shape, hw, gpu_counts(hw.gpus_per_node, opts.max_gpus), opts, prices, opts.overlap,
                             kept=kept)


def profile_counts(profile: dict[str, Any], max_gpus: int) -> list[int]:
    """Rank counts a probed machine can run: powers of two and its device count, up to its
    devices (GPU) or cores (CPU: more ranks than cores only time-share them)."""
    top = min(max_gpus, profile["cores"] if profile["device"] == "cpu" else profile.get("num_devices", 1))
    return sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= top} | ({top} if top >= 1 else set()))


def evaluate_profile(shape: ModelShape, opts: PlanOptions, prices: cost.Prices) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Candidates on the probed machine of ``opts.profile``, one rank count at a time (on
    CPU each count has its own share of the cores); counts the profile cannot price are
    skipped with the reason."""
    from ..probe import profile as P
    from .resolve import resolve

    pieces, evaluated, notes = [], 0, []
    for n in profile_counts(opts.profile, opts.max_gpus):
        try:
            hw = resolve(precision=opts.precision, profile=opts.profile, ranks=n)
        except MgbenchError as e:
            notes.append(f"{n} rank(s) not considered: {e}")
            continue
        hw = dataclasses.replace(hw, gpus_per_node=n)
        cols, k = evaluate_hardware(shape, hw, np.array([n], dtype=np.int64), opts, prices,
                                    min(opts.overlap, P.overlap(opts.profile, n, opts.overlap)))
        pieces.append(cols)
        evaluated += k
    return pieces, evaluated, notes


def kept_layouts(shape: ModelShape, opts: PlanOptions, counts: np.ndarray, gpus_per_node: int) -> dict[str, Any]:
    """The candidate layouts at these GPU counts that the layout rules keep
    (planner/layout_rules.py, the ones predict keeps), for each schedule variant: the
    degree columns that pass the cheap checks (``rows``: num_gpus, tp, pp, zero,
    micro_batch, recompute), and per variant the (indices into them, cp, ep, offload)
    groups the rules keep (``picked``); ``evaluated``: the candidates counted. Nothing of
    it depends on the hardware but its GPUs a node, so a plan computes it once for all
    systems alike (:func:`evaluate_hardware`'s ``kept``)."""
    B = opts.sequences
    tps_ = np.array([t for t in TP_CHOICES if t <= gpus_per_node])
    pps = np.array([p for p in PP_CHOICES if p <= shape.layers])
    N, T, P, Z, MB, RC = _grid(counts, tps_, pps,
                               np.array(ZERO_CHOICES), np.array(MICRO_BATCH_CHOICES), np.arange(len(RECOMPUTE)))
    cps, eps, offs = extra_axes(shape, opts)
    # Every candidate once, and the pipelined ones again under each further schedule.
    variants = schedule_variants(opts)
    # The pipelined rows once a split under each schedule (_splits).
    passes = sum(len(split_kinds(opts, name)) for name, _ in variants)
    evaluated = (N.size + (passes - 1) * int((P > 1).sum())) * len(cps) * len(eps) * len(offs)
    heads_ok = (shape.heads % T == 0) & ((shape.kv_heads % T == 0) | (T % shape.kv_heads == 0))
    ok = heads_ok & (N % (T * P) == 0)
    # ZeRO stages only differ with data parallelism (dp x cp > 1): keep stage 0 alone without it.
    ok &= (N // np.maximum(T * P, 1) > 1) | (Z == 0)
    N, T, P, Z, MB, RC = (a[ok] for a in (N, T, P, Z, MB, RC))
    # The added axes, crossed with the rows that survive the checks above only, one value
    # at a time (a full cross product of millions of rows costs more in allocation).
    picks = []
    for j, variant in enumerate(variants):
        # The first schedule prices every candidate; the others only the pipelined ones
        # (without a pipeline the schedule changes nothing).
        piped = np.ones(N.shape, dtype=bool) if j == 0 else P > 1
        picked: list[tuple[np.ndarray, int, int, bool]] = []
        for cp in cps:
            # ZeRO stages only differ with data parallelism (a search choice, not a rule).
            D_cp = N // np.maximum(T * P * cp, 1)
            differ = piped & ((D_cp * cp > 1) | (Z == 0))
            # The rules at their loosest ep and offload keep a superset of what they keep at
            # any (layout_rules.LOOSEST): every rule then runs on those rows only, a fraction
            # of the grid, once for each ep and offload.
            loose = np.flatnonzero(differ & layout_rules.keeps_all(layout_rules.rules(shape, candidates(
                opts, B, schedule=variant, num_gpus=N, tp=T, pp=P, cp=cp, zero=Z, micro_batch=MB, recompute=RC,
                **layout_rules.LOOSEST))))
            sub = {k: a[loose] for k, a in (("num_gpus", N), ("tp", T), ("pp", P), ("zero", Z), ("micro_batch", MB),
                                            ("recompute", RC))}
            for ep in eps:
                for off in offs:
                    # The one set of rules predict keeps too (planner/layout_rules.py).
                    ok = layout_rules.keeps_all(layout_rules.rules(shape, candidates(
                        opts, B, schedule=variant, cp=cp, ep=ep, offload=off, **sub)))
                    picked.append((loose[ok], cp, ep, off))
        picks.append(picked)
    rows = (N, T, P, Z, MB, RC)
    for a in (*rows, *(x[0] for picked in picks for x in picked)):
        a.setflags(write=False)  # shared by the systems of a plan
    return {"rows": rows, "variants": variants, "picked": picks, "evaluated": evaluated}


def evaluate_hardware(shape: ModelShape, hw: hardware.Hardware, counts: np.ndarray, opts: PlanOptions,
                      prices: cost.Prices, overlap: float,
                      kept: dict[Any, Any] | None = None) -> tuple[dict[str, np.ndarray], int]:
    """All candidates on ``hw`` at these GPU counts (columns of the feasible ones) and the
    count evaluated. ``kept``: a dict holding :func:`kept_layouts` by (counts, GPUs a node),
    filled here, for the systems of one plan to share."""
    system = hw.system
    B = opts.sequences
    key = (tuple(int(c) for c in np.asarray(counts).ravel()), int(hw.gpus_per_node))
    if kept is not None and key in kept:
        layouts = kept[key]
    else:
        layouts = kept_layouts(shape, opts, counts, hw.gpus_per_node)
        if kept is not None:
            kept[key] = layouts
    N, T, P, Z, MB, RC = layouts["rows"]
    evaluated, variants = layouts["evaluated"], layouts["variants"]
    names = ("num_gpus", "tp", "pp", "zero", "micro_batch", "recompute", "dp", "cp", "ep", "num_micro_batches")
    parts = []
    for j, (variant, picked) in enumerate(zip(variants, layouts["picked"])):
        idx = np.concatenate([x[0] for x in picked])
        CP, EP, OFF = (np.repeat(np.array([x[k] for x in picked]), [x[0].size for x in picked]) for k in (1, 2, 3))
        Nj, Tj, Pj, Zj, MBj, RCj = (a[idx] for a in (N, T, P, Z, MB, RC))
        D = Nj // (Tj * Pj * CP)
        rows = dict(zip(names, (Nj, Tj, Pj, Zj, MBj, RCj, D, CP, EP, B // (MBj * D))))
        for split_rows in _splits(shape, opts, rows, variant[0]):
            for off in np.unique(OFF[split_rows["_index"]]):  # offload and the schedule: one value a call
                at = OFF[split_rows["_index"]] == off
                got_j = _evaluate_rows(shape, hw, opts, overlap, B,
                                       {k: a[at] for k, a in split_rows.items() if k != "_index"}, bool(off), variant)
                parts.append(got_j | {"schedule_index": np.full(got_j["tp"].shape, j)})
    if parts:
        got = {k: np.concatenate([x[k] for x in parts]) for k in parts[0]}
    else:
        got = {k: np.zeros(0, dtype=np.int64) for k in (*names, "schedule_index")} | {
            k: np.zeros(0) for k in ("offload", "memory_per_gpu_bytes", "host_memory_per_gpu_bytes",
                                     "tokens_per_s", "mfu", "pp_last_layers")}
    N, T, P, Z, MB, RC, D, CP, EP, M = (got[k] for k in names)
    OFF, mem_total, host, tps, mfu = (got[k] for k in ("offload", "memory_per_gpu_bytes", "host_memory_per_gpu_bytes",
                                                       "tokens_per_s", "mfu"))
    # Where this accelerator's efficiency was not measured, every figure the ranking reads
    # is the pessimistic end of its interval (issue 29): the point estimate is kept beside.
    factor, evidence = ranking_factor(hw, opts, P > 1, shape, EP, OFF)
    tps_point, mfu_point = tps, mfu
    tps, mfu = tps / factor, mfu / factor
    good = cost.goodput(N, hw.gpus_per_node, opts.checkpoint_minutes, opts.failure_rate, opts.restart_minutes,
                        opts.checkpoint_write_minutes, opts.spot, opts.preemption_rate)
    hours = opts.tokens / tps / 3600.0 / good
    # A cloud instance type is rented whole: a layout on part of one pays for all its GPUs.
    billed = billed_gpus(system, N, hw.gpus_per_node)
    gpu_hours = billed * hours
    price, price_source = prices.lookup(system, hw.gpu, opts.spot)
    usd = gpu_hours * price if price is not None else np.full(N.shape, np.nan)
    cols = {
        "num_gpus": N, "tp": T, "pp": P, "dp": D, "cp": CP, "ep": EP, "offload": OFF, "zero": Z, "micro_batch": MB,
        "recompute": RC, "num_micro_batches": M, "tokens_per_s": tps, "mfu": mfu, "goodput": good, "days": hours / 24.0,
        "gpu_hours": gpu_hours, "billed_gpus": billed, "cost_usd": usd,
        "usd_per_million_tokens": usd / (opts.tokens / 1e6),
        "energy_kwh": cost.energy_kwh(N, hw.tdp_w, hours, opts.power_fraction, opts.pue),
        "memory_per_gpu_bytes": mem_total, "host_memory_per_gpu_bytes": host,
        "tokens_per_s_point": tps_point, "mfu_point": mfu_point, "ranking_factor": factor,
        "schedule_index": got["schedule_index"], "pp_last_layers": got["pp_last_layers"],
    }
    cols["_meta"] = {"system": system, "gpu": hw.gpu, "price_usd_per_gpu_hour": price, "price_source": price_source,
                     "schedules": variants,
                     "evidence": evidence,
                     "device_memory_bytes": hw.memory_bytes, "max_power_kw": hw.max_power_kw,
                     "gpus_per_node": hw.gpus_per_node, "tdp_w": hw.tdp_w}  # type: ignore[assignment]
    return cols, evaluated


def billed_gpus(system: str, num_gpus: Any, gpus_per_node: int) -> Any:
    """The GPUs a layout pays for: on a cloud instance type (hardware.toml ``cloud``),
    whole instances of ``gpus_per_node`` (4 GPUs of an 8-GPU p5.48xlarge bill 8); the
    GPUs it uses elsewhere (a price per GPU-hour, as GPU clouds sell them)."""
    if not catalog.systems().get(system, {}).get("cloud"):
        return np.asarray(num_gpus)
    return cost.nodes(num_gpus, gpus_per_node) * gpus_per_node


def schedule_variants(opts: PlanOptions) -> tuple[tuple[str, int], ...]:
    """The (schedule, virtual stages) pairs a plan prices its pipelined candidates with:
    SEARCHED_SCHEDULES with ``--schedule searched``, else the one named."""
    return SEARCHED_SCHEDULES if opts.schedule == SEARCHED else ((opts.schedule, opts.virtual_stages),)


def candidates(opts: PlanOptions, global_batch: Any, schedule: tuple[str, int] | None = None,
               **columns: Any) -> Layout:
    """The search's candidate layouts as one Layout whose degree fields are the columns
    given (num_gpus, tp, pp, cp, ep, zero, micro_batch, recompute as its index, offload;
    arrays or scalars) and whose other fields are the plan's: its sequence, batch and
    precision, sequence parallelism wherever tp > 1, and ``schedule`` (schedule, virtual
    stages; default: the plan's first, :func:`schedule_variants`)."""
    name, v = schedule or schedule_variants(opts)[0]
    return Layout(seq_len=opts.seq_len, global_batch=global_batch, precision=opts.precision,
                  fp8_recipe=opts.fp8_recipe, fp8_attention=opts.fp8_attention, optimizer=opts.optimizer,
                  sequence_parallel=columns["tp"] > 1, schedule=name, virtual_stages=v,
                  **columns)


def layout_of_row(r: dict[str, Any], opts: PlanOptions) -> Layout:
    """The Layout of one ranked row of a plan (what `mgbench predict` is given for it)."""
    return candidates(opts, r["micro_batch"] * r["dp"] * r["num_micro_batches"],
                      schedule=(r["schedule"] or "1f1b", r["virtual_stages"] or 1),
                      **{k: r[k] for k in ("num_gpus", "tp", "pp", "cp", "ep", "zero", "micro_batch", "recompute",
                                           "offload")}, pp_last_layers=r.get("pp_last_layers"))


def evidence_of(reg: dict[str, Any]) -> str:
    """Whether an interval regime's efficiency was "measured" on its accelerator (or on
    the machine itself: a probe, a calibration), "carried" from a sibling or "assumed"; for
    an MoE model on a GPU no published MoE run ran on, uncertainty.NO_MOE_RUN."""
    if "evidence" in reg:
        return reg["evidence"]
    return "assumed" if reg["regime"] in ("catalog-assumed", "probed-unvalidated") else "measured"


def ranking_factor(hw: hardware.Hardware, opts: PlanOptions, pipelined: np.ndarray,
                   shape: ModelShape, ep: np.ndarray, offload: np.ndarray) -> tuple[np.ndarray, str]:
    """Per candidate, the step-time factor the ranking applies, and the evidence: 1 where
    the accelerator's efficiency was measured (on it, or on this machine by a probe or a
    calibration); else 1 + the upper half-width of its interval (uncertainty.regime), so
    that an accelerator nothing measured is ranked on the pessimistic end and cannot win
    on an assumed efficiency. A candidate's MoE class depends on its expert-parallel
    degree ``ep`` (moe.moe_class: across AWS EFA nodes or not) and on whether it offloads
    (``offload``: an offloading MoE run is a class of its own), as the interval plan prints
    for it does."""
    from . import uncertainty

    out = np.ones(np.shape(pipelined))
    if opts.profile or (opts.calibration_regime and hw.system in opts.calibration):
        return out, "measured"
    evidence = "measured"
    ep = np.broadcast_to(np.asarray(ep), np.shape(pipelined))
    off = np.broadcast_to(np.asarray(offload, dtype=bool), np.shape(pipelined))
    for pipe in (False, True):
        for e in np.unique(ep):
            for o in np.unique(off):
                reg = uncertainty.regime(hw.gpu, pipe, None, stack=opts.stack,
                                         moe=moe_class(shape, opts.moe, hw.system, int(e), offload=bool(o),
                                                       stack=opts.stack))
                ev = evidence_of(reg)
                if ev != "measured":
                    out = np.where((np.asarray(pipelined) == pipe) & (ep == e) & (off == o), 1.0 + reg["high"], out)
                    evidence = ev
    return out, evidence


def split_kinds(opts: PlanOptions, schedule: str) -> tuple[str, ...]:
    """The block splits plan prices a pipelined candidate with under ``schedule``
    (--pp-split): "even" (Megatron-LM's default), "balanced" (a lighter last stage:
    perf.balanced_last_layers), or both where the split is searched (plan's default:
    ranking then keeps each layout's better). Under a V-shaped schedule the stage that runs
    the output layer is rank 0, beside the embedding: the balanced split lightens it."""
    return (EVEN, BALANCED) if opts.pp_split == SEARCHED else (opts.pp_split,)


def _splits(shape: ModelShape, opts: PlanOptions, rows: dict[str, np.ndarray],
            schedule: str) -> list[dict[str, np.ndarray]]:
    """The candidate ``rows`` under each of :func:`split_kinds`, with their pp_last_layers
    (NaN: even; a balanced split that cannot lighten a row leaves it even, and a searched
    one drops it, the even pass having priced it). ``_index`` gives each returned row's
    place in ``rows``."""
    n = rows["pp"].shape[0]
    kinds = split_kinds(opts, schedule)
    out = []
    for kind in kinds:
        if kind == EVEN:
            out.append({**rows, "pp_last_layers": np.full(n, np.nan), "_index": np.arange(n)})
            continue
        last = perf.balanced_last_layers(shape, opts.seq_len, rows["pp"], rows["recompute"])
        keep = ~np.isnan(last) if EVEN in kinds else np.ones(n, dtype=bool)
        out.append({**{k: a[keep] for k, a in rows.items()}, "pp_last_layers": last[keep],
                    "_index": np.flatnonzero(keep)})
    return out


def planned_stack(opts: PlanOptions) -> str:
    """The stack plan counts memory and picks the FP8 recipe by: on a probed machine
    (--hardware) mgbench's runner, as `mgbench memory --hardware` counts it; else --stack."""
    return profile_stack if opts.profile else opts.stack


def planned_recipe(opts: PlanOptions) -> str | None:
    """The FP8 recipe plan prices under --precision fp8 (--fp8-recipe, else the planned
    stack's); None under another precision."""
    return stack.fp8_recipe(planned_stack(opts), opts.fp8_recipe) if opts.precision == "fp8" else None


def _evaluate_rows(shape: ModelShape, hw: hardware.Hardware, opts: PlanOptions, overlap: float, B: int,
                   rows: dict[str, np.ndarray], offload: bool, schedule: tuple[str, int]) -> dict[str, np.ndarray]:
    """Memory of the candidate ``rows`` under ``schedule``; the ones that fit, with their throughput."""
    cand = candidates(opts, B, schedule=schedule, offload=offload,
                      **{k: rows[k] for k in ("num_gpus", "tp", "pp", "cp", "ep", "zero", "micro_batch", "recompute",
                                              "pp_last_layers")})
    held = stack.memory_of(planned_stack(opts), stack.parse_state_bytes(opts.state_bytes))
    mem = memory_per_gpu(shape, num_micro=cand.num_micro, **cand.model_kwargs(), **held,
                         margin=opts.memory_margin, fixed=holds_cuda_context(opts.profile), moe=opts.moe)
    fits = mem["total_bytes"] <= hw.memory_bytes
    kept = cand.take(fits)
    out = layout_time.step_time(shape, hw, global_batch=B, overlap=overlap, moe=opts.moe,
                                offload_state_bytes=held_state_bytes(opts.precision, held["state_bytes"]),
                                optimizer=opts.optimizer, **kept.model_kwargs())
    return {**{k: a[fits] for k, a in rows.items()}, "offload": np.full(fits.sum(), offload),
            "memory_per_gpu_bytes": mem["total_bytes"][fits],
            "host_memory_per_gpu_bytes": np.broadcast_to(mem["host_bytes"], fits.shape)[fits],
            "tokens_per_s": out["tokens_per_s"], "mfu": out["mfu"]}


def check_schedule(opts: PlanOptions) -> None:
    """One clear error for options plan cannot search as asked: virtual stages without
    a schedule that takes them, or an interleaved schedule without them; an FP8 recipe
    without FP8 (the Layout's own refusal, said once rather than once a system)."""
    why = fp8_recipe_problem(opts.precision, opts.fp8_recipe) or fp8_attention_problem(
        opts.precision, opts.fp8_attention, planned_recipe(opts))
    if why is not None:
        raise MgbenchError(why)
    if opts.schedule == SEARCHED and opts.virtual_stages != 1:
        raise MgbenchError(f"--virtual-stages {opts.virtual_stages} applies to a named --schedule (e.g. --schedule "
                           "interleaved); --schedule searched tries 2 and 4 virtual stages itself")
    if too_few_chunks(opts.schedule, opts.virtual_stages):
        raise MgbenchError(f"--schedule {opts.schedule} runs 2 or more model chunks a pipeline rank: give "
                           "--virtual-stages 2 or more (or --schedule 1f1b)")
    if opts.schedule != SEARCHED and (why := layout_rules.virtual_stages_problem(opts.schedule, opts.virtual_stages)) is not None:
        raise MgbenchError(why)


def schedule_label(r: dict[str, Any]) -> str:
    """A ranked row's pipeline schedule in words, ``interleaved v=4``, ``1f1b``, with the
    last stage's blocks where the split sets them (``1f1b last=1``); "" for a row without
    a pipeline (its schedule is None: _row) or from before plan searched them."""
    if not r.get("schedule"):
        return ""
    last = f" last={r['pp_last_layers']:g}" if r.get("pp_last_layers") is not None else ""
    return r["schedule"] + (f" v={r['virtual_stages']}" if r["schedule"] in VIRTUAL else "") + last


def _row(cols: dict[str, Any], i: int) -> dict[str, Any]:
    meta = cols["_meta"]
    r: dict[str, Any] = {"system": meta["system"], "gpu": meta["gpu"]}
    for k, v in cols.items():
        if k == "_meta":
            continue
        x = v[i].item()
        r[k] = None if isinstance(x, float) and np.isnan(x) else x
    r["recompute"] = RECOMPUTE[int(r["recompute"])]
    r["schedule"], r["virtual_stages"] = meta["schedules"][int(r.pop("schedule_index"))]
    if r["pp"] == 1:  # no pipeline: no schedule
        r["schedule"] = r["virtual_stages"] = None
    if r.get("pp_last_layers") is not None:
        r["pp_last_layers"] = int(r["pp_last_layers"])
    r["node_power_kw"] = meta["max_power_kw"]
    r["cluster_power_kw"] = (meta["max_power_kw"] * int(cost.nodes(r["num_gpus"], meta["gpus_per_node"]))
                             if meta["max_power_kw"] else None)
    r["evidence"] = meta["evidence"]
    r["price_usd_per_gpu_hour"] = meta["price_usd_per_gpu_hour"]
    r["device_memory_bytes"] = meta["device_memory_bytes"]
    return r


# Seconds between progress lines of a long search (none for a search shorter than that).
PROGRESS_EVERY_S = 5.0


def plan(shape: ModelShape, opts: PlanOptions, prices: cost.Prices | None = None,
         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Search every system's layouts; return ranked bests, the Pareto front and a
    recommendation. ``progress``: told how far the search is, every
    :data:`PROGRESS_EVERY_S` seconds of a long one."""
    t0 = time.perf_counter()
    check_bounds(opts)
    prices = prices or cost.Prices()
    assumptions = _assumptions(opts)
    own = _owned(opts)
    rents = prices  # what renting costs, for buy versus rent (under --own, plan's prices are the energy)
    if own is not None:
        opts, prices = _plan_on_owned(opts, prices, assumptions, *own)
    names = opts.systems or list(hardware.systems())
    for s in names:
        if s not in hardware.systems():
            raise MgbenchError("--systems: " + catalog.unknown_name("system", s, hardware.systems()))
    check_margin(opts.memory_margin)
    check_schedule(opts)
    decision.check_premium(opts.premium)
    evaluated, feasible, bests, price_notes, notes = 0, 0, [], {}, []
    if opts.profile:
        pieces, evaluated, notes = evaluate_profile(shape, opts, prices)
        if not pieces:
            raise MgbenchError("the profile cannot price any rank count: " + "; ".join(notes))
    else:
        pieces = []
        kept: dict[Any, Any] = {}  # the layout rules' verdicts, alike for systems with as many GPUs a node
        told = t0
        for i, s in enumerate(names, 1):
            try:
                cols, n = evaluate_system(shape, s, opts, prices, kept)
            except MgbenchError as e:  # e.g. --precision fp8 on a GPU without FP8 units
                if opts.systems:
                    raise
                notes.append(f"{s} not considered: {e}")
                continue
            evaluated += n
            pieces.append(cols)
            now = time.perf_counter()
            if progress is not None and now - told >= PROGRESS_EVERY_S and i < len(names):
                progress(f"plan: {i} of {len(names)} systems searched ({evaluated:,} layouts, {now - t0:.0f} s)")
                told = now
        if not pieces:
            raise MgbenchError("no system can be considered: " + "; ".join(notes))
        if max(extra_axes(shape, opts)[0]) == 1 and opts.seq_len < CP_MIN_SEQ:
            notes.append(f"context parallelism searched from --seq-len {CP_MIN_SEQ} on (cp = 1 here)")
        if (why := batch_note(opts)) is not None:
            notes.append(why)
    from .memory_validation import stack_memory_notes

    notes.extend(stack_memory_notes(shape, opts.stack))
    for cols in pieces:
        s = cols["_meta"]["system"]
        k = cols["num_gpus"].size
        feasible += k
        price_notes[s] = cols["_meta"]["price_source"]
        if k == 0:
            continue
        # Best layout per GPU count: highest throughput (ties: less memory).
        order = np.lexsort((cols["memory_per_gpu_bytes"], -cols["tokens_per_s"], cols["num_gpus"]))
        first = np.ones(order.size, dtype=bool)
        first[1:] = cols["num_gpus"][order][1:] != cols["num_gpus"][order][:-1]
        bests += [_row(cols, i) for i in order[first]]
    elapsed = time.perf_counter() - t0

    def allowed(r: dict[str, Any]) -> bool:
        if opts.deadline_days is not None and r["days"] > opts.deadline_days:
            return False
        if opts.budget_usd is not None and (r["cost_usd"] is None or r["cost_usd"] > opts.budget_usd):
            return False
        return True

    ok = [r for r in bests if allowed(r)]
    ranked = sorted(ok, key=lambda r: (r["cost_usd"] is None, r["cost_usd"] or 0.0, r["days"]))
    for r in ranked[: opts.top]:
        _add_interval(r, opts, shape)
    constrained = opts.deadline_days is not None or opts.budget_usd is not None
    rec, rule, lead_why = decision.lead(ranked, constrained, opts.premium, own)
    front = decision.front(ok)
    cheapest = ranked[0] if ranked and ranked[0]["cost_usd"] is not None else None
    fastest = min(ok, key=lambda r: r["days"]) if ok else None
    other = decision.runner_up(rec, ranked, rule, opts.premium) if rec is not None else None
    for r in [rec, cheapest, fastest, other, *front]:  # the front is drawn with its intervals (--html)
        if r is not None and "days_interval" not in r:
            _add_interval(r, opts, shape)
    reasons = _recommend(rec, rule, lead_why, cheapest, fastest, ranked, bests, opts)
    if rec is not None and rec.get("pp_last_layers") is not None:
        reasons.append(last_stage_reason(shape, rec))
    reasons += notes
    reasons += model_notes(shape)
    if not opts.profile and (carried := stack.carried_note(opts.stack)) is not None:
        reasons.append(carried)
    reasons += evidence_lines(rec, ranked)
    reasons += _distinguishable(rec, ranked[: opts.top])
    if shape.is_moe and rec is not None:
        # plan picks the GPU count (and prices the run's --moe-* levers): say how the planner
        # did on the model's published runs, and how the published A/B pairs of those levers
        # bear the model out
        from .moe_pairs import evidence_notes

        reasons += evidence_notes(shape, opts.moe, system=rec["system"], ep=rec["ep"], gpu_count=True)
    if rec is not None and opts.deadline_days is not None and rec["days_interval"][1] > opts.deadline_days:
        reasons.append(f"at its interval's upper end ({rec['days_interval'][1]:.1f} days) it would miss the "
                       f"{opts.deadline_days:g}-day deadline")
    return {
        "model": shape.name, "tokens": opts.tokens, "seq_len": opts.seq_len,
        "global_batch": opts.sequences,
        "num_candidates": evaluated, "num_feasible": feasible, "num_meeting_constraints": len(ok),
        "elapsed_s": elapsed, "candidates_per_s": evaluated / elapsed if elapsed > 0 else None,
        "recommendation": rec, "reasons": reasons, "ranked": ranked[: opts.top],
        "lead": {"rule": rule, "row": rec, "why": lead_why}, "cheapest": cheapest, "fastest": fastest,
        "flips": decision.flips(rec, other, ranked) if rec is not None else None,
        "lead_memory": _lead_memory(shape, rec, opts) if rec is not None else None,
        "ownership": _ownership([rec, cheapest, other], rents, assumptions, opts) if rec is not None else [],
        "owned": None if own is None else {"system": own[0], "gpus": own[1]},
        "options": bests, "pareto": front, "prices": price_notes,
        "assumptions": {
            "failure_rate_per_gpu_hour": opts.failure_rate, "checkpoint_minutes": opts.checkpoint_minutes,
            "restart_minutes": opts.restart_minutes, "power_fraction_of_tdp": opts.power_fraction, "pue": opts.pue,
            "spot": opts.spot, "overlap": opts.overlap, "stack": None if opts.profile else opts.stack,
            "precision": opts.precision,
            "fp8_recipe": planned_recipe(opts),
            "fp8_attention": opts.fp8_attention,
            "hardware_profile": opts.profile.get("hostname") if opts.profile else None,
        },
    }


def _add_interval(r: dict[str, Any], opts: PlanOptions, shape: ModelShape) -> None:
    """A candidate's intervals (planner/uncertainty.py): on step time and tokens/s per GPU,
    and, scaled alike, on days and cost (both proportional to step time); ``shape``: the
    model, whose MoE class (moe.moe_class) picks the MoE runs' residuals."""
    from . import uncertainty

    reg = uncertainty.regime(r["gpu"], r["pp"] > 1, opts.profile or None,
                             stack=stack.DEFAULT_STACK if opts.profile else opts.stack,
                             moe=moe_class(shape, opts.moe, r["system"], r["ep"], offload=r["offload"],
                                           stack=opts.stack))
    if opts.calibration_regime and r["system"] in opts.calibration:
        reg = uncertainty.with_moe(opts.calibration_regime,
                                   moe_class(shape, opts.moe, r["system"], r["ep"], offload=r["offload"],
                                             stack=opts.stack))
    # Around the point estimate: a row ranked at its pessimistic end holds that end.
    f = r.get("ranking_factor", 1.0)
    step = opts.sequences * opts.seq_len / r["tokens_per_s_point"]
    iv = uncertainty.intervals(step, r["tokens_per_s_point"] / r["num_gpus"], reg)
    unchecked = host_step.unchecked(shape.is_moe, opts.optimizer) if r["offload"] else []
    r.update(step_time_s_interval=iv["step_time_s_interval"],
             tokens_per_s_per_gpu_interval=iv["tokens_per_s_per_gpu_interval"], regime=reg["regime"],
             interval_reasons=[*reg["reasons"], *unchecked])
    lo, hi = (1.0 - reg["low"]) / f, (1.0 + reg["high"]) / f
    r["days_interval"] = [r["days"] * lo, r["days"] * hi]
    r["cost_usd_interval"] = None if r["cost_usd"] is None else [r["cost_usd"] * lo, r["cost_usd"] * hi]


def _unmeasured(ev: str) -> str:
    """Why a GPU ranks on its interval's pessimistic end, by its evidence, as a clause."""
    if ev == NO_MOE_RUN:
        return "no published MoE run ran on it"
    return f"its efficiency is {ev}, not measured on it"


def _settles(ev: str) -> str:
    """What would settle an unmeasured GPU's figure, by its evidence."""
    return "a published MoE run on it would settle it" if ev == NO_MOE_RUN else \
        "`mgbench probe` on it, or a published run, would settle it"


def evidence_lines(lead_row: dict[str, Any] | None, ranked: list[dict[str, Any]]) -> list[str]:
    """What the evidence behind the ranking changes: the lead's own figures where they are
    its pessimistic end, and the option that would be the cheapest on its point estimate
    but is not measured, with the throughput at which it would be ("MI300X is the
    cheapest only if its training throughput per GPU is at least X% of H100's")."""
    lines = []
    if lead_row is not None and lead_row.get("ranking_factor", 1.0) > 1.0:
        r = lead_row
        lines.append(f"{r['gpu']}: {_unmeasured(r['evidence'])}, so it leads on the pessimistic "
                     f"end of its interval, {r['days']:.1f} days (point estimate {r['days'] / r['ranking_factor']:.1f})")
    priced = [r for r in ranked if r["cost_usd"] is not None]
    if not priced:
        return lines
    cheapest = priced[0]
    by_point = min(priced, key=lambda r: r["cost_usd"] / r.get("ranking_factor", 1.0))
    if by_point is not cheapest and by_point["gpu"] != cheapest["gpu"]:
        u, c = by_point, cheapest
        point_cost = u["cost_usd"] / u["ranking_factor"]
        # Cost falls as throughput rises (same GPUs, same price): u is the cheaper where its
        # per-GPU throughput exceeds its point estimate x (its point cost / c's cost).
        need = (u["tokens_per_s_point"] / u["num_gpus"]) * point_cost / c["cost_usd"]
        ref = c["tokens_per_s"] / c["num_gpus"]
        lines.append(
            f"{u['num_gpus']}x {u['gpu']} ({u['system']}) would be the cheapest on its point estimate (USD "
            f"{point_cost:,.0f} against USD {c['cost_usd']:,.0f} for {c['num_gpus']}x {c['gpu']}), but "
            f"{_unmeasured(u['evidence'])}, so it is ranked at its pessimistic end (USD {u['cost_usd']:,.0f}). "
            f"It is the cheapest only if its training throughput per GPU is at least {100 * need / ref:.0f}% of "
            f"{c['gpu']}'s here; the point estimate says "
            f"{100 * u['tokens_per_s_point'] / u['num_gpus'] / ref:.0f}% ({_settles(u['evidence'])})")
    return lines


def _distinguishable(best: dict[str, Any] | None, ranked: list[dict[str, Any]]) -> list[str]:
    """The lead's interval, and which other options it cannot be told apart from by the
    lead's own rule's figure (cost when priced, else days)."""
    from .uncertainty import overlap

    if best is None:
        return []
    key = "cost_usd_interval" if best["cost_usd"] is not None else "days_interval"
    close = [r for r in ranked if r is not best and r.get(key) and overlap(best[key], r[key])]
    lines = [f"prediction interval ({best['regime']}): {best['days_interval'][0]:.1f} to {best['days_interval'][1]:.1f} days; "
             + "; ".join(best["interval_reasons"])]
    if close:
        lines.append("not distinguishable from it within the intervals: " + ", ".join(
            f"{r['num_gpus']}x {r['gpu']} ({r['system']})" for r in close[:5]))
    return lines


def _recommend(rec: dict[str, Any] | None, rule: str, lead_why: list[str], cheapest: dict[str, Any] | None,
               fastest: dict[str, Any] | None, ranked: list[dict[str, Any]], all_rows: list[dict[str, Any]],
               opts: PlanOptions) -> list[str]:
    """The lines that explain the lead answer, then the cheapest and the fastest beside it."""
    if not all_rows:
        return ["no layout within --max-gpus keeps the layout rules (tp dividing the heads, micro-batch x dp dividing "
                "the step's sequences, ...) and fits in memory; raise --max-gpus, or see the notes below"]
    if rec is None:
        fastest_any = min(all_rows, key=lambda r: r["days"])
        return [f"no layout meets the constraints; the fastest is {fastest_any['num_gpus']}x {fastest_any['gpu']} "
                f"({fastest_any['system']}) at {fastest_any['days']:.1f} days"]
    r = rec
    reasons = [
        f"{r['num_gpus']}x {r['gpu']} ({r['system']}) with tp={r['tp']} pp={r['pp']} dp={r['dp']}"
        + (f" cp={r['cp']}" if r["cp"] > 1 else "") + (f" ep={r['ep']}" if r["ep"] > 1 else "")
        + f", ZeRO-{r['zero']}" + (" with CPU offload" if r["offload"] else "")
        + f", micro-batch {r['micro_batch']}, recompute {r['recompute']}"
        + (f", schedule {lab}" if (lab := schedule_label(r)) else ""),
        *lead_why,
        f"{r['days']:.1f} days at {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.0f}%, goodput "
        f"{100 * r['goodput']:.0f}%" + (f", USD {r['cost_usd']:,.0f} ({r['usd_per_million_tokens']:.3f} per million "
                                        "tokens)" if r["cost_usd"] is not None else ", no price known")
        + (f", billed for {r['billed_gpus']} GPUs (whole {r['system']} instances)"
           if r["billed_gpus"] != r["num_gpus"] else ""),
        f"needs {r['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU of {r['device_memory_bytes'] / 1e9:.0f} GB "
        f"({r['device_memory_bytes'] / hardware.GIB:.0f} GiB)",
    ]
    if (warn := decision.long_run_warning(r)) is not None:
        reasons.append(warn)
    for name, other in (("cheapest", cheapest), ("fastest", fastest)):
        if other is not None and other is not r:
            cost = f", USD {other['cost_usd']:,.0f}" if other["cost_usd"] is not None else ""
            reasons.append(f"{name}: {other['num_gpus']}x {other['gpu']} ({other['system']}), {other['days']:.1f} days"
                           f"{cost}" + (f" ({decision.long_run_warning(other)})"
                                        if decision.long_run_warning(other) else ""))
    return reasons


def last_stage_reason(shape: ModelShape, r: dict[str, Any]) -> str:
    """What ``last=K`` asks of a stack: K blocks on the last pipeline stage, the rest on the
    others. Megatron-LM's --decoder-last-pipeline-num-layers K takes it only where the rest
    splits evenly over the other stages (and, interleaved, every stage's blocks over its
    chunks); a pipeline layout string (--pipeline-model-parallel-layout) takes any split.
    Under a V (zbv, dualpipev) the stage is rank 0, whose two chunks the run builds
    itself (DualPipe and torch's ZB-V take a module per chunk)."""
    k, p, v = r["pp_last_layers"], r["pp"], r.get("virtual_stages") or 1
    if r.get("schedule") and v_shaped(r["schedule"]):
        return (f"last={k}: give rank 0, which runs the output layer beside the embedding in the V, {k} blocks over "
                f"its two chunks and the other {p - 1} ranks the rest (the chunks are built per rank: DualPipe and "
                f"ZB-V take a module per chunk). How the {k} divide between its chunks is not priced: the time counts "
                f"the rank's {k} blocks, the memory bounds the rank by another's blocks; the last chunk, beside the "
                f"output layer, is the one to lighten; mgbench predict --pp-last-layers {k}")
    rest = shape.layers - k
    flag = rest % (p - 1) == 0 and (v == 1 or (k % v == 0 and (rest // (p - 1)) % v == 0))
    how = (f"Megatron-LM --decoder-last-pipeline-num-layers {k}" if flag else
           "a Megatron-Core --pipeline-model-parallel-layout string that does so "
           f"(--decoder-last-pipeline-num-layers {k} needs the rest to split evenly over the stages and chunks)")
    return (f"last={k}: give the last pipeline stage {k} blocks and the other {p - 1} the rest, to make room for the "
            f"output layer: {how}; mgbench predict --pp-last-layers {k}")


def _lead_memory(shape: ModelShape, r: dict[str, Any], opts: PlanOptions) -> dict[str, Any]:
    """The lead layout's memory, component by component (`mgbench memory` of it)."""
    from .predict import memory

    lay = layout_of_row(r, opts)
    out = memory(shape, lay, stack=planned_stack(opts), margin=opts.memory_margin, fixed=holds_cuda_context(opts.profile),
                 moe=opts.moe, state_bytes=stack.parse_state_bytes(opts.state_bytes))
    out["device_memory_bytes"] = r["device_memory_bytes"]
    return out


def _assumptions(opts: PlanOptions) -> ownership.Assumptions:
    """The buy-versus-rent assumptions of ``opts``, checked."""
    a = ownership.Assumptions(depreciation_years=opts.depreciation_years, utilisation=opts.utilisation,
                              electricity_usd_per_kwh=opts.electricity_usd_per_kwh,
                              hosting_usd_per_kw_month=opts.hosting_usd_per_kw_month, pue=opts.pue,
                              power_fraction=opts.power_fraction)
    a.check()
    return a


def _server_prices(opts: PlanOptions) -> dict[str, float]:
    """--server-price SYSTEM=USD,... as a dict, with one line for a malformed item."""
    out: dict[str, float] = {}
    for item in opts.server_price or []:
        name, _, value = item.partition("=")
        try:
            usd = float(value)
        except ValueError:
            raise MgbenchError(f"--server-price {item!r}: expected SYSTEM=USD, e.g. dgx-h100=300000") from None
        if not 0 < usd < float("inf") or name not in hardware.systems():
            raise MgbenchError(f"--server-price {item!r}: a known system (one of {', '.join(hardware.systems())}) "
                               "and a positive price")
        out[name] = usd
    return out


def _owned(opts: PlanOptions) -> tuple[str, int] | None:
    """--own SYSTEM:COUNT, checked."""
    if not opts.own:
        return None
    name, colon, count = opts.own.partition(":")
    if name not in hardware.systems():
        raise MgbenchError(f"--own {opts.own!r}: {name!r} is not a catalog system; give SYSTEM:COUNT, e.g. "
                           f"dgx-h100:64 (systems: {', '.join(hardware.systems())})")
    if not colon or not (count.isascii() and count.isdecimal()) or not 1 <= int(count) <= MAX_PLAN_GPUS:
        raise MgbenchError(f"--own {opts.own!r}: the GPU count after the colon must be a whole number from 1 to "
                           f"{MAX_PLAN_GPUS:,}, e.g. {name}:64")
    if opts.systems and opts.systems != [name]:
        raise MgbenchError("--own plans on the system you own: drop --systems")
    return name, int(count)


def _plan_on_owned(opts: PlanOptions, prices: cost.Prices, a: ownership.Assumptions, system: str, count: int
                   ) -> tuple[PlanOptions, cost.Prices]:
    """The owned system alone, at most ``count`` GPUs, priced at the energy a GPU-hour draws."""
    import copy

    srv = ownership.server(system, _server_prices(opts))
    if srv["power_kw"] is None:
        raise MgbenchError(f"--own {system}: its power is not in the catalog, so its energy cannot be priced")
    energy = ownership.energy_usd_per_gpu_hour(srv, a)
    owned = copy.deepcopy(prices)
    for tier in cost.TIERS:
        owned.table[tier][system] = {"usd": energy, "source": f"owned: energy only, {srv['power_kw']:g} kW x "
                                     f"{a.power_fraction:g} / {srv['gpus']} GPUs x PUE {a.pue:g} x USD "
                                     f"{a.electricity_usd_per_kwh:g}/kWh", "illustrative": False}
    return dataclasses.replace(opts, systems=[system], max_gpus=count, spot=False), owned


def _ownership(rows: list[dict[str, Any] | None], prices: cost.Prices, a: ownership.Assumptions,
               opts: PlanOptions) -> list[dict[str, Any]]:
    """Buying against renting for the systems of the lead, the cheapest and the runner-up."""
    systems = list(dict.fromkeys(r["system"] for r in rows if r is not None and r["system"] in hardware.systems()))
    overrides = _server_prices(opts)
    out = []
    for system in systems:
        gpu = hardware.systems()[system]["gpu"]
        rents = {t: prices.lookup(system, gpu, tier=t)[0] for t in cost.TIERS}
        out.append(ownership.compare(system, a, rents, overrides))
    return out
