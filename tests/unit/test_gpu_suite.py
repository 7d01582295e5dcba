"""suites/gpu.toml on one GPU and on more (issue 15, "Also"): what runs where, and the
one-GPU time estimate the suite states, recomputed from the planner's step times."""

from collections import Counter

import pytest

from mgbench import catalog
from mgbench import suite as S
from mgbench.planner import hardware
from mgbench.layout import Layout
from mgbench.planner.predict import predict

# The estimate's assumptions, as the suite's comment states them.
EAGER_FACTOR = 2.0  # eager PyTorch against the planner's tuned-kernel step time
COMPILE_S = 30.0  # torch.compile of a config's blocks
MIN_ENERGY_WINDOW_S = 5.0  # the energy window is held to at least this
STARTUP_S = 60.0  # torchrun, process warm-up, NCCL init


def one_gpu():
    return S.expand(S.load_suite("gpu", "cuda"), "cuda", 1)


def test_one_gpu_runs_the_single_grid_and_each_wrapper_once_per_model():
    """Before: 72 configs on one GPU, 48 of them ddp/fsdp at one rank re-measuring single."""
    configs = one_gpu()
    assert len(configs) == 30 and all(c.skip_reason is None for c in configs)
    by = Counter((c.strategy, c.nproc) for c in configs)
    assert by == {("single", 1): 24, ("ddp", 1): 3, ("fsdp", 1): 3}
    wrappers = [c for c in configs if c.strategy != "single"]
    assert {(c.micro_batch, c.activation_checkpointing, c.compile) for c in wrappers} == {(8, "none", False)}
    assert {c.model_name for c in wrappers} == {"gpt2-small", "gpt2-medium", "llama-1b"}


def test_more_gpus_give_ddp_and_fsdp_the_whole_grid():
    configs = S.expand(S.load_suite("gpu", "cuda"), "cuda", 8)
    by = Counter((c.strategy, c.nproc) for c in configs)
    for strategy in ("ddp", "fsdp"):
        assert {n: by[(strategy, n)] for n in (1, 2, 4, 8)} == {1: 3, 2: 24, 4: 24, 8: 24}
    assert len({c.config_id for c in configs}) == len(configs)


@pytest.mark.parametrize("devices,expected", [(1, []), (2, [2]), (6, [2, 4]), (8, [2, 4, 8])])
def test_pow2_from_2_starts_at_two_ranks(devices, expected):
    text = 'name = "t"\n[sweep]\nstrategy = "ddp"\nnproc = "pow2>=2"\n'
    assert sorted(c.nproc for c in S.expand(S.parse_suite(text, "t"), "cuda", devices)) == expected


def estimate_s(configs) -> float:
    """Seconds the configs take on one H100 SXM, by the suite comment's arithmetic."""
    hw = hardware.resolve(gpu="h100-sxm", precision="bf16")
    total, refs = STARTUP_S, set()
    for c in configs:
        # every_2nd recomputes half the blocks; "full" (all of them) bounds it from above
        layout = Layout(micro_batch=c.micro_batch, seq_len=c.seq_len, precision=c.precision,
                        recompute="none" if c.activation_checkpointing == "none" else "full")
        step = EAGER_FACTOR * predict(c.shape, hw, layout)["step_time_s"]
        build = 2.0 + 5.0 * c.shape.num_params() / 1e9
        total += build + c.warmup_steps * step + max(MIN_ENERGY_WINDOW_S, c.measured_steps * step)
        total += COMPILE_S if c.compile else 0.0
        key = (c.model_name, c.micro_batch)
        if key not in refs:  # one single-process reference per workload
            refs.add(key)
            total += build + c.check_steps * step
    return total


def test_one_gpu_sweep_is_estimated_under_20_minutes():
    minutes = estimate_s(one_gpu()) / 60
    # The suite's description says "about 15 minutes"; the budget is 20.
    assert 12 < minutes < 18, minutes
    assert "about 15" in S.load_suite("gpu", "cuda").description
    assert catalog.match_accelerator("NVIDIA H100 80GB HBM3") == "h100-sxm"
