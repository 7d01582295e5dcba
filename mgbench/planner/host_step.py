"""The optimizer work a GPU's host CPU does each step under FSDP2 CPU offload.

With CPUOffloadPolicy the sharded parameters, gradients and optimizer states live in host
memory and ``optimizer.step()`` runs on the host's CPU, after the host has waited for the
gradients' copies, so it adds to the step (docs/planner.md, "The host's optimizer work
under CPU offload"). What is priced, on a GPU's offloaded shard:

- AdamW's step over the shard's AdamW parameters: the ops torch's single-tensor AdamW runs
  (``ADAMW_OPS``; torch 2.13 torch/optim/adam.py ``_single_tensor_adam`` with decoupled
  weight decay: CPU tensors take that path by default, torch defaulting to its foreach
  kernels only for accelerator tensors and never to its fused one), or its fused kernel
  where the stack asks for it (stacks.toml ``host_adamw``: torchtitan);
- gradient clipping over the whole shard (``CLIP_OPS``: torch's ``clip_grad_norm_``, a norm
  and a multiply by the clamped coefficient whether or not it clips), unless the stack
  clips nothing (stacks.toml ``host_clip = false``: the runner);
- under Muon, which steps on the GPU, the copies of its pageable momentum at
  ``pageable_bytes_per_s`` (planner/optimizer.py prices the rest of its copies).

Each op at its measured nanoseconds an element on one thread (torchrun sets
OMP_NUM_THREADS=1 for each of several ranks a node), fp32 or bf16 by :func:`dtype_of` (FSDP2
casts the host gradients to the sharded weights' dtype, so one dtype serves both):
data/hardware.toml ``[host_cpu]``, measured by
tests/perf/bench_host_optimizer.py, which also checks the sum of ops against torch's own
AdamW step and clipping.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import catalog
from ..errors import MgbenchError
from ..model_shape import ModelShape
from .optimizer import muon_matrices
from .stack import stacks

# Every op a price below uses; the bench times exactly these ("adamw_fused": torch's fused
# AdamW step on CPU tensors, one kernel over weight, gradient and both moments).
OPS = ("mul_", "lerp_", "addcmul_", "sqrt", "div_scalar", "add_", "addcdiv_", "vector_norm", "adamw_fused")

# torch's _single_tensor_adam for AdamW, in its order: weight decay on the weight, the first
# moment's lerp, the second moment's mul_ and addcmul_, the denominator's sqrt and bias
# correction (two new tensors) and eps, the update of the weight.
ADAMW_OPS = ("mul_", "lerp_", "mul_", "addcmul_", "sqrt", "div_scalar", "add_", "addcdiv_")
# torch.nn.utils.clip_grad_norm_: each gradient's norm, then every gradient scaled.
CLIP_OPS = ("vector_norm", "mul_")
# How a stack's AdamW steps on the host (stacks.toml host_adamw): torch's default for-loop
# (the ops above) or its fused kernel (torch.optim.AdamW(fused=True), which torchtitan
# passes).
IMPLEMENTATIONS = {"for-loop": ADAMW_OPS, "fused": ("adamw_fused",)}

HOST_NOTE = ("CPU offload: the host's optimizer step priced on one CPU thread a rank (torchrun's OMP_NUM_THREADS "
             "default): {what}, at nanoseconds an element measured on {cpu} (data/hardware.toml [host_cpu]); more "
             "threads, DTensor's per-parameter dispatch, garbage collection and synchronisations are not priced")


# What an interval under offload says of the host step (predict with its seconds, plan without).
UNCHECKED = ("the host optimizer step under --offload{share} is priced at per-element rates measured on this "
             "project's VM (data/hardware.toml [host_cpu]) and no published run checks it: the interval does not "
             "cover it")


def unchecked(is_moe: bool, optimizer: str, host_s: float | None = None, step_s: float | None = None
              ) -> list[str]:
    """The interval reason a prediction with a host optimizer step carries (none where a
    published run checks it: :func:`checked_moe_optimizers`), as a list to add to the others."""
    if is_moe and optimizer in checked_moe_optimizers():
        return []
    share = f" ({host_s:.1f} s of the {step_s:.1f} s step)" if host_s is not None and step_s is not None else ""
    return [UNCHECKED.format(share=share)]


def checked_moe_optimizers() -> frozenset[str]:
    """The optimizers the published MoE runs with CPU offload stepped (published_moe_runs.toml;
    AdamW where a row names none): the "offload" interval class (moe.moe_class) takes its
    half-widths from those runs, so it covers the host step of an MoE model stepping one of
    them, and no other model's (so far one run: torchtitan's mini Kimi-K2 with Muon, whose
    host steps AdamW only for its embedding, head and norms)."""
    return frozenset(r.get("optimizer", "adamw") for r in catalog.load("published_moe_runs.toml")["runs"]
                     if r.get("offload") and r.get("split") in ("fit", "held_out"))


def host_cpu() -> dict[str, Any]:
    """hardware.toml's ``[host_cpu]`` table: the measured rates and where they come from."""
    return catalog.load("hardware.toml")["host_cpu"]


def ns_per_element(dtype: str) -> dict[str, float]:
    """Nanoseconds an element of each of ``OPS`` on one host thread, for "fp32" or "bf16"."""
    table = host_cpu()["ns_per_element"][dtype]
    return {op: float(table[op]) for op in OPS}


def adamw_ns_per_element(costs: dict[str, float], implementation: str = "for-loop") -> float:
    """Nanoseconds an element of torch's CPU AdamW step: the sum of its ops' costs
    (``IMPLEMENTATIONS``: the for-loop's ``ADAMW_OPS``, or the fused kernel)."""
    return sum(costs[op] for op in IMPLEMENTATIONS[implementation])


def implementation_of(stack: str | None, optimizer: str = "adamw") -> str:
    """The AdamW a stack steps on the host with (stacks.toml ``host_adamw``; torch's
    for-loop default where the stack names none). Under Muon, dion's own foreach scalar
    optimizer steps the AdamW parameters (per tensor on CPU): the for-loop's ops."""
    if optimizer != "adamw":
        return "for-loop"
    impl = stacks().get(stack or "", {}).get("host_adamw", "for-loop")
    if impl not in IMPLEMENTATIONS:
        raise MgbenchError(f"stacks.toml [{stack}] host_adamw = {impl!r}: one of {', '.join(IMPLEMENTATIONS)}")
    return impl


def unstated(stack: str | None) -> list[str]:
    """The host-step keys a stack's stacks.toml table leaves out (host_adamw, host_clip),
    whose defaults (torch's for-loop AdamW, clipping on) are then assumed, not read from it."""
    table = stacks().get(stack or "", {})
    return [k for k in ("host_adamw", "host_clip") if k not in table]


def clips(stack: str | None) -> bool:
    """Whether a stack clips the gradients on the host (stacks.toml ``host_clip``; torchtitan's
    max_norm 1.0 and Megatron-LM's clip_grad 1.0 default on)."""
    return bool(stacks().get(stack or "", {}).get("host_clip", True))


def clip_ns_per_element(costs: dict[str, float]) -> float:
    """Nanoseconds an element of gradient clipping: the sum of ``CLIP_OPS``' costs."""
    return sum(costs[op] for op in CLIP_OPS)


def dtype_of(state_bytes: tuple[float, float, float]) -> str:
    """The dtype the host's step runs in, from the bytes a parameter the run holds its
    weight, gradient and optimizer state in: fp32 where the weights are fp32 or the
    optimizer keeps an fp32 master copy (12 bytes or more: master and two moments), which
    is what AdamW updates and what FSDP2's host gradients take; bf16 otherwise."""
    weight, _, optimizer = state_bytes
    return "fp32" if weight >= 4 or optimizer >= 12 else "bf16"


def pageable_bytes_per_s() -> float:
    """Bytes/s a copy between pageable host memory and a GPU moves ([host_cpu] pageable_gbps)."""
    return float(host_cpu()["pageable_gbps"]) * 1e9


def adamw_share(shape: ModelShape, optimizer: str) -> float:
    """The share of a model's parameters AdamW steps: all of them under AdamW; under Muon
    those outside its matrices (embedding, output layer, norms). The whole model's share,
    applied to every GPU's shard: with a pipeline the first and last stages hold the
    embedding and the output layer, so under Muon their host step is priced low (a
    simplification; FSDP2's offload with a pipeline is rare)."""
    if optimizer == "adamw":
        return 1.0
    muon = sum(k * n * count for k, n, count in muon_matrices(shape))
    return max(0.0, 1.0 - muon / float(shape.num_params()))


def host_optimizer_seconds(shape: ModelShape, optimizer: str, shard: Any, state_bytes: tuple[float, float, float],
                    stack: str | None = None) -> Any:
    """Seconds a step the host's CPU spends on a GPU's offloaded ``shard`` (parameters):
    AdamW's step on its share (:func:`adamw_share`, as ``stack`` runs it:
    :func:`implementation_of`) and, where the stack clips, the clipping of every gradient,
    on one thread, at the dtype ``state_bytes`` (weight, gradient, optimizer bytes a
    parameter) gives (:func:`dtype_of`)."""
    p = np.asarray(shard, dtype=float)
    costs = ns_per_element(dtype_of(state_bytes))
    step = adamw_share(shape, optimizer) * adamw_ns_per_element(costs, implementation_of(stack, optimizer))
    clip = clip_ns_per_element(costs) if clips(stack) else 0.0
    return p * (step + clip) * 1e-9


def note(optimizer: str, stack: str | None = None) -> str:
    """The line predict prints for the host's priced work under offload (Muon's pageable
    copies have their own: optimizer.MUON_OFFLOAD_NOTE)."""
    adamw = f"AdamW's step ({'fused kernel' if implementation_of(stack, optimizer) == 'fused' else 'for-loop'})"
    clip = ", gradient clipping" if clips(stack) else " (the stack clips no gradient)"
    what = f"{adamw} on the embedding, output layer and norms{clip}" if optimizer != "adamw" else f"{adamw}{clip}"
    if missing := unstated(stack):
        assumed = {"host_adamw": "torch's for-loop AdamW", "host_clip": "clipping on"}
        what += (f" (assumed: the {stack or 'default'} stack's stacks.toml table states no {' or '.join(missing)}: "
                 f"{' and '.join(assumed[k] for k in missing)})")
    return HOST_NOTE.format(what=what, cpu=host_cpu()["cpu"])
