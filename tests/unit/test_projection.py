"""The run's closing projection: catalog predictions with intervals, and the model checked
against this machine through its profile."""

import json
import shutil
from pathlib import Path

import pytest

from mgbench.planner.projection import SYSTEMS, lines, projection
from mgbench.probe.profile import write_profile
from tests.unit.test_probe_profile import make_profile

FIXTURE = Path(__file__).parents[1] / "fixtures" / "runs" / "v1-smoke"


@pytest.fixture
def results(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "results" / "v1-smoke")
    return tmp_path / "results"


def test_catalog_rows_are_one_node_predictions_with_intervals(results):
    p = projection(results / "v1-smoke", results)
    assert p["model"] == "tiny" and [r["system"] for r in p["catalog"]] == list(SYSTEMS)
    for r in p["catalog"]:
        assert r["fits"] and r["num_gpus"] == 8
        lo, hi = r["tokens_per_s_per_gpu_interval"]
        assert lo <= r["tokens_per_s_per_gpu"] <= hi
    assert "share this host's cores" in p["cpu_note"]
    # No profile of the machine: the check is null with how to get one.
    assert "mgbench probe" in p["this_machine"]["null_reason"]
    text = "\n".join(lines(p))
    assert text.startswith("Projection:") and "this machine: no hardware profile" in text


def test_a_profile_of_the_machine_checks_the_model_against_the_run(results):
    host = json.loads((results / "v1-smoke" / "manifest.json").read_text())["machine"]["hostname"]
    write_profile(make_profile(hostname=host), results / "profiles" / f"{host}-cpu-20260101T000000.json")
    m = projection(results / "v1-smoke", results)["this_machine"]
    assert m["num_predicted"] >= 1 and m["mape"] is not None
    assert all(r["predicted_s"] > 0 for r in m["rows"] if r["reason"] is None)
    # Another machine's profile is not this machine's.
    other = results / "profiles"
    shutil.rmtree(other)
    write_profile(make_profile(hostname="elsewhere"), other / "elsewhere-cpu-20260101T000000.json")
    assert "null_reason" in projection(results / "v1-smoke", results)["this_machine"]
