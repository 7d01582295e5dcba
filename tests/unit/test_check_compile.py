"""The correctness check of compiled configs against the eager reference, on the figures
the first H200 run measured (results/h200-compile-seeds, committed): compiled bf16 runs
that differ from eager by compiler rounding pass, the same figures on an eager config
fail, and every injected bug still fails with the compiled tolerances."""

from pathlib import Path

import pytest

from mgbench import store
from mgbench.runner import check

RESULTS = Path(__file__).resolve().parents[2] / "results"


def figures(rec, side=""):
    """A record's check figures as run_check returns them (side "_ref": the reference's)."""
    losses = rec["check_losses" + side]
    return {"losses": losses, **{q: rec[f"{q}{side}"] for q in ("grad_norm", "param_norm", "param_delta_norm")}}


def h200_compiled():
    recs = [r for d in ("h200-gpu-quick", "h200-compile-seeds")
            for r in store.latest_records(store.read_records(RESULTS / d))]
    return [r for r in recs if r["compile"] and r["precision"] == "bf16"]


def test_the_h200_compiled_runs_fail_as_eager_and_pass_as_compiled():
    recs = h200_compiled()
    assert len(recs) == 3 and not any(r["correct"] for r in recs)  # as recorded on the H200
    for r in recs:
        mine, ref = figures(r), figures(r, "_ref")
        assert check.compare_check(mine, ref, "bf16")["correct"] is False
        assert check.compare_check(mine, ref, "bf16", compiled=True)["correct"] is True


def test_compile_widens_only_where_measured():
    assert check.tolerances("bf16", False, compiled=False) == check.TOLERANCES["bf16"]
    assert check.tolerances("fp32", False, compiled=True) == check.TOLERANCES["fp32"]  # not measured compiled
    tol = check.tolerances("bf16", False, compiled=True)
    assert tol["param_delta_norm"] == pytest.approx(10 * 2.86e-3)
    assert tol["grad_norm"] == check.TOLERANCES["bf16"]["grad_norm"]  # 10 x 1.89e-4 is under bf16's own 2.77e-3
    assert check.tolerances("bf16", True, compiled=True)["loss"] == check.LOSSY_TOLERANCE


@pytest.mark.parametrize("bug", ["grad_sum", "drop_micro_batch", "freeze"])
def test_injected_bugs_still_fail_with_the_compiled_tolerances(bug):
    """The smallest shifts the injected bugs make (check.py): grad_norm x2 (grad_sum),
    grad_norm by 0.27 (a dropped micro-batch), no change at all (freeze)."""
    r = h200_compiled()[0]
    ref = figures(r, "_ref")
    mine = dict(ref)
    if bug == "grad_sum":
        mine["grad_norm"] = 2 * ref["grad_norm"]
    elif bug == "drop_micro_batch":
        mine["grad_norm"] = 1.27 * ref["grad_norm"]
    else:
        mine.update(losses=[ref["losses"][0]] * len(ref["losses"]), param_delta_norm=0.0)
    out = check.compare_check(mine, ref, "bf16", compiled=True)
    assert out["correct"] is False
    assert ("params" if bug == "freeze" else "grad_norm") in out["check_mismatches"]


def test_the_worker_passes_the_configs_compile_flag_to_the_check(monkeypatch, tmp_path):
    """The H200 figures above pass only if the worker says the config was compiled: the
    record's verdict comes from worker.correctness, which must hand cfg.compile on."""
    from mgbench.runner import worker
    from tests.factories import make_config

    r = h200_compiled()[0]
    monkeypatch.setattr(worker.reference, "reference_check", lambda cfg, device, run_dir: figures(r, "_ref"))
    for compiled, verdict in ((True, True), (False, False)):
        cfg = make_config(model="tiny", precision="bf16", compile=compiled)
        out = worker.correctness(cfg, figures(r), None, tmp_path)
        assert out["correct"] is verdict
        assert out["param_delta_tolerance"] == pytest.approx(0.0286 if compiled else 2e-3)
