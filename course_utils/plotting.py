"""Matplotlib helpers shared by the chapters: loss curves and fitted lines."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes


def plot_losses(histories: Mapping[str, Sequence[float]], ax: Axes | None = None, *,
                title: str = "training loss", logy: bool = True) -> Axes:
    """One curve per named loss history (x: step, y: loss); non-finite values end a curve."""
    if not histories:
        raise ValueError("histories is empty: pass {'label': [loss, ...], ...}")
    ax = ax or plt.subplots(figsize=(5, 3.2))[1]
    for label, losses in histories.items():
        finite = [v for v in losses if math.isfinite(v)]
        ax.plot(range(len(finite)), finite, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="loss", title=title)
    ax.legend()
    return ax


def plot_line_fit(x: torch.Tensor, y: torch.Tensor, w: float, b: float, ax: Axes | None = None) -> Axes:
    """Scatter the (N, 1) data and draw the fitted line `w * x + b`."""
    ax = ax or plt.subplots(figsize=(5, 3.2))[1]
    xs, ys = x.detach().cpu().flatten(), y.detach().cpu().flatten()
    ax.scatter(xs, ys, s=6, alpha=0.5, label="data")
    if math.isfinite(w) and math.isfinite(b):
        ax.plot(xs, w * xs + b, color="C3", label=f"fit: {w:.2f}x + {b:.2f}")
    ax.set(xlabel="x", ylabel="y", title="fitted line")
    ax.legend()
    return ax
