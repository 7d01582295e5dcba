"""predict's hint when a layout does not fit: the single changes (a ZeRO stage, recompute,
micro-batch 1) that bring it within the GPU, each checked against memory itself."""

import re
import subprocess
import sys

import pytest

from mgbench import catalog
from mgbench.layout import Layout
from mgbench.planner.predict import memory, predict
from mgbench.planner.resolve import resolve

QWEN = catalog.model_shape("qwen3-30b-a3b")
H100 = resolve(precision="bf16", system="dgx-h100")


def _layout(**kw):
    base = dict(num_gpus=16, tp=1, pp=1, ep=16, zero=0, micro_batch=1, seq_len=4096, global_batch=16,
                precision="bf16", recompute="none")
    return Layout(**{**base, **kw})


def test_each_hint_is_a_change_that_fits_at_the_memory_it_names():
    res = predict(QWEN, H100, _layout())
    assert not res["fits"]
    hints = res["fit_hints"]
    assert hints and hints[0].startswith("--zero 1 (")
    for hint in hints:
        flag, value, gb = re.fullmatch(r"--([a-z-]+) (\S+) \(([\d,.]+) GB\)", hint).groups()
        field = flag.replace("-", "_")
        changed = _layout(**{field: int(value) if value.isdigit() else value})
        need = memory(QWEN, changed, stack=H100.stack)["total_bytes"]
        assert need <= H100.memory_bytes
        assert float(gb.replace(",", "")) == pytest.approx(need / 1e9, abs=0.006)
    # Only the lowest ZeRO stage that fits is named (ZeRO 2 and 3 fit too).
    assert sum(h.startswith("--zero") for h in hints) == 1
    # A change that does not fit is not named: selective recompute keeps too much here.
    assert memory(QWEN, _layout(recompute="selective"), stack=H100.stack)["total_bytes"] > H100.memory_bytes
    assert not any(h.startswith("--recompute selective") for h in hints)


def test_no_hint_where_it_fits_or_where_no_single_change_helps():
    assert predict(QWEN, H100, _layout(zero=1))["fit_hints"] == []
    big = predict(catalog.model_shape("llama3-70b"), H100,
                  _layout(num_gpus=8, ep=1, global_batch=8))
    assert not big["fits"] and big["fit_hints"] == []


def test_the_cli_says_it_under_the_memory_line():
    p = subprocess.run([sys.executable, "-m", "mgbench.cli", "predict", "--model", "qwen3-30b-a3b", "--system",
                        "dgx-h100", "--num-gpus", "16", "--ep", "16"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("memory") and "DOES NOT FIT" in line)
    assert "fits with one change" in lines[at + 1] and "--zero 1" in lines[at + 1]
    p = subprocess.run([sys.executable, "-m", "mgbench.cli", "predict", "--model", "llama3-70b", "--system",
                        "dgx-h100", "--num-gpus", "8"], capture_output=True, text=True)
    assert "no single change" in p.stdout
