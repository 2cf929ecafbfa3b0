"""Small models the chapters train and break. Defined here (not torchvision) so they import everywhere."""
from __future__ import annotations

from torch import nn


def mlp(sizes: list[int], *, dropout: float = 0.0) -> nn.Sequential:
    """Linear → ReLU (→ Dropout) stacks: `mlp([4, 32, 1])` maps (N, 4) to (N, 1)."""
    if len(sizes) < 2:
        raise ValueError(f"mlp needs at least an input and an output size, got {sizes}")
    if not all(isinstance(n, int) and n >= 1 for n in sizes):
        raise ValueError(f"mlp sizes must be whole numbers >= 1 (features per layer), got {sizes}")
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
            if dropout:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class SmallConvNet(nn.Sequential):
    """Conv-BatchNorm-ReLU ×2, global average pool, linear head: (N, C, H, W) float → (N, classes) logits."""

    def __init__(self, in_channels: int = 3, classes: int = 10, width: int = 16):
        super().__init__(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(2 * width, classes),
        )


class TransformerBlock(nn.Module):
    """Pre-norm self-attention + MLP block: (N, T, dim) → (N, T, dim)."""

    def __init__(self, dim: int = 64, heads: int = 4):
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads}): each head gets dim // heads features")
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = mlp([dim, 4 * dim, dim])

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))
