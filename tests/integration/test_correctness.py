"""The correctness gate bites: suites/correctness.toml's injected training bugs are all
caught and its clean configs all pass.

CI runs the shipped suite reduced to seed 0 and 2 ranks (every strategy and schedule,
every bug that applies on 2 ranks; the 4-rank 3D sweep is skipped by its layout). The
full suite (2 and 4 ranks, 3 seeds) is `mgbench run correctness`; its counts are in
README."""

from collections import Counter

from mgbench import store


def verdicts(records):
    """(caught / injected, false alarms / clean), and the records that broke the rule."""
    ran = [r for r in records if r["status"] == "ok"]
    bugs = [r for r in ran if r["inject"].startswith("bug:")]
    clean = [r for r in ran if r["inject"] == "none"]
    missed = [r["label"] for r in bugs if r["correct"] is not False]
    alarms = [(r["label"], r["correct_reason"]) for r in clean if r["correct"] is not True]
    return len(bugs) - len(missed), len(bugs), len(alarms), len(clean), missed, alarms


def test_every_injected_bug_is_caught_and_no_clean_config_is_flagged(cli, suites_dir, tmp_path):
    p = cli("run", str(suites_dir / "correctness.toml"), "--run-id", "corr", "--no-report",
            "--set", "seed=0", "--set", "nproc=2")
    assert p.returncode == 0, p.stderr
    recs = store.latest_records(store.read_records(tmp_path / "results" / "corr"))
    caught, injected, alarms, clean, missed, false_alarms = verdicts(recs)
    print(f"\ncorrectness (seed 0, 2 ranks): caught {caught}/{injected} injected bugs, "
          f"false alarms {alarms}/{clean} clean configs")
    assert not missed and not false_alarms
    assert injected >= 25 and clean >= 10
    # Every bug kind was exercised, and each miss-read names what differed.
    kinds = Counter(r["inject"] for r in recs if r["status"] == "ok" and r["inject"] != "none")
    assert set(kinds) == {"bug:freeze", "bug:no_grad_sync", "bug:grad_sum", "bug:drop_micro_batch"}
    for r in recs:
        if r["status"] == "ok" and r["inject"] != "none":
            assert any(q in r["correct_reason"] for q in ("loss", "grad_norm", "params")), r["correct_reason"]
            assert "tolerance" in r["correct_reason"]
    # What cannot apply is a skip with its reason, never a silent pass.
    skipped = [r for r in recs if r["status"] == "skipped"]
    assert skipped and all(r["skip_reason"] for r in skipped)
