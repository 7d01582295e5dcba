"""A data-loading sweep through the real CLI and torchrun (issue 18, part 3): data = "disk"
with num_workers 0 / 2 and pin_memory off / on records the data wait of every step, and
the config made input-bound on purpose is flagged in the records and by `mgbench show`.

How it is made input-bound: its dataset's index carries test_read_delay_s (a test-only
stand-in for slow storage that the reader sleeps per sample, and that the record's
data_method names), so it does not depend on how busy this machine is."""

import json

from mgbench import dataset, store

DELAY_S = 0.4  # per sample; 2 samples per step: 0.8 s of waiting against a tiny model's step (~10 ms idle)
MEASURED = 5

SUITE = """
name = "data-disk"
[[sweep]]
model = "tiny"
seq_len = 32
micro_batch = 2
warmup_steps = 1
measured_steps = {measured}
check_steps = 0
track_memory = false
data = "disk"
num_workers = [0, 2]
pin_memory = [false, true]

[[sweep]]
model = "tiny"
seq_len = 32
micro_batch = 2
warmup_steps = 1
measured_steps = {measured}
check_steps = 0
track_memory = false
data = "disk"
data_path = "{slow}"
"""


def test_data_loading_sweep_records_waits_and_flags_the_input_bound_config(tmp_path):
    from tests.conftest import run_cli

    slow = tmp_path / "slow"
    dataset.generate(slow, tokens=1000, vocab=256)
    index = json.loads((slow / "index.json").read_text())
    (slow / "index.json").write_text(json.dumps({**index, dataset.TEST_READ_DELAY: DELAY_S}))
    (tmp_path / "suite.toml").write_text(SUITE.format(measured=MEASURED, slow=slow))
    p = run_cli("run", "suite.toml", "--run-id", "d", "--no-report", "--no-projection", cwd=tmp_path)
    assert p.returncode == 0, p.stderr + p.stdout
    # the sweep's own dataset was generated once, sized to its steps, and shared by its 4 configs
    generated = [d for d in store.datasets_dir(tmp_path / "results").iterdir() if dataset.is_dataset(d)]
    assert len(generated) == 1 and p.stdout.count("generating a") == 1

    recs = store.read_records(tmp_path / "results" / "d")
    assert len(recs) == 5 and all(r["status"] == "ok" for r in recs), [r.get("error") for r in recs]
    by = {(r["data_path"], r["num_workers"], r["pin_memory"]): r for r in recs}
    fast = [by[(str(generated[0].resolve()), w, pin)] for w in (0, 2) for pin in (False, True)]
    flagged = by[(str(slow.resolve()), 0, False)]
    for r in recs:
        assert len(r["data_wait_steps_s"]) == MEASURED and len(r["data_wait_per_rank_s"]) == 1
        assert r["data_wait_s"] == r["data_wait_per_rank_s"][0] > 0
        assert r["input_bound"] == (r["data_wait_s"] / r["step_time_s"] > 0.1)
        assert f"DataLoader(num_workers={r['num_workers']}" in r["data_method"]
    assert all("pin_memory = true has no effect without CUDA" in r["data_method"] for r in fast if r["pin_memory"])
    # Reading in-process from a memmap takes well under a millisecond: never input-bound. Two
    # workers hand batches over through a queue, which a machine under heavy load can slow
    # to ~5% of a tiny model's step (seen here at load 10): only bounded against the slow one.
    assert not any(r["input_bound"] for r in fast if r["num_workers"] == 0), [r["data_wait_fraction"] for r in fast]
    assert all(r["data_wait_s"] < flagged["data_wait_s"] / 4 for r in fast)
    assert flagged["input_bound"] is True and flagged["data_wait_s"] >= 2 * DELAY_S
    assert "slowed on purpose" in flagged["data_method"]

    shown = run_cli("show", "d", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # show flags exactly the configs the records flag (the 2-worker ones may be, under load).
    assert shown.stdout.count("INPUT-BOUND") == sum(r["input_bound"] for r in recs)
    assert f"{flagged['config_id']}: input-bound" in shown.stdout
