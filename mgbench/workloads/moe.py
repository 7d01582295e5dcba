"""Mixture-of-experts MLP of the decoder (workloads/gpt.py builds it for MoE layers).

A token's hidden state goes to a router (a linear layer, hidden -> experts), whose
softmax probabilities pick the token's ``top_k`` experts; their probabilities,
renormalised to sum to 1, weight the experts' outputs (Mixtral, Qwen3-MoE). Experts are
SwiGLU MLPs held as three stacked weights (experts, in, out), so expert parallelism
shards them by slicing the first dimension and a grouped GEMM runs them in one call.

Routing is done per group of tokens, a group being one micro-batch of one rank (GShard's
"group"): the same tokens the single-process reference routes together, so routing,
capacity drops and the load-balancing loss are identical under every data-parallel or
expert-parallel layout (the correctness check relies on it).

- Dropless (``capacity_factor`` None): every assignment reaches its expert.
- Capacity: each expert takes at most ceil(c x tokens x top_k / experts) assignments of
  a group; first choices have priority over second choices, then tokens in order
  (Switch / GShard); a dropped assignment contributes nothing (the token keeps its
  residual).
- Load-balancing loss (Fedus et al. 2022, "Switch Transformers", eq. 4-6):
  E x sum_e f_e P_e, f_e the fraction of the group's T x top_k assignments routed to
  expert e (before any drop), P_e the mean router probability of e. 1 when perfectly
  balanced, E when every token goes to one expert; times ``aux_coef`` it is added to
  the loss's gradient (runner/training.py), the reported loss stays the LM loss.

Expert parallelism (strategies/expert_parallel.py) sets ``MoE.dispatch``: the routed
tokens then travel to the ranks holding their experts and back by all-to-all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import first_line
from ..model_shape import ModelShape

DROPLESS = "dropless"


@dataclass
class Routing:
    """Where one group's tokens go: the kept assignments, sorted by expert (within an
    expert: first choices, then second choices ..., each in token order)."""

    expert_of: torch.Tensor  # (A,) expert id of each kept assignment
    token_of: torch.Tensor  # (A,) its token's index in the group
    weight_of: torch.Tensor  # (A,) its combine weight (renormalised top-k probability), fp32
    counts: torch.Tensor  # (E,) kept assignments per expert
    routed: torch.Tensor  # (E,) assignments per expert before any drop
    aux_loss: torch.Tensor  # load-balancing loss (coefficient not applied), fp32 scalar


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Assignments one expert may take from a group of ``tokens`` tokens."""
    return math.ceil(factor * tokens * top_k / experts)


def load_balancing_loss(probs: torch.Tensor, routed: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss E x sum_e f_e P_e (see the module docstring);
    ``probs`` (T, E) router probabilities, ``routed`` (E,) assignments per expert."""
    tokens, experts = probs.shape
    f = routed.to(probs.dtype) / (tokens * top_k)  # not differentiable: counts
    return experts * (f * probs.mean(0)).sum()


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None) -> Routing:
    """Route one group: ``logits`` (T, E) of the router; None capacity_factor: dropless."""
    tokens, experts = logits.shape
    probs = logits.float().softmax(-1)
    top_p, top_e = probs.topk(top_k, dim=-1)
    weights = top_p / top_p.sum(-1, keepdim=True)
    # Assignments slot-major (every token's first choice, then every second choice ...),
    # so a stable sort by expert gives first choices priority under a capacity.
    flat_e = top_e.t().reshape(-1)
    routed = torch.bincount(flat_e, minlength=experts)
    order = torch.argsort(flat_e, stable=True)
    if capacity_factor is None:
        keep, counts = order, routed
    else:
        cap = capacity(tokens, top_k, experts, capacity_factor)
        starts = routed.cumsum(0) - routed
        position = torch.arange(order.numel(), device=order.device) - starts[flat_e[order]]
        keep, counts = order[position < cap], routed.clamp(max=cap)
    return Routing(expert_of=flat_e[keep], token_of=keep % tokens, weight_of=weights.t().reshape(-1)[keep],
                   counts=counts, routed=routed, aux_loss=load_balancing_loss(probs, routed, top_k))


# --- the experts' matmuls ----------------------------------------------------------------

_GROUPED: dict[tuple[str, torch.dtype, int, int], str | None] = {}


def grouped_mm_problem(device: torch.device, dtype: torch.dtype, hidden: int, ffn: int) -> str | None:
    """Why torch._grouped_mm cannot run the experts here (None when it can), probed once
    per (device, dtype, dims) with a forward and backward of the experts' shapes: torch
    2.13 runs its forward on CPU but not its backward, and on CUDA needs Hopper-class
    GPUs and 16-byte aligned strides."""
    key = (device.type, dtype, hidden, ffn)
    if key not in _GROUPED:
        if not hasattr(torch, "_grouped_mm"):
            _GROUPED[key] = f"torch {torch.__version__} has no torch._grouped_mm"
        else:
            try:
                # A graph of its own: identity saved-tensor hooks keep an enclosing
                # activation checkpoint from counting the probe's tensors as the block's.
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), torch.enable_grad():
                    x = torch.zeros(4, hidden, device=device, dtype=dtype, requires_grad=True)
                    w = torch.zeros(2, hidden, ffn, device=device, dtype=dtype, requires_grad=True)
                    offs = torch.tensor([1, 4], device=device, dtype=torch.int32)
                    torch._grouped_mm(x, w, offs=offs).sum().backward()
                _GROUPED[key] = None
            except Exception as e:  # any refusal means: loop over the experts instead
                _GROUPED[key] = f"torch._grouped_mm fails on {device.type} {str(dtype).replace('torch.', '')}: " \
                                f"{first_line(str(e))[:120]}"
    return _GROUPED[key]


class Experts(nn.Module):
    """``num`` SwiGLU experts as stacked weights w1, w3 (num, hidden, ffn) and w2 (num,
    ffn, hidden). Under expert parallelism a rank holds a slice of them."""

    def __init__(self, num: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(num, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(num, ffn, hidden))
        self.method: str | None = None  # "grouped_mm" or "loop: <why>", set by the first forward
        # Factor on the weights' gradients (expert parallelism under FSDP: see
        # strategies/expert_parallel.py); 1 leaves the graph as it is.
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """``x`` (rows, hidden) sorted by expert, ``sizes`` (num,) rows per expert."""
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        problem = grouped_mm_problem(x.device, dtype, self.w1.shape[1], self.w1.shape[2])
        self.method = "grouped_mm" if problem is None else f"loop: {problem}"
        w1, w3, w2 = self.w1, self.w3, self.w2
        if self.grad_scale != 1.0:
            w1, w3, w2 = (_ScaleGrad.apply(w, self.grad_scale) for w in (w1, w3, w2))
        if problem is None:
            offs = sizes.cumsum(0).to(torch.int32)
            x, w1, w3, w2 = (t.to(dtype) for t in (x, w1, w3, w2))
            h = F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)
            return torch._grouped_mm(h, w2, offs=offs)
        outs = []
        # Every expert runs, also on no rows: its weights stay in the graph, so DDP and
        # FSDP see a (zero) gradient for each of them in every step.
        for e, rows in enumerate(x.split(sizes.tolist())):
            outs.append((F.silu(rows @ w1[e]) * (rows @ w3[e])) @ w2[e])
        return torch.cat(outs)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` in backward."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class SharedExperts(nn.Module):
    """The experts every token uses (DeepSeek's shared experts): one SwiGLU MLP."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _in_backward() -> bool:
    """Whether autograd is running a backward pass now (activation checkpointing's
    recomputation): its forward must not log the routing a second time."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


class MoE(nn.Module):
    """Router, routed experts and optional shared experts of one MoE layer."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.num_experts, self.top_k = shape.experts, shape.top_k
        self.router = nn.Linear(shape.hidden, shape.experts, bias=False)
        self.experts = Experts(shape.experts, shape.hidden, shape.moe_ffn_hidden)
        self.shared = (SharedExperts(shape.hidden, shape.shared_experts * shape.moe_ffn_hidden)
                       if shape.shared_experts else None)
        self.capacity_factor: float | None = None  # None: dropless (see configure)
        self.aux_coef = 0.0
        # Expert parallelism: (rows sorted by expert, kept counts per expert, experts) -> rows
        self.dispatch: Callable[[torch.Tensor, torch.Tensor, Experts], torch.Tensor] | None = None
        self.aux_loss: torch.Tensor | None = None  # of the last forward, aux_coef applied
        self.log: list[torch.Tensor] | None = None  # routing statistics per forward, while logging

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        r = route(self.router(flat), self.top_k, self.capacity_factor)
        self.aux_loss = self.aux_coef * r.aux_loss if self.aux_coef else None
        if self.log is not None and not _in_backward():
            dropped = (r.routed - r.counts).sum().view(1)
            self.log.append(torch.cat([r.routed, dropped]).double())
        rows = flat[r.token_of]
        out_rows = self.experts(rows, r.counts) if self.dispatch is None else self.dispatch(rows, r.counts, self.experts)
        # Weighted sum of each token's expert outputs (weights in fp32, then the stream's dtype).
        contrib = (out_rows * r.weight_of.unsqueeze(-1)).to(flat.dtype)
        out = torch.zeros_like(flat).index_add(0, r.token_of, contrib)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view_as(x)


# --- what the runner asks of a model's MoE layers ----------------------------------------

def moe_layers(modules: list[nn.Module]) -> list[MoE]:
    """Every MoE layer inside ``modules`` (a rank's model or stage modules), each once."""
    seen: dict[int, MoE] = {}
    for m in modules:
        for sub in m.modules():
            if isinstance(sub, MoE):
                seen.setdefault(id(sub), sub)
    return list(seen.values())


def parse_capacity(value: Any) -> float | None:
    """The suite key moe_capacity_factor as a number (None: dropless)."""
    return None if value == DROPLESS else float(value)


def configure(model: nn.Module, capacity_factor: Any, aux_coef: float) -> None:
    """Set every MoE layer's routing mode and load-balancing coefficient (config keys)."""
    for m in moe_layers([model]):
        m.capacity_factor = parse_capacity(capacity_factor)
        m.aux_coef = float(aux_coef)


def aux_loss(layers: list[MoE]) -> torch.Tensor | None:
    """The load-balancing loss of the last forward, summed over MoE layers (None: none)."""
    losses = [m.aux_loss for m in layers if m.aux_loss is not None]
    return torch.stack(losses).sum() if losses else None


def start_log(layers: list[MoE]) -> None:
    """Log each forward's routing from now on (the timed window)."""
    for m in layers:
        m.log = []


def stop_log(layers: list[MoE]) -> tuple[list[list[torch.Tensor]], str | None]:
    """Stop logging; returns each layer's logged forwards and how the experts ran."""
    logs = [m.log or [] for m in layers]
    for m in layers:
        m.log = None
    return logs, next((m.experts.method for m in layers if m.experts.method), None)


def log_fields(stopped: tuple[list[list[torch.Tensor]], str | None], steps: int, group: Any = None) -> dict[str, Any]:
    """Record fields from :func:`stop_log`'s logs, summed over the ranks of ``group``
    (every rank must call; a collective): per step, over the whole global batch, the
    assignments dropped (all MoE layers) and the load imbalance (max / mean assignments
    per expert, before any drop, the mean over MoE layers).

    Logged forwards are split evenly into ``steps`` (micro-batches are equal in number
    on every rank and step)."""
    import torch.distributed as dist

    logs, method = stopped
    if not logs or steps < 1 or not logs[0]:
        return {}
    per_layer = torch.stack([torch.stack(l) for l in logs])  # (layers, forwards, E + 1)
    if dist.is_initialized():
        dist.all_reduce(per_layer, group=group)
    n_layers, forwards, width = per_layer.shape
    per_step = per_layer.reshape(n_layers, steps, forwards // steps, width).sum(2).cpu()
    routed, dropped = per_step[..., :-1], per_step[..., -1]
    imbalance = routed.max(-1).values / routed.mean(-1)  # (layers, steps)
    dropped_steps = dropped.sum(0)
    return {
        "moe_tokens_dropped_per_step": [float(v) for v in dropped_steps],
        "moe_tokens_dropped_pct": float(100.0 * dropped.sum() / routed.sum()),
        "moe_load_imbalance_per_step": [float(v) for v in imbalance.mean(0)],
        "moe_load_imbalance": float(imbalance.mean()),
        "moe_load_imbalance_max": float(imbalance.max()),
        "moe_expert_compute": method,
    }
