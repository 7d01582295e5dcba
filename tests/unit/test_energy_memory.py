from pathlib import Path

import torch

from mgbench.telemetry.energy import EnergyMeter, rapl_package_files
from mgbench.telemetry.memory import read_peak, reset_peak


def test_cpu_energy_is_null_with_reason_when_rapl_is_unreadable():
    meter = EnergyMeter("cpu", 0, local_rank=0)
    meter.start()
    out = meter.stop()
    if meter.method == "rapl":  # a bare-metal Linux host with readable counters
        assert out["energy_j"] is not None and out["energy_j"] >= 0
    else:
        assert not rapl_package_files() or meter.reason
        assert out["energy_j"] is None and out["energy_method"] == "none"
        assert "RAPL" in out["energy_reason"]


def test_non_zero_local_ranks_do_not_double_count_the_package():
    out = EnergyMeter("cpu", 0, local_rank=1)
    out.start()
    assert out.stop()["energy_reason"].startswith("RAPL counts the whole CPU package")


def test_cpu_peak_rss_resets_per_window():
    dev = torch.device("cpu")
    reset_peak(dev)
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB touched
    high = read_peak(dev)["mem_peak_gib"]
    del big
    method = reset_peak(dev)
    low = read_peak(dev)["mem_peak_gib"]
    assert high is not None and high > 0
    if method == "cpu_peak_rss_per_rank":
        assert low < high - 0.04  # the 64 MiB are gone from the new window's peak


def test_rapl_reads_packages_not_their_subzones(tmp_path):
    for zone in ("intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:1", "intel-rapl:1:0", "intel-rapl-mmio:0"):
        (tmp_path / zone).mkdir()
        (tmp_path / zone / "energy_uj").write_text("1000\n")
    names = [Path(f).parent.name for f in rapl_package_files(str(tmp_path))]
    assert names == ["intel-rapl:0", "intel-rapl:1"]
