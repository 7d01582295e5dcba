"""The layout `plan` recommends, given to `predict`, gives the same step time, memory and
MFU (issue 26, item 4): both go through one hardware resolution, one layout validity
check and one step model, so a row of plan's table is a prediction predict makes too."""

import pytest

from mgbench import catalog
from mgbench.planner.cost import Prices
from mgbench.layout import Layout
from mgbench.planner.predict import predict
from mgbench.planner.resolve import resolve
from mgbench.planner.moe import MoeOptions
from mgbench.planner.search import PlanOptions, plan

CASES = [
    ("llama3-8b", dict(tokens=1e11, systems=["dgx-h100"], max_gpus=64)),
    ("llama3-70b", dict(tokens=1e12, systems=["dgx-a100", "dgx-h100"], max_gpus=256, seq_len=8192)),
    ("mixtral-8x7b", dict(tokens=1e11, systems=["dgx-h100"], max_gpus=128)),
    ("qwen3-30b-a3b", dict(tokens=1e11, systems=["dgx-h100"], max_gpus=64, stack="torchtitan")),
    ("gpt-oss-120b", dict(tokens=1e11, systems=["hgx-h200"], max_gpus=128)),
    ("llama3-8b", dict(tokens=1e11, systems=["dgx-h100"], max_gpus=64, seq_len=32768)),  # context parallelism
    ("llama3-70b", dict(tokens=1e12, systems=["dgx-h100"], max_gpus=256, schedule="interleaved", virtual_stages=2)),
    # MoE options given to both (--moe-*): DeepEP-style dispatch to at most 2 nodes, FP8
    # dispatch, a balanced router, the MoE modules' activations recomputed, CUDA graphs.
    ("qwen3-30b-a3b", dict(tokens=1e11, systems=["dgx-b200"], max_gpus=64, precision="fp8",
                           moe=MoeOptions(imbalance=1.0, dispatcher="deepep", node_limit=2, fp8_dispatch=True,
                                          recompute_modules=("moe_act",), cuda_graphs=True))),
    ("deepseek-v3", dict(tokens=1e12, systems=["hgx-h800"], max_gpus=1024, precision="fp8",
                         moe=MoeOptions(dispatcher="deepep", node_limit=4, a2a_overlap=True))),
    # an FP8 recipe given (--fp8-recipe), with the MoE layers recomputed: their casts again
    ("qwen3-30b-a3b", dict(tokens=1e11, systems=["dgx-h100"], max_gpus=64, precision="fp8", fp8_recipe="tensorwise",
                           moe=MoeOptions(recompute_modules=("moe",)))),
]


@pytest.mark.parametrize("model,kw", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_every_ranked_layout_is_predicted_the_same_by_predict(model, kw):
    shape = catalog.model_shape(model)
    opts = PlanOptions(**kw)
    res = plan(shape, opts, Prices(None, []))
    assert res["ranked"], res["reasons"]
    for r in res["ranked"]:
        lay = Layout(num_gpus=r["num_gpus"], tp=r["tp"], pp=r["pp"], cp=r["cp"], ep=r["ep"], zero=r["zero"],
                     micro_batch=r["micro_batch"], seq_len=opts.seq_len,
                     global_batch=r["micro_batch"] * r["dp"] * r["num_micro_batches"], precision=opts.precision,
                     recompute=r["recompute"], sequence_parallel=r["tp"] > 1, schedule=r["schedule"] or "1f1b",
                     virtual_stages=r["virtual_stages"] or 1, offload=r["offload"],
                     pp_last_layers=r["pp_last_layers"], fp8_recipe=opts.fp8_recipe)
        hw = resolve(precision=opts.precision, system=r["system"],
                     stack=None if opts.stack == "megatron-lm" else opts.stack)
        p = predict(shape, hw, lay, overlap=opts.overlap, moe=opts.moe)
        tokens = lay.batch * opts.seq_len
        assert tokens / p["step_time_s"] == pytest.approx(r["tokens_per_s_point"], rel=1e-9), r
        assert p["memory"]["total_bytes"] == pytest.approx(r["memory_per_gpu_bytes"], rel=1e-9), r
        assert p["mfu"] == pytest.approx(r["mfu_point"], rel=1e-9), r
        assert p["fits"]


def _searched_against_fixed(searched_kw: dict, fixed_kw: dict, model: str = "llama3-70b",
                            max_gpus: int = 256) -> tuple[dict, dict, dict]:
    """Two plans of ``model`` on up to ``max_gpus`` H100s, one searching a choice and one
    with it fixed; asserts the searched one's best at every GPU count is at least the fixed
    one's. Returns both plans and the fixed one's best tokens/s by GPU count."""
    shape = catalog.model_shape(model)
    kw = dict(tokens=1e12, systems=["dgx-h100"], max_gpus=max_gpus, top=100)
    searched = plan(shape, PlanOptions(**kw, **searched_kw), Prices(None, []))
    fixed = plan(shape, PlanOptions(**kw, **fixed_kw), Prices(None, []))
    best = {r["num_gpus"]: r["tokens_per_s"] for r in fixed["ranked"]}
    for r in searched["ranked"]:
        if r["num_gpus"] in best:
            assert r["tokens_per_s"] >= best[r["num_gpus"]] * (1 - 1e-12), r
    return searched, fixed, best


def test_plan_searches_interleaved_schedules_and_only_gains_by_it():
    # --schedule searched (the default) prices each pipelined layout under 1F1B and under
    # interleaved 1F1B with 2 and 4 virtual stages: at every GPU count its best is at least
    # the 1F1B-only plan's, and somewhere an interleaved schedule wins (its bubble is smaller).
    # llama3-405b on up to 512: a model that needs pipelines (llama3-70b on 256 leads with
    # tp 2 and ZeRO-3 since cross-node collectives are priced as NCCL runs them).
    searched, fixed, _ = _searched_against_fixed({}, {"schedule": "1f1b"}, "llama3-405b", 512)
    assert all(r["schedule"] == "1f1b" for r in fixed["ranked"] if r["pp"] > 1)
    assert any(r["schedule"] == "interleaved" and r["virtual_stages"] in (2, 4) for r in searched["ranked"])


def test_plan_lightens_the_last_stage_and_only_gains_by_it():
    # --pp-split searched (the default) prices each pipelined layout evenly split and with a
    # last stage lightened to make room for the output layer (perf.balanced_last_layers):
    # at every GPU count its best is at least the even plan's, somewhere the lighter last
    # stage wins, and the rows say its blocks (an even plan's rows none).
    balanced, even, best = _searched_against_fixed({"schedule": "1f1b"}, {"schedule": "1f1b", "pp_split": "even"})
    lighter = [r for r in balanced["ranked"] if r["pp_last_layers"] is not None]
    assert lighter and all(r["pp"] > 1 and r["pp_last_layers"] < -(-80 // r["pp"]) for r in lighter)
    assert any(r["tokens_per_s"] > best.get(r["num_gpus"], 0) * 1.001 for r in lighter)
    assert all(r["pp_last_layers"] is None for r in even["ranked"])


def test_the_recommendation_says_how_to_set_a_lighter_last_stage():
    # llama3-70b on up to 96 H100s: the lead is a 12-stage pipeline whose last stage holds
    # fewer blocks; the reasons say how many and how to ask a stack for it.
    res = plan(catalog.model_shape("llama3-70b"), PlanOptions(tokens=1e12, systems=["dgx-h100"], max_gpus=96),
               Prices(None, []))
    lead = res["recommendation"]
    k = lead["pp_last_layers"]
    assert lead["pp"] > 1 and k is not None
    assert any(f"last={k}: give the last pipeline stage {k} blocks" in x and
               f"--decoder-last-pipeline-num-layers {k}" in x for x in res["reasons"])


def test_a_v_shaped_schedule_lightens_rank_0_which_runs_the_output_layer():
    # In ZB-V's and DualPipeV's V rank 0 holds the first chunk and the last, with the output
    # layer: the balanced split lightens it as it does a loop's last stage, the step is
    # priced alike (the head paces the pipeline only by what the missing blocks do not
    # cover), and the reason names rank 0, not Megatron-LM's loop flags.
    from mgbench.planner.search import last_stage_reason

    shape = catalog.model_shape("llama3-70b")
    res = plan(shape, PlanOptions(tokens=1e12, systems=["dgx-h100"], max_gpus=128, schedule="zbv", top=100),
               Prices(None, []))
    lighter = [r for r in res["ranked"] if r["pp"] > 1 and r["pp_last_layers"] is not None]
    assert lighter
    r = lighter[0]
    assert "give rank 0" in last_stage_reason(shape, r) and "--decoder-last" not in last_stage_reason(shape, r)
    assert "divide between its chunks is not priced" in last_stage_reason(shape, r)
    # The same layout priced by predict with and without the lighter rank 0: lighter is faster.
    import dataclasses

    from mgbench.planner.predict import predict
    from mgbench.planner.resolve import resolve
    from mgbench.planner.search import layout_of_row

    opts = PlanOptions(tokens=1e12, systems=["dgx-h100"], max_gpus=128, schedule="zbv")
    lay = layout_of_row(r, opts)
    hw = resolve(precision=lay.precision, system="dgx-h100")
    light, even = (predict(shape, hw, x)["tokens_per_s_per_gpu"]
                   for x in (lay, dataclasses.replace(lay, pp_last_layers=None)))
    assert lay.pp_last_layers == r["pp_last_layers"] and light > even


def test_the_reason_names_the_megatron_setting_that_takes_the_split():
    from mgbench.planner.search import last_stage_reason

    shape = catalog.model_shape("llama3-70b")  # 80 blocks
    # 8 stages, 4 on the last: 76 does not split over 7, so a layout string is named; 3 on
    # the last: 77 over 7 does, so Megatron-LM's flag.
    assert "--pipeline-model-parallel-layout" in last_stage_reason(shape, {"pp_last_layers": 4, "pp": 8})
    assert "Megatron-LM --decoder-last-pipeline-num-layers 3;" in last_stage_reason(shape, {"pp_last_layers": 3, "pp": 8})
    # Interleaved over 2 chunks, 10 stages: 8 on the last and 8 on each other split over the
    # chunks; 3 on the last of 8 (11 elsewhere) do not.
    assert "--decoder-last-pipeline-num-layers 8;" in last_stage_reason(
        shape, {"pp_last_layers": 8, "pp": 10, "virtual_stages": 2})
    assert "--pipeline-model-parallel-layout" in last_stage_reason(
        shape, {"pp_last_layers": 3, "pp": 8, "virtual_stages": 2})
