"""One hardware profile type, for a catalog accelerator and for the machine `mgbench probe`
measured: datasheet peaks plus the achievable figures the step model prices with, each a
:class:`Figure` that says its value, unit, kind and source.

kind  "datasheet"  a vendor's peak (hardware.toml);
      "measured"   measured on this accelerator (a public measurement with source and date,
                   or the probe on this machine);
      "carried"    a named sibling's measured figure (``carried_from``), with the reason;
      "assumed"    nothing measured it: ``reason`` says what stands in, or the value is
                   null and the term is priced another way.

The figures (fractions are of the dense peak at the figure's precision):

gemm_best       best dense bf16 matmul, MAMF-style (fraction)
gemm_best_fp8   the same in FP8 (fraction of the FP8 peak)
gemm_fixed      seconds a GEMM pays whatever its size (the small-GEMM class; with the
                operand traffic at ``mem_bw`` it gives the skinny class: :func:`shape_model`)
gemm_layer      probe only: the GEMMs of a layer's shapes, total FLOPs over total time
attention       fused attention forward + backward (fraction of the bf16 peak; FLOPs
                halved for the causal mask, as FlashAttention's papers count them)
mem_bw          achieved device-memory bandwidth (TB/s)
collectives     all_reduce bus bandwidth by group size and scope (inside a node, across)
host_link       host <-> device copies, one direction (GB/s)

The catalog's figures are in mgbench/data/efficiency.toml (:func:`catalog_profile`);
the probe's are made in mgbench/probe/profile.py. Torch-free.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from . import catalog
from .errors import MgbenchError

KINDS = ("datasheet", "measured", "carried", "assumed")
# Strength of evidence, strongest first (a profile's evidence is that of its GEMM figure).
EVIDENCE = ("measured", "carried", "assumed")
SCOPES = ("intra", "inter")
FIGURES = ("gemm_best", "gemm_best_fp8", "gemm_fixed", "attention", "mem_bw", "host_link")


@dataclass(frozen=True)
class Figure:
    """One number with its evidence. ``value`` None is unknown: ``reason`` says why."""

    value: float | None
    unit: str
    kind: str
    source: str | None = None
    date: str | None = None
    carried_from: str | None = None
    reason: str | None = None
    note: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = figure_problems(self)
        if problems:
            raise MgbenchError(f"hardware profile figure ({self.unit}): {'; '.join(problems)}")

    def to_dict(self) -> dict[str, Any]:
        out = {"value": self.value, "unit": self.unit, "kind": self.kind}
        for k in ("source", "date", "carried_from", "reason", "note"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.detail:
            out["detail"] = dict(self.detail)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Figure":
        return cls(value=None if d.get("value") is None else float(d["value"]), unit=d["unit"], kind=d["kind"],
                   source=d.get("source"), date=d.get("date"), carried_from=d.get("carried_from"),
                   reason=d.get("reason"), note=d.get("note"), detail=dict(d.get("detail") or {}))


def figure_problems(f: Figure) -> list[str]:
    """What makes a figure unusable, one line each (empty: none): every value says where it
    came from, an unknown says why."""
    out = []
    if f.kind not in KINDS:
        out.append(f"kind {f.kind!r} is not one of {', '.join(KINDS)}")
    if f.value is None and not f.reason:
        out.append("a null value needs a reason")
    if f.value is not None and not math.isfinite(f.value):
        out.append(f"value {f.value} is not finite")
    if f.kind in ("datasheet", "measured") and f.value is not None and not f.source:
        out.append(f"a {f.kind} value needs a source")
    if f.kind == "carried" and not (f.carried_from and f.reason):
        out.append("a carried value names the sibling it is carried from and why")
    if f.kind == "assumed" and not f.reason:
        out.append("an assumed value says what it assumes")
    return out


@dataclass(frozen=True)
class Collective:
    """A collective's measured bus bandwidth on ``gpus`` GPUs, inside a node or across."""

    op: str
    gpus: int
    scope: str
    busbw: Figure  # GB/s

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise MgbenchError(f"collective scope {self.scope!r}: choose {' or '.join(SCOPES)}")
        if self.gpus < 2:
            raise MgbenchError(f"a collective needs 2 or more GPUs, got {self.gpus}")

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "gpus": self.gpus, "scope": self.scope, "busbw": self.busbw.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Collective":
        return cls(op=d["op"], gpus=int(d["gpus"]), scope=d["scope"], busbw=Figure.from_dict(d["busbw"]))


@dataclass(frozen=True)
class HardwareProfile:
    """Datasheet peaks and achievable figures of one accelerator (see the module doc)."""

    accelerator: str
    peaks: dict[str, Figure]  # dense TFLOP/s by precision (bf16, fp8 ...)
    mem_bw_peak: Figure  # TB/s
    gemm_best: Figure
    gemm_best_fp8: Figure
    gemm_fixed: Figure  # seconds
    attention: Figure
    mem_bw: Figure  # TB/s achieved
    host_link: Figure  # GB/s
    collectives: tuple[Collective, ...] = ()
    gemm_layer: Figure | None = None

    @property
    def evidence(self) -> str:
        """How the efficiency the planner prices with was obtained: the kind of the best-GEMM
        figure, which every step's compute time scales with ("measured", "carried" or
        "assumed"; a datasheet figure is no measurement of efficiency: "assumed")."""
        k = self.gemm_best.kind
        return k if k in EVIDENCE and self.gemm_best.value is not None else "assumed"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accelerator": self.accelerator, "evidence": self.evidence,
                               "peaks": {k: v.to_dict() for k, v in self.peaks.items()},
                               "mem_bw_peak": self.mem_bw_peak.to_dict(),
                               **{name: getattr(self, name).to_dict() for name in FIGURES},
                               "collectives": [c.to_dict() for c in self.collectives]}
        if self.gemm_layer is not None:
            out["gemm_layer"] = self.gemm_layer.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HardwareProfile":
        """A profile from its JSON form; MgbenchError naming the figure that is wrong."""
        try:
            return cls(accelerator=d["accelerator"], peaks={k: Figure.from_dict(v) for k, v in d["peaks"].items()},
                       mem_bw_peak=Figure.from_dict(d["mem_bw_peak"]),
                       **{name: Figure.from_dict(d[name]) for name in FIGURES},
                       collectives=tuple(Collective.from_dict(c) for c in d.get("collectives") or ()),
                       gemm_layer=Figure.from_dict(d["gemm_layer"]) if d.get("gemm_layer") else None)
        except KeyError as e:
            raise MgbenchError(f"hardware profile of {d.get('accelerator', '?')}: missing {e.args[0]!r}") from None


# --------------------------------------------------------------------------------------
# The shape model's constants, read off the measured GEMM sweeps of efficiency.toml

def _data() -> dict[str, Any]:
    return catalog.load("efficiency.toml")


def gemm_kernel_seconds(flops: Any, nbytes: Any, rate: float, bw: float, t0: float, p: float) -> Any:
    """One GEMM's seconds (or an array of them): t0 + the p-norm of its compute and memory
    times (module doc of efficiency.toml). The one formula: the sweeps' fit here and the
    layers' GEMMs (planner/perf.py gemm_seconds) both price with it."""
    a, b = np.asarray(flops, dtype=float) / rate, np.asarray(nbytes, dtype=float) / bw
    return t0 + (np.maximum(a, b) if math.isinf(p) else (a ** p + b ** p) ** (1.0 / p))


def _sweep_terms(sweep: dict[str, Any], result_bytes: float) -> tuple[float, list[tuple[float, float, float, bool]]]:
    """(the sweep's best rate in FLOP/s, [(flops, bytes, measured seconds, skinny)] per row)."""
    e = float(sweep["operand_bytes"])
    rows = []
    for r in sweep["rows"]:
        m, n, k = float(r["m"]), float(r["n"]), float(r["k"])
        flops = 2.0 * m * n * k
        rows.append((flops, e * (m * k + k * n) + result_bytes * m * n, flops / (r["tflops"] * 1e12),
                     bool(r.get("skinny"))))
    return max(r["tflops"] for r in sweep["rows"]) * 1e12, rows


def _fixed_cost(sweep: dict[str, Any], p: float, small: float, result_bytes: float) -> float:
    """t0 of one sweep at norm p: the median over its small rows of measured seconds minus
    the norm term (the best rate, the sweep's own measured bandwidth)."""
    rate, rows = _sweep_terms(sweep, result_bytes)
    bw = achieved_mem_bw(sweep["accelerator"])
    return statistics.median(t - gemm_kernel_seconds(f, b, rate, bw, 0.0, p) for f, b, t, _ in rows if f < small)


@lru_cache(maxsize=1)
def shape_model() -> dict[str, Any]:
    """The GEMM shape model's constants and the evidence for them: the norm p (of
    ``roofline_norms``, the one whose worst |error| over the sweeps' skinny rows is smallest)
    and each sweep's t0 at that p (``fixed_s``), with every candidate's worst error."""
    d = _data()
    sm = d["shape_model"]
    small, rb = float(sm["small_gemm_flops"]), float(sm["result_bytes"])
    sweeps = {s["id"]: s for s in d["gemm_sweep"]}
    worst: dict[float, float] = {}
    errors: dict[float, dict[str, list[float]]] = {}
    for p in sm["roofline_norms"]:
        p = float(p)
        errors[p] = {}
        for sid, s in sweeps.items():
            rate, rows = _sweep_terms(s, rb)
            t0 = _fixed_cost(s, p, small, rb)
            bw = achieved_mem_bw(s["accelerator"])
            # error of predicted throughput: measured time / predicted time - 1
            errors[p][sid] = [t / gemm_kernel_seconds(f, b, rate, bw, t0, p) - 1.0 for f, b, t, sk in rows if sk]
        worst[p] = max(abs(e) for es in errors[p].values() for e in es)
    p = min(worst, key=lambda q: (worst[q], q))
    return {"p": p, "fixed_s": {sid: _fixed_cost(s, p, small, rb) for sid, s in sweeps.items()},
            "worst_skinny_error": worst, "skinny_errors": errors[p]}


# --------------------------------------------------------------------------------------
# Catalog profiles

def efficiency_entries() -> dict[str, dict[str, Any]]:
    """efficiency.toml's per-accelerator tables, keyed by catalog id."""
    return _data()["accelerators"]


def _entry(acc_id: str) -> dict[str, Any]:
    ent = efficiency_entries().get(acc_id)
    if ent is None:
        raise MgbenchError(f"efficiency.toml has no entry for accelerator {acc_id!r}: add one whose figures say "
                           "whether they were measured on it, carried from a sibling or assumed")
    return ent


def _measured_fraction(acc_id: str, spec: dict[str, Any], precision: str) -> float | None:
    peak = catalog.accelerator_peak(acc_id, precision)
    return None if peak is None else float(spec["tflops"]) / peak


# The key that holds a figure's own value in efficiency.toml (a spec without it, or a
# null_reason, is carried from the sibling it names with ``from``).
_VALUE_KEY = {"gemm_best": "tflops", "gemm_best_fp8": "tflops", "mem_bw": "tbps", "gemm_small": "sweep",
              "attention": "fraction", "host_link": "gbps"}


def _holder(acc_id: str, name: str, seen: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
    """(the accelerator whose own figure ``name`` stands for ``acc_id``'s, its spec):
    ``acc_id`` itself where its spec has a value or a null_reason, else the sibling its
    ``from`` names, followed on, else itself where it is a stated assumption its reader
    prices (mem_bw of kind "assumed": the median measured fraction); a figure carried in
    a circle, or with none of these, is refused."""
    if acc_id in seen:
        raise MgbenchError(f"efficiency.toml: {name} is carried in a circle: {' -> '.join(seen + (acc_id,))}")
    spec = _entry(acc_id)[name]
    if _VALUE_KEY[name] in spec or spec.get("null_reason"):
        return acc_id, spec
    if "from" not in spec:
        if name == "mem_bw" and spec.get("kind") == "assumed":  # _mem_fraction prices it: the median
            return acc_id, spec
        raise MgbenchError(f"efficiency.toml: {acc_id}.{name} is {spec.get('kind', 'given')} but names no sibling "
                           f"(from), no {_VALUE_KEY[name]} and no null_reason")
    return _holder(spec["from"], name, seen + (acc_id,))


def _gemm_fraction(acc_id: str, name: str, precision: str) -> float | None:
    """Fraction of its own peak at ``precision`` that the accelerator measuring the figure
    ``name`` (gemm_best / gemm_best_fp8: ``acc_id`` or the sibling it is carried from)
    reached; None where null."""
    holder, spec = _holder(acc_id, name)
    if spec.get("null_reason"):
        return None
    return _measured_fraction(holder, spec, precision)


def _mem_fraction(acc_id: str) -> float:
    """Achieved / datasheet memory bandwidth of ``acc_id``: measured, a sibling's, or the
    median of the measured ones (the stated assumption for memories nothing measured)."""
    holder, spec = _holder(acc_id, "mem_bw")
    if spec["kind"] == "measured":
        return float(spec["tbps"]) / float(catalog.accelerator(holder)["mem_bw_tbps"])
    return median_measured_mem_fraction()


def achieved_mem_bw(acc_id: str) -> float:
    """Bytes/s ``acc_id``'s memory achieves: its datasheet figure x :func:`_mem_fraction`
    (measured, carried from a sibling, or the stated median assumption)."""
    return _mem_fraction(acc_id) * float(catalog.accelerator(acc_id)["mem_bw_tbps"]) * 1e12


def median_measured_mem_fraction() -> float:
    """The median achieved fraction of the memories measured (efficiency.toml mem_bw kind
    "measured"): what a memory nothing measured is assumed to reach."""
    acc = catalog.accelerators()
    vals = [float(e["mem_bw"]["tbps"]) / float(acc[k]["mem_bw_tbps"]) for k, e in efficiency_entries().items()
            if e["mem_bw"]["kind"] == "measured" and k in acc]
    return statistics.median(vals)


def _sweep_of(acc_id: str) -> str:
    """The GEMM sweep (efficiency.toml gemm_sweep id) that prices ``acc_id``'s small GEMMs."""
    return _holder(acc_id, "gemm_small")[1]["sweep"]


def _attention(acc_id: str) -> float | None:
    """The fused attention kernel's fraction of the bf16 peak (``acc_id``'s or its
    sibling's); None where nothing measured it."""
    spec = _holder(acc_id, "attention")[1]
    return None if spec.get("null_reason") else float(spec["fraction"])


def _figure(spec: dict[str, Any], value: float | None, unit: str, default_source: str | None = None) -> Figure:
    """A Figure from an efficiency.toml spec and its resolved value."""
    reason = spec.get("null_reason") if value is None else spec.get("reason")
    if value is None and not reason:
        reason = spec.get("reason") or "not recorded"
    detail = {k: spec[k] for k in ("tflops", "dtype", "shape_mnk", "kernel", "sweep", "tbps", "gbps") if k in spec}
    kind = spec["kind"]
    return Figure(value=value, unit=unit, kind=kind, source=spec.get("source", default_source), date=spec.get("date"),
                  carried_from=spec.get("from"), reason=reason, note=spec.get("note"), detail=detail)


@lru_cache(maxsize=None)
def catalog_profile(acc_id: str) -> HardwareProfile:
    """The profile of a catalog accelerator: hardware.toml's peaks, efficiency.toml's
    achievable figures (carried ones resolved to the sibling's fraction of its own peak)."""
    acc = catalog.accelerator(acc_id)
    ent = _entry(acc_id)
    src = f"hardware.toml accelerators.{acc_id}: {acc.get('source', '')}"
    peaks = {k: Figure(value=float(v), unit="TFLOP/s", kind="datasheet", source=src, date=acc.get("retrieved"))
             for k, v in (acc.get("tflops") or {}).items()}
    mem_peak = float(acc["mem_bw_tbps"])
    best = _gemm_fraction(acc_id, "gemm_best", "bf16")
    best8 = _gemm_fraction(acc_id, "gemm_best_fp8", "fp8")
    gb = ent["gemm_best"]
    if best is None and not gb.get("null_reason"):
        gb = {**gb, "null_reason": "the catalog has no bf16 peak for it, so no fraction of it can be stated"
                                   + (f" (measured {gb['tflops']} TFLOP/s)" if "tflops" in gb else "")}
    sweep = _sweep_of(acc_id)
    small = ent["gemm_small"]
    fixed_spec = {**small, "source": small.get("source") or f"efficiency.toml gemm_sweep {sweep}"}
    host = ent["host_link"]
    host_spec = _holder(acc_id, "host_link")[1]
    host_val = None if host_spec.get("null_reason") else float(host_spec["gbps"])
    colls = []
    for c in ent.get("collectives") or []:
        spec = {"kind": c.get("kind", "measured"), **{k: v for k, v in c.items() if k not in ("op", "gpus", "scope")}}
        colls.append(Collective(op=c["op"], gpus=int(c["gpus"]), scope=c["scope"],
                                busbw=_figure(spec, float(c["busbw_gbps"]), "GB/s")))
    return HardwareProfile(
        accelerator=acc_id, peaks=peaks,
        mem_bw_peak=Figure(value=mem_peak, unit="TB/s", kind="datasheet", source=src, date=acc.get("retrieved")),
        gemm_best=_figure(gb, best, "fraction of the bf16 peak"),
        gemm_best_fp8=_figure(ent["gemm_best_fp8"], best8, "fraction of the fp8 peak"),
        gemm_fixed=_figure(fixed_spec, shape_model()["fixed_s"][sweep], "s"),
        attention=_figure(ent["attention"], _attention(acc_id), "fraction of the bf16 peak"),
        mem_bw=_figure(ent["mem_bw"], achieved_mem_bw(acc_id) / 1e12, "TB/s"),
        host_link=_figure(host, host_val, "GB/s"),
        collectives=tuple(colls))


