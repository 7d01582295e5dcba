"""Harness overhead: throughput of `single` through `mgbench run` / a bare training loop.

Both run the same model, batch and optimizer in one process on this machine, in one
invocation, alternating (bare, mgbench, bare, mgbench, ...) so machine drift hits both.
The bare loop is written here independently of mgbench's runner: no torchrun, no
process group, no loss collection, just forward / backward / AdamW and a clock.

    python tests/perf/bench_overhead.py [--rounds 3] [--model mini] [--json out.json]

Target (issue "mgbench run"): ratio >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mgbench import catalog, store  # noqa: E402
from mgbench.runner.launch import run_suite  # noqa: E402
from mgbench.strategies.pieces import OPTIMIZER_KW  # noqa: E402
from mgbench.suite import parse_suite  # noqa: E402
from mgbench.workloads.gpt import DecoderLM  # noqa: E402


def bare_loop(model_name: str, micro_batch: int, seq_len: int, warmup: int, steps: int) -> float:
    """Median step time of a plain training loop (one process, no harness)."""
    torch.set_num_threads(os.cpu_count() or 1)  # what mgbench gives a 1-rank CPU job
    torch.manual_seed(0)
    shape = catalog.model_shape(model_name)
    model = DecoderLM(shape, max_seq_len=seq_len)
    opt = torch.optim.AdamW(model.parameters(), **OPTIMIZER_KW)
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, shape.vocab, (micro_batch, seq_len + 1), generator=g) for _ in range(warmup + steps)]
    times = []
    for i, batch in enumerate(data):
        t0 = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, shape.vocab), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mgbench_single(model_name: str, micro_batch: int, seq_len: int, warmup: int, steps: int, results: Path) -> float:
    text = f"""name = "overhead"
[sweep]
model = "{model_name}"
strategy = "single"
nproc = 1
micro_batch = {micro_batch}
seq_len = {seq_len}
warmup_steps = {warmup}
measured_steps = {steps}
check_steps = 0
device = "cpu"
"""
    run_dir = run_suite(parse_suite(text, "overhead.toml"), results_dir=results, device_kind="cpu",
                        num_devices=1, progress=lambda m: None)
    (rec,) = store.read_records(run_dir)
    assert rec["status"] == "ok", rec
    return rec["step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mini")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    bare, harness = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            bare.append(bare_loop(a.model, a.micro_batch, a.seq_len, a.warmup, a.steps))
            harness.append(mgbench_single(a.model, a.micro_batch, a.seq_len, a.warmup, a.steps, Path(tmp)))
            print(f"round {r + 1}: bare {bare[-1] * 1000:.2f} ms/step, mgbench {harness[-1] * 1000:.2f} ms/step",
                  flush=True)
    tokens = a.micro_batch * a.seq_len
    result = {
        "model": a.model, "micro_batch": a.micro_batch, "seq_len": a.seq_len, "rounds": a.rounds,
        "bare_step_time_s": statistics.median(bare), "mgbench_step_time_s": statistics.median(harness),
        "bare_tokens_per_s": tokens / statistics.median(bare),
        "mgbench_tokens_per_s": tokens / statistics.median(harness),
    }
    result["ratio"] = result["mgbench_tokens_per_s"] / result["bare_tokens_per_s"]
    result["target"] = 0.97
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
