"""The check window's reference and comparison."""

import torch

from mgbench.runner import check, reference
from mgbench.runner.tolerance import check_config
from mgbench.store import RunDir

FIGS = {"losses": [5.5, 5.4, 5.3], "grad_norm": 2.0, "param_norm": 25.0, "param_delta_norm": 0.9}


def test_compare_check_passes_equal_figures_and_names_what_differs():
    ok = check.compare_check(dict(FIGS), FIGS, "fp32")
    assert ok["correct"] is True and ok["correct_reason"] is None and ok["check_mismatches"] == []
    assert ok["loss_max_rel_diff"] == 0.0 and ok["grad_norm_ref"] == 2.0 and ok["check_losses_ref"] == FIGS["losses"]
    bad = check.compare_check({**FIGS, "grad_norm": 4.0}, FIGS, "fp32")
    assert bad["correct"] is False and bad["check_mismatches"] == ["grad_norm"]
    assert bad["grad_norm_rel_diff"] == 1.0
    assert "grad_norm" in bad["correct_reason"] and "1.00e+00" in bad["correct_reason"]
    assert f"tolerance {check.TOLERANCES['fp32']['grad_norm']:.3g}" in bad["correct_reason"]
    frozen = check.compare_check({**FIGS, "losses": [5.5, 5.5, 5.5], "param_delta_norm": 0.0}, FIGS, "fp32")
    assert frozen["check_mismatches"] == ["loss", "params"]
    assert "check step 3" in frozen["correct_reason"] and "change since init" in frozen["correct_reason"]
    assert frozen["param_rel_diff"] == 1.0


def test_compare_check_lossy_tolerance_and_nothing_checked():
    near = {**FIGS, "grad_norm": 2.0 * 1.03}
    assert check.compare_check(near, FIGS, "fp32")["correct"] is False
    lossy = check.compare_check(near, FIGS, "fp32", lossy=True)
    assert lossy["correct"] is True and lossy["lossy"] is True
    assert lossy["grad_norm_tolerance"] == check.LOSSY_TOLERANCE
    none = check.compare_check({"losses": []}, {"losses": []}, "fp32")
    assert none["correct"] is None and "check_steps = 0" in none["correct_reason"]


def test_reference_check_is_cached_and_reduction_order_stays_within_tolerance(tmp_path):
    cfg = check_config("ddp", check_steps=2)
    cpu = torch.device("cpu")
    a = reference.reference_check(cfg, cpu, tmp_path)
    path = RunDir(tmp_path).reference(reference.check_key(cfg, cpu))
    assert path.exists() and len(a["losses"]) == 2 and a["param_delta_norm"] > 0
    assert reference.reference_check(cfg, cpu, tmp_path) == a
    # The key ignores strategy and injected bug, and follows the global batch.
    assert reference.check_key(check_config("fsdp", check_steps=2, inject="bug:freeze"), cpu) == reference.check_key(cfg, cpu)
    assert reference.check_key(check_config("ddp", check_steps=2, nproc=4), cpu) != reference.check_key(cfg, cpu)
    rev = reference.reference_check(cfg, cpu, tmp_path, reverse_micro_batches=True)
    assert rev != a  # another reduction order rounds differently ...
    assert check.compare_check(rev, a, "fp32")["correct"] is True  # ... within the tolerance


def test_missing_or_overflowed_figures_never_pass():
    """A window that reports fewer steps, or a figure only one side has, is a mismatch;
    a figure neither side has a finite value for (fp16 overflow in both) is not compared."""
    short = check.compare_check({**FIGS, "losses": FIGS["losses"][:2]}, FIGS, "fp32")
    assert short["correct"] is False and "2 check step(s) reported against 3" in short["correct_reason"]
    empty = check.compare_check({**FIGS, "losses": []}, FIGS, "fp32")
    assert empty["correct"] is False
    one_sided = check.compare_check({**FIGS, "grad_norm": None}, FIGS, "fp32")
    assert one_sided["correct"] is False and "grad_norm" in one_sided["check_mismatches"]
    assert "missing vs 2" in one_sided["correct_reason"]
    inf = float("inf")
    both = check.compare_check({**FIGS, "grad_norm": inf}, {**FIGS, "grad_norm": inf}, "fp16")
    assert both["correct"] is True and both["grad_norm_rel_diff"] is None
    assert check.compare_check({**FIGS, "grad_norm": inf}, FIGS, "fp16")["correct"] is False
