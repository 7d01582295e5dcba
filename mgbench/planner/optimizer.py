"""What the optimizer's step costs beyond the elementwise update the step model leaves out:
Muon's orthogonalisation on the GPU, and under FSDP2 CPU offload the copies its states make
to reach it.

AdamW (the default) is elementwise: the planner prices no optimizer time for it on the GPU
(a few passes over the shards); under CPU offload it runs on the host's CPU, priced by
planner/host_step.py.

Muon (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024; Kimi
K2's MuonClip and torchtitan's experiments/dion_optimizer build on it) replaces each weight
matrix's update by its momentum orthogonalised with ``NS_STEPS`` Newton-Schulz iterations.
The optimizers priced are layout.OPTIMIZERS (the layout states them; the planner prices them).
For an m x n matrix (m <= n; a wider one is transposed) an iteration is A = X X^T (2 m^2 n
FLOPs), B = b A + c A A (2 m^3), X = a X + B X (2 m^2 n): 4 m^2 n + 2 m^3, counted as dense
GEMM FLOPs (torchtitan @fda7d765 torchtitan/experiments/dion_optimizer/
newton_schulz_triton.py lines 340-377; its Triton kernels compute one triangle of the two
symmetric products, which the count does not credit). The matrices: every block's
attention projections, dense MLP, router, routed and shared experts; the embedding, the
output layer and the norms take AdamW (torchtitan's parameter_classification.py lines
62-126; Moonlight's and Kimi K2's split). The work is divided over the GPUs of a model
replica (each holds a shard or its own experts: dion's Muon orthogonalises local experts
in place and deals each other matrix to one rank of its batch), so a GPU does the model's
total / (GPUs / HSDP replicas). Multi-token-prediction modules are not counted.

Under FSDP2 CPU offload, where Muon runs on the GPU, each step copies a GPU's shard of the
Muon matrices' gradient, momentum and weight host to device, and its momentum and weight
back (torchtitan @fda7d765 dion_optimizer/muon.py lines 656-658 and 701-702, counted in
docs/research/mini_kimi_host_trace.md), serially with the step at the host link's rate.
That implementation keeps the momentum in pageable memory, whose copies block the host and
run slower than the link's pinned rate: they are priced at the pageable rate
(planner/host_step.py, which also prices the CPU gradient clipping; the host's garbage
collection such runs add is not priced).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import MgbenchError
from ..model_shape import ModelShape
from ..layout import OPTIMIZERS, optimizer_problem
from .hardware import Hardware
from .perf import gemm_rate

# Newton-Schulz iterations a Muon update runs: Keller Jordan's reference (ns_steps = 5) and
# torchtitan's dion Muon (newton_schulz_triton.py, 5 fixed coefficient sets).
NS_STEPS = 5

STATE_BYTES_NOTE = ("--optimizer {optimizer}: the optimizer states are counted at the stack's {held:g} bytes a "
                    "parameter, AdamW's (a master copy and two moments where it keeps them); Muon keeps one momentum "
                    "buffer for its matrices: give the run's bytes with --state-bytes WEIGHTS,GRADS,OPTIMIZER")
MUON_OFFLOAD_NOTE = ("--optimizer muon with --offload: its gradient and weight copied to and from the GPU at the "
                     "host link's pinned rate, its momentum (pageable host memory in torchtitan's dion Muon) at the "
                     "pageable rate (data/hardware.toml [host_cpu] pageable_gbps)")


def check(name: str) -> str:
    """``name`` if it is an optimizer the planner prices (layout.OPTIMIZERS), else one clear error."""
    if (why := optimizer_problem(name)) is not None:
        raise MgbenchError(why)
    return name


def muon_matrices(shape: ModelShape) -> list[tuple[int, int, int]]:
    """(rows, columns, how many) of the weight matrices Muon updates in one model: each
    block's attention projections and MLP (dense, or router, routed and shared experts)."""
    h = shape.hidden
    out = [(p.k, p.n, shape.layers) for p in shape.attention_parts() if p.split != "norm"]
    dense = shape.layers - shape.moe_layers
    mlp = 3 if shape.gated_mlp else 2
    if dense:
        out.append((h, shape.ffn_hidden, mlp * dense))
    if shape.is_moe:
        out.append((h, shape.experts, shape.moe_layers))
        out.append((h, shape.moe_ffn_hidden, 3 * shape.experts * shape.moe_layers))
        if shape.shared_experts:
            out.append((h, shape.shared_experts * shape.moe_ffn_hidden, 3 * shape.moe_layers))
    return out


def newton_schulz_flops(shape: ModelShape) -> float:
    """FLOPs of one Muon step's orthogonalisation over the whole model (module docstring)."""
    total = 0.0
    for k, n, count in muon_matrices(shape):
        lo, hi = min(k, n), max(k, n)
        total += count * NS_STEPS * (4.0 * lo * lo * hi + 2.0 * lo ** 3)
    return total


def step_seconds(shape: ModelShape, hw: Hardware, optimizer: str, *, num_gpus: Any, replicas: Any = 1) -> Any:
    """Seconds a GPU spends in the optimizer's own matrix work a step: 0 for AdamW; for
    Muon its share of :func:`newton_schulz_flops` at the GPU's bf16 GEMM rate."""
    n = np.asarray(num_gpus, dtype=float) / np.asarray(replicas, dtype=float)
    if check(optimizer) == "adamw":
        return 0.0 * n
    return newton_schulz_flops(shape) / n / gemm_rate(hw)


def offload_bytes(optimizer: str, shard_params: Any, state_bytes: tuple[float, float, float]) -> tuple[Any, Any]:
    """(pinned, pageable) bytes a GPU's optimizer states move a step under CPU offload
    beyond FSDP2's own copies, both directions together: none for AdamW (it steps on the
    host); for Muon the shard's gradient and weight to the GPU and the weight back (pinned,
    FSDP2's), and its momentum to the GPU and back (pageable: dion allocates it on the host
    with zeros_like; planner/host_step.py prices those), at the bytes the run holds them
    (``state_bytes``: weight, gradient, optimizer state a parameter; Muon's one momentum
    buffer is the optimizer's bytes). ``shard_params`` is the GPU's whole shard: its few
    AdamW parameters (embedding, head, norms), which step on the host, are counted with
    it, an over-count of their share."""
    p = np.asarray(shard_params, dtype=float)
    if check(optimizer) == "adamw":
        return 0.0 * p, 0.0 * p
    w, g, o = state_bytes
    return p * (g + 2.0 * w), p * 2.0 * o
