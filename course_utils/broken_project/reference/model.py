"""The model: two convolution blocks and a classifier head."""
import torch
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)


class ShapesNet(nn.Module):
    """(N, 1, 16, 16) images -> (N, 4) logits."""

    def __init__(self, channels: tuple[int, ...] = (8, 16), classes: int = 4):
        super().__init__()
        widths = (1, *channels)
        self.blocks = nn.ModuleList(ConvBlock(a, b) for a, b in zip(widths, widths[1:]))
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(channels[-1] * (16 // 2 ** len(channels)) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.dropout(x.flatten(1)))
