"""Chapter 1: the manual `y = 2x + 0.3` regression with leaf tensors, hardened (the exercises live in
`course_utils.exercises.tensors_autograd`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from course_utils._display import ReadableResult


@dataclass
class LineFit(ReadableResult):
    """Result of `fit_line`: learned `w`, `b`, the loss and the (w, b) used at each step, and whether it diverged."""

    w: float
    b: float
    losses: list[float] = field(repr=False)
    path: list[tuple[float, float]] = field(default_factory=list, repr=False)
    diverged: bool = False

    def __str__(self) -> str:
        if self.diverged:
            return (f"diverged at step {len(self.losses)}: the loss became inf/nan "
                    f"(w = {self.w:.3g}, b = {self.b:.3g} by then)")
        return f"w = {self.w:.3f}, b = {self.b:.3f} after {len(self.losses)} steps; final loss {self.losses[-1]:.5f}"


def fit_line(x: torch.Tensor, y: torch.Tensor, *, lr: float = 0.1, steps: int = 1000,
             zero_grad: bool = True, seed: int = 0) -> LineFit:
    """Fit `y ≈ w * x + b` with the chapter's hand-written loop, hardened for the widget.

    The loop a learner writes (leaf tensors, MSE, `backward()`, update under `no_grad`,
    `grad.zero_()`), plus: input checks with a readable error, a seeded start `w ~ N(0, 1)`, `b = 0`
    (`seed`), and an early stop when the loss becomes inf/nan (a too-large lr). x, y: float tensors
    of shape (N, 1) on one device. `zero_grad=False` reproduces the forgotten `grad.zero_()`.
    `LineFit.path[i]` is the (w, b) that produced `LineFit.losses[i]`.
    """
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != 1:
        raise ValueError(f"x and y must both have shape (N, 1); got {tuple(x.shape)} and {tuple(y.shape)}")
    if not lr > 0 or steps < 1:
        raise ValueError(f"need lr > 0 and steps >= 1, got lr={lr}, steps={steps}")
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1, generator=g).to(x.device).requires_grad_()
    b = torch.zeros(1, device=x.device, requires_grad=True)
    losses: list[float] = []
    path: list[tuple[float, float]] = []
    for _ in range(steps):
        loss = ((w * x + b - y) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        path.append((w.item(), b.item()))
        if not math.isfinite(losses[-1]):
            return LineFit(w.item(), b.item(), losses, path, diverged=True)
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            if zero_grad:
                w.grad.zero_()
                b.grad.zero_()
    return LineFit(w.item(), b.item(), losses, path)
