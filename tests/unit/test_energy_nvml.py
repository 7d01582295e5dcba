"""The GPU energy meter against a fake NVML that answers through pynvml's real function
names (tests/unit/nvml_fake.py checks them), on a host whose GPUs CUDA and NVML number
differently."""

import time
import types

import pytest
import torch

from mgbench.telemetry import energy as E
from mgbench.telemetry.nvml_device import NvmlDeviceUnknown, nvml_handle
from tests.factories import make_config, make_rank_figures
from tests.unit.nvml_fake import FakeNVML, host, install_cuda


def test_the_fake_uses_only_names_the_binding_has():
    import pynvml

    assert hasattr(pynvml, "nvmlDeviceGetHandleByPciBusId")
    assert not hasattr(pynvml, "nvmlDeviceGetHandleByPciBusId_v2")  # the name mgbench used to call
    FakeNVML(host(1))  # its constructor asserts every nvml* method exists in pynvml


# Defect 1: the handle of CUDA device i is the NVML device of the same board.

def test_uuid_visible_devices_resolve_to_the_right_gpu_by_pci_address(monkeypatch):
    """CUDA_VISIBLE_DEVICES holds UUIDs in an order unlike NVML's: CUDA device 0 is NVML
    GPU 3. The old code's PCI call (a name pynvml lacks) failed silently and its index
    fallback read NVML GPU 0."""
    gpus = host(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{gpus[3].uuid},{gpus[1].uuid}")
    install_cuda(monkeypatch, [gpus[3], gpus[1]])
    nvml = FakeNVML(gpus)
    h, how = nvml_handle(nvml, 0)
    assert h == 3 and how == f"PCI bus id {gpus[3].pci}"
    assert nvml_handle(nvml, 1)[0] == 1


def test_uuid_then_visible_uuid_when_pci_lookup_fails(monkeypatch):
    gpus = host(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{gpus[2].uuid[:12]},{gpus[0].uuid}")
    install_cuda(monkeypatch, [gpus[2], gpus[0]])
    nvml = FakeNVML(gpus, pci_lookup=False)
    assert nvml_handle(nvml, 0) == (2, f"UUID {gpus[2].uuid}")
    nvml = FakeNVML(gpus, pci_lookup=False, uuid_lookup=False)
    h, how = nvml_handle(nvml, 0)  # the UUID prefix in CUDA_VISIBLE_DEVICES, matched over NVML's UUIDs
    assert h == 2 and how.startswith(f"UUID prefix {gpus[2].uuid[:12]}")


def test_index_fallback_only_where_the_orders_agree(monkeypatch):
    gpus = host(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    install_cuda(monkeypatch, [gpus[3], gpus[1]])
    nvml = FakeNVML(gpus, pci_lookup=False, uuid_lookup=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with pytest.raises(NvmlDeviceUnknown, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        nvml_handle(nvml, 1)  # CUDA's default order (fastest first) may not be NVML's
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    h, how = nvml_handle(nvml, 1)
    assert h == 1 and how.startswith("NVML index 1 (CUDA_VISIBLE_DEVICES entry)") and "lookups failed" in how


def test_meter_records_how_it_found_the_gpu_or_why_not(monkeypatch):
    gpus = host(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus[1].uuid)
    install_cuda(monkeypatch, [gpus[1]])
    meter = E.EnergyMeter("cuda", 0, 0, nvml=FakeNVML(gpus))
    assert meter.method == "nvml_counter" and meter.device_match == f"PCI bus id {gpus[1].pci}"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    install_cuda(monkeypatch, gpus)
    lost = E.EnergyMeter("cuda", 0, 0, nvml=FakeNVML(gpus, pci_lookup=False, uuid_lookup=False))
    lost.start()
    out = lost.stop()
    # No lookup works and CUDA's order may not be NVML's: no figure, and the reason,
    # rather than another GPU's energy.
    assert out["energy_j"] is None and "no NVML device matches CUDA device 0" in out["energy_reason"]


def test_mig_gpu_gives_no_per_rank_energy(monkeypatch):
    gpus = host(1, mig=True)
    install_cuda(monkeypatch, gpus)
    meter = E.EnergyMeter("cuda", 0, 0, nvml=FakeNVML(gpus))
    assert meter.method == "none" and "MIG" in meter.reason


# Defect 7: a minimum energy window, the counter's update interval recorded.

def test_counter_update_interval_is_probed_and_sets_the_minimum_window(monkeypatch):
    gpus = host(1, energy_update_s=0.05)
    install_cuda(monkeypatch, gpus)
    meter = E.EnergyMeter("cuda", 0, 0, nvml=FakeNVML(gpus))
    assert 0.03 < meter.interval_s < 0.09  # 0.05 s, give or take a busy VM's polling delays
    assert meter.min_window_s == E.NVML_MIN_WINDOW_S  # 50 x 0.05 s = 2.5 s < the 5 s floor
    meter.start()
    out = meter.stop(steps=7)
    assert out["energy_update_interval_s"] == meter.interval_s and out["energy_min_window_s"] == 5.0
    assert out["energy_steps"] == 7 and out["energy_device_match"].startswith("PCI bus id")


def test_minimum_window_rules():
    assert E.min_window("nvml_counter", 0.1) == 5.0
    assert E.min_window("nvml_counter", 0.2) == 10.0  # 50 updates of a slower counter
    assert E.min_window("nvml_counter", 2.0) == E.MAX_MIN_WINDOW_S
    # did not change while probed: slower than the probe sees, so the longest window
    assert E.min_window("nvml_counter", None) == E.MAX_MIN_WINDOW_S
    assert E.min_window("rapl", 0.001) == pytest.approx(0.05)
    assert E.min_window("none", None) == 0.0


def test_a_short_window_gets_enough_steps_to_reach_the_minimum():
    # 10 steps in 0.5 s (gpt2-small on one GPU): 5 s needs 10 x (5.25 - 0.5) / 0.5 = 95 more
    assert E.steps_to_fill(5.0, 0.5, 10) == 95
    assert E.steps_to_fill(5.0, 6.0, 10) == 0
    assert E.steps_to_fill(0.0, 0.5, 10) == 0
    assert E.steps_to_fill(5.0, 0.5, 0) == 0


def _top_up_on_rank(min_windows):
    """Rank function: a meter whose minimum is this rank's, 10 steps done in ~0.1 s."""
    import torch.distributed as dist

    meter = E.EnergyMeter("cpu", 0, local_rank=1)  # reads nothing; its minimum is set here
    meter.min_window_s = min_windows[dist.get_rank()]
    meter.start()
    time.sleep(0.1)
    return E.top_up_steps(meter, 10, torch.device("cpu"))


def test_every_rank_runs_the_same_top_up_steps():
    """Rank 0 needs a 5 s window, rank 1 (nothing to read) none: both run rank 0's
    count, or a collective in the extra steps would wait forever."""
    from mgbench.runner.tolerance import run_on_gloo_ranks

    steps = run_on_gloo_ranks(_top_up_on_rank, 2, [5.0, 0.0])
    assert steps[0] == steps[1] > 400  # ~ (5.25 - 0.1) / 0.01


def _fill_on_rank(step_s):
    """Rank function: 10 timed steps at 20 ms, then top-up steps of this rank's length."""
    import torch.distributed as dist

    meter = E.EnergyMeter("cpu", 0, local_rank=1)
    meter.min_window_s = 0.5
    meter.start()
    time.sleep(0.2)
    rounds = []

    def run_steps(first, count):
        rounds.append(count)
        time.sleep(step_s[dist.get_rank()] * count)
    extra = E.fill_window(meter, 10, torch.device("cpu"), run_steps)
    return extra, rounds, meter.elapsed()


def test_the_window_is_filled_when_top_up_steps_run_faster_than_timed_ones():
    """Seen on an H200: a 1-rank DDP config's top-up steps ran 20% faster than its timed
    steps, and the window, sized once from the timed pace, closed at 4.4 s of a 5 s
    minimum. The second round, sized at the first round's own pace, fills it."""
    from mgbench.runner.tolerance import run_on_gloo_ranks

    extra, rounds, elapsed = run_on_gloo_ranks(_fill_on_rank, 1, [0.004])[0]
    assert elapsed >= 0.5
    # The first round, ~ceil((1.05 x 0.5 - 0.2) / 0.02) = 17 steps at the timed pace, falls short alone
    assert len(rounds) >= 2 and rounds[0] <= 17
    assert extra == sum(rounds)


def test_ranks_at_different_paces_run_the_same_top_up_rounds():
    """Every rank runs the same steps (a collective in them would otherwise wait
    forever): the count is the most any rank needs, round by round."""
    from mgbench.runner.tolerance import run_on_gloo_ranks

    (e0, r0, t0), (e1, r1, t1) = run_on_gloo_ranks(_fill_on_rank, 2, [0.004, 0.002])
    assert r0 == r1 and e0 == e1 == sum(r0)
    assert min(t0, t1) >= 0.5


def test_energy_per_token_counts_the_top_up_steps(monkeypatch):
    """The window held 100 steps (10 timed + 90 top-up): energy per token divides by
    the tokens of all 100."""
    from mgbench.runner.worker import summarize_config

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    # MFU picks the catalog variant by the device's memory (real torch name, faked value)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(total_memory=80 * 2**30))

    cfg = make_config(measured_steps=10, warmup_steps=1)
    ranks = [make_rank_figures(r, windows=[[0.05] * 10], energy_j=500.0, window_s=5.0, energy_method="nvml_counter",
                               energy_reason=None, energy_steps=100, energy_min_window_s=5.0,
                               energy_update_interval_s=0.1, energy_device_match=f"PCI bus id {r}")
             for r in range(2)]
    out = summarize_config(cfg, ranks, torch.device("cuda"))
    tokens = cfg.global_batch * cfg.seq_len * 100
    assert out["energy_per_token_j"] == pytest.approx(1000.0 / tokens)
    assert out["num_energy_steps"] == 100 and out["energy_min_window_s"] == 5.0
    assert out["energy_update_interval_s"] == 0.1 and out["energy_device_match"] == ["PCI bus id 0", "PCI bus id 1"]
    # Defect 13: power_w is the total of both GPUs (labelled so); per device beside it.
    assert out["power_w"] == pytest.approx(200.0) and out["power_w_per_device"] == pytest.approx(100.0)


def test_power_w_is_labelled_a_total_over_devices():
    from mgbench.record import RECORD_FIELDS

    assert "total power of all devices" in RECORD_FIELDS["power_w"].metadata["help"]
    assert "sum" in RECORD_FIELDS["power_w"].metadata["help"]


# Defect 13: the power-sampling fallback covers the whole window.

def test_power_sampling_integrates_the_whole_window(monkeypatch):
    """Samples every 0.2 s over a 0.3 s window: the thread's samples span 0.2 s at most,
    so integrating only between them gave 2/3 of the energy."""
    gpus = host(1, has_counter=False, power_w=100.0)
    install_cuda(monkeypatch, gpus)
    meter = E.EnergyMeter("cuda", 0, 0, power_sample_s=0.2, nvml=FakeNVML(gpus))
    assert meter.method == "nvml_power_sampling"
    t0 = time.perf_counter()
    meter.start()
    time.sleep(0.3)
    out = meter.stop()
    wall = time.perf_counter() - t0
    assert 0.3 < out["window_s"] <= wall  # the samples alone span 0.2 s
    assert out["energy_j"] == pytest.approx(100.0 * out["window_s"], rel=1e-4)


@pytest.mark.gpu
def test_real_nvml_finds_this_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: resolves the real NVML handle of CUDA device 0")
    import pynvml

    pynvml.nvmlInit()
    h, how = nvml_handle(pynvml, 0)
    assert how.startswith("PCI bus id")
    assert pynvml.nvmlDeviceGetUUID(h).endswith(str(torch.cuda.get_device_properties(0).uuid))
    meter = E.EnergyMeter("cuda", 0, 0)
    assert meter.method in ("nvml_counter", "nvml_power_sampling") and meter.interval_s
    meter.start()
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):
        x = x @ x / 64
    torch.cuda.synchronize()
    out = meter.stop()
    assert out["energy_j"] is not None and out["energy_j"] > 0
