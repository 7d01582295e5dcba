"""`mgbench compare`: repeated identical runs stay `~`; an injected 30% slowdown is flagged."""

import json

from mgbench import store

SUITE = """name = "cmp"
[sweep]
model = "mini"
strategy = ["single", "ddp", "zero1"]
nproc = 1
micro_batch = 2
seq_len = 64
warmup_steps = 3
measured_steps = 25
check_steps = 0
seed = [0, 1]
inject = ["none", "slow@rank=0,factor=1.3"]
"""


def split_run(results, source: str, name: str, keep) -> None:
    """A run folder holding some of another run's records (same manifest, new id)."""
    src = results / source
    dst = store.create_run_dir(results, name)
    manifest = store.read_manifest(src)
    manifest["run_id"] = name
    store.write_json_atomic(dst / "manifest.json", manifest)
    for rec in store.read_records(src):
        if keep(rec):
            store.append_record(dst, {**rec, "run_id": name})


def test_compare_flags_a_30_percent_slowdown_and_gates(cli, tmp_path):
    """Real measurements, taken interleaved. This VM's throughput drifts by up to 40%
    between runs a minute apart (4,965 vs 6,913 tokens/s for back-to-back identical
    runs), more than the effect to detect; so the "runs" compared here are measured in
    one sweep, config after config (seed 0, its 30%-slowed twin, seed 1), and split into
    three run folders. `compare` itself only ever sees run folders. Even seconds apart
    identical configs differ by up to 20% here, so the sweep is measured again (up to
    three times) until one measurement is free of such a jump."""
    (tmp_path / "c.toml").write_text(SUITE)
    results = tmp_path / "results"
    seen = []
    for k in range(3):
        p = cli("run", "c.toml", "--run-id", f"all{k}", "--no-report")
        assert p.returncode == 0, p.stderr
        a, b, slow_id = f"a{k}", f"b{k}", f"slow{k}"
        split_run(results, f"all{k}", a, lambda r: r["seed"] == 0 and r["inject"] == "none")
        split_run(results, f"all{k}", b, lambda r: r["seed"] == 1 and r["inject"] == "none")
        split_run(results, f"all{k}", slow_id, lambda r: r["seed"] == 0 and r["inject"] != "none")
        same = json.loads(cli("compare", a, b, "--json").stdout)["rows"]
        slow = json.loads(cli("compare", a, slow_id, "--json").stdout)["rows"]
        assert len(same) == len(slow) == 3
        seen.append(([round(r["change_pct"]) for r in same], [round(r["change_pct"]) for r in slow]))
        # Most configs unchanged, and every slowed one flagged.
        if sum(r["verdict"] == "~" for r in same) >= 2 and all(r["verdict"] == "worse" for r in slow):
            break
    else:
        raise AssertionError(f"3 measurements, (identical changes %, slowed changes %): {seen}")
    gate = cli("compare", a, slow_id, "--fail-on", "tokens_per_s:-5%")
    assert gate.returncode == 1 and "GATE FAILED" in gate.stdout
    assert cli("compare", a, slow_id, "--fail-on", "tokens_per_s:-90%").returncode == 0
    bad = cli("compare", a, slow_id, "--fail-on", "speed:-5")
    assert bad.returncode == 2 and "expected METRIC:-N%" in bad.stderr
    # A report of two runs of one suite carries the comparison.
    rep = cli("report", a, slow_id, "-o", "cmp.html")
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "cmp.html").read_text()
    assert ">Comparison</h2>" in html and "worse" in html
