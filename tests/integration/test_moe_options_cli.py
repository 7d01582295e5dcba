"""`--moe-*` options of predict, plan and memory (planner/moe.py MoeOptions): they reach
the step and memory models, and a bad value is one line with exit status 2. In process
(click's runner): the planner commands start no ranks."""

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from mgbench.cli import main


@pytest.fixture
def cli():
    def _run(*args: str) -> SimpleNamespace:
        r = CliRunner().invoke(main, list(args))
        return SimpleNamespace(returncode=r.exit_code, stdout=r.stdout, stderr=r.stderr)

    return _run

B200_QWEN = ("--model", "qwen3-30b-a3b", "--system", "dgx-b200", "--num-gpus", "8", "--ep", "8", "--micro-batch", "1",
             "--global-batch", "512", "--zero", "1", "--precision", "fp8", "--fp8-recipe", "mxfp8", "--moe-imbalance", "1")


def _json(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_predict_takes_the_moe_options(cli):
    eager = _json(cli("predict", *B200_QWEN, "--json"))
    graphed = _json(cli("predict", *B200_QWEN, "--moe-cuda-graphs", "--json"))
    # The published Megatron-Bridge 25.11 row of this layout is 9,299 tokens/s per GPU;
    # the eager prediction is its validation row's (moe_validation: 8,637, -7.1% on
    # 2026-11-27; 6,618 once the tenth session re-solved the host constants; 8,085 once the
    # thirteenth re-solved them after pricing gpt-oss's expert passes; 8,667 once the
    # twenty-first re-solved them on its search's fit rows; 8,053 once the twenty-second
    # re-solved them with the Llama 4 Maverick rows; 7,541 once the twenty-third re-solved them
    # on its search's rows; 7,711 once the twenty-fourth re-solved them after dgxc's GB200
    # DeepSeek-V3 rows stated their unfused attention), through the command line.
    from mgbench.planner import moe_validation as V
    row = next(r for r in V.runs() if r["id"] == "mbridge-25.11-b200-qwen3-30b-a3b-fp8")
    assert eager["tokens_per_s_per_gpu"] == pytest.approx(V.score(row)["predicted"], rel=1e-6)
    assert eager["tokens_per_s_per_gpu"] == pytest.approx(7711, rel=0.01)
    # 48 MoE layers x 64 micro-batches x (per layer + 16 x per local expert) ms of host time.
    from mgbench.planner.moe import host_constants
    c = host_constants()
    by_hand = 48 * 64 * (c["per_layer_ms"]["alltoall"] + 16 * c["per_local_expert_ms"]) * 1e-3
    assert eager["breakdown"]["moe_host_s"] == pytest.approx(by_hand, rel=1e-9)
    share = c["graphed_share"]  # what a graphed layer keeps of the eager term (stacks.toml)
    assert graphed["breakdown"]["moe_host_s"] == pytest.approx(share * by_hand, rel=1e-9)
    assert graphed["step_time_s"] == pytest.approx(eager["step_time_s"] - (1 - share) * by_hand)
    # The dispatcher and FP8 dispatch reach the all-to-all.
    deepep = _json(cli("predict", *B200_QWEN, "--moe-dispatcher", "deepep", "--moe-fp8-dispatch", "--json"))
    assert deepep["breakdown"]["ep_a2a_s"] < eager["breakdown"]["ep_a2a_s"]


def test_memory_takes_the_recompute_modules(cli):
    args = ("memory", "--model", "qwen3-30b-a3b", "--num-gpus", "8", "--ep", "8", "--micro-batch", "2", "--json")
    plain = _json(cli(*args))
    act = _json(cli(*args, "--moe-recompute-modules", "moe_act"))
    assert act["activations_bytes"] < plain["activations_bytes"]


def test_plan_takes_the_moe_options(cli):
    args = ("plan", "--model", "qwen3-30b-a3b", "--tokens", "1e11", "--systems", "dgx-b200", "--max-gpus", "16",
            "--precision", "fp8", "--json")
    eager = _json(cli(*args))
    graphed = _json(cli(*args, "--moe-cuda-graphs"))
    # A graphed layer keeps the stored share of the eager host term (at most all of it), so
    # no layout runs slower in graphs, and the fastest layout of each GPU count neither
    # (plan ranks one layout, its fastest, per GPU count); the interval is the graphed class's.
    best = {r["num_gpus"]: r["tokens_per_s"] for r in eager["ranked"]}
    in_graphs = {r["num_gpus"]: r["tokens_per_s"] for r in graphed["ranked"]}
    shared = set(best) & set(in_graphs)
    assert len(shared) >= 2
    assert all(in_graphs[n] >= best[n] * (1 - 1e-9) for n in shared)
    assert "in CUDA graphs" in graphed["recommendation"]["interval_reasons"][0]
    assert "eager" in eager["recommendation"]["interval_reasons"][0]


@pytest.mark.parametrize("bad,says", [
    (("--moe-imbalance", "0.5"), "imbalance"),
    (("--moe-recompute-modules", "attention"), "recompute modules"),
    (("--moe-dispatcher", "nccl"), "moe-dispatcher"),
    (("--moe-node-limit", "0"), "node_limit"),
    (("--moe-imbalance", "inf"), "finite"),
    (("--moe-capacity-factor", "inf"), "finite"),
    (("--moe-round-robin", "--moe-node-limit", "4"), "replaces the router"),
    (("--moe-round-robin", "--moe-imbalance", "1.3"), "exactly balanced"),
    (("--moe-backend", "uccl-ep"), "give --moe-dispatcher deepep"),
    (("--moe-dispatcher", "deepep", "--moe-backend", "pplx"), "moe-backend"),
])
def test_bad_moe_options_are_one_line_and_exit_2(cli, bad, says):
    p = cli("predict", *B200_QWEN, *bad)
    assert p.returncode == 2
    assert says in p.stderr and "Traceback" not in p.stderr


def test_moe_options_on_a_dense_model_are_said_to_be_ignored(cli):
    p = cli("predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--moe-cuda-graphs")
    assert p.returncode == 0 and "--moe-* options ignored: llama3-8b has no experts" in p.stdout
    plain = cli("predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8")
    assert "options ignored" not in plain.stdout

    planned = cli("plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "dgx-h100", "--max-gpus", "8",
                  "--moe-cuda-graphs")
    assert planned.returncode == 0 and "--moe-* options ignored: llama3-8b has no experts" in planned.stdout


def test_predict_names_the_published_ab_evidence_of_a_lever_it_is_given(cli):
    # A run that picks HybridEP (or graphs) is told how the published A/B pairs of that
    # option bore the model out (planner/moe_pairs.py); one on the defaults is not.
    from mgbench.planner import moe_pairs

    found = moe_pairs.pairs()
    s = moe_pairs.by_knob([p for p in found if "'hybridep'" in (p["from"], p["to"])])["moe.dispatcher"]
    notes = _json(cli("predict", *B200_QWEN, "--moe-dispatcher", "hybridep", "--json"))["notes"]
    line = next(n for n in notes if n.startswith("--moe-dispatcher: on the published A/B pairs"))
    assert s["text"] in line and "to or from hybridep" in line
    assert not any(n.startswith("--moe-cuda-graphs:") for n in notes)
    graphed = _json(cli("predict", *B200_QWEN, "--moe-cuda-graphs", "--json"))["notes"]
    g = moe_pairs.by_knob(found)["moe.cuda_graphs"]
    assert any(n.startswith("--moe-cuda-graphs:") and g["text"] in n for n in graphed)
    default = _json(cli("predict", *B200_QWEN, "--json"))["notes"]
    assert not any("published A/B pairs" in n for n in default)
    # a dense model gets none, whatever is set
    dense = _json(cli("predict", "--model", "llama3-8b", "--system", "dgx-b200", "--num-gpus", "8",
                      "--moe-dispatcher", "hybridep", "--json"))["notes"]
    assert not any("published A/B pairs" in n for n in dense)


def test_predict_says_how_the_all_to_all_price_did_against_nccl_tests(cli):
    # EP over NCCL's all-to-all (the default dispatcher) gets the line read from
    # published_collectives.toml; DeepEP / HybridEP (priced at the link rate DeepEP's own
    # figures reach) and a run without EP do not.
    from mgbench.planner import collective_validation as CV

    line = CV.a2a_record_note("alltoall", 8)
    notes = _json(cli("predict", *B200_QWEN, "--json"))["notes"]
    assert line in notes and "faster than 27 of the 33" in line
    hybrid = _json(cli("predict", *B200_QWEN, "--moe-dispatcher", "hybridep", "--json"))["notes"]
    assert not any("alltoall_perf" in n for n in hybrid)
    no_ep = list(B200_QWEN)
    no_ep[no_ep.index("--ep") + 1] = "1"
    assert not any("alltoall_perf" in n for n in _json(cli("predict", *no_ep, "--json"))["notes"])


def test_plan_says_how_its_leads_all_to_all_price_did(cli):
    # plan's reasons carry the same line when its lead's EP runs NCCL's all-to-all
    # (planner/search.py), and not when the run uses HybridEP.
    from mgbench.planner import collective_validation as CV

    args = ("plan", "--model", "qwen3-30b-a3b", "--tokens", "1e11", "--systems", "dgx-b200", "--max-gpus", "16",
            "--precision", "fp8", "--json")
    out = _json(cli(*args))
    lead_ep = out["recommendation"]["ep"]
    assert lead_ep > 1
    assert CV.a2a_record_note("alltoall", lead_ep) in out["reasons"]
    hybrid = _json(cli(*args, "--moe-dispatcher", "hybridep"))
    assert not any("alltoall_perf" in r for r in hybrid["reasons"])


def test_predict_prices_a_named_backend_across_efa_nodes_only(cli):
    # UCCL-EP over 4 p5 nodes: its bytes across nodes at its published kernels' share of the
    # network rate (planner/ep_kernels.py, below 1), so a slower step than DeepEP's own
    # kernels; the note names the backend. Inside one node nothing crosses: no change.
    run = ("--model", "qwen3-30b-a3b", "--system", "aws-p5", "--num-gpus", "32", "--ep", "32", "--micro-batch", "1",
           "--global-batch", "256", "--moe-dispatcher", "deepep", "--moe-imbalance", "1", "--json")
    deep = _json(cli("predict", *run))
    uccl = _json(cli("predict", *run, "--moe-backend", "uccl-ep"))
    assert uccl["step_time_s"] > deep["step_time_s"]
    assert any("deepep dispatcher (uccl-ep)" in n for n in uccl["notes"])
    assert any(n.startswith("--moe-backend uccl-ep: its bytes across EFA nodes priced at") for n in uccl["notes"])
    assert not any(n.startswith("--moe-backend") for n in deep["notes"])
    # DeepEP across EFA nodes without a backend: told its own kernels do not run there
    assert any(n.startswith("--moe-dispatcher deepep across AWS EFA nodes with no --moe-backend") for n in deep["notes"])
    assert not any("with no --moe-backend" in n for n in uccl["notes"])
    one = [a if a not in ("32",) else "8" for a in run]
    assert _json(cli("predict", *one, "--moe-backend", "uccl-ep"))["step_time_s"] == \
        pytest.approx(_json(cli("predict", *one))["step_time_s"])


def test_a_catalog_efa_system_given_another_gpu_keeps_its_fabric_in_the_notes(cli):
    # aws-p5 with H200s: priced with the backend's share, and its note says so (it once
    # read the label "aws-p5[h200]" as an unknown fabric); without a backend, told DeepEP's
    # kernels do not run over EFA.
    run = ("--model", "qwen3-30b-a3b", "--system", "aws-p5", "--gpu", "h200", "--num-gpus", "32", "--ep", "32",
           "--micro-batch", "1", "--global-batch", "256", "--moe-dispatcher", "deepep", "--moe-imbalance", "1", "--json")
    deep = _json(cli("predict", *run))
    uccl = _json(cli("predict", *run, "--moe-backend", "uccl-ep"))
    assert uccl["step_time_s"] > deep["step_time_s"]
    assert any(n.startswith("--moe-backend uccl-ep: its bytes across EFA nodes priced at") for n in uccl["notes"])
    assert any("with no --moe-backend" in n for n in deep["notes"])
