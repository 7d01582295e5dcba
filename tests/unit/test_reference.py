import torch

from mgbench import suite as S
from mgbench.runner import reference


def tiny_config(**kw):
    text = 'name = "t"\n[sweep]\nmodel = "tiny"\nseq_len = 16\nmicro_batch = 2\nwarmup_steps = 1\nmeasured_steps = 2\n'
    cfg = S.expand(S.parse_suite(text, "t"), "cpu", 4)[0]
    return S.RunConfig(**{**cfg.to_dict(), **kw})


def test_compare_flags_a_mismatch_beyond_tolerance():
    ok = reference.compare([5.0, 4.9], [5.0, 4.9000001], "fp32")
    assert ok["correct"] is True and ok["loss_max_rel_diff"] < 1e-6
    bad = reference.compare([5.0, 4.8], [5.0, 4.9], "fp32")
    assert bad["correct"] is False
    assert abs(bad["loss_max_rel_diff"] - 0.1 / 4.9) < 1e-12
    assert "reference" in bad["correct_reason"]


def test_reference_is_deterministic_and_sensitive_to_the_batch(tmp_path):
    cfg = tiny_config(check_steps=3)
    a = reference.reference_losses(cfg, torch.device("cpu"), tmp_path / "a")
    b = reference.reference_losses(cfg, torch.device("cpu"), tmp_path / "b")
    assert a == b and len(a) == 3
    # Training moves the loss from step to step.
    assert a[0] != a[2]
    # A different global batch (2 ranks' worth) is a different trajectory: the check
    # would catch a strategy that dropped or duplicated a rank's data.
    other = reference.reference_losses(tiny_config(check_steps=3, nproc=2, dp=2), torch.device("cpu"), tmp_path / "c")
    assert not reference.compare(other, a, "fp32")["correct"]


def test_reference_is_cached_in_the_run_folder(tmp_path):
    cfg = tiny_config(check_steps=2)
    reference.reference_losses(cfg, torch.device("cpu"), tmp_path)
    files = list((tmp_path / "reference").glob("*.json"))
    assert len(files) == 1
