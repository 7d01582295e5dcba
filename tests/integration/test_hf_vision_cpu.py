"""Hugging Face models (hf:) and the vision workload on gloo CPU ranks, through the real CLI:
one `mgbench run` (two torchrun jobs: 1 and 2 ranks) shared by every test here."""

import importlib.util
import shutil
from pathlib import Path

import pytest

from mgbench import store
from mgbench.workloads import VisionModel

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
NO_TRANSFORMERS = "transformers is not installed (the optional extra mgbench[hf]); its configs are skipped"

# hf: paths are relative to the suite file's folder (bench/), not to the directory mgbench runs in.
SUITE = """
name = "hf-vision"
[[sweep]]
model = "hf:models/tiny-llama/config.json"
strategy = ["ddp", "fsdp"]
nproc = 2
seq_len = 32
micro_batch = 2
measured_steps = 2
[[sweep]]
model = "hf:models/tiny-gpt2/config.json"
strategy = ["ddp", "fsdp"]
activation_checkpointing = "full"
nproc = 2
seq_len = 32
micro_batch = 2
measured_steps = 2
[[sweep]]
workload = "vision"
model = ["resnet_tiny", "vit_tiny"]
image_size = 32
strategy = "single"
micro_batch = 8
measured_steps = 2
[[sweep]]
workload = "vision"
model = ["resnet_tiny", "vit_tiny"]
image_size = 32
strategy = ["ddp", "fsdp"]
nproc = 2
micro_batch = 4
measured_steps = 2
[[sweep]]
workload = "vision"
model = "resnet_tiny"
image_size = 32
strategy = "ddp"
nproc = 2
micro_batch = 4
measured_steps = 2
inject = "bug:no_grad_sync"
[[sweep]]
model = "hf:models/tiny-llama/config.json"
strategy = "ddp"
nproc = 2
seq_len = 32
micro_batch = 2
measured_steps = 2
inject = "bug:no_grad_sync"
[[sweep]]
model = ["hf:models/tiny-llama/config.json", "hf:models/tiny-gpt2/config.json"]
strategy = "tp"
nproc = 2
seq_len = 32
micro_batch = 2
measured_steps = 2
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.conftest import run_cli

    cwd = tmp_path_factory.mktemp("hfv")
    bench = cwd / "bench"
    shutil.copytree(FIXTURES, bench / "models")
    (bench / "suite.toml").write_text(SUITE)
    p = run_cli("run", "bench/suite.toml", "--run-id", "hfv", "--no-report", "--no-projection", cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    return {r["label"]: r for r in store.read_records(cwd / "results" / "hfv")}


def _ok(rec):
    assert rec["status"] == "ok", (rec["label"], rec.get("error"), rec.get("skip_reason"))
    assert rec["correct"] is True, (rec["label"], rec["correct_reason"])
    assert len(rec["check_losses"]) == 3
    # Learnable data (Markov tokens, class patterns): the check window's loss falls.
    assert rec["check_losses"][-1] < rec["check_losses"][0], (rec["label"], rec["check_losses"])
    assert rec["mem_tracked_peak_bytes"] > 0, rec.get("mem_tracked_reason")


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_hf_llama_and_gpt2_under_ddp_and_fsdp_are_ok_and_correct(run):
    hf = [r for r in run.values() if r.get("model_hf") and r["inject"] == "none" and r["strategy"] != "tp"]
    assert {(r["model_hf"], r["strategy"]) for r in hf} == {(a, s) for a in ("llama", "gpt2") for s in ("ddp", "fsdp")}
    for r in hf:
        _ok(r)
        assert r["tokens_per_s"] > 0 and r["images_per_s"] is None
        assert r["mfu_pct"] is None and r["mfu_reason"]  # a CPU has no catalog peak
    llama = next(r for r in hf if r["model_hf"] == "llama")
    # FLOPs from the config (6N + 12 L h s with N the matmul weights); Llama's parameters
    # are exactly those of mgbench's shape: embedding, 2 x (q 64x64, k/v 64x32, o, 3 MLP
    # 64x128, 2 norms), final norm, untied head.
    n = 256 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64 + 256 * 64
    assert llama["num_params"] == n
    assert llama["flops_per_token"] == 6 * (n - 256 * 64) + 12 * 2 * 64 * 32
    assert llama["model_name"] == "hf:tiny-llama" and llama["model_config"]["num_key_value_heads"] == 2
    gpt2 = next(r for r in hf if r["model_hf"] == "gpt2")
    # GPT-2 counts its biases, LayerNorms and learned positions (not in the decoder shape),
    # its head tied to the token embedding.
    per_layer = 2 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + 2 * 64 + (64 * 256 + 256) + (256 * 64 + 64)
    assert gpt2["num_params"] == 256 * 64 + 64 * 64 + 2 * per_layer + 2 * 64


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason=NO_TRANSFORMERS)
def test_hf_llama_under_tp_by_its_plan_is_ok_and_correct_and_gpt2_without_one_is_skipped(run):
    """tp = 2 splits the Llama by its config's base_model_tp_plan (workloads/hf_tp.py) and
    matches the single-process reference; GPT-2's config has no plan."""
    tp = {r["model_hf"]: r for r in run.values() if r.get("model_hf") and r["strategy"] == "tp"}
    assert set(tp) == {"llama", "gpt2"}
    _ok(tp["llama"])
    assert tp["llama"]["tp"] == 2 and tp["llama"]["dp"] == 1 and tp["llama"]["tokens_per_s"] > 0
    ddp = next(r for r in run.values() if r.get("model_hf") == "llama" and r["strategy"] == "ddp"
               and r["inject"] == "none")
    # Same model and seed: the same weights before the window, counted whole.
    assert tp["llama"]["num_params"] == ddp["num_params"]
    assert tp["gpt2"]["status"] == "skipped"
    assert "gpt2 configs have no tensor-parallel plan" in tp["gpt2"]["skip_reason"]


def test_vision_models_under_single_ddp_fsdp_are_ok_and_correct(run):
    vis = [r for r in run.values() if r["workload"] == "vision" and r["inject"] == "none"]
    got = {(r["model_vision"], r["strategy"], r["nproc"]) for r in vis}
    assert got == {(m, s, n) for m in ("resnet_tiny", "vit_tiny") for s, n in (("single", 1), ("ddp", 2), ("fsdp", 2))}
    for r in vis:
        _ok(r)
        assert r["global_batch"] == 8  # single: 8 images; ddp and fsdp: 4 on each of 2 ranks
        m = VisionModel(r["model_vision"])
        assert r["tokens_per_s"] is None and r["tokens_reason"]
        assert r["images_per_s"] == pytest.approx(r["global_batch"] / r["step_time_s"])
        assert r["flops_per_image"] == m.flops_per_image(32) and r["num_params"] == m.num_params(32)
        assert r["check_data"] == "class-patterns"
        assert "img=32" in r["label"]


@pytest.mark.parametrize("workload", ["vision", pytest.param("gpt", marks=pytest.mark.extras)])
def test_the_check_catches_unsynchronised_gradients(run, workload):
    """The negative control: each rank steps on its own gradients (no all-reduce), and the
    check against the single-process reference says so."""
    if workload == "gpt" and not HAS_TRANSFORMERS:
        pytest.skip(NO_TRANSFORMERS)
    (r,) = [r for r in run.values() if r["workload"] == workload and r["inject"] == "bug:no_grad_sync"]
    assert r["status"] == "checked" and r["correct"] is False, r.get("correct_reason")
    assert "grad_norm" in r["check_mismatches"]
