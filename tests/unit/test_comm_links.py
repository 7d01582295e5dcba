import json

import pytest

from mgbench import catalog, store
from mgbench.errors import MgbenchError
from mgbench.planner import calibrate, hardware, perf
from mgbench.planner.search import PlanOptions, plan


def comm_run(root, gpu_name="NVIDIA H100 80GB HBM3", n=8):
    run = store.RunDir.create(root, "c")
    gpus = [{"index": 0, "name": gpu_name}] if gpu_name else []
    store.write_json_atomic(run.manifest, {"run_id": "c", "kind": "comm", "machine": {},
                                           "interconnect": {"gpus": gpus}})
    # A row without schema_version (written before rows were versioned) still loads.
    rows = [{"collective": "all_reduce", "dtype": "bfloat16", "scope": "all", "nproc": n, "size_bytes": 2**20,
             "time_s": 1e-4}]
    run.comm_rows.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store.write_json_atomic(run.comm_fit, {"all_reduce:bfloat16:all": {"alpha_s": 28e-6, "bw_gbps": 200.0}})
    return run


def test_comm_fit_becomes_ring_link_figures_by_hand(tmp_path):
    comm_run(tmp_path)
    links = calibrate.comm_links("c", tmp_path)
    assert links["gpu"] == "h100-sxm"
    # algbw 200 GB/s on 8 ranks -> busbw 200 x 2 x 7 / 8 = 350 GB/s; alpha 28 us / 14 steps = 2 us
    assert links["fields"]["intra_bw"] == pytest.approx(350e9)
    assert links["fields"]["intra_alpha_s"] == pytest.approx(2e-6)
    # The same ring then takes exactly the measured time for any size.
    t = perf.ring_time(2**24, 8, links["fields"]["intra_bw"], links["fields"]["intra_alpha_s"], 2.0)
    assert float(t) == pytest.approx(28e-6 + 2**24 / 200e9)


def test_plan_uses_measured_links_for_that_gpu_only(tmp_path):
    comm_run(tmp_path)
    links = calibrate.comm_links("c", tmp_path)
    shape = catalog.model_shape("llama3-8b")
    base = plan(shape, PlanOptions(tokens=1e12, systems=["dgx-h100"], max_gpus=8))
    slow_links = {**links["fields"], "intra_bw": 1e9}
    slow = plan(shape, PlanOptions(tokens=1e12, systems=["dgx-h100"], max_gpus=8, links={"dgx-h100": slow_links}))
    assert slow["ranked"][0]["tokens_per_s"] < base["ranked"][0]["tokens_per_s"]
    assert hardware.resolve(system="dgx-h100").intra_bw > 1e9  # the catalog itself is untouched


def test_cpu_comm_runs_cannot_stand_for_a_gpu(tmp_path):
    comm_run(tmp_path, gpu_name=None)
    with pytest.raises(MgbenchError, match="not on a catalog GPU"):
        calibrate.comm_links("c", tmp_path)
