"""Context parallelism on CUDA through torch's ring attention (issue 17, item 2), end to end
through `mgbench run` with the correctness check against the single-process reference on
the same full sequences. Skipped without CUDA (see conftest.py); the 2-rank ring needs two
GPUs (NCCL puts one rank on each).

On one GPU, cp = 1: the ring dispatch, its DTensor plumbing, the kernel choice and the
record, without an exchange between ranks. On two GPUs, cp = 2: the ring proper, with both
rotate methods, the all-gather-KV form beside them, and auto on a grouped-query model.

Not yet run on a GPU (no CUDA machine was lent while it was written): if the ring cannot
take a grouped-query model's kernel, auto falls back and says so (cp_attention_reason)."""

import pytest

from mgbench import store
from mgbench.strategies import RING_FORMS
from mgbench.strategies.context_parallel import RING_KERNELS
from tests.conftest import run_cli
from tests.gpu.conftest import cuda_count

pytestmark = pytest.mark.gpu

DENSE = "{ layers = 2, hidden = 256, heads = 4, kv_heads = 4, ffn_hidden = 512, vocab = 512 }"
GQA = "{ layers = 2, hidden = 256, heads = 4, kv_heads = 2, ffn_hidden = 512, vocab = 512 }"
SUITE = """name = "cp-ring"
[[sweep]]
model = {model}
strategy = "cp"
nproc = {nproc}
layout = {{cp = {nproc}}}
precision = "bf16"
cp_attention = {forms}
seq_len = 512
micro_batch = 2
grad_accum = 2
warmup_steps = 2
measured_steps = 5
check_steps = 3
timeout_s = 300
"""
FORMS = '["ring_allgather", "ring_alltoall", "allgather_kv"]'


def _run(tmp_path, text):
    (tmp_path / "s.toml").write_text(text)
    p = run_cli("run", "s.toml", "--device", "cuda", "--run-id", "r", "--no-report", "--no-projection", cwd=tmp_path,
                timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return store.latest_records(store.read_records(tmp_path / "results" / "r"))


def _check(recs, forms):
    assert sorted(r["cp_attention"] for r in recs) == sorted(forms)
    for r in recs:
        assert r["status"] == "ok", (r["label"], r.get("error"))
        assert r["backend"] == "nccl" and r["correct"] is True, (r["label"], r.get("correct_reason"))
        assert r["cp_attention_impl"] == r["cp_attention"], r["cp_attention_reason"]
        if r["cp_attention_impl"] in RING_FORMS:
            assert r["cp_sdpa_kernel"] in RING_KERNELS and "ring attention" in r["cp_attention_reason"]


def test_ring_attention_on_one_gpu_is_correct_and_recorded(tmp_path):
    recs = _run(tmp_path, SUITE.format(model=DENSE, nproc=1, forms=FORMS))
    _check(recs, ["ring_allgather", "ring_alltoall", "allgather_kv"])


@pytest.mark.skipif(cuda_count() < 2, reason="the 2-rank ring needs 2 CUDA devices (one NCCL rank per GPU)")
def test_ring_attention_across_two_gpus_matches_the_reference(tmp_path):
    recs = _run(tmp_path, SUITE.format(model=DENSE, nproc=2, forms=FORMS))
    _check(recs, ["ring_allgather", "ring_alltoall", "allgather_kv"])


@pytest.mark.skipif(cuda_count() < 2, reason="the 2-rank ring needs 2 CUDA devices (one NCCL rank per GPU)")
def test_auto_on_a_grouped_query_model_is_correct_and_says_which_form_ran(tmp_path):
    (rec,) = _run(tmp_path, SUITE.format(model=GQA, nproc=2, forms='"auto"'))
    assert rec["status"] == "ok" and rec["correct"] is True, (rec.get("error"), rec.get("correct_reason"))
    assert rec["cp_attention_impl"] in ("ring_allgather", "allgather_kv") and rec["cp_attention_reason"]
