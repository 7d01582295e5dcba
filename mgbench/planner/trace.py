"""`mgbench memory --trace`: run the real workload and strategy on fake tensors and a fake
process group, and count what they allocate.

The model is built by the runner's own code (:func:`mgbench.strategies.apply.prepare`:
FSDP2 ``fully_shard``, DTensor tensor parallelism, ``torch.distributed.pipelining``) and
trained for two steps by the runner's own :func:`mgbench.runner.training.train_step`,
all under ``FakeTensorMode`` (tensors carry shapes, dtypes and storage sizes but no data)
on torch's fake process group (collectives return at once; one process plays one rank
of the requested world size). Nothing is allocated, so llama3-70b on 64 ranks traces on
a laptop.

:class:`StorageTracker` counts every storage the rank creates, by category, and keeps
the peak. It does what ``torch.distributed._tools.MemTracker`` does for the peak (a
``TorchDispatchMode`` that follows each storage's lifetime through weak references and
follows ``UntypedStorage.resize_``, which FSDP2 uses to free and re-gather parameters),
with three differences, each for a stated reason:

- it does not snapshot every module at every op (MemTracker's per-op module-peak
  bookkeeping took 70% of a trace's time) and so has no per-module breakdown;
- it allows a module to run more than once per step (gradient accumulation and
  pipeline schedules call the model once per micro-batch; MemTracker raises);
- it ignores DTensor's sharding propagation, which under an outer FakeTensorMode reuses
  that mode and creates global-shape "shadow" tensors that no real run allocates
  (MemTracker counts them: 3.3 GB of phantom optimizer memory in step 1 of llama-1b
  on 8 ranks, seen while writing this).

tests/unit/test_memory_trace.py checks its peak against MemTracker's on a config where
MemTracker works. Where the time goes: FakeTensorMode's own dispatch (about 0.1 ms an op)
and, at 64 ranks, FSDP2 chunking every parameter into 64 fake views at build; llama3-70b
on 64 ranks (170,000 ops) takes about 30 s on 2 cores, where MemTracker took 411 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from functools import partial
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils.weak import WeakIdKeyDictionary

# Categories of the trace; the analytic model's five are params, grads, optimizer,
# activations and temporaries, where temporaries holds the last three here.
CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries", "gathered_params", "communication")
ANALYTIC_GROUPS = {"params": ("params",), "grads": ("grads",), "optimizer": ("optimizer",),
                   "activations": ("activations",),
                   "temporaries": ("temporaries", "gathered_params", "communication")}


class StorageTracker(TorchDispatchMode):
    """Bytes of every live storage by category, and the peak of their sum.

    A storage's category is set when it appears: ``activations`` in forward,
    ``temporaries`` in backward (gradients of activations, recomputed checkpointed
    activations) and in the optimizer step, ``communication`` for buffers a collective
    writes (all-gather and reduce-scatter outputs, DDP buckets), ``gathered_params`` for
    storages FSDP2 re-allocates with ``resize_`` (the unsharded parameters). It moves to
    ``grads`` when it becomes a parameter's gradient and to ``optimizer`` when it becomes
    an optimizer state. Tensors that exist before tracking starts are registered with
    :meth:`track_model` (parameters and buffers) and :meth:`track_optimizer`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._info: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [bytes, category]
        self._refs: list[weakref.ref] = []
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_categories = dict(self.current)
        self.peak_where = ""
        self.step = 0
        self.step_peaks: list[int] = []
        self._phase_opt = 0
        self._skip = 0
        self._params: list[torch.Tensor] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._handles: list[Any] = []
        self._patched: list[tuple[Any, str, Any]] = []
        self.num_ops = 0

    # -- bookkeeping ---------------------------------------------------------------------
    def _add(self, st: torch.UntypedStorage, cat: str) -> None:
        info = self._info.get(st)
        if info is not None:
            if info[1] != cat:
                self.current[info[1]] -= info[0]
                self.current[cat] += info[0]
                info[1] = cat
            return
        n = st.nbytes()
        info = [n, cat]
        self._info[st] = info
        self.current[cat] += n
        self.total += n
        # Dropped when the storage is freed; the list only keeps the weakref alive.
        self._refs.append(weakref.ref(st, partial(self._freed, info)))

    def _freed(self, info: list, _ref: Any) -> None:
        self.current[info[1]] -= info[0]
        self.total -= info[0]
        info[0] = 0

    def _mark(self, t: Any, cat: str) -> None:
        for x in (t if isinstance(t, (list, tuple)) else [t]):
            for st in _storages(x):
                self._add(st, cat)

    def _update_peak(self, phase: str) -> None:
        if self.total > self.peak:
            self.peak = self.total
            self.peak_categories = dict(self.current)
            self.peak_where = f"step {self.step}, {phase}"
        if self.step_peaks and self.total > self.step_peaks[-1]:
            self.step_peaks[-1] = self.total

    def _phase(self) -> str:
        if self._phase_opt:
            return "optimizer"
        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

    # -- registration --------------------------------------------------------------------
    def track_model(self, modules: list[torch.nn.Module]) -> None:
        """Parameters and buffers as ``params``; gradients as ``grads`` from the moment
        autograd accumulates them (FSDP2's sharded gradients come from a reduce-scatter
        and are marked there)."""
        for m in modules:
            for p in m.parameters():
                self._mark(p, "params")
                self._params.append(p)
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook))
            for b in m.buffers():
                self._mark(b, "params")

    def _grad_hook(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self._mark(p.grad, "grads")

    def track_optimizer(self, opt: torch.optim.Optimizer) -> None:
        self._optimizers.append(opt)
        self._mark_optimizer(opt)

    def _mark_optimizer(self, opt: torch.optim.Optimizer) -> None:
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self._mark(v, "optimizer")

    def mark_grads(self) -> None:
        """Gradients held after a backward (called between micro-steps and steps)."""
        for p in self._params:
            if p.grad is not None:
                self._mark(p.grad, "grads")

    def start_training(self, modules: list[torch.nn.Module], opt: torch.optim.Optimizer) -> None:
        """Called once the model is built (the build itself is not tracked): its
        parameters and buffers as ``params``, any optimizer state, and the peak starts
        from there."""
        self.track_model(modules)
        self.track_optimizer(opt)
        self.peak = self.total
        self.peak_categories = dict(self.current)
        self.peak_where = "after build"

    def new_step(self) -> None:
        self.step += 1
        self.step_peaks.append(self.total)

    # -- the mode ------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        # The hot path of a trace (hundreds of thousands of calls): kept lean.
        if _DTENSOR in types:
            return NotImplemented  # let DTensor run its local ops, which come back here
        if func is _WAIT:
            # The fake implementation returns a new tensor; a real wait returns its input.
            return args[0]
        res = func(*args, **(kwargs or {}))
        if self._skip:
            return res
        self.num_ops += 1
        phase = self._phase()
        if func in _COMM_OUTPUT:
            self._mark(args[0], "grads" if func in _GRAD_OUTPUT else "communication")
        cat = "activations" if phase == "forward" else "temporaries"
        if isinstance(res, torch.Tensor):
            self._mark_new(cat, res)
        elif isinstance(res, (tuple, list)):
            for t in res:
                if isinstance(t, torch.Tensor):
                    self._mark_new(cat, t)
        self._update_peak(phase)
        return res

    def _mark_new(self, cat: str, t: torch.Tensor) -> None:
        if t.device.type == "meta":  # shape-only tensors hold no memory on any device
            return
        if type(t) is _FAKE or not is_traceable_wrapper_subclass(t):
            st = t.untyped_storage()
            if st not in self._info:
                self._add(st, cat)
            return
        for st in _storages(t):
            if st not in self._info:
                self._add(st, cat)

    # -- patches active while tracking -----------------------------------------------------
    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def __enter__(self) -> "StorageTracker":
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        orig_resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = orig_resize(st, size)
            info = tracker._info.get(st)
            if info is not None:
                tracker.current[info[1]] -= info[0]
                tracker.total -= info[0]
                info[0] = st.nbytes()
                info[1] = "gathered_params"
                tracker.current[info[1]] += info[0]
                tracker.total += info[0]
            elif st.nbytes():
                tracker._add(st, "gathered_params")
            tracker._update_peak(tracker._phase())
            return out

        orig_prop = ShardingPropagator._propagate_tensor_meta_non_cached

        def propagate(prop: Any, *a: Any, **k: Any) -> Any:
            tracker._skip += 1
            try:
                return orig_prop(prop, *a, **k)
            finally:
                tracker._skip -= 1

        def pre(opt: Any, *a: Any) -> None:
            tracker._phase_opt += 1

        def post(opt: Any, *a: Any) -> None:
            tracker._phase_opt -= 1
            tracker._mark_optimizer(opt)

        self._patch(torch.UntypedStorage, "resize_", resize_)
        self._patch(ShardingPropagator, "_propagate_tensor_meta_non_cached", propagate)
        self._handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for owner, name, old in reversed(self._patched):
            setattr(owner, name, old)
        self._patched.clear()

    def grouped(self, cats: dict[str, int]) -> dict[str, int]:
        """A breakdown in the analytic model's five categories."""
        return {k: sum(cats[c] for c in v) for k, v in ANALYTIC_GROUPS.items()}


def _storages(t: Any) -> list[torch.UntypedStorage]:
    from torch.distributed._tools.common_utils import get_untyped_storages

    return list(get_untyped_storages(t)) if isinstance(t, torch.Tensor) else []


def _comm_ops() -> tuple[set, set]:
    c10d = torch.ops.c10d
    out = {c10d._allgather_base_.default, c10d._reduce_scatter_base_.default, c10d.allreduce_.default}
    grads = {c10d._reduce_scatter_base_.default}
    return out, grads


_COMM_OUTPUT, _GRAD_OUTPUT = _comm_ops()
_WAIT = torch.ops._c10d_functional.wait_tensor.default


def _late_imports() -> tuple[type, type]:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.tensor import DTensor

    return DTensor, FakeTensor


_DTENSOR, _FAKE = _late_imports()


# --- tracing a config -----------------------------------------------------------------------

@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """torch's fake process group at ``world_size`` with this process as ``rank``; device
    meshes are built outside FakeTensorMode (their rank tables are real data: built
    inside, init_device_mesh raises DataDependentOutputException)."""
    # The fake kernels of the c10d ops, imported here rather than with this module: they
    # pull in torch's memory tools (about 1 s), which a count on real tensors never needs.
    import torch.distributed._tools.fake_collectives  # noqa: F401
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed import device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    def outside_fake(fn: Any) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            with unset_fake_temporarily():
                return fn(*a, **k)
        return wrapped

    # init_device_mesh builds the rank table; FSDP2 on a tensor-parallel model builds a
    # 2-D mesh of its own (DeviceMesh.__init__). The DDP reducer's comm hook must return
    # its bucket, which a fake all-reduce does not: see _ddp_in_place below.
    patches = [(device_mesh, "init_device_mesh"), (device_mesh.DeviceMesh, "__init__")]
    saved = [getattr(owner, name) for owner, name in patches]
    for (owner, name), fn in zip(patches, saved):
        setattr(owner, name, outside_fake(fn))
    try:
        yield
    finally:
        for (owner, name), fn in zip(patches, saved):
            setattr(owner, name, fn)
        dist.destroy_process_group()


@contextlib.contextmanager
def _ddp_fake_safe() -> Iterator[None]:
    """DDP's constructor compares parameter shapes across ranks by reading tensor data in
    C++ (fake tensors have none); the fake world runs one process, so there is nothing to
    compare: skip that check while building."""
    from torch.nn.parallel import distributed as ddp_mod

    orig = ddp_mod._verify_param_shape_across_processes
    ddp_mod._verify_param_shape_across_processes = lambda *a, **k: None
    try:
        yield
    finally:
        ddp_mod._verify_param_shape_across_processes = orig


@contextlib.contextmanager
def _pipeline_fake_safe() -> Iterator[None]:
    """torch.distributed.pipelining on a fake process group, traced from one rank.

    Its first step votes on static vs dynamic shape inference (reading the vote with
    .item()) and then exchanges shape metadata with the neighbouring stages as pickled
    objects; a fake process group delivers neither. Here the vote runs on real one-element
    tensors (the fake receive leaves zeros: "dynamic", what the runner's stages, built
    without example shapes, also choose), sent metadata is dropped, and received metadata
    is what the neighbour would send: every stage but the last passes on the residual
    stream, so a stage's input, its output and their gradients have one shape and dtype.
    The stages' own metadata inference (a forward and backward on real tensors, which
    the real runner also does in step 1) runs unchanged and is traced.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        from torch.distributed.pipelining import schedules, stage
        from torch.distributed.pipelining._utils import _derive_grad_metas, _StageBackwardMeta, _StageForwardMeta
        targets = [(schedules._PipelineSchedule, "_warmup_p2p"), (stage.PipelineStage, "_send_meta"),
                   (stage.PipelineStage, "_recv_meta")]
        saved = [getattr(o, n) for o, n in targets]
    except (ImportError, AttributeError):  # another torch: pipelines cannot be traced; others can
        yield
        return
    warmup, _send, _recv = saved
    outputs: dict[str, Any] = {}

    def warmup_p2p(self: Any, *a: Any, **k: Any) -> Any:
        with unset_fake_temporarily():
            return warmup(self, *a, **k)

    def send_meta(self: Any, meta: Any, dst_stage: int) -> None:
        if isinstance(meta, _StageForwardMeta):
            outputs["residual"] = meta.forward_metas

    def recv_meta(self: Any, src_stage: int) -> Any:
        if src_stage > self.stage_index:  # gradients of this stage's outputs
            return _StageBackwardMeta(backward_metas=tuple(_derive_grad_metas(self._stage_meta.outputs)))
        return _StageForwardMeta(forward_metas=outputs["residual"])

    for (owner, name), fn in zip(targets, (warmup_p2p, send_meta, recv_meta)):
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for (owner, name), fn in zip(targets, saved):
            setattr(owner, name, fn)


def _ddp_in_place(module: Any, tracker: StorageTracker) -> None:
    """Give a DDP module a comm hook with the memory of DDP's built-in one (the fake
    process group's all-reduce future carries no tensor, which DDP's reducer rejects).
    The hook also shows the tracker the buckets, which DDP allocates when it is built."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(module, DDP):
        return

    world = dist.get_world_size()

    def hook(state, bucket):  # type: ignore[no-untyped-def]  (DDP rejects annotations other than its own)
        tracker._mark(bucket.buffer(), "communication")
        fut = torch.futures.Future()
        # What DDP's built-in hook leaves: the all-reduce in place, then the average as a
        # new tensor (its C++ AllReduceCommHook divides out of place), which the reducer
        # copies into the gradients when backward ends.
        fut.set_result(bucket.buffer() / world)
        return fut

    module.register_comm_hook(None, hook)
    module.reducer = _KeepBuckets(module.reducer)


class _KeepBuckets:
    """DDP's reducer, except that it keeps its first bucket assignment. A real DDP
    re-buckets once, before step 2, in the order gradients became ready, after agreeing
    on that order across ranks (C++ reading the data of an exchanged tensor, which fake
    tensors have not). Re-bucketing reorders the same gradients: the same bytes."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _dp_rank(cfg: Any) -> int:
    return 0  # rank 0 is data-parallel rank 0 in every layout


def traced_config(cfg: Any) -> tuple[Any, list[str]]:
    """The config the trace runs, and what it changes: fp16 is traced as bf16 (GradScaler
    reads its found-inf flag with .item(), which fake tensors cannot answer; the memory
    is the same: 2-byte activations, fp32 weights, an in-place unscale)."""
    from ..strategies import RING_FORMS

    notes = []
    if cfg.precision == "fp16":
        cfg = dataclasses.replace(cfg, precision="bf16")
        notes.append("fp16 traced as bf16 (same bytes; the loss scaler reads data, which fake tensors lack)")
    if cfg.grad_compression != "none":
        cfg = dataclasses.replace(cfg, grad_compression="none")
        notes.append("gradient compression not traced (its hooks need a real all-reduce); traced uncompressed")
    if cfg.strategy == "cp" and (cfg.cp_attention in RING_FORMS or cfg.cp_attention == "auto" and
                                 cfg.device == "cuda"):
        cfg = dataclasses.replace(cfg, cp_attention="allgather_kv")
        notes.append("cp attention traced in the all-gather-KV form (torch's ring attention, which CUDA runs, has "
                     "no CPU kernel): its causal mask is counted, the ring's per-block buffers are not")
    if cfg.device != "cpu":
        cfg = dataclasses.replace(cfg, device="cpu")
    return cfg, notes


def trace_config(cfg: Any, steps: int = 2) -> dict[str, Any]:
    """Peak bytes of rank 0 of ``cfg`` over ``steps`` training steps, by category.

    Rank 0 holds the first pipeline stage (the heaviest under 1F1B: it keeps up to pp
    micro-batches in flight; the last stage keeps one, plus the logits).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..runner.training import rank_batches, train_step
    from ..strategies.apply import prepare

    cfg, notes = traced_config(cfg)
    device = torch.device("cpu")
    t0 = time.perf_counter()
    tracker = StorageTracker()
    with fake_world(cfg.nproc), FakeTensorMode(allow_non_fake_inputs=True):
        # Token ids (8 bytes a token, a few KB) are made before tracking: not counted.
        batches = rank_batches(cfg.seed, range(steps), _dp_rank(cfg), cfg.micro_batch, cfg.grad_accum,
                               cfg.dp, cfg.seq_len, cfg.shape.vocab, device)
        with _ddp_fake_safe(), _pipeline_fake_safe():
            # The build is not tracked (its own peak, the unsharded model before FSDP
            # shards it, is not a training peak; tracking it would only cost time): what it
            # leaves is registered at the start, weights and buffers as params, and DDP's
            # gradient buckets as communication when its hook first sees them.
            prep = prepare(cfg, device)
            for m in prep.modules or [prep.model]:
                _ddp_in_place(m, tracker)
            built = time.perf_counter()
            with tracker:
                tracker.start_training(prep.modules or [prep.model], prep.optimizer)
                for step in range(steps):
                    tracker.new_step()
                    train_step(prep, batches[step], device, cfg.precision)
                    tracker.mark_grads()
            del prep, batches
    done = time.perf_counter()
    return {
        "peak_bytes": tracker.peak,
        "categories": tracker.grouped(tracker.peak_categories),
        "detail": dict(tracker.peak_categories),
        "peak_at": tracker.peak_where,
        "step_peaks_bytes": tracker.step_peaks,
        "num_ops": tracker.num_ops,
        "build_s": built - t0,
        "trace_s": done - built,
        "notes": notes,
    }


# --- `mgbench memory --trace` ----------------------------------------------------------------

# What a CPU trace with fake tensors cannot show of a CUDA run, and how the output and
# the model account for each.
CUDA_NOTES = (
    "attention: the trace ran SDPA's CPU flash kernel, which keeps what CUDA's flash kernel keeps (q, k, v, "
    "the output and an fp32 log-sum-exp per head and token); fp32 on CUDA runs the memory-efficient kernel, "
    "which keeps the same, unless grouped-query attention sends it to the math kernel, which also stores the "
    "s x s attention scores (not in the model)",
    "optimizer: on CPU torch's AdamW steps one tensor at a time (scratch: about two of the largest tensors); "
    "on CUDA the runner's AdamW is fused (no scratch; the multi-tensor step behind fp16's sharded scaler makes "
    "sqrt(v) for every tensor at once): cuda_total_bytes counts that",
    "allocator: fake tensors have exact sizes; CUDA's caching allocator rounds blocks up to 512 bytes and "
    "fragments (`mgbench memory` without --trace adds an 8% allowance for that on a GPU)",
)


def runner_config(shape: Any, layout: Any, strategy: str | None = None) -> Any:
    """The runner config (:class:`mgbench.config.RunConfig`) a planner layout
    (:class:`mgbench.layout.Layout`) describes. Without ``strategy`` the layout picks it
    (Layout.runner_strategy: from its degrees and ZeRO stage, through the registry).
    Problems raise MgbenchError naming the options to change."""
    import dataclasses as dc

    from ..config import RunConfig
    from ..errors import MgbenchError
    from ..layout import RUNNER_RECOMPUTE, for_strategy, joined_problems
    from ..strategies import BY_NAME
    from ..strategies.schedules import VIRTUAL, chunks_per_rank, too_few_chunks

    L = layout
    dp_mode = ("hsdp" if L.hsdp_enabled else "fsdp") if L.fsdp_enabled else "ddp"  # pp+tp+dp's replicas
    if strategy is None:
        strategy, why = L.runner_strategy()
        if why:
            raise MgbenchError(why)
    if strategy not in BY_NAME:
        raise MgbenchError(f"--strategy {strategy!r} is not one of {', '.join(BY_NAME)}")
    degrees = BY_NAME[strategy].degrees
    lay = None if not degrees else {k: getattr(L, k) for k in ("dp", "tp", "pp", "ep", "cp") if k in degrees}
    dims, problem = for_strategy(strategy, L.num_gpus, lay)
    if problem:
        raise MgbenchError(problem)
    if (dims.tp, dims.pp, dims.cp, dims.ep) != (L.tp, L.pp, L.cp, L.ep):
        raise MgbenchError(f"strategy {strategy} runs {dims.describe()} on {L.num_gpus} GPUs, not {L.describe()}: "
                           "change the degrees or --strategy")
    num_micro = L.batch // (L.micro_batch * dims.dp) if L.batch % (L.micro_batch * dims.dp) == 0 else 0
    if num_micro < 1:
        raise MgbenchError(f"--global-batch {L.batch} is not a multiple of micro-batch {L.micro_batch} x dp {dims.dp}")
    if L.recompute_priced_only:
        raise MgbenchError(f"--trace runs the runner's own code, which checkpoints {', '.join(RUNNER_RECOMPUTE)}: "
                           f"--recompute {L.recompute} is priced without --trace")
    if (why := shape.runner_problem()) is not None:
        raise MgbenchError(f"--trace builds the model with the runner's decoder: {why}")
    if shape.is_moe:  # torch.bincount of the routed experts, then all-to-all splits of that size
        raise MgbenchError("an MoE model's routing sizes depend on the data (how many tokens each expert gets), which "
                           "the runner's code on fake tensors cannot give: `mgbench memory` without --trace prices "
                           "the layout, and `mgbench run` with the model measures it on real ranks")
    if shape.is_mla and L.tp > 1:  # the same refusal as the suite's (suite._mla_problem)
        raise MgbenchError("--trace: tensor parallelism of multi-head latent attention is not built in the runner; "
                           "give --tp 1 (the layout without --trace is priced)")
    # The schedule registry says which schedules take --virtual-stages (interleaved and
    # interleaved_zb) and how many chunks a rank holds (ZB-V and DualPipeV: two).
    v = L.virtual_stages if L.schedule in VIRTUAL else 1
    if too_few_chunks(L.schedule, v):
        raise MgbenchError(f"the {L.schedule} schedule needs --virtual-stages 2 or more")
    problems = dims.runner_problems(L.num_gpus, layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads,
                                    virtual_stages=chunks_per_rank(L.schedule, v) if L.pp > 1 else 1,
                                    num_microbatches=num_micro if L.pp > 1 else None,
                                    experts=shape.experts or None, seq_len=L.seq_len if L.cp > 1 else None)
    if problems:
        hint = (f" (give --global-batch {L.micro_batch * dims.dp * L.pp} or more)"
                if L.pp > 1 and num_micro < L.pp else "")
        raise MgbenchError(joined_problems(problems) + hint)
    from ..config import FP8_RECIPES as RUNNER_FP8_RECIPES

    if L.fp8_recipe is not None and L.fp8_recipe not in RUNNER_FP8_RECIPES:
        raise MgbenchError(f"--trace runs the runner's torchao float8, whose recipes are "
                           f"{', '.join(RUNNER_FP8_RECIPES)}: --fp8-recipe {L.fp8_recipe} is priced without --trace")
    recipe = {"fp8_recipe": L.fp8_recipe} if L.fp8_recipe is not None else {}
    cfg = RunConfig(model=shape, strategy=strategy, nproc=L.num_gpus, micro_batch=L.micro_batch, seq_len=L.seq_len,
                    grad_accum=num_micro, precision=L.precision, activation_checkpointing=L.recompute, **recipe,
                    pp_schedule=L.schedule, virtual_stages=max(v, 2), offload=bool(L.offload),
                    dp_mode=dp_mode if BY_NAME[strategy].pipelined and degrees else "ddp", device="cpu",
                    **({"replicas": L.replicas} if L.hsdp_enabled else {}))
    return dc.replace(cfg, **dims.degrees())


def trace_memory(cfg: Any) -> dict[str, Any]:
    """`mgbench memory --trace`: the analytic model of ``cfg`` (top-level ``*_bytes``,
    for the traced CPU run), the trace (``traced``), and ``error_pct`` of the analytic
    ``total_bytes`` against the traced peak; ``cuda_total_bytes`` is the model for the
    same config on a GPU, and ``notes`` say what a CPU trace cannot show."""
    import dataclasses as dc

    from .memory import memory_for_config, runner_phases

    traced = trace_config(cfg)
    phases = runner_phases(cfg)
    peak_phase = max(phases, key=lambda k: phases[k]["total_bytes"])
    analytic = memory_for_config(cfg)
    cuda = memory_for_config(dc.replace(cfg, device="cuda"))
    notes = list(traced.pop("notes"))
    if cfg.strategy in ("ddp", "zero1") or (cfg.strategy == "pp+tp+dp" and cfg.dp_mode == "ddp" and cfg.dp > 1):
        notes.append("DDP: the fake process group cannot all-reduce; a stand-in comm hook leaves what DDP's "
                     "built-in one leaves (the bucket reduced in place, its average as a new tensor), and DDP keeps "
                     "its first bucket order (a real DDP re-buckets once, before step 2: the same bytes)")
    if cfg.pipelined:
        notes.append(f"pipeline: traced rank 0, which holds the first stage ({cfg.pp_schedule}: it keeps the most "
                     "micro-batches in flight; the last stage keeps one, and the logits)")
    return {
        "config": cfg.label, "strategy": cfg.strategy, "dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp,
        "grad_accum": cfg.grad_accum, **analytic, "analytic_peak_phase": peak_phase,
        "traced": traced,
        "error_pct": 100.0 * (analytic["total_bytes"] - traced["peak_bytes"]) / traced["peak_bytes"],
        "cuda_total_bytes": cuda["total_bytes"],
        "notes": notes + list(CUDA_NOTES),
    }
