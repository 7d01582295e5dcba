"""What the manifest says connects the GPUs, read through a fake NVML that answers with
pynvml's real function names (tests/unit/nvml_fake.py)."""

import pynvml
import pytest

from mgbench.comm.run import link_peak, pcie_peak
from mgbench.telemetry.interconnect import gpu_links, summary
from mgbench.telemetry.nvml_device import NVLINK_VERSIONS, nvlink_version
from tests.unit.nvml_fake import FakeNVML, host, install_cuda


def test_only_the_visible_gpus_are_listed(monkeypatch):
    """Defect 13: NVML counts every GPU of the host; a job given GPUs 2 and 3 listed all
    eight, numbered as NVML numbers them."""
    gpus = host(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    install_cuda(monkeypatch, [gpus[3], gpus[2]])
    listed = gpu_links(FakeNVML(gpus))["gpus"]
    assert [(g["index"], g["nvml_match"]) for g in listed] == [(0, f"PCI bus id {gpus[3].pci}"),
                                                               (1, f"PCI bus id {gpus[2].pci}")]


def test_pcie_max_is_recorded_beside_the_idle_current_link(monkeypatch):
    """Defect 5: an idle H100 reports its link at Gen1; the link is Gen5 x16."""
    gpus = host(1, pcie=(1, 16, 5, 16), nvlinks=0)
    install_cuda(monkeypatch, gpus)
    g = gpu_links(FakeNVML(gpus))["gpus"][0]
    assert (g["pcie_gen"], g["pcie_width"], g["pcie_gen_max"], g["pcie_width_max"]) == (1, 16, 5, 16)
    line = summary([g], [])
    assert "PCIe gen5 x16 (now gen1 x16" in line and "no active NVLink" in line


def test_link_peak_uses_the_maximum_pcie_generation_and_width():
    idle = {"interconnect": {"gpus": [{"name": "NVIDIA H100 PCIe", "pcie_gen": 1, "pcie_width": 16,
                                       "pcie_gen_max": 5, "pcie_width_max": 16, "nvlinks_active": 0}]}}
    peak, why = link_peak(idle, None)
    assert peak == pytest.approx(63.0) and "pcie5" in why  # gen1 gave no peak at all
    narrow = {"pcie_gen_max": 4, "pcie_width_max": 8}
    assert pcie_peak(narrow)[0] == pytest.approx(31.5 / 2)
    old = {"interconnect": {"gpus": [{"name": "NVIDIA H100 PCIe", "pcie_gen": 5, "pcie_width": 16}]}}
    peak, why = link_peak(old, None)  # a folder with the current link only: no guess from it
    assert peak is None and "idles at Gen1" in why


def test_nvlink_version_is_the_generation_not_nvmls_enum(monkeypatch):
    """Defect 13: nvmlDeviceGetNvLinkVersion returns NVML_NVLINK_VERSION_4_0 = 6 on an
    H100; the manifest said version 6."""
    gpus = host(2, nvlink_enum=pynvml.NVML_NVLINK_VERSION_4_0)
    install_cuda(monkeypatch, gpus)
    listed = gpu_links(FakeNVML(gpus))["gpus"]
    link = listed[0]["nvlinks"][0]
    assert link["version"] == "4.0" and link["version_nvml_enum"] == 6
    assert listed[0]["nvlinks_active"] == 18
    assert "36 active NVLink links (NVLink 4.0)" in summary(listed, [])


def test_nvlink_table_matches_the_bindings_constants():
    consts = {getattr(pynvml, n): n.removeprefix("NVML_NVLINK_VERSION_").replace("_", ".")
              for n in dir(pynvml) if n.startswith("NVML_NVLINK_VERSION_") and not n.endswith("INVALID")}
    assert consts == NVLINK_VERSIONS
    assert nvlink_version(4) == "3.0" and nvlink_version(99) is None


def test_detect_on_a_gpu_host_writes_the_summary_line(monkeypatch):
    """Found on the first H200 (2026-11-27): every `mgbench run` and the selftest stopped
    in detect() with UnboundLocalError, because the no-GPU branch bound a local named
    `summary`, hiding the function for the GPU branch. CI has no GPU, so the GPU branch is
    taken here on a fake host: device nodes, CUDA and NVML all answering."""
    from mgbench.telemetry import interconnect, machine

    gpus = host(2, nvlink_enum=pynvml.NVML_NVLINK_VERSION_4_0)
    install_cuda(monkeypatch, gpus)
    monkeypatch.setattr(machine, "gpu_device_nodes", lambda: ["/dev/nvidia0", "/dev/nvidia1"])
    monkeypatch.setattr(interconnect, "_cuda_available", lambda: True)
    monkeypatch.setattr(interconnect, "gpu_links", lambda: gpu_links(FakeNVML(gpus)))
    monkeypatch.setattr(interconnect, "topo_matrix", lambda: None)
    found = interconnect.detect()
    assert found["summary"].startswith("2 GPU(s); 36 active NVLink links (NVLink 4.0)")
    assert [g["index"] for g in found["gpus"]] == [0, 1]
