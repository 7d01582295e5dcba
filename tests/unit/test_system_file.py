"""`--system-file PATH`: a user's own system (and accelerator and links) for predict and plan.

A good file plans and predicts under its system's name; every kind of bad file stops the
command with exit status 2 and one line naming each problem, and loads nothing.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mgbench import catalog
from mgbench.cli import main
from mgbench.errors import MgbenchError

GOOD = """
[accelerators.lab-gpu]
name = "Our lab GPU"
tflops = { bf16 = 400.0, fp32 = 50.0 }
memory_gb = 48
mem_bw_tbps = 1.0
tdp_w = 350

[links.lab-fabric]
peak_gbps = 100.0
bw_eff = 0.8
alpha_us = 2.0

[systems.lab-box]
name = "Our 4-GPU box"
gpu = "lab-gpu"
gpus_per_node = 4
intra_link = "lab-fabric"
inter_link = "eth-100g"
nics_per_node = 1
max_power_kw = 2.5
"""

# A system built only from catalog parts.
CATALOG_PARTS = """
[systems.my-h100-box]
gpu = "h100-sxm"
gpus_per_node = 4
intra_link = "nvlink4"
inter_link = "ib-ndr"
nics_per_node = 2
"""


@pytest.fixture(autouse=True)
def _catalog_alone():
    catalog.clear_system_file()
    yield
    catalog.clear_system_file()


def _write(tmp_path, text: str, name: str = "box.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_good_file_plans_under_its_systems_name(tmp_path):
    f = _write(tmp_path, GOOD)
    r = _run("plan", "--model", "gpt2-small", "--tokens", "1e9", "--seq-len", "1024", "--system-file", f,
             "--systems", "lab-box", "--max-gpus", "8", "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)["recommendation"]
    assert rec["system"] == "lab-box" and rec["gpu"] == "lab-gpu" and rec["num_gpus"] <= 8
    # No price for the user's GPU: cost is null, the plan says how to give one.
    assert rec["cost_usd"] is None
    # The file's hardware is this command's only: the catalog is hardware.toml's again.
    assert "lab-box" not in catalog.systems() and "lab-gpu" not in catalog.accelerators()


def test_a_good_file_predicts_on_its_only_system_without_naming_it(tmp_path):
    f = _write(tmp_path, GOOD)
    r = _run("predict", "--model", "gpt2-small", "--seq-len", "1024", "--num-gpus", "4", "--system-file", f, "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["tokens_per_s"] > 0 and res["device_memory_bytes"] == 48 * 2**30


def test_a_file_of_catalog_parts_predicts_by_name_and_can_be_priced(tmp_path):
    f = _write(tmp_path, CATALOG_PARTS)
    r = _run("predict", "--model", "gpt2-small", "--seq-len", "1024", "--num-gpus", "8", "--zero", "3",
             "--system-file", f, "--system", "my-h100-box", "--json")
    assert r.exit_code == 0, r.output
    r = _run("plan", "--model", "gpt2-small", "--tokens", "1e9", "--seq-len", "1024", "--system-file", f,
             "--systems", "my-h100-box", "--max-gpus", "8", "--json")
    rec = json.loads(r.output)["recommendation"]
    assert rec["system"] == "my-h100-box" and rec["cost_usd"] > 0  # the h100-sxm price of prices.toml


def test_without_the_file_its_system_is_unknown(tmp_path):
    r = _run("predict", "--model", "gpt2-small", "--system", "lab-box")
    assert r.exit_code == 2 and "unknown system 'lab-box'" in r.output


@pytest.mark.parametrize("text,problem", [
    ("[systems.b]\ngpus_per_node = 8\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\nnics_per_node = 8\n",
     "[systems.b] missing key 'gpu'"),
    ("[systems.b]\ngpu = 'h900'\ngpus_per_node = 8\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\nnics_per_node = 8\n",
     "[systems.b] gpu: unknown gpu 'h900'"),
    ("[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 8\nintra_link = 'nvlink9'\ninter_link = 'ib-ndr'\n"
     "nics_per_node = 8\n", "[systems.b] intra_link: unknown link 'nvlink9'"),
    ("[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 0\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\n"
     "nics_per_node = 8\n", "[systems.b] gpus_per_node must be positive, got 0"),
    ("[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 8\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\n"
     "nics_per_node = 'eight'\n", "[systems.b] nics_per_node must be a whole number, got 'eight'"),
    ("[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 8\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\n"
     "nics_per_node = 8\nmax_power_kw = -3\n", "[systems.b] max_power_kw must be positive, got -3"),
    ("[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 8\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\n"
     "nics_per_node = 8\nnic_count = 8\n", "[systems.b] unknown key 'nic_count'"),
    ("[systems.dgx-h100]\ngpu = 'h100-sxm'\ngpus_per_node = 8\nintra_link = 'nvlink4'\ninter_link = 'ib-ndr'\n"
     "nics_per_node = 8\n", "[systems.dgx-h100]: the catalog already has a system 'dgx-h100'"),
    ("[accelerators.g]\ntflops = { bf16 = 100 }\nmemory_gb = 40\nmem_bw_tbps = 1.0\nmx_formats = 'yes'\n"
     "[systems.b]\ngpu = 'g'\ngpus_per_node = 2\nintra_link = 'pcie4'\ninter_link = 'eth-100g'\nnics_per_node = 1\n",
     "[accelerators.g] mx_formats must be true or false, got 'yes'"),
    ("[accelerators.g]\ntflops = { bf16 = 100 }\nmemory_gb = 40\nmem_bw_tbps = 1.0\nfp8_any_layout = 1\n"
     "[systems.b]\ngpu = 'g'\ngpus_per_node = 2\nintra_link = 'pcie4'\ninter_link = 'eth-100g'\nnics_per_node = 1\n",
     "[accelerators.g] fp8_any_layout must be true or false, got 1"),
    ("[accelerators.g]\ntflops = { bf16 = 0 }\nmemory_gb = 40\nmem_bw_tbps = 1.0\n"
     "[systems.b]\ngpu = 'g'\ngpus_per_node = 2\nintra_link = 'pcie4'\ninter_link = 'eth-100g'\nnics_per_node = 1\n",
     "[accelerators.g] tflops.bf16 must be a positive number of TFLOPS, got 0"),
    ("[accelerators.g]\ntflops = { bf16 = 100.0 }\nmem_bw_tbps = 1.0\n"
     "[systems.b]\ngpu = 'g'\ngpus_per_node = 2\nintra_link = 'pcie4'\ninter_link = 'eth-100g'\nnics_per_node = 1\n",
     "[accelerators.g] missing key 'memory_gb'"),
    ("[links.l]\npeak_gbps = 50.0\nbw_eff = 1.5\nalpha_us = 1.0\n"
     "[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 2\nintra_link = 'l'\ninter_link = 'eth-100g'\nnics_per_node = 1\n",
     "[links.l] bw_eff must be a fraction in (0, 1], got 1.5"),
    ("[links.l]\npeak_gbps = '50'\nbw_eff = 0.8\nalpha_us = 1.0\n"
     "[systems.b]\ngpu = 'h100-sxm'\ngpus_per_node = 2\nintra_link = 'l'\ninter_link = 'eth-100g'\nnics_per_node = 1\n",
     "[links.l] peak_gbps must be a number, got '50'"),
    ("[accelerators.g]\ntflops = { bf16 = 100.0 }\nmemory_gb = 40\nmem_bw_tbps = 1.0\n",
     "no [systems.NAME] table"),
    ("[system.b]\ngpu = 'h100-sxm'\n", "unknown table [system]"),
    ("[systems.b\ngpu = 'h100-sxm'\n", "malformed TOML"),
])
def test_each_kind_of_bad_file_exits_2_with_one_line_naming_the_problem(tmp_path, text, problem):
    f = _write(tmp_path, text)
    for cmd in (["predict", "--model", "gpt2-small", "--system-file", f],
                ["plan", "--model", "gpt2-small", "--tokens", "1e9", "--system-file", f]):
        r = _run(*cmd)
        assert r.exit_code == 2, r.output
        assert "Traceback" not in r.output
        lines = [line for line in r.output.splitlines() if problem in line]
        assert len(lines) == 1, r.output
    assert "b" not in catalog.systems()


def test_every_problem_of_a_file_is_listed_at_once_one_per_line(tmp_path):
    f = _write(tmp_path, "[systems.b]\ngpu = 'h900'\ngpus_per_node = -1\nintra_link = 'nvlink4'\n")
    with pytest.raises(MgbenchError) as e:
        catalog.use_system_file(f)
    lines = str(e.value).splitlines()
    assert lines[0].endswith("4 problems:")
    assert sorted(line.strip() for line in lines[1:]) == sorted([
        "[systems.b] gpu: unknown gpu 'h900' (a hardware.toml accelerator such as h100-sxm, or one of this file's "
        "[accelerators.NAME])",
        "[systems.b] gpus_per_node must be positive, got -1",
        "[systems.b] missing key 'inter_link'",
        "[systems.b] missing key 'nics_per_node'",
    ])
    assert "b" not in catalog.systems()


def test_a_missing_file_is_one_line(tmp_path):
    r = _run("predict", "--model", "gpt2-small", "--system-file", str(tmp_path / "nope.toml"))
    assert r.exit_code == 2 and f"--system-file {tmp_path / 'nope.toml'}: file not found" in r.output


def test_an_accelerator_without_a_tdp_plans_with_energy_unknown(tmp_path):
    f = _write(tmp_path, GOOD.replace("tdp_w = 350\n", ""))
    r = _run("plan", "--model", "gpt2-small", "--tokens", "1e9", "--seq-len", "1024", "--system-file", f,
             "--systems", "lab-box", "--max-gpus", "4", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["recommendation"]["energy_kwh"] is None


_SYSTEM = "[systems.b]\ngpu = 'g'\ngpus_per_node = 2\nintra_link = 'pcie4'\ninter_link = 'eth-100g'\nnics_per_node = 1\n"
_ACC = "[accelerators.g]\ntflops = { bf16 = 100.0 }\nmemory_gb = 40\nmem_bw_tbps = 1.0\n"


@pytest.mark.parametrize("text,problem", [
    (_ACC + "name = 7\n" + _SYSTEM, "[accelerators.g] name must be a string, got 7"),
    (_ACC + "retrieved = 2026\n" + _SYSTEM, "[accelerators.g] retrieved must be a date, got 2026"),
    (_ACC.replace("tflops = { bf16 = 100.0 }", "tflops = 100.0") + _SYSTEM,
     "[accelerators.g] tflops must be a table of dense TFLOPS"),
    (_ACC.replace("bf16 = 100.0", "int4 = 100.0") + _SYSTEM, "[accelerators.g] tflops: unknown precision 'int4'"),
    (_ACC + "match = 'G100'\n" + _SYSTEM, "[accelerators.g] match must be a list of regular expressions"),
    (_ACC + "match = ['G(100']\n" + _SYSTEM, "[accelerators.g] match: 'G(100' is not a regular expression"),
    (_ACC + _SYSTEM.replace("gpu = 'g'", "gpu = 3"), "[systems.b] gpu must be a string naming an accelerator, got 3"),
    ("[links.l]\npeak_gbps = 50.0\nbw_eff = 0.0\nalpha_us = 1.0\n" + _ACC + _SYSTEM.replace("'pcie4'", "'l'"),
     "[links.l] bw_eff must be a fraction in (0, 1], got 0.0"),
    ("[links.l]\npeak_gbps = 50.0\nbw_eff = 0.8\nalpha_us = -1.0\n" + _ACC + _SYSTEM.replace("'pcie4'", "'l'"),
     "[links.l] alpha_us cannot be negative, got -1.0"),
    ("[links.l]\npeak_gbps = 50.0\nbw_eff = 0.8\nalpha_us = 1.0\na2a_peer_us = -5.0\n" + _ACC
     + _SYSTEM.replace("'pcie4'", "'l'"), "[links.l] a2a_peer_us cannot be negative, got -5.0"),
    ("links = 3\n" + _ACC + _SYSTEM, "[links] must be a table of named entries"),
    ("[accelerators]\ng = 5\n" + _SYSTEM, "[accelerators.g] must be a table of keys, got 5"),
])
def test_every_value_check_of_a_system_file_fires_on_a_bad_value(text, problem):
    # Each type and range check of check_system_file shown failing on one bad value.
    import tomllib

    problems = catalog.check_system_file(tomllib.loads(text))
    assert any(p.startswith(problem) for p in problems), problems


def test_a_users_link_may_give_its_all_to_all_cost_per_peer_node(tmp_path):
    # A link's a2a_peer_us (what an all-to-all pays per peer node, as hardware.toml's efa-v2)
    # reaches the all-to-all's price; without it the link's latency stands there.
    from mgbench.planner import moe
    from mgbench.planner.hardware import resolve

    text = GOOD.replace('inter_link = "eth-100g"', 'inter_link = "lab-fabric"')
    with_peer = text.replace("alpha_us = 2.0", "alpha_us = 2.0\na2a_peer_us = 50.0")
    S, n = 1e6, 8  # two nodes of 4 GPUs: 3 peers inside, one peer node
    got = {}
    for name, body in (("plain", text), ("peer", with_peer)):
        catalog.clear_system_file()
        catalog.use_system_file(_write(tmp_path, body, f"{name}.toml"))
        hw = resolve(system="lab-box")
        b = S / moe.nccl_all_to_all_share()
        wire = max(b * 3 / n / hw.intra_bw, b * 4 / n / hw.inter_bw)
        peer = hw.inter_alpha_s if name == "plain" else 50e-6
        assert hw.a2a_peer_s == (None if name == "plain" else pytest.approx(50e-6))
        got[name] = float(moe.alltoall_seconds(hw, n, S))
        assert got[name] == pytest.approx(3 * hw.intra_alpha_s + peer + wire)
    assert got["peer"] - got["plain"] == pytest.approx(48e-6)  # 50 us against the link's 2
