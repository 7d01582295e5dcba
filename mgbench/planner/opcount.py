"""Count what one training step runs besides matmuls: aten ops and the bytes they touch.

On a CPU nothing fuses the non-matmul work of a step (norms, rotary, SiLU, softmax inside
SDPA, the loss, AdamW one tensor at a time, FSDP's copies): each aten op pays a dispatch
overhead and streams its operands through memory. The probed CPU prediction prices
exactly that (planner/perf.py, ``host_ops``): ops x per-op overhead + bytes / elementwise
bandwidth, with matmuls and SDPA priced apart at their own probed rates.

:class:`OpCounter` is a ``TorchDispatchMode`` that sees every aten op and sorts it:

- ``matmul`` (mm, addmm, bmm, baddbmm ...): their FLOPs are the planner's matmul term;
- ``attention`` (SDPA kernels, forward and backward): priced at the probed SDPA rate;
- ``view`` (ops whose output aliases an input: view, t, transpose, expand, slice ...):
  an overhead each, no bytes;
- ``collective`` (c10d ops): priced by the alpha-beta communication model, not here;
- ``ignored`` (``prim::`` queries such as ``prim::device``): fake tensors dispatch them,
  a real run reads them as attributes;
- ``compute`` (everything else): an overhead each, and the bytes of every tensor it reads
  or writes (inputs and outputs counted apart, so an in-place ``add_`` of n bytes counts
  3 n, as the bandwidth probe's ``add`` does).

:func:`count_step` runs the runner's own build and training step for a config under
fake tensors and torch's fake process group (planner/trace.py's machinery): one step of
rank 0 costs about 0.1 ms an op to trace and allocates nothing. A one-rank step that is
cheap to run for real is counted on real tensors instead (the same ops, faster).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

KINDS = ("matmul", "attention", "view", "compute", "collective", "ignored")
PHASES = ("forward", "backward", "optimizer")
MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "_addmm_activation", "addbmm", "dot", "vdot"}
# Ops that only read metadata or make an alias (the schema does not always mark them as views).
FREE_OPS = {"detach", "alias", "_unsafe_view", "lift_fresh", "_to_copy_meta", "sym_size", "sym_stride",
            "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "_local_scalar_dense"}


def op_kind(func: Any) -> str:
    """Which of :data:`KINDS` an aten OpOverload belongs to."""
    ns = func.namespace
    name = func._schema.name.split("::")[-1]
    if ns in ("c10d", "_c10d_functional", "c10d_functional", "_dtensor"):
        return "collective"
    if ns == "prim":  # prim::device and kin: FakeTensor's own queries, attribute reads in a real run
        return "ignored"
    if name in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in name or name.startswith("_flash_attention") or name.startswith("_efficient_attention"):
        return "attention"
    if func.is_view or name in FREE_OPS:
        return "view"
    return "compute"


@dataclass(frozen=True)
class TensorSpec:
    """What a recorded op's tensor argument was: enough to make one like it (same shape,
    strides and dtype, so broadcasts and strided views run as they did)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def make(self, device: torch.device) -> torch.Tensor:
        """A tensor of this layout: random floats, zero integers (valid as indices)."""
        # One storage the strides address (broadcast dims have stride 0), then the view.
        n = 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride)) if all(self.shape) else 0
        base = torch.empty(n, dtype=self.dtype, device=device)
        base = base.uniform_() if base.is_floating_point() else base.zero_()
        return base.as_strided(self.shape, self.stride)


def _spec(x: Any) -> Any:
    return TensorSpec(tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else x


def materialize(spec: Any, device: torch.device) -> Any:
    """A recorded op's arguments with a fresh tensor for each TensorSpec."""
    return tree_map(lambda x: x.make(device) if isinstance(x, TensorSpec) else x, spec)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _mm_flops(name: str, args: tuple, out: Any) -> float:
    """2 m n k of a matmul from its operands (mm/addmm/bmm/baddbmm; 0 for the rest)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("mm", "bmm"):
        a, b = tensors[0], tensors[1]
    elif name in ("addmm", "baddbmm", "_addmm_activation", "addbmm"):
        a, b = tensors[1], tensors[2]
    else:
        return 0.0
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2.0 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


class OpCounter(TorchDispatchMode):
    """Counts of aten ops by kind and phase, the bytes compute ops touch, matmul FLOPs.

    The phase is ``optimizer`` between an optimizer's step pre- and post-hooks,
    ``backward`` while autograd's engine runs a graph task, else ``forward``.
    """

    def __init__(self, record: bool = False) -> None:
        super().__init__()
        self.record = record
        self.recorded: list[tuple[Any, Any, int]] = []  # (op, args/kwargs with TensorSpecs, bytes)
        self.ops = {p: dict.fromkeys(KINDS, 0) for p in PHASES}
        self.bytes = dict.fromkeys(PHASES, 0)
        self.matmul_flops = 0.0
        self.by_name: dict[str, int] = {}
        self._in_optimizer = False
        self._handles: list[Any] = []

    def _phase(self) -> str:
        if self._in_optimizer:
            return "optimizer"
        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        kind = op_kind(func)
        phase = self._phase()
        self.ops[phase][kind] += 1
        name = func._schema.name.split("::")[-1]
        self.by_name[name] = self.by_name.get(name, 0) + 1
        if kind == "compute":
            flat_in, _ = tree_flatten((args, kwargs or {}))
            flat_out, _ = tree_flatten(out)
            nbytes = sum(_nbytes(t) for t in flat_in + flat_out if isinstance(t, torch.Tensor))
            self.bytes[phase] += nbytes
            if self.record and any(isinstance(t, torch.Tensor) for t in flat_in):
                self.recorded.append((func, tree_map(_spec, (args, kwargs or {})), nbytes))
        elif kind == "matmul":
            self.matmul_flops += _mm_flops(name, args, out)
        return out

    def __enter__(self) -> "OpCounter":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre(*_a: Any) -> None:
            self._in_optimizer = True

        def post(*_a: Any) -> None:
            self._in_optimizer = False

        self._handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        super().__exit__(*exc)

    def summary(self) -> dict[str, Any]:
        """Totals over phases: ``ops`` (every priced op: compute + view + matmul +
        attention; collectives excluded), ``compute_ops``, ``view_ops``, ``bytes``
        (compute ops' operands), ``matmul_flops``, and the same per phase."""
        tot = {k: sum(self.ops[p][k] for p in PHASES) for k in KINDS}
        return {"ops": tot["compute"] + tot["view"] + tot["matmul"] + tot["attention"],
                "compute_ops": tot["compute"], "view_ops": tot["view"], "matmul_ops": tot["matmul"],
                "attention_ops": tot["attention"], "collective_ops": tot["collective"],
                "bytes": sum(self.bytes.values()), "matmul_flops": self.matmul_flops,
                "by_phase": {p: {**self.ops[p], "bytes": self.bytes[p]} for p in PHASES}}


# Where a step is cheap to run for real, count_step counts it on real tensors: the same ops
# (tests/unit/test_planner_opcount.py compares the two), faster than fake tensors, whose
# every op goes through FakeTensorMode's Python (a tiny model's step, on the 2-core VM:
# 0.8-2.6 s fake, 0.25-0.3 s real). Only at one rank, where a real world-1 gloo
# group computes what a real run does; at more, the fake group's collectives would hand
# back unfilled buffers.
REAL_STEP_MAX_FLOPS = 2e10  # about 0.2 s of fp32 matmuls on a 2-core VM
REAL_STEP_MAX_BYTES = 1 << 30


def counts_on_real_tensors(cfg: Any) -> bool:
    """Whether :func:`count_step` runs ``cfg`` (a traced config) on real tensors: one rank,
    and a step the planner's formulas put under REAL_STEP_MAX_FLOPS and REAL_STEP_MAX_BYTES."""
    from ..errors import MgbenchError
    from ..layout import RECOMPUTE
    from .memory import memory_for_config
    from .perf import hardware_flops_per_token

    if cfg.nproc != 1:
        return False
    try:
        per_token = hardware_flops_per_token(cfg.shape, cfg.seq_len, RECOMPUTE.index(cfg.activation_checkpointing))
    except MgbenchError:  # not a decoder LM: no formula sizes its step, the fake trace needs none
        return False
    flops = float(per_token) * cfg.global_batch * cfg.seq_len  # one rank: dp = 1
    return flops <= REAL_STEP_MAX_FLOPS and memory_for_config(cfg)["total_bytes"] <= REAL_STEP_MAX_BYTES


def count_step(cfg: Any, record: bool = False, tensors: str = "auto") -> dict[str, Any]:
    """What rank 0 of runner config ``cfg`` runs in one training step (its second: the
    first also creates the optimizer states), counted (:func:`OpCounter.summary`) on fake
    tensors and torch's fake process group, or, where :func:`counts_on_real_tensors`
    (``tensors="auto"``) or ``tensors="real"``, on real tensors and a world-1 gloo group;
    plus ``tensors`` (which), ``count_s`` (the time the count took) and ``notes``. With
    ``record``, also ``recorded``: each compute op with tensor inputs, as (op, argument
    specs, bytes), for the probe to replay on real tensors."""
    import time

    from ..process_group import gloo_group
    from .trace import traced_config

    if tensors not in ("auto", "real", "fake"):
        raise ValueError(f"tensors = {tensors!r}: auto, real or fake")
    cfg, notes = traced_config(cfg)
    real = tensors == "real" or tensors == "auto" and counts_on_real_tensors(cfg)
    t0 = time.perf_counter()
    counter = OpCounter(record=record)
    with gloo_group() if real else _fake_world(cfg.nproc):
        _two_steps(cfg, counter, fake_ddp=not real)  # the models live in there: see gloo_group
    out = {**counter.summary(), "tensors": "real" if real else "fake", "count_s": time.perf_counter() - t0,
           "notes": notes}
    if record:
        out["recorded"] = counter.recorded
    return out


def _two_steps(cfg: Any, counter: OpCounter, fake_ddp: bool) -> None:
    """Build ``cfg`` as the runner does and run two steps, the second under ``counter``."""
    from ..runner.training import rank_batches, train_step
    from ..strategies.apply import prepare

    device = torch.device("cpu")
    batches = rank_batches(cfg.seed, range(2), 0, cfg.micro_batch, cfg.grad_accum, cfg.dp, cfg.seq_len,
                           cfg.shape.vocab, device)
    prep = prepare(cfg, device)
    if fake_ddp:
        for m in prep.modules or [prep.model]:
            _fake_ddp_hook(m)
    train_step(prep, batches[0], device, cfg.precision)
    with counter:
        train_step(prep, batches[1], device, cfg.precision)


@contextlib.contextmanager
def _fake_world(nproc: int) -> Iterator[None]:
    """Fake tensors on torch's fake process group of ``nproc`` (planner/trace.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .trace import _ddp_fake_safe, _pipeline_fake_safe, fake_world

    with fake_world(nproc), FakeTensorMode(allow_non_fake_inputs=True), _ddp_fake_safe(), _pipeline_fake_safe():
        yield


def _fake_ddp_hook(module: Any) -> None:
    """DDP on the fake process group needs a comm hook (trace.py's stand-in); it leaves
    what DDP's built-in hook leaves, so the ops counted are DDP's."""
    from .trace import StorageTracker, _ddp_in_place

    _ddp_in_place(module, StorageTracker())


def host_ops(summary: dict[str, Any]) -> dict[str, float]:
    """What perf.compute_terms prices op by op (``host_ops``): the compute and view ops of a
    :meth:`OpCounter.summary` and the bytes compute ops touch, and the collectives
    issued (priced by their latency, planner/against.py). Matmuls and SDPA are priced
    by their own probed rates, whose timings include their dispatch."""
    return {"ops": float(summary["compute_ops"] + summary["view_ops"]), "bytes": float(summary["bytes"]),
            "collectives": float(summary["collective_ops"])}
