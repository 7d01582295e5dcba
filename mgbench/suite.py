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
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import faults
from .config import FIELDS, SWEEP_KEYS, RunConfig, applies, config_id, is_hsdp
from .errors import MgbenchError
from .layout import Layout, for_strategy, joined_problems
from .strategies import (DATA_PARALLEL, FP8_ALIGN, PIPELINED, RING_FORMS, RING_NEEDS_CUDA, moe_problem,
                         schedules)

TOP_KEYS = {"name", "description", "sweep", "cpu", "gpu"}
# The suites mgbench ships, beside the package in a source checkout (an installed wheel
# carries mgbench/ only: then there are none to name).
SHIPPED_SUITES = Path(__file__).resolve().parent.parent / "suites"


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
    if "sweep" not in data:
        # Without one the suite would silently run every key's default (one tiny config);
        # what runs by default is a suite too (`mgbench run` alone: suites/default.toml).
        raise MgbenchError(f"{path}: no [sweep] table: a suite needs one (or several [[sweep]] tables) naming what "
                           "to run, e.g. [sweep] strategy = [\"ddp\", \"fsdp\"] nproc = [1, 2]; see suites/smoke.toml")
    raw = data["sweep"]
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
    # hf:PATH in a suite file is relative to the file's folder (made absolute here, so the
    # run's stored sweeps and --resume find it from anywhere).
    from .workloads import resolve_hf_path

    for sweep in sweeps:
        if "model" in sweep:
            sweep["model"] = [resolve_hf_path(v, Path(path).parent) for v in sweep["model"]]
    name = data.get("name", Path(path).stem)
    if not isinstance(name, str) or not name:
        raise MgbenchError(f"{path}: name must be a non-empty string")
    return Suite(name=name, description=str(data.get("description", "")), path=path, text=text, sweeps=sweeps)


def load_suite(path: str | Path, device_kind: str = "cpu") -> Suite:
    """Read a suite file (or a name in suites/, e.g. ``smoke``) and validate it."""
    p = resolve_suite_path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:  # unreadable, or not text
        raise MgbenchError(f"suite {p}: cannot read it as a TOML file ({e}); give a readable .toml file") from None
    return parse_suite(text, str(p), device_kind)


def resolve_suite_path(path: str | Path) -> Path:
    """A path as given, or ``suites/<name>.toml`` here or in the installed package's tree."""
    p = Path(path)
    if p.is_file():
        return p
    candidates = [Path("suites") / f"{path}.toml", SHIPPED_SUITES / f"{path}.toml"]
    for c in candidates:
        if c.is_file():
            return c
    if p.is_dir():
        raise MgbenchError(f"suite {str(path)!r} is a folder: give a .toml file in it, e.g. {p / 'my.toml'}")
    raise MgbenchError(
        f"suite {str(path)!r} not found: give a path to a .toml file"
        + (f" or a built-in suite name ({', '.join(builtin_suites())})" if builtin_suites() else "")
    )


def builtin_suites() -> list[str]:
    """The names of the suites mgbench ships (suites/*.toml beside the package)."""
    return sorted(p.stem for p in SHIPPED_SUITES.glob("*.toml"))


def suite_from_manifest(manifest: dict[str, Any]) -> Suite:
    """The suite a run was started with (file text, --set overrides included), for --resume."""
    info = manifest.get("suite", {})
    stored = info.get("sweeps", [info["sweep"]] if "sweep" in info else None)
    if stored is None:
        raise MgbenchError(f"run {manifest.get('run_id')} was written without its sweep; it cannot be resumed")
    # The stored sweeps are the ones that ran (overrides applied, device section chosen,
    # migrated with the manifest); the file's text is kept as it was, not re-validated,
    # since an older mgbench may have spelt a value differently.
    sweeps = [_check_table(f"run {manifest.get('run_id')}: stored sweep", t) for t in stored]
    return Suite(name=info.get("name") or str(manifest.get("run_id")), description=info.get("description", ""),
                 path=info.get("path", "<suite>"), text=info.get("text", ""), sweeps=sweeps)


def apply_overrides(suite: Suite, overrides: list[str]) -> Suite:
    """Apply ``--set key=value`` pairs (TOML values: ``nproc=[1,2]``, ``precision="bf16"``)."""
    table: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise MgbenchError(f"--set {item!r}: expected KEY=VALUE, e.g. --set measured_steps=5")
        key, raw = item.split("=", 1)
        try:
            table[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError as e:
            if raw.strip()[:1] in ("[", "{", '"', "'"):  # meant as a TOML list, table or string: say it is broken
                raise MgbenchError(f"--set {item!r}: malformed TOML value ({e}); e.g. --set nproc=[1,2] or "
                                   "--set precision=\"bf16\"") from None
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
        elif v in ("pow2", "pow2>=2"):
            # "pow2>=2": multi-rank strategies, whose one-rank point is the single-process run
            n = 1 if v == "pow2" else 2
            while n <= num_devices:
                out.append(n)
                n *= 2
        else:
            out.append(v)
    return list(dict.fromkeys(out))


def expand(suite: Suite, device_kind: str, num_devices: int) -> list[RunConfig]:
    """The cartesian product of each sweep, each config with its skip reason (or None).
    Labels are unique: a procedure key that varies in the suite is shown in them."""
    configs = []
    for table in suite.sweeps:
        configs += _expand_one(suite, table, device_kind, num_devices)
    # One record per config id: duplicates (e.g. nproc listed twice) collapse.
    configs = list({c.config_id: c for c in configs}.values())
    values = [c.to_dict() for c in configs]
    varying = [k for k in SWEEP_KEYS if len({repr(v[k]) for v in values}) > 1]
    # Each config's label names the keys that vary in the suite and matter to it.
    return [replace(c, label_keys=tuple(k for k in varying if applies(k, c.to_dict()))) for c in configs]


def _expand_one(suite: Suite, table: dict[str, list[Any]], device_kind: str, num_devices: int) -> list[RunConfig]:
    sweep = {k: table.get(k, [default]) for k, (_, default, _) in SWEEP_KEYS.items()}
    sweep["nproc"] = _expand_nproc(sweep["nproc"], num_devices)
    keys = list(sweep)
    configs = []
    for combo in itertools.product(*(sweep[k] for k in keys)):
        p = dict(zip(keys, combo))
        p["device"] = device_kind if p["device"] == "auto" else p["device"]
        # Keys that only matter to some configs are pinned for the others, so they
        # neither multiply configs nor change ids where they have no effect.
        for k in keys:
            if not applies(k, p):
                p[k] = FIELDS[k].default
        if p["workload"] == "command":
            # The user's command picks its own parallelism: no degrees to resolve.
            if not p["command"].strip():
                raise MgbenchError(f"{suite.path}: workload = \"command\" needs command = \"...\", the launch line "
                                   "(e.g. \"python train.py\" or \"torchrun --nproc-per-node 2 train.py\")")
            dims, problem = None, None
        else:
            dims, problem = for_strategy(p["strategy"], p["nproc"], None if p["layout"] == "auto" else p["layout"])
        if dims is not None:
            p.update(dims.degrees())
        cfg = RunConfig(**p)
        reason = problem or _skip_reason(cfg, device_kind, num_devices)
        configs.append(replace(cfg, skip_reason=reason, config_id=config_id(cfg.params())))
    return configs


def _rank_shortfall(p: dict[str, Any], num_devices: int) -> str | None:
    """Why a config cannot get its ranks here (None: it can)."""
    if p["nproc"] <= num_devices:
        return None
    what = "GPUs" if p["device"] == "cuda" else "CPU ranks allowed here"
    return f"needs {p['nproc']} ranks but only {num_devices} {what}"


def _skip_reason(cfg: RunConfig, device_kind: str, num_devices: int) -> str | None:
    from .workloads import skip_reason as workload_skip_reason

    p = cfg.params()
    if p["device"] == "cuda" and device_kind != "cuda":
        return "config asks for cuda but no CUDA device was found"
    if p["workload"] == "command":
        return _rank_shortfall(p, num_devices)
    why = workload_skip_reason(cfg)  # strategies and sizes a Hugging Face or vision model takes
    if why:
        return why
    shape = cfg.shape if p["workload"] != "vision" else None  # vision: data parallel only, no dims to divide
    dims = Layout.of(dp=p["dp"], tp=p["tp"], pp=p["pp"], ep=cfg.ep, cp=cfg.cp)
    experts = getattr(shape, "experts", 0)
    if (why := moe_problem(p["strategy"], experts)):
        return why
    pipelined = p["strategy"] in PIPELINED
    sizes = {} if shape is None else dict(layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads,
                                          ffn_hidden=shape.ffn_hidden, vocab=shape.vocab)
    problems = dims.runner_problems(
        p["nproc"], **sizes,
        virtual_stages=schedules.chunks_per_rank(p["pp_schedule"], p["virtual_stages"]) if pipelined else 1,
        num_microbatches=p["grad_accum"] if pipelined else None, experts=experts or None,
        seq_len=p["seq_len"] if cfg.cp > 1 else None)
    if problems:
        return joined_problems(problems)
    if p["strategy"] == "cp" and p["compile"]:
        return "compile = true is not wired to cp (its K/V all-gather inside compiled blocks is untested); use false"
    if p["strategy"] == "cp" and p["cp_attention"] in RING_FORMS and p["device"] != "cuda":
        return RING_NEEDS_CUDA.format(asked=p["cp_attention"])
    if p["tp"] > 1 and shape.tie_embeddings:
        return "tensor parallelism with tied embeddings is not supported; use a model with tie_embeddings = false"
    if getattr(shape, "is_mla", False) and (why := _mla_problem(p)):
        return why
    if p["grad_compression"] != "none" and p["strategy"] not in ("ddp", "zero1"):
        return f"grad_compression is a DDP communication hook: it applies to ddp and zero1, not {p['strategy']}"
    if p["grad_compression"] == "bf16" and p["device"] == "cpu" and not gloo_reduces_half():
        return "bf16 gradient compression on CPU: gloo reduces bf16 from torch 2.13 on; use fp16"
    if pipelined and shape.tie_embeddings and p["pp"] > 1:
        return "pipeline parallelism with tied embeddings is not supported (embedding and head sit on different stages)"
    if p["strategy"] == "pp+tp+dp" and p["dp_mode"] == "ddp" and p["tp"] > 1 and p["dp"] > 1:
        return "DDP cannot replicate tensor-parallel (DTensor) parameters; use dp_mode = \"fsdp\" with tp > 1 and dp > 1"
    if pipelined and (why := schedules.schedule_problem(p["pp_schedule"], p["pp"], p["grad_accum"], p["compile"])):
        return why
    # A GPU without float8 units is said before a missing torchao: installing it would not help.
    if p["precision"] == "fp8" and p["device"] == "cuda" and device_kind == "cuda" and (why := _fp8_gpu_problem()):
        return why
    if (why := _hsdp_fp8_problem(p)):
        return why
    fp8_tp_cuda = p["precision"] == "fp8" and p["tp"] > 1 and p["device"] == "cuda"
    if fp8_tp_cuda and (why := _fp8_tp_shard_problem(shape, p["tp"])):
        return why
    if p["data"] == "disk" and p["warmup_steps"] < 1:
        # The DataLoader's start-up (workers, first reads) happens in a warm-up step
        # (runner/data_loading.LoaderFeed.warmup_reads); without one it would be timed.
        return "data = \"disk\" needs warmup_steps >= 1: the loader's start-up must happen before the timed window"
    bug = faults.bug_of(p["inject"])
    if bug and not p["check_steps"]:
        return f"bug:{bug} acts in the correctness check window, and check_steps = 0 turns the check off"
    if bug and (why := faults.bug_problem(bug, p["strategy"], p["dp"], p["grad_accum"], p["pp"])):
        return why
    if (why := _rank_shortfall(p, num_devices)):
        return why
    if p["device"] == "cpu" and p["precision"] != "fp32" and not gloo_reduces_half():
        return (f"{p['precision']} on CPU: gloo reduces bf16/fp16 from torch 2.13 on (this is "
                f"{'.'.join(map(str, _torch_version()))}); use precision = \"fp32\" on CPU")
    return None


def _mla_problem(p: dict[str, Any]) -> str | None:
    """Why a model with multi-head latent attention (workloads/gpt.MLAttention) cannot run
    this config (None when it can)."""
    if p["tp"] > 1:
        return ("tensor parallelism of multi-head latent attention is not built (the tp plan splits wq/wk/wv/wo; MLA "
                "has wq_a/wq_b/wkv_a/wkv_b): use a data-, expert- or pipeline-parallel strategy")
    if p["strategy"] == "cp" and p["device"] == "cuda" and p["cp_attention"] != "allgather_kv":
        return ("cp with multi-head latent attention runs the all-gather-KV form only (torch's ring attention over "
                "MLA's q, k and v is untested): set cp_attention = \"allgather_kv\"")
    return None


def _hsdp_fp8_problem(p: dict[str, Any]) -> str | None:
    """Why an hsdp, offload or fp8 config cannot run (None when it can)."""
    if is_hsdp(p):
        if p["dp"] % p["replicas"]:
            return (f"hsdp: replicas = {p['replicas']} does not divide the data-parallel degree dp = {p['dp']}; "
                    "set replicas to a divisor of dp")
    if p["precision"] == "fp8":
        from importlib.util import find_spec

        # What cannot run is said first: it holds with or without torchao installed.
        if p["strategy"] in PIPELINED or (p["tp"] > 1 and p["strategy"] not in ("tp", "tp_sp")):
            return (f"fp8 runs with data parallelism ({', '.join(('single',) + DATA_PARALLEL)}) and tp / tp_sp here: "
                    "float8 pipeline stages and fp8 fsdp+tp are not built yet")
        if find_spec("torchao") is None:
            return "precision = \"fp8\" needs torchao's float8 training: install mgbench[fp8]"
    return None


def _fp8_gpu_problem() -> str | None:
    """Why this host's GPUs cannot run fp8 (None: they can, or torch sees no GPU to ask):
    the first visible GPU without float8 tensor cores (strategies/fp8.capability_problem).
    Asked here so such configs are skipped with the reason instead of each failing in its
    first step. torch is imported only for cuda on a "cuda" machine, which detect_devices
    found through torch already; the suite stays torch-free otherwise."""
    import torch

    if not torch.cuda.is_available():
        return None
    from .strategies.fp8 import capability_problem

    for i in range(torch.cuda.device_count()):
        why = capability_problem(torch.cuda.get_device_capability(i), f"GPU {i} ({torch.cuda.get_device_name(i)})")
        if why:
            return why
    return None


def _fp8_tp_shard_problem(shape: Any, tp: int) -> str | None:
    """On CUDA every rank's piece of a float8 linear needs both dims a multiple of
    FP8_ALIGN (torch._scaled_mm); tensor parallelism splits q/k/v/w1/w3 by output and wo/w2 by
    input features. Linears whose whole dims are not aligned stay bf16 (strategies/fp8.py)."""
    q, kv, f = shape.heads * shape.dim_head, shape.kv_heads * shape.dim_head, shape.ffn_hidden
    for name, split, other in (("wq", q, shape.hidden), ("wk", kv, shape.hidden), ("w1", f, shape.hidden)):
        if split % FP8_ALIGN == 0 and other % FP8_ALIGN == 0 and (split % tp or (split // tp) % FP8_ALIGN):
            return (f"fp8 with tp = {tp} on CUDA: {name}'s {split} output features split {tp} ways are not a multiple "
                    f"of {FP8_ALIGN} per rank (torch._scaled_mm needs it); use a smaller tp or a model whose dims "
                    "allow it")
    return None


def gloo_reduces_half() -> bool:
    """Whether gloo all-reduces bf16 and fp16 here (torch 2.13 on: measured)."""
    return _torch_version() >= (2, 13)


def _torch_version() -> tuple[int, int]:
    """Installed torch's (major, minor), read without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version("torch").split(".")[:2]
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return (0, 0)
