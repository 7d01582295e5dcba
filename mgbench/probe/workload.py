"""What the probe times: the workload step it replays and the attention shapes of its
model. Shared by the probe (probe/run.py) and its concurrent kernel processes
(probe/concurrent.py), which import it and not each other."""

from __future__ import annotations

from typing import Any

from ..model_shape import ModelShape

# Forward passes the probe credits SDPA's forward + backward with (kernels.attention:
# backward 2 x forward, as the planner's model FLOPs count it); probe/profile.py converts
# its rate to a kernel fraction's convention (planner/perf.py FLASH_FWD_BWD_PASSES).
ATTENTION_FWD_BWD_PASSES = 3.0


def attention_shapes(shape: ModelShape, tokens: int, kind: str) -> list[dict[str, Any]]:
    """Causal SDPA shapes to time: the model's heads at two sequence lengths (on CPU 128
    and 512, on GPUs 1024 and 4096, capped at ``tokens``), ``tokens`` tokens each."""
    seqs = sorted({min(tokens, 128 if kind == "cpu" else 1024), min(tokens, 512 if kind == "cpu" else 4096)})
    return [{"batch": max(1, tokens // s), "heads": shape.heads, "seq": s, "head_dim": shape.dim_head} for s in seqs]


def workload_config(shape: ModelShape, tokens: int) -> Any:
    """The single-process fp32 CPU config whose step the probe replays: the default
    suite's micro-batch and sequence length when ``tokens`` is theirs, else one
    sequence of ``tokens``."""
    from ..config import RunConfig
    from ..suite import load_suite

    sweep = load_suite("default", "cpu").sweeps[0]
    mb, seq = sweep["micro_batch"][0], sweep["seq_len"][0]
    if mb * seq != tokens:
        mb, seq = 1, tokens
    return RunConfig(model=shape, strategy="single", nproc=1, micro_batch=mb, seq_len=seq, precision="fp32",
                     device="cpu")
