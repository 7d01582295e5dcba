import pytest

from mgbench.collectives import busbw_factor
from mgbench.comm.fit import fit
from mgbench.comm.worker import sizes
from mgbench.telemetry import breakdown as B
from mgbench.telemetry.interconnect import infiniband


@pytest.mark.parametrize("name,n,factor", [("all_reduce", 4, 1.5), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
                                           ("reduce_scatter", 8, 0.875), ("all_to_all", 2, 0.5),
                                           ("broadcast", 4, 1.0), ("sendrecv", 4, 1.0)])
def test_nccl_tests_bus_bandwidth_factors(name, n, factor):
    assert busbw_factor(name, n) == factor


def test_alpha_beta_fit_recovers_a_known_line():
    rows = [{"size_bytes": s, "time_s": 20e-6 + s / 5e9} for s in sizes(4096, 16 * 2**20, 2)]
    f = fit(rows)
    assert f["alpha_s"] == pytest.approx(20e-6, rel=1e-4)
    assert f["bw_gbps"] == pytest.approx(5.0, rel=1e-4)
    assert f["fit_mean_abs_error_pct"] < 1e-3
    assert f["num_points"] == len([s for s in sizes(4096, 16 * 2**20, 2) if s >= 65536])


def test_fit_resists_one_outlier():
    rows = [{"size_bytes": s, "time_s": 20e-6 + s / 5e9} for s in sizes(65536, 16 * 2**20, 2)]
    rows[3]["time_s"] *= 3
    f = fit(rows)
    assert f["bw_gbps"] == pytest.approx(5.0, rel=0.02)


def test_interval_algebra():
    assert B.union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert B.intersect([(0, 3), (5, 6)], [(2, 5.5)]) == [(2, 3), (5, 5.5)]
    assert B.subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]


def test_split_adds_up_by_hand():
    # window 0..10: compute 0..4 and 6..8; comm 3..7 -> overlapped 1 (3..4) + 1 (6..7) = 2
    out = B.split([(0, 4), (6, 8)], [(3, 7)], (0, 10))
    assert out == {"compute_s": 6, "comm_s": 4, "overlapped_comm_s": 2, "exposed_comm_s": 2, "idle_s": 2,
                   "window_s": 10}
    assert out["compute_s"] + out["exposed_comm_s"] + out["idle_s"] == out["window_s"]


def test_infiniband_ports_read_from_sysfs(tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    assert infiniband(str(tmp_path)) == [{"device": "mlx5_0", "port": "1", "state": "4: ACTIVE",
                                          "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}]
    assert infiniband(str(tmp_path / "none")) == []
