"""`mgbench comm` on gloo CPU ranks, and the profiled split of training steps."""

import json
import time

import pytest

from mgbench import store

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def check_rows(out, nproc):
    """What holds for any measurement: values right, nccl-tests' bandwidth arithmetic."""
    rows = out["rows"]
    assert {r["collective"] for r in rows} == set(FACTORS)
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["busbw_factor"] == FACTORS[r["collective"]](nproc)
        assert r["busbw_gbps"] / r["algbw_gbps"] == pytest.approx(FACTORS[r["collective"]](nproc), rel=1e-12)
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
    assert "no GPU interconnect" in out["interconnect"]["summary"]
    assert set(out["fits"]) == {f"{c}:float32:all" for c in FACTORS}


def test_comm_sweep_like_nccl_tests_its_table_and_report(cli, tmp_path):
    """2 ranks here; 4 ranks run in test_multinode's two-node sweep (2 x 2), and the busbw
    factors for 2, 4 and 8 ranks are checked by hand in tests/unit/test_collectives.py.
    One sweep serves the JSON, the table (the function the command prints) and the report."""
    from mgbench.comm.run import render

    p = cli("comm", "--json", "--run-id", "t", "--max-bytes", "262144", "--iters", "10")  # default: 2 CPU ranks
    assert p.returncode == 0, p.stderr
    check_rows(json.loads(p.stdout), 2)
    table = render(tmp_path / "results" / "t", None)
    assert "busbw(GB/s)" in table and "#wrong" in table and "out of bounds values: 0" in table
    assert "copy bandwidth: copy bandwidth needs a GPU" in table  # said, not measured, on CPU
    rep = cli("report", "t", "-o", "c.html")
    assert rep.returncode == 0, rep.stderr
    assert "Collective bus bandwidth vs message size" in (tmp_path / "c.html").read_text()
    bad = cli("comm", "--nproc", "99")
    assert bad.returncode == 2 and "--nproc 99" in bad.stderr


@pytest.mark.live
@pytest.mark.parametrize("nproc", [2, 4])
def test_comm_alpha_beta_fit_holds_on_a_quiet_machine(cli, nproc):
    """Judges this machine's timing noise: the alpha-beta fit explains the measured times
    within 25% (best of 3 sweeps; the VM's speed drifts between runs)."""
    best: dict[str, float] = {}
    for attempt in range(3):
        t0 = time.monotonic()
        p = cli("comm", "--nproc", str(nproc), "--json", "--run-id", f"c{nproc}-{attempt}")
        assert p.returncode == 0, p.stderr
        assert time.monotonic() - t0 < 120
        out = json.loads(p.stdout)
        check_rows(out, nproc)
        for k, f in out["fits"].items():
            best[k] = min(best.get(k, float("inf")), f["fit_mean_abs_error_pct"])
        if all(e < 25 for e in best.values()):
            break
    else:
        raise AssertionError(f"alpha-beta fit errors (best of 3 measurements) over 25%: {best}")


PROFILE_SUITE = """name = "prof"
[sweep]
model = "{model}"
strategy = ["ddp", "fsdp"]
nproc = {nproc}
micro_batch = 2
seq_len = 64
warmup_steps = 2
measured_steps = {measured}
check_steps = 2
profile = true
track_memory = false
"""


def profiled_records(cli, tmp_path, nproc: str, model: str = "mini", measured: int = 6):
    (tmp_path / "p.toml").write_text(PROFILE_SUITE.format(nproc=nproc, model=model, measured=measured))
    p = cli("run", "p.toml", "--run-id", "prof")
    assert p.returncode == 0, p.stderr
    recs = {(r["strategy"], r["nproc"]): r for r in store.read_records(tmp_path / "results" / "prof")}
    for r in recs.values():
        assert r["status"] == "ok"
        parts = r["breakdown_compute_s"] + r["breakdown_exposed_comm_s"] + r["breakdown_idle_s"]
        assert parts == pytest.approx(r["breakdown_window_s"], rel=1e-9)
        assert r["breakdown_overlapped_comm_s"] + r["breakdown_exposed_comm_s"] == pytest.approx(r["breakdown_comm_s"])
        assert 0 < r["comm_fraction"] < 1
    return recs


def test_profiled_breakdown_adds_up(cli, tmp_path):
    """The parts add up to the profiled step exactly (same intervals), and the report shows them.
    The tiny model and 2 timed steps: what is checked here is arithmetic, not timing (the live
    test below judges timing on "mini")."""
    profiled_records(cli, tmp_path, "2", model="tiny", measured=2)
    assert "Where the step time goes" in (tmp_path / "reports" / "prof.html").read_text()


@pytest.mark.live
def test_profiled_breakdown_tracks_the_timed_step_and_grows_with_world_size(cli, tmp_path):
    """Judges timing: the profiled step may be slower than the timed median because the
    profiler adds per-op overhead (+7% to +36% seen on this machine), and the two are
    measured seconds apart on VMs whose speed moves 20-60% in seconds (seen in CI), so the
    bound is 0.5x to 2.2x: still far from the 3x a window summed over its 3 profiled steps
    would show. Communication's share grows from 2 to 4 ranks."""
    recs = profiled_records(cli, tmp_path, "[2, 4]")
    for r in recs.values():
        assert 0.5 * r["step_time_s"] < r["breakdown_window_s"] < 2.2 * r["step_time_s"]
    for strat in ("ddp", "fsdp"):
        assert recs[(strat, 4)]["comm_fraction"] > recs[(strat, 2)]["comm_fraction"], strat


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_interrupted_comm_sweep_is_recorded_as_interrupted(tmp_path, sig):
    """An interrupted `mgbench comm` stayed "running" forever (no pid recorded for `status`
    to see it gone, SIGTERM ended it outright); now it is "interrupted", exit 130, as `run`."""
    import json
    import signal
    import subprocess
    import sys
    import time

    p = subprocess.Popen([sys.executable, "-m", "mgbench.cli", "comm", "--run-id", "c1", "--iters", "200",
                          "--max-bytes", "16777216"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    manifest = tmp_path / "results" / "c1" / "manifest.json"
    deadline = time.time() + 60
    while not manifest.exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # the ranks are measuring
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted" in err, err
    m = json.loads(manifest.read_text())
    assert m["status"] == "interrupted" and isinstance(m["pid"], int)
    status = subprocess.run([sys.executable, "-m", "mgbench.cli", "status", "c1"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert status.returncode == 0 and "run c1: interrupted" in status.stdout, status.stdout + status.stderr
