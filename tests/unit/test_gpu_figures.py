"""Rank-side pieces of issue 15 that need no process group: the MFU peak (defect 6),
checkpointing without RNG-state preservation (defect 12) and the pipeline loss that
scales for fp16 (defect 3). CUDA calls that cannot run here are mocked under their
real torch names."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from mgbench.runner import worker
from mgbench.telemetry.tf32 import fp32_matmul_mode
from mgbench.strategies import pieces
from mgbench.strategies.pipeline import StageLoss
from mgbench.workloads.gpt import DecoderLM
from tests.factories import make_config

H100 = "NVIDIA H100 80GB HBM3"


@contextlib.contextmanager
def fp32_precision(value):
    """Set torch's CUDA fp32 matmul mode (the new API), restoring it after."""
    matmul = torch.backends.cuda.matmul
    old = matmul.fp32_precision
    matmul.fp32_precision = value
    try:
        yield
    finally:
        matmul.fp32_precision = old


@pytest.fixture
def cuda_device(monkeypatch):
    """A CUDA device object whose properties torch would report for an H100 SXM."""
    props = SimpleNamespace(total_memory=81559 * 2**20, name=H100)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return torch.device("cuda", 0)


def test_fp32_mfu_divides_by_the_tf32_peak_when_tf32_is_on(cuda_device):
    """Defect 6: with TF32 on, fp32 matmuls run on tensor cores; dividing by the fp32 peak
    (67 TFLOPS) gave 149% for 100 TFLOPS of model FLOPs."""
    with fp32_precision("tf32"):
        assert fp32_matmul_mode()[0] == "tf32"
        f = worker.mfu_fields("fp32", H100, cuda_device, 100.0)
    assert f["peak_tflops"] == 494.5 and f["mfu_peak_precision"] == "tf32" and f["tf32_matmul"] is True
    assert f["mfu_pct"] == pytest.approx(100 * 100 / 494.5) and f["mfu_reason"] is None
    assert "fp32_precision = 'tf32'" in f["fp32_matmul_setting"]
    assert f["device_memory_gib"] == pytest.approx(79.65, abs=0.01)


def test_mfu_above_100_percent_is_null_with_the_reason(cuda_device):
    """The same 100 TFLOPS against the fp32 peak (TF32 off) would be 149%: no device does
    that, so the figure is null and the reason names the peak used."""
    with fp32_precision("ieee"):
        f = worker.mfu_fields("fp32", H100, cuda_device, 100.0)
    assert f["tf32_matmul"] is False and f["peak_tflops"] == 67.0
    assert f["mfu_pct"] is None and "149%" in f["mfu_reason"] and "cannot be this device's" in f["mfu_reason"]
    ok = worker.mfu_fields("fp32", H100, cuda_device, 30.0)
    assert ok["mfu_pct"] == pytest.approx(100 * 30 / 67)


def test_h200_nvl_mfu_uses_its_own_peak(cuda_device, monkeypatch):
    """Defect 6: an H200 NVL matched the SXM entry (989 TFLOPS bf16 instead of 835)."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=143771 * 2**20))
    f = worker.mfu_fields("bf16", "NVIDIA H200 NVL", cuda_device, 417.5)
    assert f["peak_tflops"] == 835.0 and f["mfu_pct"] == pytest.approx(50.0)


def test_cpu_has_no_peak_and_no_tf32_reading():
    f = worker.mfu_fields("fp32", "cpu: test", torch.device("cpu"), 1.0)
    assert f["mfu_pct"] is None and "no peak FLOPS" in f["mfu_reason"]
    assert f["tf32_matmul"] is None and f["device_memory_gib"] is None


def test_checkpointing_keeps_no_rng_state(monkeypatch):
    """Defect 12: checkpointed blocks neither save nor restore the RNG state (the model draws
    no random numbers: no dropout), and recompute exactly the same gradients."""
    model = DecoderLM(make_config(model="tiny").shape, max_seq_len=16)
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    calls = []
    real = torch.get_rng_state
    monkeypatch.setattr(torch, "get_rng_state", lambda: calls.append(1) or real())
    x = torch.randint(0, model.shape.vocab, (2, 16))
    torch.manual_seed(0)
    plain = DecoderLM(model.shape, max_seq_len=16)
    torch.manual_seed(0)
    ckpt = DecoderLM(model.shape, max_seq_len=16)
    pieces.apply_activation_checkpointing(ckpt, "full")
    assert all(isinstance(b, pieces.Checkpointed) for b in ckpt.blocks.values())
    grads = []
    for m in (plain, ckpt):
        m(x).float().logsumexp(-1).mean().backward()
        grads.append([p.grad for p in m.parameters()])
    assert calls == []  # preserve_rng_state=True stashes torch.get_rng_state() per block
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_stage_loss_scales_for_fp16_and_reports_the_true_loss():
    """Defect 3: the pipeline schedule runs backward on what its loss function returns, so
    that function scales the loss; the reported loss is divided back exactly."""
    scaler = pieces.LossScaler(torch.device("cpu"))
    loss_fn = StageLoss(scaler)
    logits = torch.randn(2, 4, 8, requires_grad=True)
    target = torch.randint(0, 8, (2, 4))
    scaled = loss_fn(logits, target)
    true = StageLoss()(logits, target)
    assert scaled.item() == pytest.approx(true.item() * scaler.get_scale())
    assert loss_fn.true_losses([scaled])[0].item() == true.item()  # the scale is a power of two
    assert StageLoss().true_losses([true]) == [true]
