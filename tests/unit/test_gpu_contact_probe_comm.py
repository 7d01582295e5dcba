"""Issue 30, items 2, 3, 4, 5 and 12: what the probe leaves on the GPU, the peak of fp32
convolutions, the exactness of `mgbench comm`'s checks, GB200 taken for a B200 and an
fp8 run's closing projection. GPU-only behaviour through CPU stand-ins: CUDA calls are
replaced under their real torch names, and the probe's child process by a stub script."""

import json
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mgbench import catalog, cli, collectives
from mgbench.planner.projection import SYSTEMS, lines, projection
from mgbench.probe import kernels
from mgbench.probe import run as probe_run
from mgbench.runner import worker
from mgbench.telemetry import tf32
from mgbench.workloads import vision
from tests.factories import make_config, make_rank_figures, make_record, make_run
from tests.unit.test_collectives import SIMULATE

H100 = "NVIDIA H100 80GB HBM3"
FAILED_TAIL = "the run goes on without the check against this machine"


# --- item 2: the default run's probe runs in a child process ----------------------------


@pytest.fixture
def no_probe_in_process(monkeypatch):
    """`mgbench run`'s process must not probe itself (its GPU kernels would leave a CUDA
    context and cached memory on GPU 0 for the whole run): the probe here raises, and so
    does anything that would initialise CUDA here."""
    def in_process(*_a, **_k):
        raise AssertionError("the probe ran in the CLI's process")

    monkeypatch.setattr(probe_run, "probe", in_process)
    monkeypatch.setattr(torch.cuda, "_lazy_init", in_process)


def stub_child(monkeypatch, code: str) -> None:
    """The probe's child process replaced by ``code`` (a Python script), given the same
    SPEC and OUT arguments as ``python -m mgbench.probe``."""
    argv = lambda spec, out: [sys.executable, "-c", code, json.dumps(spec), str(out)]  # noqa: E731
    monkeypatch.setattr(probe_run, "child_argv", argv, raising=False)  # so that it runs, and fails, on code without one


def test_the_run_probes_in_a_child_and_relays_its_progress(tmp_path, monkeypatch, no_probe_in_process):
    profile = tmp_path / "profiles" / "host-cuda-1.json"
    stub_child(monkeypatch, "import json, sys; from pathlib import Path\n"
                            "spec = json.loads(sys.argv[1]); assert spec['device'] == 'cuda', spec\n"
                            "print('GEMM bfloat16: 21 shapes', flush=True); print('attention bfloat16', flush=True)\n"
                            f"Path(sys.argv[2]).write_text({str(profile)!r})")
    said: list[str] = []
    cli._probe_once("cuda", str(tmp_path), said.append)
    assert said[1:] == ["  probe: GEMM bfloat16: 21 shapes", "  probe: attention bfloat16", f"  profile: {profile}"]


def test_a_child_that_cannot_open_the_gpu_costs_only_the_check(tmp_path, monkeypatch, no_probe_in_process):
    stub_child(monkeypatch, "print('GEMM bfloat16', flush=True)\n"
                            "raise RuntimeError('CUDA error: all CUDA-capable devices are busy or unavailable')")
    said: list[str] = []
    cli._probe_once("cuda", str(tmp_path), said.append)
    assert said[1] == "  probe: GEMM bfloat16"
    assert said[2] == ("  probe failed (RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable); "
                       + FAILED_TAIL)
    assert len(said) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA (the probe would run)")
def test_the_real_child_fails_with_its_error_in_one_line(tmp_path, no_probe_in_process):
    """`python -m mgbench.probe` itself (no stub): on a machine without CUDA a CUDA probe
    refuses at once, and the user reads the child's own message."""
    said: list[str] = []
    cli._probe_once("cuda", str(tmp_path), said.append)
    assert said[-1] == ("  probe failed (--device cuda: no CUDA device is visible here; use --device cpu or auto); "
                        + FAILED_TAIL)


def test_the_child_writes_the_profile_and_names_it(tmp_path, monkeypatch, capsys):
    def probe(device, results_dir, progress):
        progress("GEMM float32")
        return {"hostname": "h", "device": device, "created_at": "2026-01-02T03:04:05"}

    monkeypatch.setattr(probe_run, "probe", probe)
    out = tmp_path / "out"
    probe_run.child_main([json.dumps({"device": "cpu", "results_dir": str(tmp_path)}), str(out)])
    path = Path(out.read_text())
    assert path.parent == tmp_path / "profiles" and json.loads(path.read_text())["hostname"] == "h"
    assert capsys.readouterr().out == "GEMM float32\n"


def test_the_probe_kernels_give_their_memory_back(monkeypatch):
    """`mgbench probe` in process: after each kernel its operands are freed and the CUDA
    caching allocator emptied (empty_cache can only give back blocks no tensor holds)."""
    made: list[weakref.ref] = []
    emptied: list[int] = []
    def tracked(real):
        def make(*args, **kwargs):
            t = real(*args, **kwargs)
            made.append(weakref.ref(t))
            return t
        return make

    for fn in ("randn", "rand"):  # the kernels' operands
        monkeypatch.setattr(torch, fn, tracked(getattr(torch, fn)))

    def empty_cache():
        emptied.append(sum(r() is not None for r in made))

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(kernels, "WARMUP_S", 0.0)
    cpu = torch.device("cpu")
    kernels.gemm(cpu, "float32", [{"m": 8, "k": 8, "n": 8}], repeats=1, min_time_s=0.0)
    kernels.attention(cpu, "float32", [{"batch": 1, "heads": 1, "seq": 8, "head_dim": 4}], repeats=1)
    kernels.memory_bandwidth(cpu, 4096, repeats=1)
    assert made and emptied == [0, 0, 0]  # one per kernel, with none of its tensors alive


# --- item 3: fp32 convolutions run as TF32 -----------------------------------------------


@pytest.fixture
def cuda_h100(monkeypatch):
    """A CUDA device whose properties and name torch would report for an H100 SXM."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=81559 * 2**20, name=H100))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: H100)
    return torch.device("cuda", 0)


def _summary(model: str, cuda_h100) -> dict:
    wl = "gpt" if model == "tiny" else "vision"
    cfg = make_config(workload=wl, model=model, precision="fp32", strategy="ddp", nproc=2,
                      **({"image_size": 32} if wl == "vision" else {}))
    return worker.summarize_config(cfg, [make_rank_figures(0), make_rank_figures(1)], cuda_h100)


def test_fp32_resnet_mfu_divides_by_the_tf32_peak_under_cudnn_defaults(cuda_h100):
    """cuDNN runs fp32 convolutions on TF32 tensor cores by default in torch 2.13
    (torch.backends.cudnn.allow_tf32 = True) while matmuls stay IEEE fp32: a ResNet's MFU
    against the fp32 peak (67 TFLOPS on an H100) was 7x too high."""
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"  # torch's default for matmuls
    conv = torch.backends.cudnn.conv
    saved = conv.fp32_precision
    try:
        conv.fp32_precision = "tf32"
        rec = _summary("resnet_tiny", cuda_h100)
        assert rec["peak_tflops"] == 494.5 and rec["mfu_peak_precision"] == "tf32" and rec["tf32_matmul"] is True
        assert "cudnn.conv.fp32_precision = 'tf32'" in rec["fp32_matmul_setting"]
        # The matmul workloads still follow the matmul setting.
        for model in ("vit_tiny", "tiny"):
            rec = _summary(model, cuda_h100)
            assert rec["peak_tflops"] == 67.0 and rec["mfu_peak_precision"] == "fp32", model
        conv.fp32_precision = "ieee"  # told not to: the fp32 peak
        rec = _summary("resnet_tiny", cuda_h100)
        assert rec["peak_tflops"] == 67.0 and rec["mfu_peak_precision"] == "fp32" and rec["tf32_matmul"] is False
    finally:
        conv.fp32_precision = saved


def test_the_conv_mode_reads_cudnn_and_without_cudnn_the_matmul_setting(monkeypatch):
    resnet = make_config(workload="vision", model="resnet_tiny", image_size=32)
    assert vision.fp32_mode(resnet) is tf32.fp32_conv_mode
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    mode, setting = tf32.fp32_conv_mode()
    assert mode == "ieee" and "cudnn.enabled = False" in setting and "matmul" in setting


# --- item 4: comm's checks are exact at any rank count -----------------------------------


def _ring_sum(sends: list, start: int):
    """The sum of the ranks' buffers added one rank at a time round the ring from rank
    ``start``, rounding to the dtype at each step (as a ring all-reduce's chunk does)."""
    n = len(sends)
    acc = sends[start % n].clone()
    for k in range(1, n):
        acc = acc + sends[(start + k) % n]
    return acc


def _results(name: str, dtype, n: int, drop: int | None = None, twice: int | None = None):
    """Every rank's result of a collective on n simulated ranks (the reductions once per
    ring start), with the layout it ran at; ``drop``: that rank's contribution missing,
    ``twice``: counted twice."""
    coll = collectives.get(name)
    elem = torch.empty((), dtype=dtype).element_size()
    lay = coll.layout(n * elem * (1 if coll.split else 2), elem, n)  # >= n elements per rank's share
    sends = []
    for r in range(n):
        t = torch.empty(lay.send, dtype=dtype)
        coll.fill(t, r, n, lay.chunk)
        sends.append(t)
    if name not in ("all_reduce", "reduce_scatter"):
        return coll, lay, list(enumerate(SIMULATE[name](sends, n, lay.chunk)))
    if drop is not None:
        sends[drop] = torch.zeros_like(sends[drop])
    if twice is not None:
        sends[twice] = sends[twice] * 2
    out = []
    # A ring reduces each chunk from another rank: every start on up to 64 ranks (the
    # rank + 1 fill went wrong from 4 of 23 starts in bf16), a sample above.
    for start in range(n) if n <= 64 else sorted({0, 1, 2, 5, n // 3, n // 2, n - 1}):
        total = _ring_sum(sends, start)
        for r in range(n):
            out.append((r, total if name == "all_reduce" else total[r * lay.chunk:(r + 1) * lay.chunk]))
    return coll, lay, out


def _wrong(coll, lay, results, n: int) -> int:
    return sum(int((o != coll.expected(o, r, n, lay.chunk)).sum()) for r, o in results)


@pytest.mark.parametrize("dtype,n", [(torch.bfloat16, 23), (torch.float16, 64), (torch.bfloat16, 300),
                                     (torch.float16, 300), (torch.bfloat16, 1024), (torch.float16, 1024),
                                     (torch.float32, 1024)])
@pytest.mark.parametrize("name", collectives.NAMES)
def test_a_correct_collective_has_no_wrong_element_at_any_rank_count(name, dtype, n):
    """bf16 holds integers exactly up to 256, fp16 up to 2048: a rank + 1 fill summed to
    n(n+1)/2 gave false #wrong from 23 bf16 ranks and 64 fp16 ones, whatever the order of
    the partial sums; the all-gather and all-to-all labels rounded differently in the
    fill and the expected result from 257 bf16 / 300 fp16 ranks."""
    assert _wrong(*_results(name, dtype, n), n) == 0


@pytest.mark.parametrize("dtype,n", [(torch.bfloat16, 23), (torch.float16, 64), (torch.bfloat16, 1024)])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_a_rank_missing_or_counted_twice_is_still_seen(name, dtype, n):
    for r in (0, n // 2, n - 1):
        assert _wrong(*_results(name, dtype, n, drop=r), n) > 0, r
        assert _wrong(*_results(name, dtype, n, twice=r), n) > 0, r


def test_the_reduction_fill_stays_within_every_dtype_exact_integers():
    for n in (1, 2, 15, 16, 23, 64, 1024, 4096):
        assert collectives.reduce_sum(n) <= 128  # half of bf16's 256: a doubled result is exact too
        assert sum(collectives.reduce_weights(r, n)[0] for r in range(n)) == collectives.reduce_sum(n)


# --- item 5: GB200 is not a B200 ---------------------------------------------------------


@pytest.mark.parametrize("name,key", [
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),  # its own entry (issue 29), never the B200's
    ("NVIDIA GB300", "gb300"),  # its own entry (2026-11-27), never the B300's
    ("NVIDIA B300 SXM6 AC", "b300"),
    ("NVIDIA GB999", None),  # a made-up Grace part: no sibling's entry
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GH200 480GB", "gh200-96gb"),
    ("NVIDIA L40S", "l40s"),
    ("AMD Instinct MI300X", "mi300x"),
])
def test_device_names_match_whole_words_only(name, key):
    assert catalog.match_accelerator(name) == key


def test_an_unknown_grace_blackwell_gets_no_peak_rather_than_b200s(cuda_h100):
    """GB200 and GB300 have their own catalog entries (2,500 dense bf16 TFLOPS each); a
    Grace part the catalog does not know (a made-up name here) gets no peak rather than a
    sibling's."""
    assert catalog.peak_tflops("NVIDIA GB200", "bf16", memory_gib=186.0)[0] == 2500.0
    assert catalog.peak_tflops("NVIDIA GB300", "bf16", memory_gib=279.0)[0] == 2500.0
    value, reason = catalog.peak_tflops("NVIDIA GB999", "bf16", memory_gib=279.0)
    assert value is None and "no peak FLOPS in the catalog for device 'NVIDIA GB999'" in reason
    f = worker.mfu_fields("bf16", "NVIDIA GB999", cuda_h100, 500.0)
    assert f["mfu_pct"] is None and "GB999" in f["mfu_reason"]


# --- item 12: an fp8 run's closing projection ---------------------------------------------


def test_an_fp8_run_closes_with_a_projection_that_leaves_out_gpus_without_fp8(tmp_path):
    """suites/modern.toml with torchao ran its 23 configs, then exited 2 from the closing
    projection: the A100 of dgx-a100 has no FP8 peak."""
    fp8 = make_config(precision="fp8", strategy="fsdp", nproc=4)
    bf16 = make_config(precision="bf16", strategy="fsdp", nproc=4)
    results = tmp_path / "results"
    run = make_run(results, "modern", [make_record(fp8, step_times_s=[0.2, 0.2, 0.2]),
                                       make_record(bf16, step_times_s=[0.3, 0.3, 0.3])])
    p = projection(run.path, results)
    assert p["precision"] == "fp8" and [r["system"] for r in p["catalog"]] == list(SYSTEMS)
    rows = {r["system"]: r for r in p["catalog"]}
    assert not rows["dgx-a100"]["fits"]
    assert "a100-sxm-80gb has no FP8 peak" in rows["dgx-a100"]["reason"]
    assert rows["dgx-h100"]["fits"] and rows["mi300x-8"]["fits"]
    assert any(line.startswith("  dgx-a100") and "left out" in line for line in lines(p))
