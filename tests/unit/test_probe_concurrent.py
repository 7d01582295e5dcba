"""The probe's concurrent kernel processes (probe/concurrent.py): a process that fails, one
that never finishes and one left waiting for the others each end the probe with a line
that says which, instead of a hang or a traceback."""

import pytest

from mgbench.errors import MgbenchError
from mgbench.probe import concurrent


def test_a_failing_process_is_named_with_its_error():
    # A model the catalog does not know: each process fails before timing anything.
    with pytest.raises(MgbenchError, match=r"the probe's 1 concurrent kernel processes failed: .*no-such-model"):
        concurrent.run_together(1, "no-such-model", 64, ["float32"], threads=1)


def test_a_process_that_does_not_finish_in_time_is_killed_and_said():
    with pytest.raises(MgbenchError, match=r"failed: process 0 did not finish within 0.01 s \(killed\)"):
        concurrent.run_together(1, "tiny", 64, ["float32"], threads=1, timeout_s=0.01)


def test_a_process_left_alone_at_the_barrier_gives_up(tmp_path, monkeypatch):
    monkeypatch.setattr(concurrent, "BARRIER_TIMEOUT_S", 0.05)
    with pytest.raises(SystemExit, match="probe process 0: the other 1 did not start within 0.05 s"):
        concurrent._barrier(str(tmp_path), 0, 2)


def test_the_first_failure_ends_the_wait_and_the_rest_are_killed(tmp_path):
    """A process that fails early ends the wait at once, instead of after the others'
    timeouts (a process beside it would sit at the barrier or in its gloo group)."""
    import subprocess
    import sys
    import time

    errs = [tmp_path / "err0.txt", tmp_path / "err1.txt"]
    codes = ["import time; time.sleep(60)", "import sys; sys.stderr.write('warming up\\nboom\\n'); sys.exit(3)"]
    procs = []
    for code, err in zip(codes, errs):
        with open(err, "w") as f:
            procs.append(subprocess.Popen([sys.executable, "-c", code], stderr=f))
    t0 = time.monotonic()
    assert concurrent._wait_all(procs, errs, timeout_s=60) == "process 1: boom"
    assert time.monotonic() - t0 < 30 and procs[0].poll() is not None  # the sleeper was killed, not waited for
