"""Issue 30, item 2: fp8 configs on GPUs without float8 tensor cores (compute capability
below 8.9, e.g. an A100) are skipped with the reason instead of failing one by one. The
GPUs are torch.cuda's answers, monkeypatched on this CPU machine."""

import importlib.util

import pytest
import torch

from mgbench import suite as S
from mgbench.record import Record

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None

SUITE = """
name = "fp8-contact"
[sweep]
model = "tiny"
strategy = "ddp"
nproc = 2
precision = ["bf16", "fp8"]
"""


def gpus(monkeypatch, *caps, name="NVIDIA A100-SXM4-80GB"):
    """A host whose visible GPUs have these compute capabilities."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: caps[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: name)


def by_precision(device_kind="cuda"):
    configs = S.expand(S.parse_suite(SUITE, "x.toml", device_kind), device_kind, 2)
    return {c.precision: c for c in configs}


def test_fp8_on_an_a100_is_skipped_naming_its_capability(monkeypatch):
    gpus(monkeypatch, (8, 0), (8, 0))
    got = by_precision()
    why = got["fp8"].skip_reason
    assert why is not None, "before: the config ran and failed in torch._scaled_mm"
    assert "8.0" in why and ">= 8.9" in why and "Ada, Hopper, Blackwell" in why and "A100" in why
    assert got["bf16"].skip_reason is None  # only fp8 needs the float8 units
    rec = Record.skipped(got["fp8"], "run").to_dict()
    assert rec["status"] == "skipped" and rec["skip_reason"] == why and rec["error"] is None


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install mgbench[fp8]): fp8 configs are "
                                              "skipped for that before their GPU is asked")
@pytest.mark.parametrize("cap", [(8, 9), (9, 0), (10, 0)])
def test_ada_hopper_and_blackwell_run_fp8(monkeypatch, cap):
    gpus(monkeypatch, cap, cap, name="NVIDIA H100 80GB HBM3")
    assert by_precision()["fp8"].skip_reason is None


def test_one_older_gpu_among_the_visible_ones_is_named(monkeypatch):
    gpus(monkeypatch, (9, 0), (8, 6))
    assert "GPU 1" in by_precision()["fp8"].skip_reason and "8.6" in by_precision()["fp8"].skip_reason


def test_capability_rule_and_no_gpu_to_ask():
    from mgbench.strategies.fp8 import FP8_MIN_CAPABILITY, capability_problem

    assert FP8_MIN_CAPABILITY == (8, 9)
    assert capability_problem((8, 9)) is None and capability_problem((12, 0)) is None
    assert "7.5" in capability_problem((7, 5))
    # No CUDA torch on this machine: nothing to ask, the suite's other rules decide (as before).
    if not torch.cuda.is_available():
        why = by_precision()["fp8"].skip_reason
        assert why is None if HAS_TORCHAO else "install mgbench[fp8]" in why
