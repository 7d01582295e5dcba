"""Image classifiers in plain torch: a bottleneck ResNet and a Vision Transformer, with
seeded random images (timed steps) and learnable ones (the correctness check).

Written from the papers, not from torchvision (whose wheels on PyPI are CUDA builds that
fail to load beside a CPU torch, so it cannot be a dependency here):

- ResNet (He et al. 2015, "Deep Residual Learning for Image Recognition"): a 7x7 stride-2
  stem and a 3x3 max pool, then stages of bottleneck blocks (1x1 reduce, 3x3, 1x1 expand
  x4, BatchNorm after each convolution), the stride of a stage's first block on its 3x3
  convolution ("ResNet v1.5", the layout torchvision and most trainers use), projection
  shortcuts where the shape changes, global average pooling and a linear classifier.
- ViT (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words"): non-overlapping
  patches embedded by a stride-P convolution, a class token, learned position
  embeddings, pre-norm encoder blocks (LayerNorm, multi-head self-attention, LayerNorm,
  GELU MLP), a final LayerNorm and a linear head on the class token.

Parameter counts and forward MACs are in :mod:`mgbench.workloads` (torch-free) and a
test checks them against these modules and the published figures. ``blocks`` (an
``nn.ModuleDict``) holds the residual stages (ResNet) or the encoder blocks (ViT): FSDP
shards each, activation checkpointing wraps them. Dims come from
:data:`mgbench.workloads.VISION_PRESETS`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import RESNET_EXPANSION, VisionModel

# Learnable images: each class has a fixed pattern (drawn from the seed at this
# resolution, then scaled up to the image size), and an image is its class's pattern plus
# noise of this standard deviation, so the class can be read from the image and even
# the first optimizer steps lower the loss.
PATTERN_SIZE = 4
NOISE_STD = 0.25
# The name records give this data (check_data says it for the token workloads).
LEARNABLE_IMAGES = "class-patterns"
# Seed offsets, so patterns, learnable rows and random rows are unrelated streams.
_PATTERN_SALT = 0x1A6E_5EED
_ROW_SALT = 0x1A6E_0001


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * RESNET_EXPANSION
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = (nn.Sequential(nn.Conv2d(c_in, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                         if stride != 1 or c_in != out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """Images (batch, 3, H, W) -> class logits (batch, classes)."""

    def __init__(self, blocks: tuple[int, ...], widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        stem = widths[0]
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        stages, c_in = {}, stem
        for i, (n, w) in enumerate(zip(blocks, widths)):
            layers = []
            for b in range(n):
                layers.append(Bottleneck(c_in, w, 2 if i > 0 and b == 0 else 1))
                c_in = w * RESNET_EXPANSION
            stages[str(i)] = nn.Sequential(*layers)
        self.blocks = nn.ModuleDict(stages)
        self.head = nn.Linear(c_in, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # He et al. 2015's initialisation
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.blocks.values():
            x = stage(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class EncoderBlock(nn.Module):
    def __init__(self, hidden: int, mlp: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-6)
        self.fc1 = nn.Linear(hidden, mlp)
        self.fc2 = nn.Linear(mlp, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v)  # every token sees every token
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Images (batch, 3, H, W) -> class logits (batch, classes)."""

    def __init__(self, layers: int, hidden: int, mlp: int, heads: int, patch: int, classes: int,
                 image_size: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, hidden, patch, stride=patch)
        tokens = (image_size // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos = nn.Parameter(torch.empty(1, tokens, hidden).normal_(std=0.02))
        self.blocks = nn.ModuleDict({str(i): EncoderBlock(hidden, mlp, heads) for i in range(layers)})
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # (batch, patches, hidden)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1) + self.pos.to(x.dtype)
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def build(cfg: Any) -> nn.Module:
    """The config's classifier with the current RNG state (the caller seeds it)."""
    spec: VisionModel = cfg.model
    d = spec.dims
    if d["kind"] == "resnet":
        return ResNet(d["blocks"], d["widths"], d["classes"])
    return ViT(d["layers"], d["hidden"], d["mlp"], d["heads"], d["patch"], d["classes"], cfg.image_size)


def fp32_mode(cfg: Any) -> Callable[[], tuple[str, str]]:
    """The reader of how this process runs the config's fp32 FLOPs on CUDA, for MFU's
    peak (runner/worker.py mfu_fields): ("ieee" | "tf32", the setting read).

    A ResNet's FLOPs are convolutions, which cuDNN runs on TF32 tensor cores unless told
    not to: torch 2.13 allows TF32 for cuDNN by default (torch.backends.cudnn.allow_tf32,
    whose new form is torch.backends.cudnn.conv.fp32_precision = "tf32"), while it does
    not for matmuls (torch.backends.cuda.matmul.allow_tf32 = False). Dividing such a
    run's FLOPs by the fp32 (non-tensor-core) peak gave an MFU several times too high.
    Every other config's FLOPs are matmuls (a ViT's patch embedding is its one small
    convolution), read as the matmul setting (telemetry/tf32.py)."""
    from ..telemetry.tf32 import fp32_conv_mode, fp32_matmul_mode

    if isinstance(cfg.model, VisionModel) and cfg.model.dims["kind"] == "resnet":
        return fp32_conv_mode
    return fp32_matmul_mode


def num_params(cfg: Any) -> int:
    """Trainable parameters of the built model (the analytic count is in VisionModel)."""
    return cfg.model.num_params(cfg.image_size)


def _patterns(seed: int, classes: int, size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_PATTERN_SALT + seed)
    small = torch.randn(classes, 3, PATTERN_SIZE, PATTERN_SIZE, generator=g)
    return F.interpolate(small, size=(size, size), mode="nearest")


def image_rows(seed: int, step: int, rows: range, size: int, classes: int,
               learnable: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` of one step's global batch: (images (n, 3, size, size), labels (n,)).

    Each row is drawn from a generator seeded with (seed, step, row), so a rank draws only
    its own rows and every layout and the single-process reference see the same images.
    Random images are standard normal noise with random labels (nothing to learn, as the
    timed steps of the token workload); learnable ones are their class's pattern plus noise.
    """
    xs, ys = [], []
    patterns = _patterns(seed, classes, size) if learnable else None
    for r in rows:
        g = torch.Generator().manual_seed((_ROW_SALT if learnable else 0) + (seed * 1_000_003 + step) * 100_003 + r)
        y = int(torch.randint(0, classes, (), generator=g))
        x = torch.randn(3, size, size, generator=g)
        xs.append(patterns[y] + NOISE_STD * x if patterns is not None else x)
        ys.append(y)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.long)


def rank_batches(cfg: Any, steps: range, rank: int, grad_accum: int, dp_size: int, device: torch.device,
                 learnable: bool = False) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """For each step, this data-parallel rank's micro-batches (images, labels): rank r
    takes rows [r * ga * mb, (r + 1) * ga * mb) of the global batch, as the token
    workload splits its batches (mgbench.runner.training.rank_batches)."""
    mb, rows = cfg.micro_batch, cfg.micro_batch * grad_accum
    classes = cfg.model.dims["classes"]
    out = []
    for step in steps:
        x, y = image_rows(cfg.seed, step, range(rank * rows, (rank + 1) * rows), cfg.image_size, classes, learnable)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out.append([(x[i : i + mb], y[i : i + mb]) for i in range(0, rows, mb)])
    return out
