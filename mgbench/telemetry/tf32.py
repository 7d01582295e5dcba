"""How this process runs fp32 matmuls and convolutions on CUDA (IEEE fp32 or TF32 tensor
cores): MFU's peak must be that of the units the FLOPs ran on. Read by the worker's MFU,
the vision workload (convolutions) and the probe."""

from __future__ import annotations

import torch


def fp32_matmul_mode() -> tuple[str, str]:
    """How this process runs fp32 matmuls on CUDA: ("ieee" | "tf32", the setting read).

    fp32 MFU must divide by the peak of the units the matmuls ran on: with TF32 allowed
    they run on tensor cores, whose tf32 peak is 7x (H100) the fp32 one. torch 2.13 has
    two APIs for the setting and refuses to answer the legacy one (allow_tf32,
    get_float32_matmul_precision) when the new one was used to set it, so the new
    per-backend setting is read first. "medium" runs CUDA matmuls as "high" does (TF32)."""
    matmul = torch.backends.cuda.matmul
    try:
        new = matmul.fp32_precision  # "ieee" | "tf32" | "none" (not set through this API)
    except (AttributeError, RuntimeError):
        new = None
    if new in ("ieee", "tf32"):
        return new, f"torch.backends.cuda.matmul.fp32_precision = {new!r}"
    try:
        prec = torch.get_float32_matmul_precision()
    except RuntimeError:
        prec = None
    if prec is not None:
        return ("ieee" if prec == "highest" else "tf32"), f"torch.get_float32_matmul_precision() = {prec!r}"
    tf32 = bool(matmul.allow_tf32)
    return ("tf32" if tf32 else "ieee"), f"torch.backends.cuda.matmul.allow_tf32 = {tf32}"


def fp32_conv_mode() -> tuple[str, str]:
    """How this process runs fp32 convolutions on CUDA: ("ieee" | "tf32", the setting read).

    torch's new per-operator setting is read first (it answers with the resolved value:
    "none" means that no level asks for TF32), as the legacy allow_tf32 refuses to answer
    once the new API gave convolutions and RNNs different settings. With cuDNN disabled,
    convolutions fall back to im2col + GEMM, which follow the matmul setting."""
    cudnn = torch.backends.cudnn
    if not cudnn.enabled:
        mode, setting = fp32_matmul_mode()
        return mode, f"torch.backends.cudnn.enabled = False, so {setting}"
    try:
        new = cudnn.conv.fp32_precision
    except (AttributeError, RuntimeError):  # a torch without the per-operator API
        tf32 = bool(cudnn.allow_tf32)
        return ("tf32" if tf32 else "ieee"), f"torch.backends.cudnn.allow_tf32 = {tf32}"
    return ("tf32" if new == "tf32" else "ieee"), f"torch.backends.cudnn.conv.fp32_precision = {new!r}"
