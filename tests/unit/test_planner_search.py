import dataclasses

import numpy as np
import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.planner import cost, hardware, stack
from mgbench.layout import RECOMPUTE
from mgbench.planner.memory import memory_per_gpu
from mgbench.planner.search import PlanOptions, plan


@pytest.fixture(scope="module")
def plan70b():
    # The even split alone (3 s of 13 saved): these tests ask what holds of any ranked row;
    # test_plan_predict_agree.py covers the searched split, plan's default.
    return plan(catalog.model_shape("llama3-70b"), PlanOptions(tokens=1.5e13, deadline_days=90, top=50,
                                                                pp_split="even"))


def test_searches_over_a_million_layouts(plan70b):
    assert plan70b["num_candidates"] >= 1_000_000
    assert plan70b["num_feasible"] > 0


def test_no_ranked_layout_exceeds_device_memory(plan70b):
    shape = catalog.model_shape("llama3-70b")
    for r in plan70b["ranked"] + [plan70b["recommendation"]]:
        hw = hardware.resolve(system=r["system"])
        m = memory_per_gpu(shape, seq=4096, micro_batch=r["micro_batch"], num_micro=r["num_micro_batches"],
                           tp=r["tp"], pp=r["pp"], dp=r["dp"], zero=r["zero"], recompute=RECOMPUTE.index(r["recompute"]),
                           sp=r["tp"] > 1, schedule=r["schedule"] or "1f1b", virtual_stages=r["virtual_stages"] or 1,
                           **stack.memory_of(None))  # the default stack's memory
        assert float(m["total_bytes"]) == pytest.approx(r["memory_per_gpu_bytes"])
        assert r["memory_per_gpu_bytes"] <= hw.memory_bytes
        assert r["tp"] * r["pp"] * r["dp"] == r["num_gpus"]


def test_cost_is_gpu_hours_times_price_exactly(plan70b):
    prices = cost.Prices()
    for r in plan70b["ranked"]:
        price, _ = prices.lookup(r["system"], r["gpu"])
        if price is None:
            assert r["cost_usd"] is None
        else:
            assert r["cost_usd"] == r["gpu_hours"] * price
            assert r["gpu_hours"] == pytest.approx(r["num_gpus"] * r["days"] * 24)
            assert r["usd_per_million_tokens"] == pytest.approx(r["cost_usd"] / 1.5e7)


def test_constraints_and_ranking(plan70b):
    assert all(r["days"] <= 90 for r in plan70b["ranked"])
    costs = [r["cost_usd"] for r in plan70b["ranked"] if r["cost_usd"] is not None]
    assert costs == sorted(costs)
    assert plan70b["recommendation"] == plan70b["ranked"][0]
    front = plan70b["pareto"]
    for a in front:
        assert not any(b["days"] <= a["days"] and b["cost_usd"] < a["cost_usd"] for b in plan70b["ranked"]
                       if b["cost_usd"] is not None and b is not a)


def test_price_override_and_budget():
    shape = catalog.model_shape("llama3-8b")
    opts = PlanOptions(tokens=1e12, systems=["h100-pcie-8"], max_gpus=256)
    none = plan(shape, opts)  # no sourced H100 PCIe price in prices.toml
    assert none["ranked"][0]["cost_usd"] is None and "pass --price" in none["prices"]["h100-pcie-8"]
    priced = plan(shape, opts, cost.Prices(overrides=["h100-pcie=2"]))
    r = priced["recommendation"]
    assert r["cost_usd"] == r["gpu_hours"] * 2.0
    tight = plan(shape, PlanOptions(tokens=1e12, systems=["h100-pcie-8"], max_gpus=256, budget_usd=1.0),
                 cost.Prices(overrides=["h100-pcie=2"]))
    assert tight["recommendation"] is None and "no layout meets" in tight["reasons"][0]
    # The catalog's B200 price is used unless overridden.
    b200 = plan(shape, PlanOptions(tokens=1e12, systems=["dgx-b200"], max_gpus=256))["recommendation"]
    assert b200["cost_usd"] == b200["gpu_hours"] * 5.25


def test_goodput_by_hand():
    # 1024 GPUs, 2e-5 failures/GPU-h -> 0.02048/h; lose 30 min + 15 min each; 1 min of 60 writing.
    g = cost.goodput(1024, 8, 60.0, 2e-5, 15.0, 1.0, False, 0.0)
    assert float(g) == pytest.approx((1 - 1 / 60) / (1 + 0.02048 * 0.75))
    spot = cost.goodput(1024, 8, 60.0, 2e-5, 15.0, 1.0, True, 0.01)
    assert float(spot) == pytest.approx((1 - 1 / 60) / (1 + (0.02048 + 1.28) * 0.75))


def test_llama3_failure_rate_default():
    assert cost.FAILURE_RATE_PER_GPU_HOUR == pytest.approx(1.97e-5, rel=0.01)


def test_prices_file_and_bad_overrides(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[on_demand.l40s]\nusd = 0.9\nsource = "my quote"\n')
    p = cost.Prices(str(f))
    assert p.lookup("l40s-8", "l40s") == (0.9, "my quote")
    with pytest.raises(MgbenchError, match="NAME=USD"):
        cost.Prices(overrides=["h100-sxm=cheap"])
    f.write_text("[on_demand.l40s]\nprice = 1\n")
    with pytest.raises(MgbenchError, match="needs usd"):
        cost.Prices(str(f))


def test_unknown_system_is_a_clear_error():
    with pytest.raises(MgbenchError, match="unknown system 'dgx-h1000'"):
        plan(catalog.model_shape("llama3-8b"), PlanOptions(tokens=1e12, systems=["dgx-h1000"]))


def test_every_planoptions_field_documents_its_option():
    # mgbench/cli_options.py turns each field into a `plan` option; its help lives here.
    for f in dataclasses.fields(PlanOptions):
        assert f.metadata.get("help") or f.metadata.get("set_by"), f"PlanOptions.{f.name}: no help in metadata"
    defaults = PlanOptions(tokens=1.0)
    assert (defaults.restart_minutes, defaults.checkpoint_write_minutes, defaults.preemption_rate) == (
        cost.RESTART_MINUTES, cost.CHECKPOINT_WRITE_MINUTES, cost.SPOT_PREEMPTIONS_PER_NODE_HOUR)


# --- plan --hardware PROFILE: the probed machine instead of catalog systems -------------

def _probed_plan(profile, **over):
    opts = PlanOptions(tokens=1e9, seq_len=1024, global_batch_tokens=8 * 1024, precision="fp32", **over)
    opts.profile = profile
    return plan(catalog.model_shape("gpt2-small"), opts)


def test_plan_on_a_cpu_profile_ranks_its_rank_counts_with_the_profiles_speeds():
    from mgbench.layout import Layout
    from mgbench.planner.predict import predict
    from mgbench.probe import profile as P
    from tests.unit.test_probe_profile import make_profile

    prof = make_profile(cores=2)
    res = _probed_plan(prof)
    assert {r["num_gpus"] for r in res["ranked"]} == {1, 2}  # up to the cores: more only time-share them
    assert all(r["system"] == "probed:box" and r["regime"] == "probed-unvalidated" for r in res["ranked"])
    assert res["assumptions"]["hardware_profile"] == "box" and res["assumptions"]["stack"] is None
    # The one-rank row is predict's answer for that layout on the profile's one-rank Hardware.
    one = next(r for r in res["ranked"] if r["num_gpus"] == 1)
    lay = Layout(num_gpus=1, micro_batch=one["micro_batch"], seq_len=1024, global_batch=8, precision="fp32",
                 recompute=one["recompute"])
    want = predict(catalog.model_shape("gpt2-small"), P.hardware(prof, "fp32", 1), lay)
    assert one["tokens_per_s"] == pytest.approx(want["tokens_per_s"])
    # Two CPU ranks on two cores: gloo shares the cores, so nothing overlaps (probe/profile.overlap).
    assert P.overlap(prof, 2, 1.0) == 0.0


def test_plan_on_a_profile_skips_rank_counts_it_cannot_price_and_says_why():
    from tests.unit.test_probe_profile import make_profile

    res = _probed_plan(make_profile(cores=2, comm=False))
    assert {r["num_gpus"] for r in res["ranked"]} == {1}
    assert any("2 rank(s) not considered" in line and "no collective fit" in line for line in res["reasons"])


def test_plan_on_a_profile_that_prices_nothing_is_refused():
    from tests.unit.test_probe_profile import make_profile

    # Probed at 2 threads only: one rank gets 2 threads (probed), two ranks 1 (not probed, no comm).
    prof = make_profile(cores=2, comm=False)
    prof["gemm"] = [g for g in prof["gemm"] if g["threads"] == 2]
    prof["gemm"][0]["dtype"] = "bfloat16"  # and not at the plan's precision either
    with pytest.raises(MgbenchError, match="cannot price any rank count"):
        _probed_plan(prof)


def test_stack_option_scales_every_candidate():
    shape = catalog.model_shape("llama3-8b")
    kw = dict(tokens=1e12, systems=["dgx-a100"], max_gpus=64)
    mega, tt = plan(shape, PlanOptions(**kw)), plan(shape, PlanOptions(**kw, stack="torchtitan"))
    assert tt["assumptions"]["stack"] == "torchtitan"
    assert tt["recommendation"]["days"] > mega["recommendation"]["days"]
    assert any("torchtitan" in line for line in tt["reasons"])  # the interval comes from its rows


def test_expert_parallel_degrees_up_to_256_for_a_256_expert_model():
    # DeepSeek-V3's 256 experts: every power of two up to 256 divides them; Mixtral's 8 stop
    # at 8. A dense model searches ep = 1 only.
    from mgbench import catalog
    from mgbench.planner.search import PlanOptions, extra_axes

    opts = PlanOptions(tokens=1e12)
    assert extra_axes(catalog.model_shape("deepseek-v3"), opts)[1] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert extra_axes(catalog.model_shape("mixtral-8x7b"), opts)[1] == [1, 2, 4, 8]
    assert extra_axes(catalog.model_shape("llama3-8b"), opts)[1] == [1]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_on_a_probed_machine_the_filter_and_the_lead_count_memory_alike(device):
    # plan --hardware prices memory as mgbench's runner holds it on that machine (fp32
    # states; a CUDA context on a GPU, none on a CPU). The filter had used the default
    # stack's bytes and, on a probed GPU, no CUDA context, while the lead's memory (what
    # plan prints and `predict` of its line gives) used the runner's: two totals for one
    # layout (found by a review).
    from tests.unit.test_probe_profile import _probed_h100, make_profile

    prof = _probed_h100(num_devices=8) if device == "cuda" else make_profile(cores=2)
    shape = catalog.model_shape("gpt2-small")
    out = plan(shape, PlanOptions(tokens=1e9, seq_len=1024, precision="fp32" if device == "cpu" else "bf16",
                                  profile=prof), cost.Prices(None, []))
    lead = out["recommendation"]
    assert out["lead_memory"]["total_bytes"] == pytest.approx(lead["memory_per_gpu_bytes"], rel=1e-9)
    assert (out["lead_memory"]["fixed_bytes"] > 0) == (device == "cuda")


def test_the_lead_memory_counts_the_moe_options_the_filter_counts():
    # The filter priced memory with the MoE options and the lead's memory without them: a
    # review found 241.7 GB against 264.6 GB for Qwen3-30B-A3B on B300 with moe_act recomputed.
    from mgbench.planner import moe

    opts = PlanOptions(tokens=1e10, systems=["dgx-b300"], max_gpus=16,
                       moe=moe.MoeOptions(recompute_modules=("moe_act",)))
    out = plan(catalog.model_shape("qwen3-30b-a3b"), opts, cost.Prices(None, []))
    assert out["lead_memory"]["total_bytes"] == pytest.approx(out["recommendation"]["memory_per_gpu_bytes"], rel=1e-9)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_predict_on_a_probed_machine_counts_the_cuda_context_as_plan_does(device, tmp_path):
    # predict --hardware had decided by whether the profile probed host ops (an older CPU
    # profile without them got a CUDA context); now by the profile's device, plan's rule
    # (probe/profile.py holds_cuda_context).
    import json as _json

    from click.testing import CliRunner

    from mgbench.cli import main
    from tests.unit.test_probe_profile import _probed_h100, make_profile

    prof = _probed_h100(num_devices=8) if device == "cuda" else make_profile(cores=2)
    if device == "cpu":
        prof.pop("host_ops", None)  # an older CPU profile, written before the host-op probes
    path = tmp_path / "p.json"
    path.write_text(_json.dumps(prof))
    r = CliRunner().invoke(main, ["predict", "--hardware", str(path), "--model", "gpt2-small", "--num-gpus", "1",
                                  "--micro-batch", "2", "--seq-len", "256", "--json"]
                           + (["--precision", "fp32"] if device == "cpu" else []))
    assert r.exit_code == 0, r.output
    assert (_json.loads(r.output)["memory"]["fixed_bytes"] > 0) == (device == "cuda")


def test_systems_share_the_layout_rules_verdicts_and_get_the_same_answer(monkeypatch):
    # A plan computes the kept layouts once for every system with as many GPUs a node
    # (search.kept_layouts); each system's candidates must be what it gets alone.
    from mgbench.planner import search

    shape = catalog.model_shape("llama3-8b")
    opts = PlanOptions(tokens=1e12, max_gpus=64)
    prices = cost.Prices()
    calls = []
    real = search.kept_layouts
    monkeypatch.setattr(search, "kept_layouts", lambda *a: calls.append(a[3]) or real(*a))
    shared: dict = {}
    systems = ("dgx-h100", "dgx-b200", "gb200-nvl72")  # 8, 8 and 72 GPUs a node (an NVL72 rack)
    for system in systems:
        together, n1 = search.evaluate_system(shape, system, opts, prices, shared)
        alone, n2 = search.evaluate_system(shape, system, opts, prices)
        assert n1 == n2
        for k, v in alone.items():
            if k != "_meta":
                assert np.array_equal(together[k], v, equal_nan=True), (system, k)
    # Once for the two 8-GPU systems and once for the rack when shared; once a call alone.
    assert calls.count(8) == 1 + 2 and calls.count(72) == 1 + 1
    assert len(shared) == 2
    # The shared columns are read-only: a system cannot change another's.
    kept = next(iter(shared.values()))
    with pytest.raises(ValueError):
        kept["rows"][0][0] = 0
    with pytest.raises(ValueError):
        kept["picked"][0][0][0][:1] = 0


def test_a_long_search_says_how_far_it_is(monkeypatch):
    from mgbench.planner import search

    said: list[str] = []
    three = PlanOptions(tokens=1e12, systems=["dgx-h100", "dgx-b200", "hgx-h200"], max_gpus=64)
    monkeypatch.setattr(search, "PROGRESS_EVERY_S", 0.0)
    plan(catalog.model_shape("llama3-8b"), three, progress=said.append)
    assert [s.split(" (")[0] for s in said] == ["plan: 1 of 3 systems searched", "plan: 2 of 3 systems searched"]
    assert all(s.endswith(" s)") and "layouts" in s for s in said)
    # A search shorter than the interval says nothing.
    monkeypatch.setattr(search, "PROGRESS_EVERY_S", 1e9)
    said.clear()
    plan(catalog.model_shape("llama3-8b"), three, progress=said.append)
    assert said == []


def test_plan_json_stays_parseable_when_stderr_is_not_a_terminal(monkeypatch):
    # The CLI tells progress to a terminal only: a runner that reads both streams as one
    # (click's CliRunner here; a pipe in a script) gets the JSON alone.
    import json

    from click.testing import CliRunner

    from mgbench.cli import main
    from mgbench.planner import search

    monkeypatch.setattr(search, "PROGRESS_EVERY_S", 0.0)
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "dgx-h100,dgx-b200",
                                  "--max-gpus", "64", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["recommendation"] is not None


@pytest.mark.parametrize("model, offload", [("qwen3-30b-a3b", True), ("mixtral-8x7b", False), ("llama3-8b", True)])
def test_kept_layouts_are_every_rule_on_the_whole_grid(model, offload):
    # kept_layouts runs the layout rules on the rows kept at their loosest ep and offload
    # (layout_rules.LOOSEST); each group it picks must be what every rule keeps over the
    # whole grid at that group's ep and offload, less the rows where the ZeRO stage cannot
    # differ or the schedule changes nothing (as the search has always dropped them).
    from mgbench.planner import layout_rules, search

    shape = catalog.model_shape(model)
    opts = PlanOptions(tokens=1e12, max_gpus=64, offload=offload)
    counts = search.gpu_counts(8, opts.max_gpus)
    kept = search.kept_layouts(shape, opts, counts, 8)
    N, T, P, Z, MB, RC = kept["rows"]
    checked = 0
    for j, (variant, picked) in enumerate(zip(kept["variants"], kept["picked"])):
        piped = np.ones(N.shape, dtype=bool) if j == 0 else P > 1
        for idx, cp, ep, off in picked:
            differ = piped & ((N // np.maximum(T * P * cp, 1) * cp > 1) | (Z == 0))
            whole = layout_rules.keeps_all(layout_rules.rules(shape, search.candidates(
                opts, opts.sequences, schedule=variant, num_gpus=N, tp=T, pp=P, cp=cp, ep=ep, zero=Z,
                micro_batch=MB, recompute=RC, offload=off)))
            assert np.array_equal(idx, np.flatnonzero(whole & differ)), (variant, cp, ep, off)
            checked += idx.size
    assert checked > 0
