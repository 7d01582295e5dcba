"""Device detection on the launcher side: torch-free where no GPU driver exists."""

import subprocess
import sys

from mgbench.telemetry import machine
from tests.conftest import REPO


def test_gpu_device_nodes_follow_the_patterns(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "GPU_DEVICE_NODES", (str(tmp_path / "nvidia[0-9]*"),))
    assert machine.gpu_device_nodes() is False
    (tmp_path / "nvidia0").touch()  # a driver's node appears: torch must be asked
    assert machine.gpu_device_nodes() is True


def test_a_cpu_host_is_detected_and_fingerprinted_without_importing_torch():
    code = ("import sys; from mgbench.launching import detect_devices; from mgbench.telemetry.machine import "
            "fingerprint, gpu_device_nodes; kind, n = detect_devices(); fp = fingerprint(); "
            "print(gpu_device_nodes(), kind, n >= 4, fp['torch'], fp['gpu_count'], 'torch' in sys.modules, "
            "fp['cuda'] is None and 'no CUDA device' in fp['cuda_reason'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    if out.split()[0] == "True":
        import pytest

        pytest.skip("this host has GPU device nodes: the torch-free path does not apply")
    nodes, kind, enough, version, gpus, imported, cuda_null_with_reason = out.split()
    assert (kind, enough, gpus, imported, cuda_null_with_reason) == ("cpu", "True", "0", "False", "True")
    assert version.startswith("2.")  # torch's version read from its package metadata
