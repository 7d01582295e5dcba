"""Mixture-of-experts terms of a step (issue 26): expert-parallel all-to-all by scope, what
the pipeline schedule hides of it, load imbalance or a capacity factor, the MoE modules a
recipe recomputes and the token permutation around the all-to-all. layout_time.step_time
adds them; every function takes numpy arrays (plan's search prices millions of layouts).

The expert-parallel group
    Megatron-Core's MoE parallel folding (expert tensor-parallel degree 1): the ep ranks of
    a group are ep consecutive ranks of the tp x cp x dp ones, so experts / ep sit on each
    and a group spans ``ep`` GPUs: g = min(ep, GPUs a node) of them in each of
    N = ep / g nodes (NVLink / xGMI inside, the NIC across). Each rank dispatches its own
    s b / (cp tp) tokens (sequence parallelism splits them over tp); its experts get
    ep x that x top_k / experts rows each (perf.shaped_gemms counts the same).

Bytes one rank sends per all-to-all, per token (balanced routing: each of a token's top_k
experts is any of the E with equal chance; h the hidden size):
    "alltoall"  Megatron-Core's all-to-all dispatcher sends one row per chosen expert:
                k (g - 1) / ep rows to its node's other GPUs, k (ep - g) / ep across.
                Limiting a token to M nodes changes neither: a row crosses the network
                whenever its expert is on another node, limited or not.
    "deepep" / "hybridep"  DeepEP's normal kernels (and NVIDIA's HybridEP) send a token
                once to each node it goes to (to the GPU of the same local index), which
                forwards it over NVLink to each GPU it goes to there (DeepEP README,
                "normal kernels with NVLink and RDMA forwarding"): D_n (N - 1) / N rows
                across and D_g (g - 1) / g inside, D_n and D_g the expected distinct
                nodes and GPUs a token reaches (:func:`distinct_reached`). This is where
                node-limited routing pays: DeepSeek-V3 (section 3.2.2) sends each token
                to at most M = 4 nodes, so D_n <= M.
    Dispatch rows are in the activation dtype, or FP8 with a 1 x 128 tile's fp32 scale
    (1 + 4 / 128 bytes an element) where the run dispatches in FP8 (DeepSeek-V3 section
    3.3: dispatch in FP8, combine in BF16; backward likewise: the gradient entering the
    experts' down-projection, which combine's backward dispatches, in FP8, dispatch's
    backward combine in BF16). Combine rows mirror dispatch rows.
    One all-to-all takes max(inside bytes / intra_bw, across bytes / inter_bw) (the two
    links run at once) times the busiest receiver's load (:meth:`MoeOptions.load`), plus
    one latency per peer GPU of the node and a cost per peer node (the link's a2a_peer_us
    where the catalog solved one, else its latency; DeepEP and HybridEP pay it too, though it
    was solved on NCCL's all-to-all). NCCL's all-to-all (the "alltoall" dispatcher) moves its
    bytes at :func:`nccl_all_to_all_share` of the links' rates; a DeepEP run that names its
    implementation over EFA (MoeOptions.backend) moves its bytes across EFA nodes at that
    backend's published kernels' share of the network rate (planner/ep_kernels.py). The bandwidths are the
    catalog's (hardware.toml links, the ring busbw fraction): DeepEP's published H800
    figures agree with what they give an H800 node (see :data:`DEEPEP_H800`).
    A step issues 4 per MoE layer and micro-batch (dispatch and combine, forward and
    backward) and 2 more per MoE layer run again (full recompute, or the "moe" module).

What the schedule hides (:func:`exposed_a2a`)
    Without overlap, all of it is exposed (Megatron-Core's default). DualPipe (schedule
    "dualpipev"; DeepSeek-V3 section 3.2.1) and Megatron-Core's EP overlap
    (overlap_moe_expert_parallel_comm: one micro-batch's forward beside another's
    backward) run a chunk's all-to-all while the paired chunk computes. Passes without a
    partner (warm-up and cool-down: :func:`unpaired_share`) stay exposed. DualPipe's paired
    passes cost max(comm - compute, SM share x comm) (its pairing by part of a layer is not
    in code read here); Megatron-Core's pair each all-to-all with one part of a layer
    (:func:`layer_schedule_exposed`), at least the SM share of the communication: while the
    communication kernels run they hold :data:`OVERLAP_SM_SHARE` of the GPU's SMs, so the
    compute beside them slows.

Load (:meth:`MoeOptions.load`)
    Dropless routing: the busiest expert-parallel rank's routed rows over the mean
    (``imbalance``; :data:`DEFAULT_IMBALANCE` for a learned router, 1 for the
    force-balanced routers of benchmark tables; 1 under round-robin routing, which also
    sets where a token's experts sit: :func:`distinct_reached`); with a capacity factor C
    the busiest rank computes at most C x the mean (the rest is dropped). The experts' GEMMs and the
    all-to-alls are priced at the busiest rank's load: every MoE layer waits for it. Without
    expert parallelism (ep 1) the load is 1 (:func:`rank_load`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import MgbenchError
from ..model_shape import MLA_UP_PROJECTIONS, ModelShape
from ..strategies.schedules import VIRTUAL

# DeepEP's normal (training) kernels on H800, DeepSeek-V3's pretraining setting (4096
# tokens a batch, hidden 7168, top-4 groups, top-8 experts, FP8 dispatch, BF16 combine):
# "bottleneck bandwidth" per GPU, GB/s (deepseek-ai/DeepEP docs/legacy.md @dd758caf,
# "Normal kernels with NVLink and RDMA forwarding"; it gives H800's NVLink as ~160 GB/s
# and the CX7 400 Gb/s NIC as ~50 GB/s). What the catalog gives an hgx-h800 node: NVLink
# 200 x 0.82 = 164 GB/s, InfiniBand NDR 50 x 0.925 = 46.25 GB/s a GPU: within 7% of the
# intranode figures and 7-25% off the internode ones, as printed (the benchmark's
# "logical" bytes count a token once for each node it reaches, its own included), so the
# all-to-all is priced at the catalog's links, with no factor of its own.
# tests/unit/test_moe_terms.py keeps the comparison. Put in the bytes that cross nodes
# (x (N - 1) / N, as planner/ep_kernels.py reads the EFA backends' figures of the same
# benchmark) they are 0.47, 0.92-0.94 and 0.95-0.96 of the catalog's rate at 2, 4 and 8 nodes: the
# 2-node shortfall the EFA backends show is DeepEP's on InfiniBand too.
DEEPEP_H800 = {"intranode": {"ep": 8, "dispatch_gbps": 153.0, "combine_gbps": 158.0},
               "internode": [{"ep": 16, "dispatch_gbps": 43.0, "combine_gbps": 43.0},
                             {"ep": 32, "dispatch_gbps": 58.0, "combine_gbps": 57.0},
                             {"ep": 64, "dispatch_gbps": 51.0, "combine_gbps": 50.0}]}

# The SMs the communication kernels hold while they overlap compute: DeepSeek-V3's 20 of
# the H800's 132 (DeepSeek-V3 technical report, arXiv:2412.19437, section 3.2.2: "only 20
# SMs are sufficient to fully utilize the bandwidths of IB and NVLink"). Carried to every
# GPU and dispatcher (an assumption: DeepEP V1's normal kernels take 24, its V2 4-6 for the
# same setting, DeepEP README @dd758caf; Megatron-Bridge's HybridEP recipes 32).
OVERLAP_SM_SHARE = 20.0 / 132.0

# A learned router's busiest expert-parallel rank over the mean rank's routed rows, in a
# dropless run. An assumption, not a measurement: DeepSeek-V3 (section 2.1.2) keeps its
# experts balanced with a bias per expert (auxiliary-loss-free balancing) but publishes no
# per-rank load; 10% over the mean is taken. Benchmark tables that force-balance the
# router (Megatron-Bridge's) state 1.
DEFAULT_IMBALANCE = 1.1

# FP8 dispatch: one byte an element and one fp32 scale per 1 x 128 tile of activations
# (DeepSeek-V3 section 3.3.2, fine-grained quantization).
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0

DISPATCHERS = ("alltoall", "deepep", "hybridep")
# The implementations a DeepEP dispatch may name where it does not run DeepEP's
# InfiniBand kernels (MoeOptions.backend, a published row's dispatcher_backend): UCCL's
# EFA drop-in for DeepEP, DeepEP over NVSHMEM on libfabric, and DeepEP v2 (ElasticBuffer)
# over NCCL's GIN device API (on EFA its GPU-initiated GDA transport). Across EFA nodes
# each is priced at its published kernels' share of the network rate where
# published_ep_kernels.toml has fit rows for it (planner/ep_kernels.py), at the links'
# rates where it has none.
DISPATCHER_BACKENDS = ("uccl-ep", "nvshmem-libfabric", "deepep-v2-nccl-gin")
# The backends whose traffic across EFA nodes a CPU thread posts: UCCL-EP by design (its
# CPU proxies issue the RDMA writes the GPU asks for), and NVSHMEM's libfabric transport,
# like every NVSHMEM remote transport but IBGDA ("other transports that rely on passing
# messages to a CPU proxy thread", NVSHMEM's best-practice guide, Performance). DeepEP v2
# over NCCL GIN is GPU-initiated on EFA (its GDA transport); that it pays no such extra is
# an assumption no fit row has tested (its dispatch also waits on the host by default:
# DeepEP dd758ca deep_ep/buffers/elastic.py do_cpu_sync). :func:`efa_notify_seconds`.
PROXY_BACKENDS = ("uccl-ep", "nvshmem-libfabric")
# Megatron-Core recompute_modules (its MoE README, "Fine-grained Recomputation"): the
# matmuls of "mla_up_proj", "mlp" and "moe" are priced again here; "mla_up_proj",
# "moe_act", "moe" and "layernorm" discard what memory.py would count as saved ("mlp": not
# modelled there). The elementwise ones ("moe_act", "layernorm") run again at a
# memory traffic that is not priced.
RECOMPUTE_MODULES = ("mla_up_proj", "mlp", "moe", "moe_act", "layernorm")
# Passes over a token's rows (read + write) the permutation around one all-to-all pair
# makes, forward: permute before dispatch and unpermute after combine (Megatron-Core
# moe_utils.permute / unpermute); backward repeats both.
PERMUTE_PASSES = 4.0


@dataclass(frozen=True)
class MoeOptions:
    """How a run routes and moves its tokens; the planner's defaults are a learned
    router, Megatron-Core's all-to-all dispatcher, no overlap beyond the schedule's own.
    Each field's metadata is its `--moe-*` option of predict, plan and memory
    (cli_options.moe_group)."""

    # None: not given, priced at DEFAULT_IMBALANCE and said to be an assumption (a value
    # given is the user's, even where it equals the default).
    imbalance: float | None = field(default=None, metadata={
        "metavar": "X", "help": "Dropless routing: the busiest expert-parallel rank's routed rows over the mean "
                                f"(1 = balanced; not given: {DEFAULT_IMBALANCE:g}, an assumption for a learned "
                                "router)."})
    capacity_factor: float | None = field(default=None, metadata={
        "metavar": "C", "help": "Drop the rows over C x the mean an expert receives (Megatron-Core's "
                                "moe_expert_capacity_factor, priced without padding: the busiest rank at most C x "
                                "the mean; default: dropless)."})
    dispatcher: str = field(default="alltoall", metadata={
        "choices": DISPATCHERS, "help": "alltoall: Megatron-Core's (one row per chosen expert); deepep / hybridep: "
                                        "one row per destination node and GPU, forwarded over NVLink. Each has its own "
                                        "host launch time a layer pass when eager (stacks.toml [moe_host])."})
    backend: str | None = field(default=None, metadata={
        "choices": DISPATCHER_BACKENDS,
        "help": "deepep only: the kernels' implementation over AWS EFA, uccl-ep (UCCL's drop-in for "
                "DeepEP), nvshmem-libfabric (DeepEP on NVSHMEM's libfabric transport) or deepep-v2-nccl-gin "
                "(DeepEP v2 over NCCL's GIN, GPU-initiated); across EFA nodes its bytes move at the share of the "
                "network rate its published benchmarks reach (data/published_ep_kernels.toml; none for "
                "deepep-v2-nccl-gin: the links' rates), and the two through a CPU proxy (uccl-ep, "
                "nvshmem-libfabric) add efa_proxy_notify_ms a forward dispatch (stacks.toml [moe_host]). Not given: "
                "DeepEP's own kernels, at the links' rates."})
    node_limit: int | None = field(default=None, metadata={
        "metavar": "M", "help": "Each token's experts on at most M nodes (DeepSeek-V3: 4)."})
    device_limit: int | None = field(default=None, metadata={
        "metavar": "M", "help": "Each token's experts on at most M GPUs (DeepSeek-V2: 3)."})
    fp8_dispatch: bool = field(default=False, metadata={
        "help": "Dispatch all-to-alls carry FP8 with 1x128 scales (DeepSeek-V3); combine stays BF16."})
    a2a_overlap: bool = field(default=False, metadata={
        "help": "Overlap the expert all-to-all with another micro-batch's compute (Megatron-Core "
                "overlap_moe_expert_parallel_comm; the dualpipev schedule always does)."})
    wgrad_in_backward: bool = field(default=False, metadata={
        "help": "With --moe-a2a-overlap: the weight gradients run inside each backward (Megatron-Core "
                "delay_wgrad_compute off), so the dispatch's backward waits for them too. Not given: delayed, as "
                "Megatron-Bridge's performance scripts set it with the overlap."})
    recompute_modules: tuple[str, ...] = field(default=(), metadata={
        "metavar": "LIST", "help": "Megatron-Core recompute_modules priced: " + ",".join(RECOMPUTE_MODULES) + "."})
    fp8_act_cache: bool = field(default=False, metadata={
        "help": "The experts' SwiGLU input is cached in FP8 for backward (DeepSeek-V3 section 3.3.3): memory only."})
    cuda_graphs: bool = field(default=False, metadata={
        "help": "MoE layers captured in CUDA graphs (a sync-free dispatcher): no host launches, but the per-layer "
                "time the published graphed runs still show stays (stacks.toml [moe_host] graphed_share of the eager "
                "term, graphed_padded_share with --moe-capacity-factor, taken then as drop-and-pad, the whole layer "
                "captured; the prediction's notes give it; at 1 the step is priced as eager's and only the interval, "
                "the graphed runs', differs)."})
    fused_grouped_mlp: bool = field(default=False, metadata={
        "help": "The experts' GEMMs, gated activation and biases run in one kernel (Transformer Engine's CuteDSL "
                "grouped MLP: MXFP8 or NVFP4 on Blackwell, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1): the elementwise passes "
                "gpt-oss-style experts add unfused (the clamp of the GLU's inputs, the router-weighted bias) are "
                "not priced. The grouped GEMMs are priced alike either way."})
    round_robin: bool = field(default=False, metadata={
        "help": "Benchmark routing that gives token t the top_k consecutive experts from t x top_k (torchtitan's "
                "moe_force_load_balance, NeMo AutoModel's fake balanced gate): exactly balanced, and a token "
                "reaches the fewest GPUs and nodes, which DeepEP and HybridEP send less for. Megatron-Core's "
                "forced balance draws random experts instead (the default pricing). Balanced by construction, "
                "and it replaces the router: an imbalance other than 1 and router limits are refused."})

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules or ()))  # a CLI list too
        if self.dispatcher not in DISPATCHERS:
            raise MgbenchError(f"MoE dispatcher must be one of {', '.join(DISPATCHERS)}, got {self.dispatcher!r}")
        if self.backend is not None:
            if self.backend not in DISPATCHER_BACKENDS:
                raise MgbenchError(f"MoE backend must be one of {', '.join(DISPATCHER_BACKENDS)}, got {self.backend!r}")
            if self.dispatcher != "deepep":
                raise MgbenchError(f"MoE backend {self.backend!r} names an implementation of DeepEP's kernels (their "
                                   "published figures are DeepEP's): give --moe-dispatcher deepep with it, or no backend")
        if self.wgrad_in_backward and not self.a2a_overlap:
            raise MgbenchError("MoE wgrad_in_backward (--moe-wgrad-in-backward) says where Megatron-Core's EP overlap "
                               "schedules the weight gradients: give --moe-a2a-overlap with it, or leave it out")
        for name in ("imbalance", "capacity_factor"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise MgbenchError(f"MoE {name} (--moe-{name.replace('_', '-')}) must be a finite number, got {v}")
        if self.imbalance is not None and not self.imbalance >= 1.0:
            raise MgbenchError("MoE load imbalance (--moe-imbalance) is the busiest rank's load over the mean: "
                               f">= 1 (1 is perfectly balanced), got {self.imbalance}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise MgbenchError(f"MoE capacity factor (--moe-capacity-factor) must be > 0 (1.0 keeps each expert's mean "
                               f"load), got {self.capacity_factor}")
        for name in ("node_limit", "device_limit"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise MgbenchError(f"MoE {name} (--moe-{name.replace('_', '-')}) must be a positive integer, "
                                   f"got {v!r}")
        bad = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise MgbenchError(f"MoE recompute modules priced are {', '.join(RECOMPUTE_MODULES)}; got {', '.join(bad)}")
        if self.round_robin:
            # The round-robin assignment replaces the router: no group or device limit
            # applies, and it is balanced by construction.
            limits = [n for n in ("node_limit", "device_limit") if getattr(self, n)]
            if limits:
                raise MgbenchError(f"MoE round_robin routing replaces the router, so {' and '.join(limits)} cannot "
                                   "apply: give one or the other")
            if self.imbalance not in (None, 1.0):
                raise MgbenchError(f"MoE round_robin routing is exactly balanced, so an imbalance of "
                                   f"{self.imbalance:g} cannot apply: give no imbalance")

    @property
    def load(self) -> float:
        """The busiest rank's routed rows over the mean: the imbalance, capped by a
        capacity factor (tokens over capacity are dropped, not padded)."""
        imbalance = 1.0 if self.round_robin else DEFAULT_IMBALANCE if self.imbalance is None else self.imbalance
        return imbalance if self.capacity_factor is None else min(imbalance, self.capacity_factor)

    @property
    def dedup(self) -> bool:
        """One copy per destination node and GPU (DeepEP, HybridEP), not one per expert."""
        return self.dispatcher != "alltoall"


# --- the expert-parallel group ----------------------------------------------------------

def rank_load(opts: MoeOptions, ep: Any) -> Any:
    """The busiest rank's routed rows over the mean at expert-parallel degree ``ep``
    (arrays broadcast): :meth:`MoeOptions.load` where ep > 1; 1 without expert parallelism
    (ep 1), where there is no busier rank to wait for: each rank runs every expert on its
    own tokens, tokens x top_k rows whatever the router picks (how the rows spread over the
    experts changes the grouped GEMMs' shapes, not their rows). A capacity factor, priced
    as dropping the rows over it (not padding to it), cannot raise that either."""
    e = np.asarray(ep, dtype=float)
    out = np.where(e > 1, opts.load, 1.0)
    return float(out) if out.ndim == 0 else out


def ep_geometry(ep: Any, gpus_per_node: int) -> tuple[Any, Any]:
    """(g, N): the group's ranks in each node and its nodes, for ``ep`` consecutive ranks
    (MoE parallel folding) on nodes of ``gpus_per_node`` GPUs; groups start at a node's
    first GPU."""
    n = np.asarray(ep, dtype=float)
    g = np.minimum(n, float(gpus_per_node))
    return g, np.ceil(n / g)


def _none_chosen(pool: Any, bin_size: Any, k: int) -> Any:
    """Chance that none of ``k`` experts drawn without replacement from ``pool`` falls in a
    given bin of ``bin_size`` of them (hypergeometric)."""
    pool, bin_size = np.asarray(pool, dtype=float), np.asarray(bin_size, dtype=float)
    p = np.ones(np.broadcast(pool, bin_size).shape)
    for i in range(k):
        p = p * np.clip((pool - bin_size - i) / np.maximum(pool - i, 1.0), 0.0, 1.0)
    return p


def _blocks_spanned(experts: int, k: int, block: Any) -> Any:
    """Mean number of ``block``-sized runs of experts (a GPU's, a node's) that k
    consecutive experts starting at t k mod E touch, over the tokens t (round-robin
    routing: each start t k mod E equally often)."""
    starts = (np.arange(experts, dtype=float) * k) % experts
    starts = np.unique(starts)[(slice(None),) + (None,) * np.ndim(block)]
    b = np.asarray(block, dtype=float)
    # A run that wraps past the last expert into the first block touches no block twice:
    # at most every block, E / b of them.
    touched = np.floor((starts + k - 1) / b) - np.floor(starts / b) + 1.0
    return np.minimum(touched, experts / b).mean(axis=0)


def distinct_reached(shape: ModelShape, ep: Any, gpus_per_node: int, node_limit: int | None = None,
                     device_limit: int | None = None, round_robin: bool = False) -> tuple[Any, Any]:
    """(D_n, D_g): the expected distinct nodes and GPUs of the ep group a token's top_k
    experts are on, with balanced routing: each node (each GPU) holds E / N (E / ep) of
    the E experts; with a node limit M < N the token first takes M of the N nodes and its
    k experts among their M E / N; with a device limit likewise among M GPUs' experts.
    Round-robin routing (``round_robin``) gives token t the k consecutive experts from
    t k mod E: they fill as few GPUs and nodes as their runs of E / ep and E / N allow
    (Qwen3-30B-A3B at EP 8: one GPU, where random experts reach 5.3)."""
    E, k = float(shape.experts), shape.top_k
    n = np.asarray(ep, dtype=float)
    g, N = ep_geometry(ep, gpus_per_node)
    per_node, per_gpu = E / N, E / n
    if round_robin:
        return _blocks_spanned(shape.experts, k, per_node), _blocks_spanned(shape.experts, k, per_gpu)
    nodes, gpus, pool = N, n, E + 0.0 * n
    if node_limit is not None:
        nodes = np.minimum(N, float(node_limit))
        gpus = nodes * g
        pool = nodes * per_node
    if device_limit is not None:
        gpus = np.minimum(gpus, float(device_limit))
        pool = np.minimum(pool, gpus * per_gpu)
        nodes = np.minimum(nodes, gpus)
    d_n = nodes * (1.0 - _none_chosen(pool, per_node, k))
    d_g = gpus * (1.0 - _none_chosen(pool, per_gpu, k))
    return d_n, d_g


def rows_sent(shape: ModelShape, ep: Any, gpus_per_node: int, opts: MoeOptions) -> tuple[Any, Any]:
    """(inside, across): rows one rank sends per token of its own in one all-to-all,
    to its node's other GPUs and to other nodes (see the module docstring)."""
    n = np.asarray(ep, dtype=float)
    g, N = ep_geometry(ep, gpus_per_node)
    k = float(shape.top_k)
    if not opts.dedup:
        inside, across = k * (g - 1.0) / n, k * (n - g) / n
    else:
        d_n, d_g = distinct_reached(shape, ep, gpus_per_node, opts.node_limit, opts.device_limit, opts.round_robin)
        across = d_n * (N - 1.0) / N
        inside = d_g * (g - 1.0) / g
    one = n > 1
    return np.where(one, inside, 0.0), np.where(one, across, 0.0)


def exchange_seconds(hw: Any, ranks: Any, inside_bytes: Any, across_bytes: Any, per_node: Any = None) -> Any:
    """Seconds of one all-to-all exchange over ``ranks`` consecutive ranks (ep_geometry)
    in which a rank sends ``inside_bytes`` to its node's other GPUs and ``across_bytes`` to
    other nodes: the slower of the two links at its rate (NVLink and the network run at
    once), plus a latency per other GPU of the node and a cost per other node (the link's
    ``a2a_peer_us`` where the catalog solved one, else its latency). The one price of
    an all-to-all: MoE's dispatch and combine (:func:`a2a_seconds`) and nccl-tests'
    alltoall_perf (:func:`alltoall_seconds`, planner/collective_validation.py) both use it.
    ``per_node``: the group's ranks a node holds where they are not consecutive (an
    expert-parallel group strided by expert tensor parallelism, :func:`ep_ranks_per_node`)."""
    n = np.asarray(ranks, dtype=float)
    g, N = ep_geometry(ranks, hw.gpus_per_node if per_node is None else per_node)
    wire = np.maximum(np.asarray(inside_bytes, dtype=float) / hw.intra_bw,
                      np.asarray(across_bytes, dtype=float) / hw.inter_bw)
    peer = hw.inter_alpha_s if hw.a2a_peer_s is None else hw.a2a_peer_s
    latency = (g - 1.0) * hw.intra_alpha_s + (N - 1.0) * peer
    return np.where(n > 1, latency + wire, 0.0)


def nccl_all_to_all_share() -> float:
    """The share of the links' rates NCCL's all-to-all moves its bytes at (hardware.toml
    [planner.all_to_all] nccl_share, solved on published alltoall_perf rows:
    collective_validation.solve_all_to_all_share)."""
    from .. import catalog

    share = catalog.load("hardware.toml")["planner"]["all_to_all"]["nccl_share"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
        raise MgbenchError(f"hardware.toml [planner.all_to_all] nccl_share must be a fraction above 0 and at most 1, "
                           f"got {share!r}")
    return float(share)


def alltoall_seconds(hw: Any, ranks: Any, nbytes: Any, share: float | None = None) -> Any:
    """Seconds of an even NCCL all-to-all of ``nbytes`` a rank (each rank sends nbytes /
    ranks to every rank, itself included: nccl-tests' alltoall_perf at size nbytes), its
    bytes moving at ``share`` of the links' rates (None: :func:`nccl_all_to_all_share`)."""
    n = np.asarray(ranks, dtype=float)
    g, _ = ep_geometry(ranks, hw.gpus_per_node)
    b = np.asarray(nbytes, dtype=float) / (nccl_all_to_all_share() if share is None else share)
    return exchange_seconds(hw, ranks, b * (g - 1.0) / n, b * (n - g) / n)


def ep_ranks_per_node(gpus_per_node: int, etp: Any = 1) -> Any:
    """A node's ranks of one expert-parallel group: Megatron-Core lays the expert tensor-
    parallel ranks innermost, so an ep group's ranks are etp GPUs apart and a node holds
    gpus_per_node / etp of them (whole ranks; at least one)."""
    return np.maximum(np.floor(float(gpus_per_node) / np.asarray(etp, dtype=float)), 1.0)


def a2a_seconds(shape: ModelShape, hw: Any, *, tokens: Any, ep: Any, elem_bytes: float, opts: MoeOptions,
                across_share: float = 1.0, etp: Any = 1) -> Any:
    """Seconds of one dispatch (or combine) of ``tokens`` tokens a rank, each element
    ``elem_bytes`` bytes, at the busiest receiver's load; Megatron-Core's all-to-all
    dispatcher runs NCCL's all-to-all (:func:`nccl_all_to_all_share` of the links' rates),
    DeepEP and HybridEP their own kernels at the links' rates, the bytes across nodes at
    ``across_share`` of the network's (a named backend's over EFA:
    ep_kernels.priced_share); ``etp``: the group's ranks strided by expert tensor
    parallelism (:func:`ep_ranks_per_node`)."""
    per_node = ep_ranks_per_node(hw.gpus_per_node, etp)
    inside, across = rows_sent(shape, ep, per_node, opts)
    row = np.asarray(tokens, dtype=float) * shape.hidden * elem_bytes * opts.load
    if opts.dispatcher == "alltoall":  # NCCL's all-to-all
        row = row / nccl_all_to_all_share()
    return exchange_seconds(hw, ep, row * inside, row * across / across_share, per_node=per_node)


def dispatch_bytes(opts: MoeOptions, act_bytes: float) -> float:
    """Bytes an element of a dispatched row (FP8 with its scales, or the activations')."""
    return FP8_DISPATCH_BYTES if opts.fp8_dispatch else act_bytes


def a2a_directions(shape: ModelShape, hw: Any, *, tokens: Any, ep: Any, act_bytes: float, opts: MoeOptions,
                   moe_layers: Any, num_micro: Any, moe_rerun_share: Any, across_share: float = 1.0,
                   etp: Any = 1) -> tuple[Any, Any]:
    """Seconds of every expert-parallel all-to-all of a step on one rank, by direction: per
    MoE layer of its stage and micro-batch, (those at dispatch's bytes: dispatch forward and
    combine's backward, which dispatches; those at the activations': combine forward and
    dispatch's backward), each with a forward pass again for the ``moe_rerun_share`` of MoE
    layers recomputed (``across_share``: :func:`a2a_seconds`). Their sum is the step's
    all-to-all."""
    d = a2a_seconds(shape, hw, tokens=tokens, ep=ep, elem_bytes=dispatch_bytes(opts, act_bytes), opts=opts,
                    across_share=across_share, etp=etp)
    c = a2a_seconds(shape, hw, tokens=tokens, ep=ep, elem_bytes=act_bytes, opts=opts, across_share=across_share,
                    etp=etp)
    passes = (2.0 + np.asarray(moe_rerun_share, dtype=float)) * np.asarray(moe_layers, dtype=float) * \
        np.asarray(num_micro, dtype=float)
    return passes * d, passes * c


# --- what the schedule hides ------------------------------------------------------------

def overlaps(schedule: str, opts: MoeOptions) -> bool:
    """Whether the all-to-all runs beside another micro-batch's compute: DualPipe always,
    any other schedule where the run turns Megatron-Core's EP overlap on."""
    return schedule == "dualpipev" or opts.a2a_overlap


def unpaired_share(pp: Any, num_micro: Any, schedule: str, virtual_stages: int = 1) -> Any:
    """Share of the first pipeline rank's chunk passes that run with no other micro-batch's
    pass beside them (their all-to-all cannot hide): the warm-up forwards and the
    cool-down backwards, (p - 1) of m for 1F1B-like schedules (DualPipeV taken so; its
    report gives no per-phase count), 2 (p - 1) + (v - 1) p of v m chunk passes for the
    interleaved ones (Megatron-LM's warm-up count), one of m without a pipeline."""
    p = np.asarray(pp, dtype=float)
    m = np.maximum(np.asarray(num_micro, dtype=float), 1.0)
    if schedule in VIRTUAL:
        v = float(virtual_stages)
        warm = (2.0 * (p - 1.0) + (v - 1.0) * p) / (v * m)
    else:
        warm = (p - 1.0) / m
    return np.clip(np.where(p > 1, warm, 1.0 / m), 0.0, 1.0)


@dataclass(frozen=True, eq=False)  # array fields: no value equality or hash
class LayerSplit:
    """A step's MoE-layer compute as Megatron-Core's EP overlap schedules it
    (megatron/core/models/gpt/fine_grained_callables.py at core_v0.17.1), seconds of both
    passes summed over the step's MoE layers and micro-batches (dense layers stay out: their
    dispatch and combine are no-ops). ``attention``: the "attn" node (attention, the pre-MLP
    norm, router, shared experts; the permutation under the all-to-all dispatcher);
    ``experts``: the "mlp" node (the routed experts; the permutation under DeepEP and
    HybridEP, whose dispatch post-processing runs there); ``on_comm``: compute the combine
    node runs on the communication stream (the unpermutation, forward and backward);
    ``wgrad_delayed``: Megatron-Core's delay_wgrad_compute (weight gradients run apart from
    the input gradients and record no event), which Megatron-Bridge's performance scripts set
    with the overlap (scripts/performance/utils/overrides.py _set_moe_a2a_overlap_overrides,
    v0.4.2); off, the weight gradients run inside each backward."""

    attention: Any
    experts: Any
    on_comm: Any = 0.0
    wgrad_delayed: bool = True


# The steady period of the schedule's graph: STEADY_LAYERS layers chained to settle, then
# the period taken over STEADY_LAYERS more (it settles within a couple of layers:
# tests/unit/test_moe_terms.py checks 4 against 32).
STEADY_LAYERS = 4


def layer_schedule_exposed(split: LayerSplit, dispatch: Any, combine: Any) -> Any:
    """Seconds of all-to-all that Megatron-Core's EP overlap leaves exposed when one
    micro-batch's layers run forward beside another's backward
    (TransformerLayerSchedulePlan.run, megatron/core/models/common/model_chunk_schedule_plan.py
    at core_v0.17.1): the steady period of a chain of layers less their compute.
    ``dispatch`` / ``combine``: the all-to-all seconds at dispatch's / the activations'
    bytes, both passes (:func:`a2a_directions`). A step's sums may be given (every MoE layer
    alike: the period scales with its inputs). The planner's split of a pass: forward a
    third, backward two thirds, half of it input and half weight gradients (all input
    gradients when the weight gradients are not delayed).

    The two streams run in the order run() issues them, and each node waits for the last
    node of its own micro-batch (one CUDA event a micro-batch's chunk, recorded by every
    node; weight gradients record none):
    communication: combine backward, dispatch forward, dispatch backward, combine forward;
    compute: attention forward, experts' input gradients, experts' weight gradients,
    experts' forward, attention's input gradients, attention's weight gradients.
    So dispatch backward waits for the experts' input gradients only, and the next layer's
    combine backward for attention's, each running beside the weight gradients."""
    a = np.asarray(split.attention, dtype=float)
    x = np.asarray(split.experts, dtype=float)
    k = np.asarray(split.on_comm, dtype=float)
    d = np.asarray(dispatch, dtype=float)
    c = np.asarray(combine, dtype=float)
    third = 1.0 / 3.0
    attn_f, exp_f = a * third, x * third
    if split.wgrad_delayed:
        attn_dgrad, attn_wgrad, exp_dgrad, exp_wgrad = a * third, a * third, x * third, x * third
    else:
        attn_dgrad, attn_wgrad, exp_dgrad, exp_wgrad = 2.0 * a * third, 0.0 * a, 2.0 * x * third, 0.0 * x
    # combine's backward sends gradients the way dispatch does; the unpermutation runs in
    # the combine nodes, half of it in each pass
    comb_b, disp_f, disp_b, comb_f = d / 2.0 + k / 2.0, d / 2.0, c / 2.0, c / 2.0 + k / 2.0
    # When each stream is free and when each micro-batch's last node ended; each node's end
    # is both its stream's and its micro-batch's (one array each, updated in place).
    comm, comp, fwd, bwd = (np.zeros(np.broadcast(a, x, k, d, c).shape) for _ in range(4))

    def node(stream: np.ndarray, chain: np.ndarray, seconds: Any) -> None:
        np.maximum(stream, chain, out=stream)
        stream += seconds
        chain[...] = stream

    settled = comm
    for layer in range(2 * STEADY_LAYERS):
        node(comm, bwd, comb_b)
        node(comp, fwd, attn_f)
        node(comp, bwd, exp_dgrad)
        node(comm, fwd, disp_f)
        comp += exp_wgrad
        node(comm, bwd, disp_b)
        node(comp, fwd, exp_f)
        node(comp, bwd, attn_dgrad)
        node(comm, fwd, comb_f)
        comp += attn_wgrad
        if layer == STEADY_LAYERS - 1:
            settled = np.maximum(comm, comp)
    period = (np.maximum(comm, comp) - settled) / STEADY_LAYERS
    return period - (a + x + k)


def exposed_a2a(a2a: Any, blocks: Any, *, pp: Any, num_micro: Any, schedule: str, virtual_stages: int,
                opts: MoeOptions, split: LayerSplit | None = None, dispatch: Any = None) -> Any:
    """Seconds a step waits for of ``a2a`` seconds of all-to-all beside ``blocks`` seconds
    of block compute (see the module docstring): all of it without overlap; with it, the
    unpaired passes' share, and of the paired passes' all-to-all what their compute
    cannot cover, or at least the compute the SMs it holds would have done. Under
    Megatron-Core's EP overlap (not DualPipe) what the compute cannot cover is
    :func:`layer_schedule_exposed`'s, from ``split`` (the MoE layers' compute by node) and
    ``dispatch`` (the dispatch-direction seconds of ``a2a``); without them, as DualPipe."""
    a2a = np.asarray(a2a, dtype=float)
    if not overlaps(schedule, opts):
        return a2a
    u = unpaired_share(pp, num_micro, schedule, virtual_stages)
    paired_comm = (1.0 - u) * a2a
    paired_compute = (1.0 - u) * np.asarray(blocks, dtype=float)
    if schedule != "dualpipev" and split is not None and dispatch is not None:
        d = np.asarray(dispatch, dtype=float)
        uncovered = (1.0 - u) * layer_schedule_exposed(split, d, a2a - d)
    else:
        uncovered = paired_comm - paired_compute
    return u * a2a + np.maximum(uncovered, OVERLAP_SM_SHARE * paired_comm)


# --- compute the MoE layers add --------------------------------------------------------

def expert_share_of_linear(shape: ModelShape, stage_layers: Any) -> Any:
    """The routed experts' share of a block stage's linear FLOPs (the FLOP count, for
    hardware where perf prices no GEMM shapes and reports no ``expert_gemm_s``): per token
    6 x 3 h F_e x top_k on each MoE block over 6 x the blocks' active matmul weights."""
    if not shape.is_moe:
        return 0.0 * np.asarray(stage_layers, dtype=float)
    block_weights = shape.num_matmul_params() - shape.num_head_matmul_params()
    routed = shape.moe_layers * shape.top_k * shape.expert_params()
    return routed / block_weights + 0.0 * np.asarray(stage_layers, dtype=float)


def recompute_flops_per_token(shape: ModelShape, modules: tuple[str, ...], load: float) -> float:
    """Forward FLOPs a token's blocks (all of them, the MTP modules' included) run again
    for Megatron-Core ``recompute_modules``: "mla_up_proj" MLA's q and kv up-projections,
    "mlp" the dense blocks' MLP, "moe" an MoE block's router, shared and routed experts
    (the routed ones at ``load``). Like perf.hardware_flops_per_token, a stage computes
    its ceil(L / p) / L share of them."""
    h = shape.hidden
    out = 0.0
    if "mla_up_proj" in modules and shape.is_mla:
        up = sum(p.k * p.n for p in shape.attention_parts() if p.name in MLA_UP_PROJECTIONS)
        out += 2.0 * up * (shape.layers + shape.mtp_layers)
    if "mlp" in modules:
        out += 2.0 * (3 if shape.gated_mlp else 2) * h * shape.ffn_hidden * (shape.layers - shape.moe_layers)
    if "moe" in modules and shape.is_moe:
        per = h * shape.experts + shape.shared_experts * shape.expert_params() + load * shape.top_k * shape.expert_params()
        out += 2.0 * per * shape.moe_layers
    return out


def moe_rerun_share(shape: ModelShape, modules: tuple[str, ...], recomputed_share: Any) -> Any:
    """Share of MoE layers whose forward (and so its all-to-all pair) runs again: the
    blocks recomputed whole, or every one under the "moe" module."""
    return np.maximum(np.asarray(recomputed_share, dtype=float), 1.0 if "moe" in modules else 0.0)


def permute_seconds(shape: ModelShape, hw: Any, *, tokens: Any, act_bytes: float, moe_layers: Any,
                    num_micro: Any, load: Any) -> Any:
    """Seconds of the token permutation around the all-to-alls: per MoE layer and
    micro-batch :data:`PERMUTE_PASSES` passes, each reading a rank's tokens and writing
    their top_k rows (or the reverse), at the achieved memory bandwidth; ``load``: the
    busiest rank's (:func:`rank_load`)."""
    rows = np.asarray(tokens, dtype=float) * (1.0 + shape.top_k * np.asarray(load, dtype=float))
    nbytes = PERMUTE_PASSES * rows * shape.hidden * act_bytes
    bw = hw.mem_bw * hw.mem_bw_fraction
    return nbytes / bw * np.asarray(moe_layers, dtype=float) * np.asarray(num_micro, dtype=float)


# --- gpt-oss's expert epilogue, where it runs unfused --------------------------------------

# Bytes a routed row moves through the elementwise ops gpt-oss's experts add around the
# grouped GEMMs when they run unfused, (forward, backward), in BF16 activations, counted
# from Megatron-Core's code (d98e8a64dd, 2026-08-22) op by op, each op reading its inputs
# and writing its outputs once (views free): tests/unit/test_moe_epilogue.py replays the
# ops on CPU under a dispatch mode that adds up each aten op's bytes. F: the GLU's width
# (expert_ffn_hidden), H: hidden.
#   clamp (glu_clamp; fusions/fused_bias_geglu.weighted_bias_quick_geglu_impl clamps the
#     two halves with eager ops before the jit-fused quick-GEGLU): forward two clamps
#     (read F, write F each) and the cat of the halves (read 2F, write 2F) = 16F;
#     backward autograd's clamp gradients, compare masks then a where (the one-sided 8F,
#     the two-sided 14F), and the chunk's cat of the two (8F) = 30F. Recomputing the
#     activation (moe_act, moe, or the whole block) runs the forward again.
#   bias (expert_bias; moe/experts.TEGroupedMLP._apply_bias adds the second linear's bias
#     times the router's weight per local expert after the GEMM: split, t + b x p, cat,
#     cast back): its bytes follow the weights' dtype. HybridEP and DeepEP take fp32
#     weights (their dispatchers' "only supports float32 probs"), so the products are
#     fp32: forward 28H, backward 40H. Megatron-Core's all-to-all keeps the router's dtype,
#     which gpt-oss's Megatron-Bridge recipes leave at the logits' (BF16): 12H and 16H.
#     Recomputing the MoE layer (moe, or the whole block; not moe_act, which checkpoints
#     the activation alone) runs the forward again.
#   The first linear's bias runs in the GEMM (Transformer Engine's GroupedLinear): nothing.
# Megatron-Core's SwiGLU fuses a clamp into its jit kernel: only this quick-GEGLU path (gpt-oss's)
# runs it apart. A fused grouped MLP (Transformer Engine's CuteDSL kernel, MXFP8 or NVFP4
# on Blackwell, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1) does all of it in its GEMMs:
# MoeOptions.fused_grouped_mlp.
EPILOGUE_BYTES = {"clamp": (16.0, 30.0), "bias_fp32_weights": (28.0, 40.0), "bias_bf16_weights": (12.0, 16.0)}
# The router weights' dtype by dispatcher, as the bias path sees them.
FP32_WEIGHTS = {"alltoall": False, "deepep": True, "hybridep": True}


def fused_grouped_mlp_problem(gpu: str | None, precision: str, recipe: str | None) -> str | None:
    """Why a run stating Transformer Engine's fused grouped MLP (MoeOptions.
    fused_grouped_mlp) cannot have it, or None: the CuteDSL kernel takes an MX recipe on
    NVIDIA Blackwell only (TE ops/fused/grouped_mlp.py: MXFP8 or NVFP4, compute capability
    10); ``gpu`` None (memory without a system): the precision alone is checked."""
    from .. import catalog

    known = gpu is not None and gpu in catalog.accelerators()
    blackwell = not known or (catalog.accelerator_vendor(gpu) == "nvidia" and catalog.accelerator_mx_formats(gpu))
    if precision == "fp8" and recipe == "mxfp8" and blackwell:
        return None
    on = precision + (f" ({recipe})" if recipe else "") + (f" on {gpu}" if gpu else "")
    return (f"Transformer Engine's fused grouped MLP runs MXFP8 on NVIDIA Blackwell (--precision fp8 --fp8-recipe "
            f"mxfp8 on such a GPU), not {on}")


def epilogue_seconds(shape: ModelShape, hw: Any, *, tokens: Any, moe_layers: Any, num_micro: Any, load: Any,
                     opts: "MoeOptions", act_rerun: Any = 0.0, layer_rerun: Any = 0.0,
                     act_bytes: float = 2.0) -> Any:
    """Seconds of the unfused elementwise passes gpt-oss's experts add (the clamp of the
    GLU's inputs, ``glu_clamp``; the router-weighted bias of the second linear,
    ``expert_bias``): :data:`EPILOGUE_BYTES` a routed row, the busiest rank's rows
    (``tokens`` x top_k x ``load``), at the achieved memory bandwidth, scaled by
    ``act_bytes`` / 2 (the counts are BF16's); ``act_rerun`` / ``layer_rerun``: the share
    of layers whose activation / whole MoE layer runs its forward again. Nothing under a
    fused grouped MLP (``opts.fused_grouped_mlp``) or for experts without either."""
    rows = np.asarray(tokens, dtype=float) * shape.top_k * np.asarray(load, dtype=float)
    f = float(shape.expert_ffn_hidden or shape.ffn_hidden)
    per_row = 0.0 * rows
    if opts.fused_grouped_mlp:
        return per_row
    if shape.glu_clamp is not None:
        fwd, bwd = EPILOGUE_BYTES["clamp"]
        per_row = per_row + f * (fwd * (1.0 + np.asarray(act_rerun, dtype=float)) + bwd)
    if shape.expert_bias:
        # Under fp32 training the weights are the activations' dtype whatever the
        # dispatcher: no cast, the BF16-weights ops at 4 bytes an element.
        mixed = FP32_WEIGHTS[opts.dispatcher] and act_bytes < 4.0
        fwd, bwd = EPILOGUE_BYTES["bias_fp32_weights" if mixed else "bias_bf16_weights"]
        per_row = per_row + shape.hidden * (fwd * (1.0 + np.asarray(layer_rerun, dtype=float)) + bwd)
    bw = hw.mem_bw * hw.mem_bw_fraction
    return per_row * act_bytes / 2.0 * rows / bw * np.asarray(moe_layers, dtype=float) \
        * np.asarray(num_micro, dtype=float)


def epilogue_note(shape: ModelShape, opts: "MoeOptions", counted: bool, stack: str | None) -> str | None:
    """What the prediction says of gpt-oss-style experts (None for others); ``counted``:
    whether the stack runs them as the counted ops (stack.counts_expert_epilogue)."""
    what = [w for w, on in (("clamped GLU inputs", shape.glu_clamp is not None), ("expert biases", shape.expert_bias))
            if on]
    if not what:
        return None
    if not counted:
        return (f"MoE experts with {' and '.join(what)}: their elementwise passes are not priced for the {stack} "
                "stack (counted from Megatron-Core's ops only: stacks.toml expert_epilogue)")
    if opts.fused_grouped_mlp:
        return (f"MoE experts with {' and '.join(what)}: inside the fused grouped MLP (--moe-fused-grouped-mlp), "
                "no passes of their own")
    return (f"MoE experts with {' and '.join(what)}: priced as Megatron-Core runs them unfused, elementwise passes "
            "over every routed row (planner/moe.py EPILOGUE_BYTES, counted from its ops); a run with "
            "Transformer Engine's fused grouped MLP (MXFP8 on Blackwell) has none: "
            "--moe-fused-grouped-mlp")


# --- the classes of MoE runs whose errors are kept apart ------------------------------------

# The prediction-interval classes of MoE runs (:func:`moe_class`; planner/uncertainty.py
# takes each class's half-widths from the published runs of it).
MOE_CLASSES = ("eager", "graphed", "efa", "efa-deepep", "offload", "eager-torchtitan", "eager-automodel")


def moe_class(shape: Any, options: Any = None, system: str | None = None, ep: Any = None,
              offload: bool = False, stack: str | None = None) -> str | None:
    """The MoE interval class of a prediction: None for a dense model, "offload" where the
    run offloads its model states to the host (FSDP2's CPU offload, --offload: the optimizer
    step then runs on the host, priced on one thread (planner/host_step.py) but not the
    host's other work, so such runs miss by their own measure), "graphed" where
    its MoE layers run in CUDA graphs (MoeOptions.cuda_graphs, --moe-cuda-graphs);
    eager with expert parallelism across nodes of a ``system`` that talk over AWS EFA
    (``ep`` over its GPUs a node; ``ep`` None: taken to cross them:
    hardware.ep_crosses_efa), "efa" with the all-to-all dispatcher and "efa-deepep" with
    DeepEP or HybridEP (the published EFA runs, a third party's, every one with EP across
    nodes, ran far slower than the model prices, DeepEP's most: docs/planner.md);
    "eager-torchtitan" on torchtitan's stack (``stack``: its MoE layer is priced with
    Megatron-Core's host constants, an assumption, and its published runs miss by their own
    measure), "eager-automodel" on NeMo AutoModel's (either of its stacks: its own MoE layer,
    FSDP2 with DeepEP or all-to-all, priced likewise); else "eager"."""
    from .hardware import ep_crosses_efa

    if not getattr(shape, "is_moe", False):
        return None
    if offload:
        return "offload"
    if options is not None and options.cuda_graphs:
        return "graphed"
    if ep_crosses_efa(system, ep):
        deep = options is not None and options.dispatcher != "alltoall"
        return "efa-deepep" if deep else "efa"
    if stack == "torchtitan":
        return "eager-torchtitan"
    if stack in ("automodel", "automodel-flex"):
        return "eager-automodel"
    return "eager"


# --- the host's launch cost ----------------------------------------------------------------

# The most of the eager term a graphed layer can keep: above 1 the model would price CUDA
# graphs as slowing a layer down, against every published A/B but one of -1.5%
# (docs/research/moe_breakdown.md). moe_validation.solve_graphed_share searches up to it.
MAX_GRAPHED_SHARE = 1.0


@lru_cache(maxsize=1)
def host_constants() -> dict[str, Any]:
    """data/stacks.toml [moe_host]: the host time an eager MoE layer adds per micro-batch
    (forward and backward) in ms: ``per_layer_ms``, a table by dispatcher (one value for
    each of :data:`DISPATCHERS`), and ``per_local_expert_ms``; ``graphed_share`` and
    ``graphed_padded_share``: the share of that time a layer captured in CUDA graphs still
    takes, dropless or drop-and-pad (:func:`graphed_share_key`, :func:`host_seconds`)."""
    from .. import catalog

    c = dict(catalog.load("stacks.toml")["moe_host"])
    per_layer = c.get("per_layer_ms")
    if not isinstance(per_layer, dict) or sorted(per_layer) != sorted(DISPATCHERS):
        raise MgbenchError(f"stacks.toml [moe_host] per_layer_ms must give one value for each dispatcher "
                           f"({', '.join(DISPATCHERS)}), got {per_layer!r}")
    for key, low, high, what in (
            *((k, 0.0, MAX_GRAPHED_SHARE, f"a number from 0 to {MAX_GRAPHED_SHARE:g}") for k in GRAPHED_SHARE_KEYS),
            ("torchtitan_extra_ms", -min(float(v) for v in per_layer.values()), float("inf"),
             "a number of ms no lower than minus the smallest per_layer_ms"),
            ("efa_proxy_notify_ms", 0.0, float("inf"), "a number of ms, 0 or more")):
        v = c.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not low <= v <= high:
            raise MgbenchError(f"stacks.toml [moe_host] {key} must be {what}, got {v!r}")
    return c


# The share of a layer pass's launches its forward makes, where recompute runs the forward
# again (counted from the ops, not measured): the router, permutation and dispatch ops each
# have one backward op (1/2); a local expert's GEMMs are one a linear forward and two
# (data and weight gradient) backward (1/3), as Transformer Engine's GroupedLinear runs them.
HOST_FORWARD_SHARE = {"per_layer": 1.0 / 2.0, "per_local_expert": 1.0 / 3.0}


def host_launches(shape: ModelShape, *, ep: Any, moe_layers: Any, num_micro: Any,
                  rerun: Any = 0.0) -> tuple[Any, Any]:
    """(n, n x local experts): a stage's MoE layer passes a step (its MoE layers x the
    micro-batches), and the same weighted by the experts each rank holds; where a share
    ``rerun`` of the MoE layers runs its forward again (full recompute, or the "moe"
    module: :func:`moe_rerun_share`), each pass counts that share of its forward's
    launches again (:data:`HOST_FORWARD_SHARE`)."""
    n = np.asarray(moe_layers, dtype=float) * np.asarray(num_micro, dtype=float)
    r = np.asarray(rerun, dtype=float)
    n_local = n * shape.experts / np.asarray(ep, dtype=float)
    return (n * (1.0 + r * HOST_FORWARD_SHARE["per_layer"]),
            n_local * (1.0 + r * HOST_FORWARD_SHARE["per_local_expert"]))


# The stored shares of the eager host term a graphed MoE layer keeps: dropless, drop-and-pad
# (stacks.toml [moe_host]; :func:`graphed_share_key` picks one).
GRAPHED_SHARE_KEYS = ("graphed_share", "graphed_padded_share")


def graphed_share_key(opts: MoeOptions) -> str:
    """Which stored share of the eager host term a graphed run's MoE layers keep
    (:func:`host_constants`): "graphed_padded_share" where the run has a capacity factor,
    "graphed_share" where it is dropless. Megatron-Core captures an MoE layer only where its
    shapes are static, with a capacity factor and padding (core_v0.14.0 moe/README.md:
    without them "the resulting dynamic shapes make MoE layers uncapturable"), so a graphed
    run with a capacity factor is taken as drop-and-pad, its permutation, dispatch and expert
    GEMMs in the graph; a dropless one graphs attention, or the router and preprocess, or a
    full iteration over a paged stash (rule of the twentieth session, docs/planner.md)."""
    return GRAPHED_SHARE_KEYS[opts.capacity_factor is not None]


def host_seconds(shape: ModelShape, *, ep: Any, moe_layers: Any, num_micro: Any, opts: MoeOptions,
                 rerun: Any = 0.0, stack: str | None = None) -> Any:
    """Seconds a step's eager MoE layers add, n x (per_layer[dispatcher] +
    per_local_expert x experts / ep) ms (:func:`host_launches`, :func:`host_constants`):
    the launch work of each layer pass (the router, the permutation and the dispatcher's
    own kernels, which differ by dispatcher) and of each local expert's small kernels,
    which the GPU waits for (the DeepSeek-V3 GB200 account NVIDIA published calls the eager
    baseline launch-bound: "the CPU kernel launch speed cannot keep up"). Where the run
    captures its MoE layers in CUDA graphs the host launches nothing, but the same small
    kernels (router, permutation, per-expert casts and GEMMs, their gaps) still run on the
    GPU, which the eager term covered and the rest of the model does not price: such a
    layer takes ``graphed_share`` of the eager time, ``graphed_padded_share`` where it drops
    and pads (:func:`graphed_share_key`; each solved from its own graphed fit rows,
    moe_validation.solve_graphed_share). A recomputed MoE layer launches
    its forward again (``rerun``, :func:`host_launches`). The constants are Megatron-Core's
    MoE layer's; a torchtitan run (``stack``) adds ``torchtitan_extra_ms`` a layer pass, its
    own router, permutation and grouped GEMMs in eager PyTorch ops (solved from torchtitan's
    fit rows: moe_validation.solve_torchtitan_extra)."""
    n, n_local = host_launches(shape, ep=ep, moe_layers=moe_layers, num_micro=num_micro, rerun=rerun)
    c = host_constants()
    per_layer = float(c["per_layer_ms"][opts.dispatcher]) + (float(c["torchtitan_extra_ms"]) if stack == "torchtitan"
                                                             else 0.0)
    eager = (per_layer * n + float(c["per_local_expert_ms"]) * n_local) * 1e-3
    return float(c[graphed_share_key(opts)]) * eager if opts.cuda_graphs else eager


def efa_notify_launches(*, ep: Any, gpus_per_node: int, across_efa: bool, moe_layers: Any, num_micro: Any,
                        opts: MoeOptions, rerun: Any = 0.0) -> Any:
    """A stage's forward DeepEP-style dispatches a step that exchange their token counts
    across AWS EFA nodes through a CPU proxy: its MoE layers x micro-batches, and again for
    the share ``rerun`` whose forward recompute runs (each a dispatch that is not cached),
    where the run's backend is one of :data:`PROXY_BACKENDS`, its system talks over EFA
    (``across_efa``) and its EP group spans nodes (:func:`ep_geometry`); else 0."""
    n = np.asarray(moe_layers, dtype=float) * np.asarray(num_micro, dtype=float) * (1.0 + np.asarray(rerun, dtype=float))
    if not across_efa or opts.dispatcher != "deepep" or opts.backend not in PROXY_BACKENDS:
        return 0.0 * n
    _, nodes = ep_geometry(ep, gpus_per_node)
    return np.where(nodes > 1, n, 0.0)


def efa_notify_seconds(**kwargs: Any) -> Any:
    """Seconds of host wait a step's forward DeepEP-style dispatches across EFA nodes
    through a CPU proxy add (:func:`efa_notify_launches` x ``efa_proxy_notify_ms``,
    :func:`host_constants`): the extra that exchange takes through a proxy over EFA, beyond
    the per-layer host wait already priced (:func:`host_seconds`, whose DeepEP constant was
    solved on runs off EFA and holds the wait every non-cached dispatch makes). DeepEP's
    internode benchmark times the dispatch kernel on a cached handle (DeepEP dd758ca
    tests/legacy/test_internode.py lines 247-251, 567632dd tests/test_internode.py 245-247;
    UCCL ep/bench/test_internode.py 433-435; the notify kernel is timed apart), so the
    kernel shares of published_ep_kernels.toml hold neither the count exchange nor the
    host's wait for the counts that a training step's forward dispatch makes (Megatron-Core
    core_v0.17.0 to v0.19.0 fused_a2a.py: no num_worst_tokens; backward reuses the
    handle). Waited for in full, as the host term (:func:`host_wait`). Solved on fit rows
    (one, so far): moe_validation.solve_efa_notify."""
    return efa_notify_launches(**kwargs) * float(host_constants()["efa_proxy_notify_ms"]) * 1e-3


def host_wait(host: Any, *, bubble_fraction: Any) -> Any:
    """Seconds a step waits for ``host`` seconds of eager MoE time (:func:`host_seconds`):
    all of it, and since it lengthens every stage's pass the pipeline bubble grows with it
    (/ (1 - bubble fraction)).

    Dropless and drop-and-pad alike. Megatron-Core's drop-and-pad dispatcher has no
    device-to-host sync (moe_pad_expert_input_to_capacity fixes every expert's rows), so the
    host could in principle launch ahead and hide behind the GPU's compute; the published
    eager drop-and-pad runs say it does not (data/published_moe_runs.toml: five held-out
    Megatron-Bridge 25.09 token-drop rows, +27% to +55% too fast when only the host time
    beyond the compute was charged, -21% to +5% with all of it, at the constants of the
    day; since the tenth session's re-solve 27.6% against 21.2% mean |error|, a thinner
    margin; docs/planner.md says this choice was made with those rows in view)."""
    return host / (1.0 - bubble_fraction)


def note(opts: MoeOptions, schedule: str) -> str:
    """One line of a prediction's notes: the MoE options it was priced with."""
    how = [f"{opts.dispatcher} dispatcher" + (f" ({opts.backend})" if opts.backend else "")]
    if opts.node_limit:
        how.append(f"at most {opts.node_limit} nodes a token")
    if opts.device_limit:
        how.append(f"at most {opts.device_limit} GPUs a token")
    if opts.fp8_dispatch:
        how.append("FP8 dispatch")
    how.append("all-to-all overlapped with the paired micro-batch" if overlaps(schedule, opts)
               else "all-to-all exposed")
    if opts.round_robin:
        load = ("round-robin routing (token t's experts consecutive from t x top_k): exactly balanced, "
                "the fewest GPUs and nodes a token")
        if opts.capacity_factor is not None:
            load += f"; capacity factor {opts.capacity_factor:g}, busiest expert rank at {opts.load:g} x the mean"
    elif opts.capacity_factor is not None:
        load = f"capacity factor {opts.capacity_factor:g}, busiest expert rank at {opts.load:g} x the mean (1 at ep 1)"
    elif opts.imbalance is None:
        load = (f"dropless, busiest expert rank at {opts.load:g} x the mean (an assumption: moe.DEFAULT_IMBALANCE; "
                "1 at ep 1, where every rank runs all experts)")
    else:
        load = f"dropless, busiest expert rank at {opts.imbalance:g} x the mean (1 at ep 1)"
    key = graphed_share_key(opts)
    share = float(host_constants()[key])
    kept = "all" if share == 1.0 else f"{share:.0%}"
    kind = "dropless" if key == GRAPHED_SHARE_KEYS[0] else "drop-and-pad (a capacity factor: the whole MoE layer captured)"
    host = (f"{kind} MoE layers in CUDA graphs: no host launches, yet {kept} of the eager layers' per-layer time kept "
            f"(stacks.toml [moe_host] {key}, solved from the published graphed runs of that kind)" if opts.cuda_graphs else
            f"eager MoE layers: the host's launch time per layer and micro-batch added, {opts.dispatcher} "
            "dispatcher's (solved from Megatron-Core and DeepSeek runs, stacks.toml [moe_host]; applied to every "
            "stack, dropless or drop-and-pad, an assumption)")
    return "MoE: " + ", ".join(how) + "; " + load + "; " + host


def options_of(row: dict[str, Any]) -> MoeOptions:
    """The MoeOptions a published row (data/published_moe_runs.toml) states."""
    routing = row.get("routing", "learned")
    if routing not in ("learned", "force_balanced", "round_robin"):
        raise MgbenchError(f"published_moe_runs.toml: {row.get('id')!r}: routing must be learned, force_balanced "
                           f"(random experts, Megatron-Core's) or round_robin, got {routing!r}")
    imbalance = row.get("imbalance")
    return MoeOptions(imbalance=1.0 if routing in ("force_balanced", "round_robin")
                      else None if imbalance is None else float(imbalance), round_robin=routing == "round_robin",
                      capacity_factor=row.get("capacity_factor"), dispatcher=row.get("dispatcher", "alltoall"),
                      backend=row.get("dispatcher_backend"),
                      node_limit=row.get("node_limit"), device_limit=row.get("device_limit"),
                      fp8_dispatch=bool(row.get("fp8_dispatch", False)), a2a_overlap=bool(row.get("a2a_overlap", False)),
                      wgrad_in_backward=bool(row.get("wgrad_in_backward", False)),
                      recompute_modules=tuple(row.get("moe_recompute", ())),
                      fp8_act_cache=bool(row.get("fp8_act_cache", False)),
                      cuda_graphs=bool(row.get("cuda_graphs", False)),
                      fused_grouped_mlp=bool(row.get("fused_grouped_mlp", False)))
