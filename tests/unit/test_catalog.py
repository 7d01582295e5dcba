import pytest

from mgbench import catalog


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA B200", "b200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("cpu: AMD EPYC", None),
    ],
)
def test_device_names_match_the_right_entry(name, key):
    assert catalog.match_accelerator(name) == key


def test_peaks_are_datasheet_values_and_unknown_is_none():
    assert catalog.peak_tflops("NVIDIA H100 80GB HBM3", "bf16")[0] == 989.0
    assert catalog.peak_tflops("NVIDIA H100 PCIe", "bf16")[0] == 756.0
    assert catalog.peak_tflops("NVIDIA A100-SXM4-80GB", "bf16")[0] == 312.0
    value, reason = catalog.peak_tflops("cpu: AMD EPYC", "fp32")
    assert value is None and "no peak FLOPS" in reason
    value, reason = catalog.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8")
    assert value is None and "fp8" in reason


def test_every_catalog_entry_cites_a_source():
    for key, acc in catalog.accelerators().items():
        assert acc.get("source") and acc.get("retrieved"), key
    for key, m in catalog.model_presets().items():
        assert m.get("source"), key
