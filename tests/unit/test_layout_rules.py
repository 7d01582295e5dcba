"""One set of layout rules for plan's search and for predict (issue 31, item 2): the
vectorised masks accept exactly the layouts predict.validate accepts, and each rule
fires on a layout that breaks it."""

import itertools

import numpy as np
import pytest

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.planner import layout_rules as R
from mgbench.layout import Layout
from mgbench.planner.predict import validate

SHAPE = catalog.model_shape("mixtral-8x7b")  # 32 layers, 32 heads, 8 kv heads, 8 experts


def test_the_masks_accept_what_predict_accepts():
    grid = list(itertools.product([8, 12, 16], [1, 2, 3, 8], [1, 2, 4, 16, 40], [1, 2], [1, 2, 8], [0, 3], [1, 4]))
    cols = np.array(grid).T
    # One Layout whose fields are the grid's columns: the form plan's search holds.
    masks = R.rules(SHAPE, Layout(num_gpus=cols[0], tp=cols[1], pp=cols[2], cp=cols[3], ep=cols[4], zero=cols[5],
                                  micro_batch=cols[6], global_batch=64, seq_len=4096, schedule="interleaved",
                                  virtual_stages=2))
    ok = R.keeps_all(masks)
    seen = {True: 0, False: 0}
    for (n, t, p, c, e, z, mb), want in zip(grid, ok):
        lay = Layout(num_gpus=n, tp=t, pp=p, cp=c, ep=e, zero=z, micro_batch=mb, seq_len=4096, global_batch=64,
                     schedule="interleaved", virtual_stages=2)
        try:
            validate(lay, SHAPE)
            got = True
        except MgbenchError:
            got = False
        assert got == bool(want), (n, t, p, c, e, z, mb, {k: bool(v[grid.index((n, t, p, c, e, z, mb))])
                                                          for k, v in masks.items()})
        seen[got] += 1
    assert seen[True] > 10 and seen[False] > 10  # both kinds in the grid


@pytest.mark.parametrize("kw,rule", [
    (dict(num_gpus=8, tp=3), "divides"),
    (dict(num_gpus=8, global_batch=12), "batch"),
    (dict(num_gpus=12, tp=12), "heads"),
    (dict(num_gpus=8, pp=8, global_batch=64, schedule="interleaved", virtual_stages=8), "layers"),
    (dict(num_gpus=8, ep=16), "experts"),
    (dict(num_gpus=8, cp=2, seq_len=4098), "cp_seq"),
    (dict(num_gpus=8, zero=1, offload=True), "offload"),
    (dict(num_gpus=8, zero=3, replicas=8), "hsdp"),
    (dict(num_gpus=8, pp=4, global_batch=6, micro_batch=1, schedule="interleaved", virtual_stages=2), "schedule"),
    (dict(num_gpus=8, pp=2, global_batch=16, schedule="interleaved", virtual_stages=1), "chunks"),
    (dict(num_gpus=8, pp_last_layers=1), "last_stage"),
    (dict(num_gpus=8, pp=4, pp_last_layers=9), "last_stage"),  # heavier than the others' 8
    (dict(num_gpus=8, pp=4, pp_last_layers=-1), "last_stage"),
    (dict(num_gpus=8, pp=4, global_batch=16, schedule="zbv", pp_last_layers=9), "last_stage"),  # rank 0 of the V
])
def test_each_rule_fires_on_a_layout_that_breaks_it(kw, rule):
    args = dict(num_gpus=8, tp=1, pp=1, global_batch=16, seq_len=4096) | kw
    masks = R.rules(SHAPE, Layout(**args))
    assert not bool(masks[rule]), rule
    assert R.MESSAGES[rule]  # and says why in one line


def test_experts_fold_over_tensor_and_data_parallel_ranks():
    """Megatron-Core's MoE parallel folding: the ep group may take a stage's tp ranks too,
    so ep may exceed dp (Qwen3-235B on H100 was published with tp 2, dp 16, ep 32); an ep
    that divides no stage's tp x dp x cp ranks is still refused."""
    shape = catalog.model_shape("qwen3-30b-a3b")  # 128 experts
    ok = R.rules(shape, Layout(num_gpus=8, tp=2, ep=8, global_batch=16, seq_len=4096))
    assert bool(ok["experts"])  # dp = 4 < ep = 8, tp x dp = 8
    bad = R.rules(shape, Layout(num_gpus=8, tp=2, ep=16, global_batch=16, seq_len=4096))
    assert not bool(bad["experts"])
    assert "tp x dp x cp" in R.MESSAGES["experts"](Layout(num_gpus=8, tp=2, ep=16), shape)
