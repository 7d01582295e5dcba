"""predict's hint when a layout does not fit: the single changes (a ZeRO stage, a recompute
mode, micro-batch 1 at the same global batch) that bring it within the GPU, each checked
by predicting the changed layout."""

import re
import subprocess
import sys

import pytest

from mgbench import catalog
from mgbench.layout import RECOMPUTE, Layout
from mgbench.planner import perf
from mgbench.planner.predict import predict
from mgbench.planner.resolve import resolve

QWEN = catalog.model_shape("qwen3-30b-a3b")
LLAMA8 = catalog.model_shape("llama3-8b")
H100 = resolve(precision="bf16", system="dgx-h100")


def _layout(**kw):
    base = dict(num_gpus=16, tp=1, pp=1, ep=16, zero=0, micro_batch=1, seq_len=4096, global_batch=16,
                precision="bf16", recompute="none")
    return Layout(**{**base, **kw})


def _changed(layout, hint):
    """The layout a hint names, and the memory it states (GB)."""
    flags, gb = re.fullmatch(r"(.+) \(([\d,.]+) GB\)", hint).groups()
    change = {}
    for flag, value in re.findall(r"--([a-z-]+) (\S+)", flags):
        change[flag.replace("-", "_")] = int(value) if value.isdigit() else value
    return Layout(**{**layout.__dict__, **change}), float(gb.replace(",", ""))


def _checked(shape, layout):
    """The hints of a layout that does not fit, each predicted: it fits at the memory named."""
    res = predict(shape, H100, layout)
    assert not res["fits"]
    for hint in res["fit_hints"]:
        changed, gb = _changed(layout, hint)
        again = predict(shape, H100, changed)
        assert again["fits"], hint
        assert again["memory"]["total_bytes"] / 1e9 == pytest.approx(gb, abs=0.006)
        if changed.recompute != layout.recompute:
            # No mode that runs fewer FLOPs again fits: the hint is the cheapest that does.
            cost = {r: float(perf.hardware_flops_per_token(shape, layout.seq_len, RECOMPUTE.index(r)))
                    for r in RECOMPUTE}
            cheaper = [r for r in RECOMPUTE if r not in ("none", layout.recompute)
                       and cost[r] < cost[changed.recompute]]
            assert not any(predict(shape, H100, Layout(**{**layout.__dict__, "recompute": r}))["fits"] for r in cheaper)
    return [h.split(" (")[0] for h in res["fit_hints"]]


def test_each_kind_names_its_first_change_that_fits():
    # ZeRO 1, 2 and 3 all fit: the lowest is named. Of the recompute modes, selective and op
    # keep too much here; every_2nd and full fit, and every_2nd runs fewer FLOPs again
    # (perf.hardware_flops_per_token orders them; _checked asserts no cheaper mode fits).
    assert _checked(QWEN, _layout()) == ["--zero 1", "--recompute every_2nd"]
    assert predict(QWEN, H100, _layout(recompute="full"))["fits"]


def test_micro_batch_one_keeps_the_global_batch():
    # Micro-batch 8 at ZeRO 3 on 8 GPUs, 8,192 tokens: 64 sequences a step. The hint keeps
    # them (--global-batch 64): a smaller batch would fit for the wrong reason.
    layout = Layout(num_gpus=8, zero=3, micro_batch=8, seq_len=8192, precision="bf16", recompute="none")
    assert layout.batch == 64
    assert _checked(LLAMA8, layout) == ["--micro-batch 1 --global-batch 64"]


def test_no_hint_where_it_fits_or_where_no_single_change_helps():
    assert predict(QWEN, H100, _layout(zero=1))["fit_hints"] == []
    big = predict(catalog.model_shape("llama3-70b"), H100, _layout(num_gpus=8, ep=1, global_batch=8))
    assert not big["fits"] and big["fit_hints"] == []


def test_the_cli_says_it_under_the_memory_line():
    def run(*args):
        p = subprocess.run([sys.executable, "-m", "mgbench.cli", "predict", *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    lines = run("--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--num-gpus", "16", "--ep", "16")
    at = next(i for i, line in enumerate(lines) if line.startswith("memory") and "DOES NOT FIT" in line)
    assert "fits with one change" in lines[at + 1] and "--zero 1" in lines[at + 1]
    # A dense model is not told to raise --ep.
    dense = "\n".join(run("--model", "llama3-70b", "--system", "dgx-h100", "--num-gpus", "8"))
    assert "no single change" in dense and "more GPUs, or more model parallelism (--tp, --pp)" in dense
