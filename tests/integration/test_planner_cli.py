import json

import pytest


def test_memory_zero_paper_example_through_the_cli(cli):
    got = []
    for z in range(4):
        p = cli("memory", "--params", "7.5e9", "--num-gpus", "64", "--zero", str(z), "--stack", "deepspeed", "--json")
        assert p.returncode == 0, p.stderr
        got.append(json.loads(p.stdout)["model_states_bytes"] / 1e9)
    assert [round(x, 1) for x in got] == [120.0, 31.4, 16.6, 1.9]


def test_predict_json_interface(cli):
    p = cli("predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--zero", "3",
            "--seq-len", "4096", "--recompute", "every_2nd", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
              "mfu", "memory", "fits", "breakdown"):
        assert k in out
    for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes", "activations_bytes", "total_bytes"):
        assert k in out["memory"]
    for k in ("compute_s", "exposed_comm_s", "bubble_s"):
        assert k in out["breakdown"]


def test_plan_json_interface(cli):
    p = cli("plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "dgx-a100,dgx-h100", "--max-gpus", "256",
            "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for k in ("num_candidates", "elapsed_s", "recommendation", "ranked"):
        assert k in out
    for k in ("system", "gpu", "num_gpus", "tp", "pp", "dp", "zero", "micro_batch", "recompute", "tokens_per_s", "days",
              "gpu_hours", "cost_usd", "usd_per_million_tokens", "energy_kwh", "memory_per_gpu_bytes"):
        assert k in out["ranked"][0]


def test_plan_cost_options_change_the_answer(cli):
    base = ["plan", "--model", "llama3-8b", "--tokens", "1e12", "--systems", "dgx-h100", "--max-gpus", "64", "--json"]

    def plan(*extra):
        p = cli(*base, *extra)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    a, pue = plan(), plan("--pue", "2.4")
    # PUE does not move the ranking (cost and days), only the energy: twice the PUE, twice the kWh.
    assert [r["num_gpus"] for r in pue["ranked"]] == [r["num_gpus"] for r in a["ranked"]]
    for r, q in zip(a["ranked"], pue["ranked"]):
        assert q["energy_kwh"] == pytest.approx(2 * r["energy_kwh"])
    slow = plan("--restart-minutes", "600", "--checkpoint-write-minutes", "10", "--overlap", "0.5")
    assert slow["assumptions"]["overlap"] == 0.5 and slow["assumptions"]["restart_minutes"] == 600
    assert max(r["goodput"] for r in slow["ranked"]) < min(r["goodput"] for r in a["ranked"])
    assert len(a["ranked"]) <= 20  # --top's default is PlanOptions', as in `report --plan-model`


@pytest.mark.parametrize(
    "args,expected",
    [
        (["memory", "--model", "llama3-8b", "--params", "1e9"], "give exactly one of"),
        (["memory", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "3"], "= 3 does not divide the 8 GPUs"),
        (["memory", "--model", "llama3-8b", "--num-gpus", "6", "--tp", "3"], "tp=3 does not divide the 32 attention heads"),
        (["memory", "--model", "tiny", "--num-gpus", "4", "--pp", "4"], "pp=4 x 1 virtual stage(s) exceeds the 2 layers"),
        (["predict", "--model", "llama3-8b", "--system", "nope"], "unknown system 'nope'"),
        (["predict", "--params", "1e9", "--system", "dgx-h100"], "needs the model's shape"),
        (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--price", "h100-sxm=x"], "expected NAME=USD"),
        (["plan", "--model", "gpt5", "--tokens", "1e12"], "unknown model preset 'gpt5'"),
        (["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--pp", "2", "--schedule",
          "interleaved"], "--schedule interleaved runs 2 or more model chunks"),
        (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--virtual-stages", "4"],
         "--virtual-stages 4 applies to a named --schedule"),
        (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--schedule", "interleaved"],
         "give --virtual-stages 2 or more"),
        (["plan", "--model", "llama3-8b", "--tokens", "1e12", "--schedule", "1f1b", "--virtual-stages", "4"],
         "--schedule 1f1b holds a fixed number of chunks"),
        (["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--pp-last-layers", "1"],
         "--pp-last-layers 1 needs a pipeline"),
        (["memory", "--params", "7e9", "--num-gpus", "8", "--pp", "2", "--pp-last-layers", "999"],
         "--pp-last-layers 999 needs the model's layers"),
        (["memory", "--model", "llama3-8b", "--num-gpus", "8", "--pp", "4", "--pp-last-layers", "9"],
         "the last of 4 stages may hold 0 to 8 of the 32 layers"),
        (["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--pp", "4", "--global-batch",
          "16", "--schedule", "zbv", "--pp-last-layers", "9"],
         "the last of 4 stages (in the V, rank 0, which runs the output layer) may hold 0 to 8"),
        (["memory", "--model", "llama3-8b", "--num-gpus", "8", "--pp", "4", "--pp-last-layers", "2", "--trace"],
         "--pp-last-layers 2 is priced without --trace"),
        (["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--fp8-recipe", "mxfp8"],
         "--fp8-recipe mxfp8 applies to --precision fp8"),
        (["plan", "--model", "llama3-8b", "--tokens", "1e11", "--systems", "dgx-h100", "--fp8-recipe", "delayed"],
         "--fp8-recipe delayed applies to --precision fp8"),
        (["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--num-gpus", "8", "--precision", "fp8",
          "--fp8-recipe", "mxfp8"], "and h100-sxm has none; give one of delayed, tensorwise, rowwise, blockwise"),
    ],
)
def test_planner_bad_input(cli, args, expected):
    p = cli(*args)
    assert p.returncode == 2 and expected in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("cmd", ["memory", "predict", "plan"])
def test_planner_help_has_examples(cli, cmd):
    p = cli(cmd, "--help")
    assert p.returncode == 0 and "Example" in p.stdout


def test_memory_and_plan_take_a_hardware_profile(cli, tmp_path):
    from tests.unit.test_probe_profile import make_profile

    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(make_profile(host_memory_bytes=4e9)))
    p = cli("memory", "--model", "gpt2-small", "--micro-batch", "8", "--seq-len", "1024", "--precision", "fp32",
            "--num-gpus", "2", "--hardware", str(prof), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["device_memory_bytes"] == 2e9 and out["fits"] is False  # 4 GB of RAM over 2 ranks
    p = cli("memory", "--model", "gpt2-small", "--micro-batch", "8", "--seq-len", "1024", "--precision", "fp32",
            "--num-gpus", "2", "--hardware", str(prof))
    assert "DOES NOT FIT" in p.stdout and "host RAM of box / 2 rank(s)" in p.stdout
    assert "2.00 GB  (1.86 GiB, host RAM" in p.stdout  # the budget in both units, as every line above it
    bad = cli("plan", "--model", "gpt2-small", "--tokens", "1e9", "--hardware", str(prof), "--systems", "dgx-a100")
    assert bad.returncode == 2 and "drop --systems" in bad.stderr and "Traceback" not in bad.stderr
    stack = cli("predict", "--model", "llama3-8b", "--gpu", "a100-sxm-80gb", "--stack", "mgbench")
    assert stack.returncode == 2 and "not fitted: mgbench's first GPU runs" in stack.stderr and "Traceback" not in stack.stderr


def test_plan_on_a_probed_gpu_prices_its_measured_attention_kernel(cli, tmp_path):
    # plan --hardware reads the typed profile: a probed attention kernel half as fast
    # makes the same recommendation slower (were attention priced as GEMMs, as before the
    # typed profile, the two would plan alike).
    from tests.unit.test_probe_profile import _probed_h100

    def plan(attention_tflops):
        prof = tmp_path / f"h100-{attention_tflops}.json"
        prof.write_text(json.dumps(_probed_h100(num_devices=8, attention=[
            {"dtype": "bfloat16", "typical_tflops": attention_tflops, "shapes": []}])))
        p = cli("plan", "--model", "llama3-8b", "--tokens", "1e10", "--seq-len", "8192",
                "--hardware", str(prof), "--json")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["recommendation"]

    fast, slow = plan(400.0), plan(200.0)
    per_gpu = [r["tokens_per_s"] / r["num_gpus"] for r in (fast, slow)]
    assert fast["evidence"] == "measured" and per_gpu[1] < 0.97 * per_gpu[0]


def test_the_plan_table_names_each_pipelined_rows_schedule(cli):
    p = cli("plan", "--model", "llama3-70b", "--tokens", "1e12", "--systems", "dgx-h100", "--max-gpus", "256")
    assert p.returncode == 0, p.stderr
    header, rule, *rows = p.stdout.splitlines()
    start = header.index("schedule")
    end = start + len(rule[start:].split()[0])  # the column's width, from its rule of dashes
    table = [r for r in rows if r.startswith("dgx-h100")]
    cells = [(int(r.split()[2].split("/")[1]), r[start:end].strip()) for r in table]
    assert any(pp > 1 for pp, _ in cells) and any(pp == 1 for pp, _ in cells)
    for pp, cell in cells:
        # A lighter last stage, where it wins, follows the schedule: "1f1b last=9".
        sched = cell.split(" last=")[0]
        assert cell == "-" if pp == 1 else (sched == "1f1b" or sched in ("interleaved v=2", "interleaved v=4")), (pp, cell)
        if " last=" in cell:
            assert 0 <= int(cell.split(" last=")[1]) < -(-80 // pp), (pp, cell)


def test_predict_and_memory_carry_the_last_stages_blocks(cli):
    args = ("--model", "llama3-8b", "--num-gpus", "8", "--pp", "4", "--global-batch", "8")
    light = json.loads(cli("predict", *args, "--system", "dgx-h100", "--pp-last-layers", "6", "--json").stdout)
    even = json.loads(cli("predict", *args, "--system", "dgx-h100", "--json").stdout)
    assert light["memory"]["layout"]["pp_last_layers"] == 6 and even["memory"]["layout"]["pp_last_layers"] is None
    assert light["step_time_s"] < even["step_time_s"]  # a 128K vocabulary's output layer fits in the room
    mem = json.loads(cli("memory", *args, "--pp-last-layers", "6", "--json").stdout)
    assert mem["layout"]["pp_last_layers"] == 6
    assert mem["activations_bytes"] > json.loads(cli("memory", *args, "--json").stdout)["activations_bytes"]


def test_predict_on_a_probed_cpu_takes_a_lighter_last_stage(cli, tmp_path):
    # A probed CPU profile without op probes prices a set last stage as a GPU would; one
    # with them counts the runner's ops, on its even split, and refuses the pair
    # (test_probe_host_terms.py), as --trace does.
    from tests.unit.test_probe_profile import make_profile

    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(make_profile(host_memory_bytes=64e9)))
    args = ("predict", "--model", "mini", "--micro-batch", "2", "--seq-len", "128", "--precision", "fp32",
            "--num-gpus", "2", "--pp", "2", "--global-batch", "8", "--hardware", str(prof), "--json")
    p = cli(*args, "--pp-last-layers", "0")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["memory"]["layout"]["pp_last_layers"] == 0


def test_predict_names_its_schedule_and_fp8_recipe_in_its_header(cli):
    p = cli("predict", "--model", "llama3-70b", "--system", "dgx-h100", "--num-gpus", "64", "--pp", "4", "--zero", "1",
            "--global-batch", "64", "--schedule", "interleaved", "--virtual-stages", "2", "--pp-last-layers", "19",
            "--precision", "fp8", "--fp8-recipe", "tensorwise")
    assert p.returncode == 0, p.stderr
    head = p.stdout.splitlines()[0]
    assert "fp8 (tensorwise recipe)" in head and "schedule=interleaved v=2 last=19" in head, head
    # plan refuses a recipe without FP8 once, not once a system
    bad = cli("plan", "--model", "llama3-8b", "--tokens", "1e11", "--fp8-recipe", "delayed")
    assert bad.returncode == 2 and bad.stderr.count("applies to --precision fp8") == 1, bad.stderr
