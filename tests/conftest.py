import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# README's test command runs two pytest workers, each launching CPU ranks sized for the
# whole machine (mgbench gives ranks an equal share of the cores), so the cores are
# oversubscribed about 2x. OpenMP's idle threads then spin-wait at every parallel region's
# barrier by default, burning the cores the other worker's ranks need. Measured on the
# 2-core VM under load, the smoke suite at 1, 2 and 4 ranks (13 configs): 75 CPU-s and
# 234 s wall spinning, 46 CPU-s and 55 s passive. Set before any test imports torch
# (libgomp reads it once) and inherited by every rank the tests launch; a caller's own
# setting wins. No CI test asserts timings (those are the `live` tests).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_cli(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the real `mgbench` entry point in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "mgbench.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


# Test files that run the longest torchrun jobs, scheduled first: with two pytest workers
# (README's test command), a long file that starts last would leave one worker alone at
# the end. Measured CPU seconds per file (MGBENCH_TEST_CPU below) decide the list. xdist
# hands files out in this order (pytest_configure below turns its own reordering off).
LONGEST_FIRST = ("integration/test_parallelism_cpu.py", "unit/test_docs.py", "unit/test_check_gloo.py",
                 "integration/test_modern.py",
                 "integration/test_run_cpu.py", "integration/test_reliability.py", "integration/test_multinode.py",
                 "unit/test_memory_trace.py", "integration/test_hf_vision_cpu.py", "integration/test_comm_cpu.py",
                 "unit/test_tracked_memory.py", "integration/test_command_workload.py", "unit/test_strategies_gloo.py",
                 "unit/test_probe_time_share.py", "integration/test_compare.py", "integration/test_planner_cli.py",
                 "integration/test_data_disk.py", "integration/test_correctness.py", "unit/test_synthetic.py",
                 "unit/test_hf_tp.py", "unit/test_moe.py")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    # pytest-xdist (3.8 and later) hands out files by their number of tests unless told
    # not to; older versions keep collection order, which the sort below sets.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):  # type: ignore[no-untyped-def]
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests = Path(__file__).parent
    missing = [n for n in LONGEST_FIRST if not (tests / n).exists()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}"
    # stable: file order kept
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(LONGEST_FIRST)))
    # A test that skips without an optional extra says so in its skip reason ("mgbench[hf]",
    # "mgbench[fp8]"): marked `extras`, so that .ci/run can run them again once installed.
    for item in items:
        if any(EXTRA_HINT in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")):
            item.add_marker("extras")


EXTRA_HINT = "mgbench["


@pytest.fixture
def cli(tmp_path):
    def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return run_cli(*args, cwd=tmp_path, timeout=timeout)

    return _run


@pytest.fixture
def suites_dir():
    return REPO / "suites"


# CPU seconds per test (this process, every child it waited for and the ranks it ran
# through run_on_gloo_ranks, which a fork server reaps), for keeping CI under its time
# budget on a shared machine, where wall times say little:
#   MGBENCH_TEST_CPU=cpu.tsv python -m pytest ...   then   sort -t$'\t' -k2 -rn cpu.tsv
_CPU_LOG = os.environ.get("MGBENCH_TEST_CPU")


def _cpu_s() -> float:
    import resource

    from mgbench.runner.tolerance import RANKS_CPU_S

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + RANKS_CPU_S[0]


if _CPU_LOG:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):  # type: ignore[no-untyped-def]
        import time

        t0, w0 = _cpu_s(), time.time()
        yield
        with open(_CPU_LOG, "a") as f:  # test, CPU-s, its start and end (epoch s), the xdist worker
            f.write(f"{item.nodeid}\t{_cpu_s() - t0:.1f}\t{w0:.1f}\t{time.time():.1f}\t"
                    f"{os.environ.get('PYTEST_XDIST_WORKER', '-')}\n")
