import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the real `mgbench` entry point in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "mgbench.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.fixture
def cli(tmp_path):
    def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return run_cli(*args, cwd=tmp_path, timeout=timeout)

    return _run


@pytest.fixture
def suites_dir():
    return REPO / "suites"
