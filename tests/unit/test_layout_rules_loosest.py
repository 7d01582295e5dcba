"""layout_rules.LOOSEST: at ep 1 and without CPU offload no layout rule is stricter than at
any other ep or offload, the other fields held. plan's search relies on it
(search.kept_layouts runs every rule only on the rows the loosest values keep), so a rule
that became stricter at ep 1 or without offload would silently drop layouts from plans:
this checks the superset over random layouts, and that the check catches such a rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mgbench import catalog
from mgbench.layout import Layout
from mgbench.planner import layout_rules


def random_layouts(seed: int, n: int = 40_000) -> Layout:
    rng = np.random.default_rng(seed)
    pick = lambda values: rng.choice(values, n)  # noqa: E731
    return Layout(num_gpus=pick([8, 16, 24, 64, 96, 256, 512]), tp=pick([1, 2, 4, 8]), pp=pick([1, 2, 3, 4, 8]),
                  cp=pick([1, 2]), ep=pick([1, 2, 4, 8, 16, 32, 64]), zero=pick([0, 1, 2, 3]),
                  micro_batch=pick([1, 2, 4]), global_batch=pick([64, 96, 512, 1024]), seq_len=4096,
                  replicas=pick([1, 2, 4]), offload=pick([False, True]), etp=pick([1, 2]),
                  schedule="interleaved", virtual_stages=2)


def loosest_misses(shape, layout: Layout) -> int:
    """Layouts kept at their own ep / offload but not at the loosest values."""
    kept = layout_rules.keeps_all(layout_rules.rules(shape, layout))
    loose = layout_rules.keeps_all(layout_rules.rules(shape, dataclasses.replace(layout, **layout_rules.LOOSEST)))
    return int(np.sum(kept & ~loose))


@pytest.mark.parametrize("model", ["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b", "llama3-8b"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_loosest_values_keep_a_superset(model, seed):
    shape = catalog.model_shape(model)
    layout = random_layouts(seed)
    kept = layout_rules.keeps_all(layout_rules.rules(shape, layout))
    assert kept.any() and not kept.all()  # the sample holds layouts of both kinds
    assert loosest_misses(shape, layout) == 0


def test_a_rule_stricter_at_ep_1_is_caught(monkeypatch):
    shape = catalog.model_shape("deepseek-v3")
    layout = random_layouts(0)
    real = layout_rules.rules

    def stricter(shape, L):  # a broken rule: refuses ep 1
        out = real(shape, L)
        out["broken"] = np.asarray(L.ep) > 1
        return out

    monkeypatch.setattr(layout_rules, "rules", stricter)
    assert loosest_misses(shape, layout) > 0
