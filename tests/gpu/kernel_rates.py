"""Kernel rates the planner's constants stand on, measured on the GPU at hand.

    python tests/gpu/kernel_rates.py -o kernels.json      # one GPU, about 40 s
    python tests/gpu/kernel_rates.py --device cpu --small  # the plumbing, on a CPU

What it times (median of 5 spans of back-to-back calls after warm-up, the probe's timer;
random data). The H200 lease of 2026-11-27 (results/h200-lease-2026-11-27) ran an earlier
version that synchronised after every call, so its small kernels carry about 30 us of
launch latency each:

- the two ceilings: a large bf16 matrix product and a device-to-device copy;
- scaled_dot_product_attention forward, and forward + backward, per SDPA backend
  (FlashAttention-2, cuDNN, memory-efficient), causal and not, at head dim 128: the
  planner prices attention at a fraction of dense peak (efficiency.toml ``attention``),
  taken from published FlashAttention-2 figures, while Transformer Engine stacks run
  cuDNN's kernel;
- the routed experts' GEMMs at published MoE shapes (DeepSeek-V3, Qwen3-30B-A3B,
  GPT-OSS, Mixtral), at several rows per expert, as one ``torch.mm`` and, where torch
  has it, as one grouped GEMM over 8 local experts (``torch._grouped_mm``): the
  planner prices each local expert at its own shape under one fixed cost
  (perf.shaped_gemms), which these rows test.

The figures are raw seconds with the FLOPs counted here; the comparison with the model
is made on the CPU afterwards (no planner code runs on the GPU machine). A kernel that
cannot run on this torch is a row with its error, never a missing row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from mgbench.probe.kernels import timer

# (name, hidden, moe_ffn_hidden) of the routed experts; up is gated (2 x ffn columns).
EXPERT_SHAPES = [("deepseek-v3", 7168, 2048), ("qwen3-30b-a3b", 2048, 768), ("gpt-oss", 2880, 2880),
                 ("mixtral-8x7b", 4096, 14336)]
ROWS_PER_EXPERT = [128, 512, 2048, 8192]
LOCAL_EXPERTS = 8
ATTN = {"batch": 2, "heads": 32, "head_dim": 128, "seqs": [2048, 4096, 8192]}


def med(dev: torch.device, fn: Callable[[], Any], min_time_s: float = 0.02) -> float:
    """Median seconds per call of ``fn`` over 5 spans of back-to-back calls (the probe's
    timer, mgbench.probe.kernels.timer: a short kernel's launch latency is not counted
    once per call, as synchronising after every call counted it)."""
    return statistics.median(timer(dev, fn, 5, min_time_s))


def ceilings(dev: torch.device, small: bool) -> dict[str, Any]:
    """A large bf16 product (TFLOP/s) and a device-to-device copy (GB/s, read + write)."""
    n = 1024 if small else 8192
    a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    t = med(dev, lambda: a @ b)
    nbytes = (16 if small else 1024) * 2**20
    src = torch.randn(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    c = med(dev, lambda: dst.copy_(src))
    del a, b, src, dst
    return {"gemm_bf16": {"m": n, "n": n, "k": n, "s": t, "tflops": 2 * n**3 / t / 1e12},
            "copy": {"bytes": nbytes, "s": c, "gbps_read_plus_write": 2 * nbytes / c / 1e9}}


def attention(dev: torch.device, small: bool) -> list[dict[str, Any]]:
    """SDPA forward and forward + backward per backend, causal and not."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
    if dev.type == "cpu":
        backends = {"math": SDPBackend.MATH}
    b, h, d = ATTN["batch"], ATTN["heads"], ATTN["head_dim"]
    seqs = [128, 256] if small else ATTN["seqs"]
    rows = []
    for name, backend in backends.items():
        for s in seqs:
            for causal in (True, False):
                row: dict[str, Any] = {"backend": name, "batch": b, "heads": h, "head_dim": d, "seq": s,
                                       "causal": causal, "dtype": "bfloat16",
                                       # the two matmuls' forward FLOPs, halved for the causal mask
                                       "fwd_flops": 4.0 * b * h * s * s * d / (2 if causal else 1)}
                try:
                    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                               for _ in range(3))
                    g = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)

                    def fwd() -> Any:
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def fwd_bwd() -> None:
                        fwd().backward(g)

                    with torch.no_grad():
                        tf = med(dev, fwd)
                    row.update(fwd_s=tf, fwd_bwd_s=med(dev, fwd_bwd))
                except Exception as e:  # a backend this torch or GPU lacks: the row says so
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                rows.append(row)
                q = k = v = g = None  # noqa: F841  (free before the next shape)
    return rows


def experts(dev: torch.device, small: bool) -> list[dict[str, Any]]:
    """Expert GEMMs (forward): up [m, h] x [h, 2f] and down [m, f] x [f, h], one mm, and
    one grouped mm over LOCAL_EXPERTS experts of m rows each."""
    rows = []
    grouped = getattr(torch, "_grouped_mm", None)
    shapes = [("tiny", 64, 32)] if small else EXPERT_SHAPES
    for name, h, f in shapes:
        for m in ([16, 64] if small else ROWS_PER_EXPERT):
            for mat, (k, n) in (("up", (h, 2 * f)), ("down", (f, h))):
                row: dict[str, Any] = {"model": name, "matrix": mat, "m": m, "k": k, "n": n,
                                       "local_experts": LOCAL_EXPERTS, "flops_one": 2.0 * m * k * n}
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                row["mm_s"] = med(dev, lambda: x @ w)
                if grouped is None:
                    row["grouped_error"] = "torch._grouped_mm: not in this torch"
                else:
                    try:
                        xs = torch.randn(LOCAL_EXPERTS * m, k, device=dev, dtype=torch.bfloat16)
                        # weights stored [E, n, k] and used transposed, as MoE layers keep them
                        ws = torch.randn(LOCAL_EXPERTS, n, k, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
                        offs = torch.arange(1, LOCAL_EXPERTS + 1, device=dev, dtype=torch.int32) * m
                        ref = xs[:m].float() @ ws[0].float()
                        got = grouped(xs, ws, offs=offs)[:m].float()
                        row["grouped_rel_err"] = float((got - ref).norm() / ref.norm())
                        row["grouped_s"] = med(dev, lambda: grouped(xs, ws, offs=offs))
                        del xs, ws
                    except Exception as e:
                        row["grouped_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                rows.append(row)
                del x, w
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="kernels.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--small", action="store_true", help="tiny sizes: check the script, not the machine")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("kernel_rates: no CUDA device here; --device cpu --small checks the script", file=sys.stderr)
        return 2
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    out: dict[str, Any] = {"torch": torch.__version__,
                           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                           "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
                           "cuda": torch.version.cuda}
    for part, fn in (("ceilings", ceilings), ("attention", attention), ("experts", experts)):
        t = time.monotonic()
        try:
            out[part] = fn(dev, args.small)
        except Exception as e:  # keep what the other parts measured
            out[part] = {"error": f"{type(e).__name__}: {e}"[:500]}
        out[f"{part}_wall_s"] = time.monotonic() - t
        with open(args.output, "w") as fh:  # after each part: a later failure loses nothing
            json.dump(out, fh, indent=1)
        print(f"kernel_rates: {part} in {out[f'{part}_wall_s']:.1f} s", flush=True)
    c = out.get("ceilings", {})
    if "gemm_bf16" in c:
        print(f"bf16 GEMM {c['gemm_bf16']['tflops']:.0f} TFLOP/s; copy {c['copy']['gbps_read_plus_write']:.0f} GB/s")
    for r in out.get("attention", []) if isinstance(out.get("attention"), list) else []:
        if "fwd_bwd_s" in r:
            print(f"sdpa {r['backend']:9s} s={r['seq']:5d} causal={r['causal']!s:5s} fwd "
                  f"{r['fwd_flops'] / r['fwd_s'] / 1e12:6.0f} TFLOP/s, fwd+bwd (3.5x fwd FLOPs) "
                  f"{3.5 * r['fwd_flops'] / r['fwd_bwd_s'] / 1e12:6.0f} TFLOP/s")
        else:
            print(f"sdpa {r['backend']:9s} s={r['seq']:5d} causal={r['causal']!s:5s} {r.get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
