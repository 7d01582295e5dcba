"""Scaling efficiency above 100% on CPU ranks that share cores is flagged as noise."""

import pandas as pd

from mgbench.report import figures
from mgbench.report.html import warnings
from tests.factories import make_config, make_record


def frame(tps_by_n, device="cpu"):
    rows = []
    for n, tps in tps_by_n.items():
        cfg = make_config(strategy="ddp", nproc=n, device=device)
        rec = make_record(cfg, step_time_s=0.1, tokens_per_s=tps, correct=True).to_dict()
        rec["device"] = device
        rows.append(rec)
    return pd.DataFrame(rows)


def test_superlinear_cpu_scaling_is_noise_with_a_warning():
    df = frame({1: 1000.0, 2: 2100.0})  # 105% at 2 ranks
    pts = next(iter(figures.scaling_points(df).values()))
    assert [p["noise"] for p in pts] == [False, True]
    assert any("noise of this machine" in w and "105%" in w for w in warnings(df))


def test_sublinear_or_gpu_scaling_is_not_flagged():
    assert not any("noise" in w for w in warnings(frame({1: 1000.0, 2: 1800.0})))
    gpu = frame({1: 1000.0, 2: 2100.0}, device="cuda")
    assert not any(p["noise"] for pts in figures.scaling_points(gpu).values() for p in pts)
