"""Chapter 1: the manual `y = 2x + 0.3` regression with leaf tensors, and the chapter's exercises."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from course_utils._display import ReadableResult
from course_utils.exercises import Verdict, reference_solution, report_check


@dataclass
class LineFit(ReadableResult):
    """Result of `fit_line`: learned `w`, `b`, the loss per step, and whether it diverged."""

    w: float
    b: float
    losses: list[float] = field(repr=False)
    diverged: bool = False

    def __str__(self) -> str:
        end = "diverged (loss became inf/nan)" if self.diverged else f"final loss {self.losses[-1]:.5f}"
        return f"w = {self.w:.3f}, b = {self.b:.3f} after {len(self.losses)} steps; {end}"


def fit_line(x: torch.Tensor, y: torch.Tensor, *, lr: float = 0.1, steps: int = 1000,
             zero_grad: bool = True, seed: int = 0) -> LineFit:
    """Fit `y ≈ w * x + b` by hand: leaf tensors, MSE, `backward()`, updates under `no_grad`.

    x, y: float tensors of shape (N, 1) on the same device. `zero_grad=False` reproduces the
    forgotten `grad.zero_()` pitfall. Stops early if the loss becomes non-finite (a too-large lr).
    """
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != 1:
        raise ValueError(f"x and y must both have shape (N, 1); got {tuple(x.shape)} and {tuple(y.shape)}")
    if not lr > 0 or steps < 1:
        raise ValueError(f"need lr > 0 and steps >= 1, got lr={lr}, steps={steps}")
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1, generator=g).to(x.device).requires_grad_()
    b = torch.zeros(1, device=x.device, requires_grad=True)
    losses: list[float] = []
    for _ in range(steps):
        loss = ((w * x + b - y) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            return LineFit(w.item(), b.item(), losses, diverged=True)
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            if zero_grad:
                w.grad.zero_()
                b.grad.zero_()
    return LineFit(w.item(), b.item(), losses)


# --- exercises ---------------------------------------------------------------------------

@reference_solution("grad_of_cube", chapter=1)
def _grad_of_cube(x: float) -> float:
    t = torch.tensor(x, requires_grad=True)
    (t ** 3).backward()
    return t.grad.item()


def check_grad_of_cube(fn: Callable[[float], float]) -> Verdict:
    """Exercise 1: `fn(x)` must return d/dx x**3 at x (that is 3x^2), computed by autograd."""
    got = [fn(2.0), fn(-1.5)]
    expected = [12.0, 6.75]
    passed = all(isinstance(g, float) and math.isclose(g, e, rel_tol=1e-6) for g, e in zip(got, expected))
    observed = None if got[0] is None else f"at x = 2.0 and -1.5 your function returned {got}"
    return report_check("grad_of_cube", passed, observed,
                        ["the derivative of x**3 is 3x**2: at 2.0 that is 12.0, and it must be a Python float",
                         "let autograd do it: a tensor made with requires_grad=True, then backward() on t ** 3"])


@reference_solution("sgd_update", chapter=1)
def _sgd_update(params: list[torch.Tensor], lr: float) -> None:
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad.zero_()


def check_sgd_update(fn: Callable[[list[torch.Tensor], float], None]) -> Verdict:
    """Exercise 2: `fn(params, lr)` must update each leaf in place by `-lr * grad` and zero its grad."""
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    (w ** 2).sum().backward()  # grad = 2w = [2, -4]
    returned = fn([w], 0.25)
    got = {"w": w.detach().tolist(), "grad": None if w.grad is None else w.grad.tolist(),
           "is_leaf": w.is_leaf, "requires_grad": w.requires_grad}
    expected = {"w": [0.5, -1.0], "grad": [0.0, 0.0], "is_leaf": True, "requires_grad": True}
    passed = got == expected
    untouched = returned is None and got["w"] == [1.0, -2.0] and got["grad"] == [2.0, -4.0]
    observed = None if untouched else f"after one update of w = [1, -2] (grad [2, -4], lr 0.25) you left {got}"
    return report_check("sgd_update", passed, observed,
                        ["the update must change the same tensor object the caller holds, and leave its grad at 0",
                         "`p = p - ...` only rebinds a local name; an in-place operator on a leaf needs "
                         "torch.no_grad()"])
