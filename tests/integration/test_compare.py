"""`mgbench compare`: repeated identical runs stay `~`; an injected 30% slowdown is flagged."""

import json

SUITE = """name = "cmp"
[sweep]
model = "mini"
strategy = ["single", "ddp", "zero1"]
nproc = [1]
micro_batch = 2
seq_len = 64
warmup_steps = 3
measured_steps = 25
check_steps = 0
"""


def test_compare_flags_a_30_percent_slowdown_and_gates(cli, tmp_path):
    """End to end on real runs. This VM's throughput drifts by up to 40% between runs a
    minute apart (measured: 4,965 vs 6,913 tokens/s for back-to-back identical runs),
    so the three runs are measured again, up to three times, until one set is free of
    a drift phase; the verdict logic itself is tested deterministically in
    tests/unit/test_compare.py."""
    (tmp_path / "c.toml").write_text(SUITE)
    failures = []
    for attempt in range(3):
        ids = {k: f"{k}{attempt}" for k in ("a", "slow", "b")}
        for key, extra in (("a", []), ("slow", ["--set", 'inject="slow@rank=0,factor=1.3"']), ("b", [])):
            p = cli("run", "c.toml", "--run-id", ids[key], "--no-report", *extra)
            assert p.returncode == 0, p.stderr
        same = json.loads(cli("compare", ids["a"], ids["b"], "--json").stdout)["rows"]
        slow = json.loads(cli("compare", ids["a"], ids["slow"], "--json").stdout)["rows"]
        unchanged = sum(r["verdict"] == "~" for r in same)
        flagged = sum(r["verdict"] == "worse" for r in slow)
        if unchanged >= 2 and flagged == 3:
            break
        failures.append((unchanged, flagged, [round(r["change_pct"]) for r in same + slow]))
    else:
        raise AssertionError(f"3 attempts, (unchanged of 3, flagged of 3, changes %): {failures}")
    gate = cli("compare", ids["a"], ids["slow"], "--fail-on", "tokens_per_s:-5%")
    assert gate.returncode == 1 and "GATE FAILED" in gate.stdout
    assert cli("compare", ids["a"], ids["slow"], "--fail-on", "tokens_per_s:-90%").returncode == 0
    bad = cli("compare", ids["a"], ids["slow"], "--fail-on", "speed:-5")
    assert bad.returncode == 2 and "expected METRIC:-N%" in bad.stderr
    # A report of two runs of one suite carries the comparison.
    rep = cli("report", ids["a"], ids["slow"], "-o", "cmp.html")
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "cmp.html").read_text()
    assert ">Comparison</h2>" in html and "worse" in html
