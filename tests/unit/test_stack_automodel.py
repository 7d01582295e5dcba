"""The NeMo AutoModel stack (stacks.toml [stacks.automodel]): Transformer Engine's fused
attention (cuDNN's curve on Hopper, where torchtitan's SDPA takes FlashAttention-2's),
torchtitan's efficiency carried with its reason, and a carried efficiency that cannot
stand (an unknown or circular source, no reason) refused."""

from __future__ import annotations

import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.planner import perf, stack
from mgbench.planner.resolve import resolve


def test_automodel_prices_transformer_engines_attention_at_torchtitans_efficiency():
    assert stack.efficiency("automodel") == stack.efficiency("torchtitan") == pytest.approx(0.894)
    auto = resolve(precision="bf16", system="dgx-h100", stack="automodel")
    titan = resolve(precision="bf16", system="dgx-h100", stack="torchtitan")
    # efficiency.toml [attention_curves] at 4,096: cuDNN 0.444, FlashAttention-2 0.254
    assert perf.attention_fraction(auto, 4096) == pytest.approx(0.444)
    assert perf.attention_fraction(titan, 4096) == pytest.approx(0.254)
    mem = stack.memory_of("automodel")
    # its configs' bf16 parameters and Adam moments, torch's cross-entropy over bf16 logits
    # (the flash_ce bytes), separate TE modules whose saved tensors are autograd's, and no
    # Megatron-Core gpt-oss epilogue (AutoModel compiles the clamp)
    assert mem["state_bytes"] == (2.0, 2.0, 4.0) and mem["loss"] == "flash_ce"
    assert mem["te_saved_inputs"] is False and mem["expert_epilogue"] is False
    assert stack.efficiency_stack("automodel") == "torchtitan" and stack.efficiency_stack("megatron-lm") == "megatron-lm"


def test_a_carried_efficiency_that_cannot_stand_is_refused(monkeypatch):
    real = catalog.load("stacks.toml")

    def with_stacks(**entries):
        table = {**real, "stacks": {**real["stacks"], **entries}}
        monkeypatch.setattr(catalog, "load", lambda name: table if name == "stacks.toml" else real_load(name))

    real_load = catalog.load
    with_stacks(a={"efficiency_from": "nowhere", "efficiency_reason": "x"})
    with pytest.raises(MgbenchError, match="efficiency_from 'nowhere'"):
        stack.efficiency("a")
    with_stacks(a={"efficiency_from": "b", "efficiency_reason": "x"}, b={"efficiency_from": "a", "efficiency_reason": "x"})
    with pytest.raises(MgbenchError, match="carried in a circle"):
        stack.efficiency("a")
    with_stacks(a={"efficiency_from": "torchtitan"})
    with pytest.raises(MgbenchError, match="without its efficiency_reason"):
        stack.efficiency("a")


def test_predict_takes_the_stack(cli):
    out = cli("predict", "--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--num-gpus", "8", "--ep", "8",
              "--zero", "3", "--stack", "automodel")
    assert out.returncode == 0, out.stderr
    assert "stack          automodel (efficiency 0.894" in out.stdout
    # the carried factor is said, not hidden behind the number; a stack measured on its own
    # runs says nothing
    assert "note: --stack automodel: efficiency carried from torchtitan: no published dense AutoModel run" in out.stdout
    assert stack.carried_note("torchtitan") is None and stack.carried_note("megatron-lm") is None


def test_its_dense_interval_is_the_stack_its_efficiency_comes_froms():
    # no published dense AutoModel run: the interval is torchtitan's (whose factor it
    # carries), not megatron-lm's narrower one, and says so
    from mgbench.planner import uncertainty as U

    auto = U.regime("a100-sxm-80gb", False, stack="automodel")
    titan = U.regime("a100-sxm-80gb", False, stack="torchtitan")
    mega = U.regime("a100-sxm-80gb", False, stack="megatron-lm")
    assert (auto["low"], auto["high"]) == (titan["low"], titan["high"]) != (mega["low"], mega["high"])
    assert "whose efficiency automodel carries" in auto["reasons"][0]
