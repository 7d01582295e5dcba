"""Suites: TOML sweep definitions -> validated, expanded list of RunConfig.

A suite file has ``name``, ``description``, a ``[sweep]`` table (or several
``[[sweep]]`` tables, whose configs add up), and optional ``[cpu]`` and ``[gpu]`` tables
whose keys override every sweep on that kind of machine. Every sweep key takes one
value or a list; the cartesian product of the lists is the set of
configs. Configs that cannot run here are kept, with ``status = "skipped"`` and the
reason, so a sweep never loses a point silently.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import catalog
from .errors import MgbenchError
from .model_shape import ModelShape
from .strategies import PIPELINED, STRATEGIES, dims_for

PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
CHECKPOINTING = ("none", "selective", "full")
DEVICES = ("auto", "cpu", "cuda")


def _int(min_value: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not isinstance(v, int) or isinstance(v, bool):
            return f"must be an integer, got {v!r}"
        if v < min_value:
            return f"must be >= {min_value}, got {v}"
        return None

    return check


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v not in allowed:
            hint = difflib.get_close_matches(str(v), allowed, n=1)
            more = f" (did you mean {hint[0]!r}?)" if hint else ""
            return f"{v!r} is not one of {', '.join(allowed)}{more}"
        return None

    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _nproc(v: Any) -> str | None:
    if v in ("pow2", "all"):
        return None
    err = _int(1)(v)
    return f"{err} (or \"pow2\" / \"all\" for the detected devices)" if err else None


def _model(v: Any) -> str | None:
    if isinstance(v, str):
        return _choice(tuple(catalog.model_presets()))(v)
    if isinstance(v, dict):
        try:
            ModelShape.from_dict(v)
        except MgbenchError as e:
            return str(e)
        return None
    return f"must be a preset name or a table of dims, got {v!r}"


def _layout(v: Any) -> str | None:
    if v == "auto":
        return None
    if not isinstance(v, dict) or not v:
        return f"must be a table of degrees such as {{dp = 2, tp = 2}}, got {v!r}"
    for k, d in v.items():
        if k not in ("dp", "tp", "pp"):
            hint = difflib.get_close_matches(k, ("dp", "tp", "pp"), n=1)
            return f"unknown degree {k!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "") + "; allowed: dp, tp, pp"
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            return f"degree {k} must be a positive integer, got {d!r}"
    return None


def _inject(v: Any) -> str | None:
    from .runner.inject import parse

    if not isinstance(v, str):
        return f"must be a string such as \"oom@step=3,rank=1\" or \"none\", got {v!r}"
    try:
        parse(v)
    except ValueError as e:
        return str(e)
    return None


# key -> (validator, default, help). The one schema for suite files and --set.
SWEEP_KEYS: dict[str, tuple[Callable[[Any], str | None], Any, str]] = {
    "workload": (_choice(("gpt",)), "gpt", "training workload (decoder LM)"),
    "model": (_model, "tiny", "preset name (see models.toml) or {layers, hidden, heads, ffn_hidden, vocab, ...}"),
    "strategy": (_choice(tuple(STRATEGIES)), "single", "parallelism strategy"),
    "nproc": (_nproc, 1, "ranks (devices) per config; \"pow2\" = 1, 2, 4 ... up to the devices found"),
    "micro_batch": (_int(1), 1, "sequences per rank per micro-step"),
    "seq_len": (_int(2), 128, "tokens per sequence"),
    "grad_accum": (_int(1), 1, "micro-batches per optimizer step (pipelines: the schedule's micro-batch count)"),
    "layout": (_layout, "auto", "parallel degrees, e.g. {dp = 2, tp = 2}; \"auto\": the strategy's default"),
    "dp_mode": (_choice(("ddp", "fsdp")), "ddp", "data parallelism inside pp+tp+dp: ddp or fsdp"),
    "pp_schedule": (_choice(SCHEDULES), "1f1b", "pipeline schedule: gpipe, 1f1b or interleaved (1F1B)"),
    "virtual_stages": (_int(1), 2, "model chunks per rank for the interleaved schedule"),
    "precision": (_choice(PRECISIONS), "fp32", "fp32, bf16 (autocast) or fp16 (autocast + loss scaling)"),
    "activation_checkpointing": (_choice(CHECKPOINTING), "none", "none, selective (every 2nd block) or full (every block)"),
    "compile": (_bool, False, "torch.compile each block"),
    "warmup_steps": (_int(0), 3, "untimed steps before the measured window"),
    "measured_steps": (_int(2), 10, "timed optimizer steps per repeat"),
    "repeats": (_int(1), 1, "measured windows per config"),
    "rounds": (_int(1), 1, "measure each config in this many rounds, interleaved with the other configs of its "
                           "torchrun job (round 1 of every config, then round 2, ...); each round rebuilds the "
                           "model and warms up again. For shared or noisy machines, whose speed drifts over minutes"),
    "seed": (_int(0), 0, "seed of weights and random tokens"),
    "check_steps": (_int(0), 3, "first steps whose loss is checked against the single-process reference (0: no check)"),
    "timeout_s": (_int(1), 900, "seconds a config (each round of it) may take before its job is stopped"),
    "device": (_choice(DEVICES), "auto", "cpu, cuda, or auto (cuda when present)"),
    "grad_compression": (_choice(("none", "fp16", "bf16", "powersgd")), "none",
                         "DDP communication hook compressing gradients (lossy: looser loss tolerance)"),
    "powersgd_rank": (_int(1), 2, "matrix rank of PowerSGD's low-rank gradient approximation"),
    "profile": (_bool, False, "after the timed window, profile a few steps and split them into compute / communication / idle"),
    "profile_steps": (_int(1), 3, "steps in the profiled window"),
    "inject": (_inject, "none", "fault injection for testing recovery: oom@step=S,rank=R | crash@... | kill@... | hang@... | slow@rank=R,factor=F"),
}
TOP_KEYS = {"name", "description", "sweep", "cpu", "gpu"}


@dataclass(frozen=True)
class RunConfig:
    """One point of a sweep: everything the worker needs to run it."""

    strategy: str
    nproc: int
    model: dict[str, Any]
    micro_batch: int
    seq_len: int
    grad_accum: int
    precision: str
    activation_checkpointing: str
    compile: bool
    warmup_steps: int
    measured_steps: int
    repeats: int
    seed: int
    check_steps: int
    timeout_s: int
    device: str
    layout: Any = "auto"
    dp_mode: str = "ddp"
    pp_schedule: str = "1f1b"
    virtual_stages: int = 2
    dp: int = 1
    tp: int = 1
    pp: int = 1
    inject: str = "none"
    grad_compression: str = "none"
    powersgd_rank: int = 2
    profile: bool = False
    profile_steps: int = 3
    rounds: int = 1
    workload: str = "gpt"
    skip_reason: str | None = None
    config_id: str = field(default="")

    @property
    def shape(self) -> ModelShape:
        return ModelShape(**self.model)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro-batch x micro-batches x data-parallel degree."""
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def pipelined(self) -> bool:
        return self.strategy in PIPELINED

    @property
    def label(self) -> str:
        ac = "" if self.activation_checkpointing == "none" else f" ac={self.activation_checkpointing}"
        comp = " compile" if self.compile else ""
        lay = ""
        if self.tp > 1 or self.pp > 1:
            lay = f" [dp={self.dp} tp={self.tp} pp={self.pp}]"
        if self.pipelined:
            lay += f" {self.pp_schedule}" + (f" v={self.virtual_stages}" if self.pp_schedule == "interleaved" else "")
        return (
            f"{self.strategy} n={self.nproc}{lay} {self.model['name']} mb={self.micro_batch} "
            f"s={self.seq_len} ga={self.grad_accum} {self.precision}{ac}{comp}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        return cls(**d)


def config_id(params: dict[str, Any]) -> str:
    """Stable id of a config: its strategy and size, then a hash of every parameter."""
    blob = json.dumps(params, sort_keys=True).encode()
    return f"{params['strategy']}-n{params['nproc']}-{hashlib.sha1(blob).hexdigest()[:10]}"


@dataclass
class Suite:
    name: str
    description: str
    path: str
    text: str
    sweeps: list[dict[str, list[Any]]]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _check_table(where: str, table: Any) -> dict[str, list[Any]]:
    if not isinstance(table, dict):
        raise MgbenchError(f"{where}: must be a table of sweep keys")
    out: dict[str, list[Any]] = {}
    for key, value in table.items():
        if key not in SWEEP_KEYS:
            hint = difflib.get_close_matches(key, SWEEP_KEYS, n=1)
            more = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise MgbenchError(
                f"{where}: unknown key {key!r}{more}; allowed: {', '.join(SWEEP_KEYS)}"
            )
        values = value if isinstance(value, list) else [value]
        if not values:
            raise MgbenchError(f"{where}.{key}: empty list; give at least one value")
        check = SWEEP_KEYS[key][0]
        for v in values:
            err = check(v)
            if err:
                raise MgbenchError(f"{where}.{key}: {err}")
        out[key] = values
    return out


def parse_suite(text: str, path: str = "<suite>", device_kind: str = "cpu") -> Suite:
    """Parse and validate suite TOML; ``device_kind`` picks the [cpu] or [gpu] overrides."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MgbenchError(f"{path}: malformed TOML: {e}") from None
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        hint = difflib.get_close_matches(unknown[0], TOP_KEYS, n=1)
        more = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise MgbenchError(
            f"{path}: unknown top-level key {unknown[0]!r}{more}; allowed: {', '.join(sorted(TOP_KEYS))}"
        )
    raw = data.get("sweep", {})
    tables = raw if isinstance(raw, list) else [raw]
    if not tables:
        raise MgbenchError(f"{path}: [[sweep]] is empty; give at least one sweep table")
    sweeps = [_check_table(f"{path}: [sweep]" if len(tables) == 1 else f"{path}: [[sweep]] #{i + 1}", t)
              for i, t in enumerate(tables)]
    section = "gpu" if device_kind == "cuda" else "cpu"
    for kind in ("cpu", "gpu"):
        if kind in data:
            overrides = _check_table(f"{path}: [{kind}]", data[kind])
            if kind == section:
                for sweep in sweeps:
                    sweep.update(overrides)
    name = data.get("name", Path(path).stem)
    if not isinstance(name, str) or not name:
        raise MgbenchError(f"{path}: name must be a non-empty string")
    return Suite(name=name, description=str(data.get("description", "")), path=path, text=text, sweeps=sweeps)


def load_suite(path: str | Path, device_kind: str = "cpu") -> Suite:
    """Read a suite file (or a name in suites/, e.g. ``smoke``) and validate it."""
    p = resolve_suite_path(path)
    return parse_suite(p.read_text(), str(p), device_kind)


def resolve_suite_path(path: str | Path) -> Path:
    """A path as given, or ``suites/<name>.toml`` here or in the installed package's tree."""
    p = Path(path)
    if p.is_file():
        return p
    candidates = [Path("suites") / f"{path}.toml", Path(__file__).resolve().parent.parent / "suites" / f"{path}.toml"]
    for c in candidates:
        if c.is_file():
            return c
    raise MgbenchError(
        f"suite {str(path)!r} not found: give a path to a .toml file or a name in suites/ (e.g. smoke)"
    )


def suite_from_manifest(manifest: dict[str, Any], device_kind: str) -> Suite:
    """The suite a run was started with (file text, --set overrides included), for --resume."""
    info = manifest.get("suite", {})
    stored = info.get("sweeps", [info["sweep"]] if "sweep" in info else None)
    if stored is None:
        raise MgbenchError(f"run {manifest.get('run_id')} was written without its sweep; it cannot be resumed")
    parsed = parse_suite(info["text"], info.get("path", "<suite>"), device_kind)
    # The stored sweeps are the ones that ran (overrides applied, device section chosen).
    parsed.sweeps = [_check_table(f"run {manifest.get('run_id')}: stored sweep", t) for t in stored]
    return parsed


def apply_overrides(suite: Suite, overrides: list[str]) -> Suite:
    """Apply ``--set key=value`` pairs (TOML values: ``nproc=[1,2]``, ``precision="bf16"``)."""
    table: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise MgbenchError(f"--set {item!r}: expected KEY=VALUE, e.g. --set measured_steps=5")
        key, raw = item.split("=", 1)
        try:
            table[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            table[key.strip()] = raw  # a bare word: treat as a string (fsdp, bf16, tiny)
    checked = _check_table("--set", table)
    for sweep in suite.sweeps:
        sweep.update(checked)
    return suite


def _expand_nproc(values: list[Any], num_devices: int) -> list[int]:
    out: list[int] = []
    for v in values:
        if v == "all":
            out.append(num_devices)
        elif v == "pow2":
            n = 1
            while n <= num_devices:
                out.append(n)
                n *= 2
        else:
            out.append(v)
    return list(dict.fromkeys(out))


def expand(suite: Suite, device_kind: str, num_devices: int) -> list[RunConfig]:
    """The cartesian product of each sweep, each config with its skip reason (or None)."""
    configs = []
    for table in suite.sweeps:
        configs += _expand_one(suite, table, device_kind, num_devices)
    # One record per config id: duplicates (e.g. nproc listed twice) collapse.
    return list({c.config_id: c for c in configs}.values())


def _expand_one(suite: Suite, table: dict[str, list[Any]], device_kind: str, num_devices: int) -> list[RunConfig]:
    sweep = {k: table.get(k, [default]) for k, (_, default, _) in SWEEP_KEYS.items()}
    sweep["nproc"] = _expand_nproc(sweep["nproc"], num_devices)
    keys = list(sweep)
    configs = []
    for combo in itertools.product(*(sweep[k] for k in keys)):
        p = dict(zip(keys, combo))
        model = p["model"]
        shape = catalog.model_shape(model) if isinstance(model, str) else ModelShape.from_dict(model)
        p["model"] = {**shape.to_dict(), "name": model if isinstance(model, str) else "custom"}
        p["device"] = device_kind if p["device"] == "auto" else p["device"]
        if p["check_steps"] > p["warmup_steps"] + p["measured_steps"]:
            raise MgbenchError(
                f"{suite.path}: check_steps ({p['check_steps']}) exceeds warmup_steps + measured_steps "
                f"({p['warmup_steps'] + p['measured_steps']}); lower check_steps or add steps"
            )
        # Keys that only matter to some strategies are pinned for the others, so they
        # neither multiply configs nor change ids where they have no effect.
        if p["strategy"] not in PIPELINED:
            p["pp_schedule"], p["virtual_stages"] = "1f1b", 2
        elif p["pp_schedule"] != "interleaved":
            p["virtual_stages"] = 2
        if p["strategy"] != "pp+tp+dp":
            p["dp_mode"] = "ddp"
        if not p["profile"]:
            p["profile_steps"] = 3
        if p["grad_compression"] != "powersgd":
            p["powersgd_rank"] = 2
        dims, problem = dims_for(p["strategy"], p["nproc"], None if p["layout"] == "auto" else p["layout"])
        if dims is not None:
            p.update(dp=dims.dp, tp=dims.tp, pp=dims.pp)
        cid = config_id(p)
        reason = problem or _skip_reason(p, device_kind, num_devices, shape)
        configs.append(RunConfig(**p, skip_reason=reason, config_id=cid))
    return configs


def _skip_reason(p: dict[str, Any], device_kind: str, num_devices: int, shape: ModelShape) -> str | None:
    from .parallel_dims import ParallelDims

    if p["device"] == "cuda" and device_kind != "cuda":
        return "config asks for cuda but no CUDA device was found"
    dims = ParallelDims(dp=p["dp"], tp=p["tp"], pp=p["pp"])
    pipelined = p["strategy"] in PIPELINED
    problems = dims.problems(
        p["nproc"], layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads, ffn_hidden=shape.ffn_hidden,
        vocab=shape.vocab, virtual_stages=p["virtual_stages"] if pipelined and p["pp_schedule"] == "interleaved" else 1,
        num_microbatches=p["grad_accum"] if pipelined else None)
    if problems:
        return "; ".join(problems)
    if p["tp"] > 1 and shape.tie_embeddings:
        return "tensor parallelism with tied embeddings is not supported; use a model with tie_embeddings = false"
    if p["grad_compression"] != "none" and p["strategy"] not in ("ddp", "zero1"):
        return f"grad_compression is a DDP communication hook: it applies to ddp and zero1, not {p['strategy']}"
    if p["grad_compression"] == "bf16" and p["device"] == "cpu":
        return "bf16 gradient compression on CPU: gloo cannot all-reduce bf16; use fp16"
    if pipelined and shape.tie_embeddings and p["pp"] > 1:
        return "pipeline parallelism with tied embeddings is not supported (embedding and head sit on different stages)"
    if p["strategy"] == "pp+tp+dp" and p["dp_mode"] == "ddp" and p["tp"] > 1 and p["dp"] > 1:
        return "DDP cannot replicate tensor-parallel (DTensor) parameters; use dp_mode = \"fsdp\" with tp > 1 and dp > 1"
    if pipelined and p["pp_schedule"] == "interleaved" and p["grad_accum"] % p["pp"]:
        return f"the interleaved schedule needs grad_accum (micro-batches, {p['grad_accum']}) to be a multiple of pp ({p['pp']})"
    if p["nproc"] > num_devices:
        what = "GPUs" if p["device"] == "cuda" else "CPU ranks allowed here"
        return f"needs {p['nproc']} ranks but only {num_devices} {what}"
    if p["device"] == "cpu" and p["precision"] != "fp32":
        return f"{p['precision']} on CPU: gloo has no bf16/fp16 reductions; use precision = \"fp32\" on CPU"
    return None
