"""Issue 17 runner knobs that need no process group: the zero-bubble schedules' theoretical
bubble and stage placement, what each new knob refuses (a skip with its reason), fp8's
MFU / HFU by hand, the fp8 conversion, and the record's notes for CPU runs. The runs
themselves are tests/integration/test_modern.py."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from mgbench.runner import worker
from mgbench.strategies import schedules
from mgbench.strategies.schedules import bubble_unknown_reason, theoretical_bubble
from mgbench.suite import expand, parse_suite
from tests.factories import make_config

H100 = "NVIDIA H100 80GB HBM3"
HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
MODEL = "{ layers = 8, hidden = 64, heads = 4, kv_heads = 4, ffn_hidden = 176, vocab = 256 }"


def test_zero_bubble_theoretical_bubble_by_hand():
    # p = 4 ranks, m = 8 micro-batches; unit times T_F = T_B = T_W = 1 per chunk.
    # ZB1P interleaved over v = 2: bubble p - 1 = 3 units, work 3 v m = 48: 3 / 51.
    assert theoretical_bubble(4, 8, "interleaved_zb", 2) == pytest.approx(3 / 51)
    # v = 1 is ZB-H1: 3 / (24 + 3); a third of 1F1B's bubble time (3 x 3 units).
    assert theoretical_bubble(4, 8, "interleaved_zb", 1) == pytest.approx(3 / 27)
    # ZB-V: zero once m >= 2p = 8 ...
    assert theoretical_bubble(4, 8, "zbv", 2) == 0.0
    # ... and no figure below that, with the reason.
    assert theoretical_bubble(4, 4, "zbv", 2) is None
    assert "2 x pp = 8" in bubble_unknown_reason(4, 4, "zbv")
    assert bubble_unknown_reason(4, 8, "zbv") is None
    # DualPipeV: (p - 1)(F&B + B - 3W) = 3 x (3 + 2 - 3) = 6 units over 2 chunks x 3 x 8 = 48: 6 / 54.
    assert theoretical_bubble(4, 8, "dualpipev", 2) == pytest.approx(6 / 54)
    # The older schedules keep Narayanan et al.'s values.
    assert theoretical_bubble(4, 8, "1f1b", 1) == pytest.approx(3 / 11)
    assert theoretical_bubble(4, 8, "interleaved", 2) == pytest.approx(3 / 19)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        theoretical_bubble(4, 8, "zb-h2", 1)


def test_v_schedules_place_two_chunks_per_rank_in_a_v():
    assert [schedules.rank_chunks("zbv", r, 4, 2) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert schedules.rank_chunks("dualpipev", 1, 2, 5) == [1, 2]  # virtual_stages does not apply
    assert schedules.rank_chunks("interleaved_zb", 1, 4, 2) == [1, 5]
    assert schedules.chunks_per_rank("zbv", 3) == 2 and schedules.chunks_per_rank("1f1b", 3) == 1


@pytest.mark.parametrize("schedule, pp, m, compile, words", [
    ("dualpipev", 4, 6, False, "at least as many micro-batches as stages"),
    ("interleaved_zb", 4, 6, False, "multiple of pp"),
    ("zbv", 2, 4, True, "compile = false"),
])
def test_schedule_problems_fire(schedule, pp, m, compile, words):
    assert words in schedules.schedule_problem(schedule, pp, m, compile)


def test_schedules_that_can_run_have_no_problem():
    assert schedules.schedule_problem("dualpipev", 4, 8, False) is None
    assert schedules.schedule_problem("1f1b", 2, 4, True) is None  # no split backward


def _skips(body: str) -> list[str | None]:
    return [c.skip_reason for c in expand(parse_suite(f'name = "t"\n[sweep]\nmodel = {MODEL}\n' + body), "cpu", 4)]


def test_suite_skips_what_the_new_knobs_cannot_run(monkeypatch):
    assert "replicas = 3 does not divide" in _skips('strategy = "hsdp"\nnproc = 4\nreplicas = 3\n')[0]
    assert _skips('strategy = "hsdp"\nnproc = 4\nreplicas = 2\n') == [None]
    assert "grad_accum >= 8" in _skips('strategy = "pp"\nnproc = 4\npp_schedule = "dualpipev"\ngrad_accum = 4\n')[0]
    # Zero-bubble schedules run with data-parallel replicas (schedules.grad_sync).
    for dp_mode in ("ddp", "fsdp", "hsdp"):
        assert _skips('strategy = "pp+tp+dp"\nnproc = 4\nlayout = {pp = 2, tp = 1, dp = 2}\n'
                      f'dp_mode = "{dp_mode}"\npp_schedule = "zbv"\ngrad_accum = 4\n') == [None]
    # Without torchao an fp8 config is a skip that says what to install.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    assert "install mgbench[fp8]" in _skips('strategy = "fsdp"\nnproc = 4\nprecision = "fp8"\n')[0]


def test_hsdp_label_and_zero_stage():
    cfg = make_config(strategy="hsdp", nproc=4, replicas=2)
    assert " 2x2 " in cfg.label and cfg.zero_stage == 3
    assert make_config(strategy="pp+tp+dp", nproc=4, layout={"pp": 2, "tp": 1, "dp": 2}, dp_mode="hsdp").zero_stage == 3


@pytest.fixture
def cuda_h100(monkeypatch):
    """torch's device properties of an H100 SXM (the CUDA call cannot run here)."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=81559 * 2**20, name=H100))
    monkeypatch.setattr(worker, "fp32_matmul_mode", lambda: ("ieee", "test"))
    return torch.device("cuda", 0)


def test_fp8_mfu_uses_the_bf16_peak_and_hfu_the_fp8_peak(cuda_h100):
    # 494.5 TFLOP/s of model FLOPs per H100 SXM: MFU = 494.5 / 989 (bf16 dense) = 50%;
    # HFU = 494.5 / 1979 (fp8 dense) = 24.99%.
    f = worker.mfu_fields("fp8", H100, cuda_h100, 494.5)
    assert f["peak_tflops"] == 989.0 and f["mfu_peak_precision"] == "bf16"
    assert f["mfu_pct"] == pytest.approx(50.0)
    assert f["hfu_peak_tflops"] == 1979.0 and f["hfu_pct"] == pytest.approx(100 * 494.5 / 1979)
    assert f["hfu_reason"] is None
    # A figure past the fp8 peak cannot be this device's: null, with the reason.
    bad = worker.hfu_fields("fp8", H100, 79.6, 2500.0)
    assert bad["hfu_pct"] is None and "126%" in bad["hfu_reason"]
    # Other precisions record no HFU, and say why.
    assert "fp8 configs only" in worker.mfu_fields("bf16", H100, cuda_h100, 100.0)["hfu_reason"]


def test_cpu_notes_for_fp8_speed_and_offload():
    assert "says nothing about fp8 hardware" in worker.fp8_fields("fp8", "cpu")["fp8_speed_reason"]
    assert worker.fp8_fields("fp8", "cuda") == {"fp8_speed_reason": None}
    assert worker.fp8_fields("bf16", "cpu") == {}
    on = make_config(strategy="fsdp", nproc=2, offload=True)
    assert "no-op in effect" in worker.offload_fields(on, torch.device("cpu"))["offload_reason"]
    assert worker.offload_fields(make_config(strategy="fsdp", nproc=2), torch.device("cpu")) == {}


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install mgbench[fp8])")
def test_fp8_converts_block_linears_and_keeps_the_head():
    from torchao.float8.float8_linear import Float8Linear

    from mgbench.strategies import fp8
    from mgbench.workloads.gpt import DecoderLM

    cfg = make_config(model={"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 176, "vocab": 256})
    model = DecoderLM(cfg.shape, max_seq_len=16)
    assert fp8.convert(model, "rowwise", fsdp=False) == 2 * 7  # q, k, v, o, w1, w2, w3 per block
    assert not isinstance(model.head, Float8Linear)
    odd = torch.nn.Sequential(torch.nn.Linear(10, 20))
    with pytest.raises(ValueError, match="multiple of 16"):
        fp8.convert(odd, "tensorwise", fsdp=False)
