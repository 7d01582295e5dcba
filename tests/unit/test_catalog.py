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


# Issue 15 defect 6: "H200" also matched H200 NVL and GH200, and every A100 that was not
# a 40 GB PCIe card fell into the SXM 80 GB entry. Names as torch / NVML report them.
@pytest.mark.parametrize(
    "name,memory_gib,key,bf16",
    [
        ("NVIDIA H200", 139.8, "h200", 989.0),
        ("NVIDIA H200 NVL", 139.8, "h200-nvl", 835.0),
        ("NVIDIA GH200 480GB", 95.0, "gh200-96gb", 989.0),
        ("NVIDIA GH200 144G HBM3e", 142.0, "gh200-144gb", 989.0),
        ("NVIDIA A100-SXM4-40GB", 39.4, "a100-sxm-40gb", 312.0),
        ("NVIDIA A100-SXM4-80GB", 79.2, "a100-sxm-80gb", 312.0),
        ("NVIDIA A100 80GB PCIe", 79.2, "a100-pcie-80gb", 312.0),
        ("NVIDIA A100-PCIE-40GB", 39.4, "a100-pcie-40gb", 312.0),
        # a name that does not say which variant: the memory does
        ("NVIDIA A100", 39.4, "a100-sxm-40gb", 312.0),
        ("NVIDIA A100", 79.2, "a100-sxm-80gb", 312.0),
        ("NVIDIA GH200", 142.0, "gh200-144gb", 989.0),
    ],
)
def test_variants_are_told_apart_by_name_then_memory(name, memory_gib, key, bf16):
    assert catalog.match_accelerator(name, memory_gib) == key
    value, reason = catalog.peak_tflops(name, "bf16", memory_gib)
    assert value == bf16 and key in reason


def test_a_shared_name_without_memory_has_no_peak_and_says_why():
    assert catalog.match_accelerator("NVIDIA A100") is None
    value, reason = catalog.peak_tflops("NVIDIA A100", "bf16")
    assert value is None and "shared by a100-sxm-40gb, a100-sxm-80gb" in reason and "memory" in reason
    value, reason = catalog.peak_tflops("NVIDIA A100", "bf16", memory_gib=60.0)
    assert value is None and "60.0 GiB fits none" in reason


def test_fp32_mfu_uses_the_tf32_peak_when_matmuls_ran_on_tf32():
    assert catalog.peak_tflops("NVIDIA H100 80GB HBM3", "fp32")[0] == 67.0
    value, reason = catalog.peak_tflops("NVIDIA H100 80GB HBM3", "fp32", fp32_matmul="tf32")
    assert value == 494.5 and "tf32 peak" in reason and "TF32 tensor cores" in reason
    # bf16 / fp16 configs are not affected by the fp32 matmul setting
    assert catalog.peak_tflops("NVIDIA H100 80GB HBM3", "bf16", fp32_matmul="tf32")[0] == 989.0
    assert catalog.peak_precision("fp32", "tf32") == "tf32" and catalog.peak_precision("bf16", "tf32") == "bf16"


def test_every_entry_with_a_memory_match_has_a_range():
    for key, acc in catalog.accelerators().items():
        m = acc.get("match_by_memory")
        if m:
            lo, hi = m["memory_gib"]
            assert lo < acc["memory_gb"] <= hi * 1.1 and m["names"], key


# Issue 29: the accelerators a 2026 buyer compares, by the names torch / NVML / ROCm report.
# GB200 is not a B200 and H800 is not an H100 (each has its own peaks); variants with other
# clocks or power (H800 PCIe, RTX 5090 D, the 300 W Max-Q, MI350X) are not claimed at all.
@pytest.mark.parametrize(
    "name,key,bf16",
    [
        ("NVIDIA H800", "h800", 989.0),
        ("NVIDIA H800 80GB HBM3", "h800", 989.0),
        ("NVIDIA H800 PCIe", None, None),
        ("NVIDIA GB200", "gb200", 2500.0),
        ("NVIDIA GB200 185GB", "gb200", 2500.0),
        ("NVIDIA B200", "b200", 2250.0),
        ("AMD Instinct MI325X", "mi325x", 1307.4),
        ("AMD Instinct MI355X", "mi355x", 2500.0),
        ("AMD Instinct MI350X", None, None),
        ("NVIDIA GeForce RTX 5090", "rtx-5090", 209.5),
        ("NVIDIA GeForce RTX 5090 D", None, None),
        ("NVIDIA GeForce RTX 5090 Laptop GPU", None, None),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada", None),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000", None),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000", None),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", None, None),
        # the existing entries keep their names
        ("NVIDIA RTX A6000", "rtx-a6000", 154.8),
        ("NVIDIA H100 80GB HBM3", "h100-sxm", 989.0),
    ],
)
def test_new_accelerators_match_their_own_entry_only(name, key, bf16):
    assert catalog.match_accelerator(name) == key
    value, reason = catalog.peak_tflops(name, "bf16")
    assert value == bf16
    if key is not None and bf16 is None:
        assert f"catalog has no bf16 peak for {key}" in reason


def test_every_catalog_link_and_system_cites_a_source():
    for key, link in catalog.links().items():
        assert link.get("source") and link.get("eff_source") and link.get("retrieved"), key
    for key, s in catalog.systems().items():
        assert s.get("source") and s.get("retrieved"), key
