"""Which attention context parallelism runs (cp_attention), what the CPU can check of torch's
ring attention without a GPU, and the refusals. The ring itself runs on CUDA only
(tests/gpu/test_cp_ring.py); the all-gather-KV form runs here, checked against the
reference in suites/modern.toml (cp = 2 x dp = 2) and tests/unit/test_strategies_gloo.py
(cp = 2, fp16)."""

import pytest
import torch

from mgbench import suite as S
from mgbench.strategies import CP_ATTENTION, RING_FORMS, RING_NEEDS_CUDA
from mgbench.strategies import context_parallel as CP
from mgbench.strategies.context_parallel import (
    attention_form,
    cp_fields,
    decide_form,
    local_positions,
    ring_attention,
    ring_dispatch,
    torch_ring_positions,
)
from tests.factories import make_config

CPU = torch.device("cpu")


def _cp(**kw):
    return make_config(strategy="cp", nproc=2, model="tiny", seq_len=32, **kw)


@pytest.mark.parametrize("seq_len,cp", [(16, 2), (32, 4), (24, 3), (64, 8)])
def test_our_load_balanced_split_is_the_layout_torchs_ring_expects(seq_len, cp):
    """The ring's causal block logic (torch's _is_causal_behavior with load balancing on)
    is written for its head-tail balancer's split: ours must be the same on every rank,
    or the ring computes a different attention (prepare re-checks this before a ring run)."""
    for r in range(cp):
        assert local_positions(seq_len, cp, r) == torch_ring_positions(seq_len, cp, r)
    # The comparison tells splits apart: a plain contiguous split is not torch's layout.
    contiguous = list(range(seq_len // cp))
    assert torch_ring_positions(seq_len, cp, 0) != contiguous


def test_cpu_runs_the_allgather_form_and_the_record_says_why():
    form, why = attention_form(_cp(), CPU)
    assert form == "allgather_kv"
    assert "CPU" in why and "_scaled_dot_product_flash_attention_for_cpu" in why and "flex" in why
    fields = cp_fields(_cp(), CPU)
    assert fields["cp_attention_impl"] == "allgather_kv" and fields["cp_attention_reason"] == why
    # torch's own kernel choice for a rank's call (CPU SDPA with a mask: its flash kernel).
    assert fields["cp_sdpa_kernel"] == "FLASH_ATTENTION"
    assert attention_form(_cp(cp_attention="allgather_kv"), CPU) == ("allgather_kv", "cp_attention = \"allgather_kv\"")
    assert cp_fields(make_config(strategy="ddp", nproc=2), CPU) == {}


@pytest.mark.parametrize("asked", ["ring_allgather", "ring_alltoall"])
def test_a_ring_asked_for_on_cpu_is_refused_on_the_rank(asked):
    # A config that reached a rank without the suite's check (a hand-built RunConfig).
    with pytest.raises(ValueError, match=f"cp_attention = \"{asked}\" needs CUDA"):
        attention_form(_cp(cp_attention=asked), CPU)


def test_the_ring_forms_are_named_once():
    """suite expansion, the rank's decision and the trace all ask RING_FORMS which values
    are rings; each is a cp_attention choice with a rotate method torch knows."""
    assert set(RING_FORMS) == {"ring_allgather", "ring_alltoall"} and set(RING_FORMS) < set(CP_ATTENTION)
    assert set(RING_FORMS.values()) == {"allgather", "alltoall"}  # ring_dispatch's names


def test_a_kernel_the_ring_cannot_dispatch_is_refused_when_asked_and_avoided_by_auto():
    """torch picks MATH for shapes its fused kernels refuse (on CUDA; decided here without
    one): a ring asked for by name cannot run, "auto" falls back to the all-gather form."""
    shapes = " (fp32, 4/2 heads, head dim 16)"
    for asked in RING_FORMS:
        with pytest.raises(ValueError, match=f"cp_attention = \"{asked}\" cannot run: torch picks the MATH SDPA "
                                             r"kernel for this rank's q, k, v \(fp32, 4/2 heads"):
            decide_form(asked, "cuda", "MATH", shapes)
    form, why = decide_form("auto", "cuda", "MATH", shapes)
    assert form == "allgather_kv" and "torch picks the MATH SDPA kernel" in why
    # A kernel the ring dispatches: the ring runs, with the rotation asked for.
    form, why = decide_form("ring_alltoall", "cuda", "EFFICIENT_ATTENTION")
    assert form == "ring_alltoall" and "EFFICIENT_ATTENTION" in why and "rotated by alltoall" in why
    assert decide_form("auto", "cuda", "FLASH_ATTENTION")[0] == "ring_allgather"
    assert decide_form("allgather_kv", "cuda", None)[0] == "allgather_kv"


def test_a_torch_that_splits_the_sequence_otherwise_is_refused_before_a_ring_run(monkeypatch):
    """The ring's causal block logic assumes torch's head-tail split; if torch's split
    ever stops matching ours, shard_sequence refuses the ring rather than compute a
    different attention. Made to fire with a contiguous split in torch's place."""
    from torch.distributed.device_mesh import init_device_mesh

    from mgbench.planner.trace import fake_world
    from mgbench.workloads.gpt import DecoderLM

    cfg = _cp()
    monkeypatch.setattr(CP, "torch_ring_positions", lambda seq_len, cp, rank: list(
        range(rank * seq_len // cp, (rank + 1) * seq_len // cp)))
    with fake_world(2):
        mesh = init_device_mesh("cpu", (2,))
        with pytest.raises(RuntimeError, match="torch's ring attention no longer splits seq_len 32 over cp = 2"):
            CP.shard_sequence(DecoderLM(cfg.shape, cfg.seq_len), cfg.seq_len, 2, 1, mesh, CPU, "ring_allgather")


def test_ring_on_cpu_is_skipped_at_expansion_with_one_line():
    text = """name = "x"
[sweep]
model = "tiny"
strategy = "cp"
nproc = 2
seq_len = 32
cp_attention = ["auto", "ring_allgather", "ring_alltoall", "allgather_kv"]
"""
    cfgs = S.expand(S.parse_suite(text, "x.toml"), "cpu", 2)
    by = {c.cp_attention: c for c in cfgs}
    assert by["auto"].skip_reason is None and by["allgather_kv"].skip_reason is None
    for asked in ("ring_allgather", "ring_alltoall"):
        assert by[asked].skip_reason == RING_NEEDS_CUDA.format(asked=asked)
        assert "\n" not in by[asked].skip_reason
    # Four configs, four ids; "auto" is the default, which adds nothing to an id (config_id
    # hashes non-defaults only), so cp configs keep the ids they had before the key existed.
    assert len({c.config_id for c in cfgs}) == 4
    assert by["auto"].config_id == make_config(strategy="cp", nproc=2, model="tiny", seq_len=32).config_id
    # The key only matters to cp: pinned to its default elsewhere.
    ddp = S.expand(S.parse_suite(text.replace('"cp"', '"ddp"'), "x.toml"), "cpu", 2)
    assert len(ddp) == 1 and ddp[0].cp_attention == "auto"
    with pytest.raises(Exception, match="'ring' is not one of auto, ring_allgather, ring_alltoall, allgather_kv"):
        S.parse_suite(text.replace('["auto", "ring_allgather", "ring_alltoall", "allgather_kv"]', '"ring"'), "x.toml")


def test_ring_dispatch_is_on_for_the_step_only_and_cpu_sdpa_cannot_ring():
    """torch keeps the ring's switches process-wide: ring_dispatch sets them for one step
    and puts them back, also when the step raises. On CPU the call does reach torch's ring
    dispatch and stops there: its CPU SDPA kernel has no context-parallel rule (torch
    2.13). If a later torch runs it, this test fails: then let CPU take the ring too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._attention import _cp_options, _RotateMethod

    from mgbench.planner.trace import fake_world

    flash = torch.ops.aten._scaled_dot_product_flash_attention.default
    handlers = lambda: DTensor._op_dispatcher._custom_op_handlers  # noqa: E731
    saved = (_cp_options.enable_load_balance, _cp_options.rotate_method)
    with fake_world(2):
        attend = ring_attention(init_device_mesh("cpu", (2,)))
        q = torch.randn(1, 4, 8, 16)
        kv = torch.randn(1, 2, 8, 16)  # grouped-query: 2 K/V heads for 4 query heads
        assert flash not in handlers()
        with ring_dispatch("alltoall"):
            assert flash in handlers()
            assert _cp_options.rotate_method == _RotateMethod.ALL_TO_ALL and _cp_options.enable_load_balance
        assert flash not in handlers() and (_cp_options.enable_load_balance, _cp_options.rotate_method) == saved
        with pytest.raises(NotImplementedError, match="_scaled_dot_product_flash_attention_for_cpu"):
            with ring_dispatch("allgather"):
                attend(q, kv, kv)
        assert flash not in handlers() and (_cp_options.enable_load_balance, _cp_options.rotate_method) == saved


def test_a_gpu_runs_ring_config_is_traced_on_cpu_in_the_allgather_form_and_says_so():
    """`predict --against` and `memory --trace` trace a run's configs on CPU: a ring config
    of a CUDA run would be refused there (no CPU kernel), so it is traced in the
    all-gather-KV form, with a note."""
    from mgbench.planner.trace import traced_config

    for asked, device in (("ring_alltoall", "cuda"), ("auto", "cuda")):
        traced, notes = traced_config(_cp(cp_attention=asked, device=device))
        assert (traced.cp_attention, traced.device) == ("allgather_kv", "cpu")
        assert any("all-gather-KV form" in n for n in notes)
    traced, notes = traced_config(_cp())  # CPU, auto: what the run itself ran
    assert traced.cp_attention == "auto" and notes == []
