"""Chapter 1: the manual `y = 2x + 0.3` regression with leaf tensors, and the chapter's exercises."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from course_utils._display import ReadableResult
from course_utils.devices import get_device
from course_utils.exercises import Verdict, reference_solution, report_check


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


# --- exercises ---------------------------------------------------------------------------
# Each check runs the learner's function on its own small, seeded data and reports what it
# observed; a wrong answer never crashes a check (the learner's exception is the observation).

_AUTOGRAD_ENTRY_POINTS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


class _TorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called while active (did any code run?), and
    the calls that ask autograd for gradients (`Tensor.backward`, `torch.autograd.backward` / `grad`)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.autograd = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.autograd += func in _AUTOGRAD_ENTRY_POINTS
        return func(*args, **(kwargs or {}))


def _run_counted(fn: Callable, *args) -> tuple[object, str | None, _TorchCalls]:
    """Call the learner's `fn(*args)`: (result, the error it raised as one line or None, what it called)."""
    with _TorchCalls() as calls:
        try:
            return fn(*args), None, calls
        except Exception as exc:  # any mistake of the learner's is an observation, not a crash
            first_line = (str(exc).strip().splitlines() or [""])[0]
            return None, f"your function raised {type(exc).__name__}: {first_line}", calls


def _run(fn: Callable, *args) -> tuple[object, str | None, int]:
    """Call the learner's `fn(*args)`: (result, the error it raised as one line or None, torch calls)."""
    result, error, calls = _run_counted(fn, *args)
    return result, error, calls.count


def _describe(value: object) -> str:
    """A returned value in the learner's terms: its repr and type (a tensor is called out as one)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor ({value!r}), not a Python float"
    return f"{value!r} ({type(value).__name__})"


@reference_solution("grad_of_cube", chapter=1)
def _grad_of_cube(x: float) -> float:
    t = torch.tensor(x, requires_grad=True)
    (t ** 3).backward()
    return t.grad.item()


def check_grad_of_cube(fn: Callable[[float], float]) -> Verdict:
    """Exercise 1 (write it): `fn(x)` returns d/dx x**3 at x (a Python float), computed by autograd.

    Calls `fn` at 2.0 and -1.5; passes when both values are right and each call asked autograd for the
    gradient (`backward()` or `torch.autograd.grad`), so a derivative worked out by hand is rejected.
    """
    hints = ["the number has to come from autograd, not from a formula you derive: the input must first "
             "become a tensor that autograd tracks",
             "backward() on a scalar fills .grad of the leaves it was computed from; .grad is a tensor, "
             "the check wants a Python float"]
    results, calls, autograd_calls = [], 0, 0
    for x in (2.0, -1.5):
        got, error, seen = _run_counted(fn, x)
        calls, autograd_calls = calls + seen.count, autograd_calls + min(seen.autograd, 1)
        if error:
            return report_check("grad_of_cube", False, f"at x = {x} {error}", hints)
        results.append((x, got))
    if all(got is None for _, got in results) and calls == 0:
        return report_check("grad_of_cube", False, None, hints)        # still `...`
    wrong = [(x, got) for x, got in results
             if not (isinstance(got, float) and math.isclose(got, 3 * x ** 2, rel_tol=1e-6))]
    observed = None
    if wrong:
        x, got = wrong[0]
        observed = f"at x = {x} your function returned {_describe(got)}; d/dx x**3 there is {3 * x ** 2}"
    elif autograd_calls < len(results):
        observed = ("your function returned the right numbers, but autograd computed none of them: "
                    "neither backward() nor torch.autograd.grad ran")
    return report_check("grad_of_cube", observed is None, observed, hints)


@reference_solution("sgd_update", chapter=1)
def _sgd_update(params: list[torch.Tensor], lr: float) -> None:
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad.zero_()


def check_sgd_update(fn: Callable[[list[torch.Tensor], float], None]) -> Verdict:
    """Exercise 2 (write it): `fn(params, lr)` updates each leaf in place by `-lr * grad`, then zeroes its grad.

    Runs one update on w = [1, -2] (grad [2, -4]) and b = [0.5] (grad [3]) with lr 0.25, on
    `get_device()`. A gradient reset to None (as `optimizer.zero_grad()` does by default) counts as zeroed.
    """
    hints = ["the update must change the very tensor objects in `params` (the caller holds them), "
             "and leave their gradients at zero",
             "`p = p - ...` only rebinds a local name; an in-place operator on a leaf that requires grad "
             "needs autograd switched off"]
    device = get_device()
    w = torch.tensor([1.0, -2.0], device=device, requires_grad=True)
    b = torch.tensor([0.5], device=device, requires_grad=True)
    ((w ** 2).sum() + 3 * b.sum()).backward()                  # w.grad = [2, -4], b.grad = [3]
    returned, error, calls = _run(fn, [w, b], 0.25)
    if error:
        return report_check("sgd_update", False, error, hints)
    if returned is None and calls == 0:
        return report_check("sgd_update", False, None, hints)   # still `...`
    problems = []
    for name, p, expected in (("w", w, [0.5, -1.0]), ("b", b, [-0.25])):
        if not (p.is_leaf and p.requires_grad):
            problems.append(f"{name} is no longer a leaf that requires grad")
        values = p.detach().tolist()
        if not all(math.isclose(v, e, abs_tol=1e-6) for v, e in zip(values, expected)):
            problems.append(f"{name} is {values}, expected {expected}")
        if p.grad is not None and p.grad.abs().max().item() != 0:
            problems.append(f"{name}.grad is still {p.grad.tolist()}")
    observed = None
    if problems:
        observed = "after one update (lr 0.25) of w = [1, -2] with grad [2, -4] and b = [0.5] with grad [3]: " + \
                   "; ".join(problems)
    return report_check("sgd_update", not problems, observed, hints)


@reference_solution("fit_line_by_hand", chapter=1)
def _fit_line_by_hand(x: torch.Tensor, y: torch.Tensor, lr: float = 0.1,
                      steps: int = 300) -> tuple[float, float, list[float]]:
    w = torch.zeros(1, device=x.device, requires_grad=True)
    b = torch.zeros(1, device=x.device, requires_grad=True)
    losses = []
    for _ in range(steps):
        loss = ((w * x + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
        losses.append(loss.item())
    return w.item(), b.item(), losses


def check_fit_line_by_hand(fn: Callable) -> Verdict:
    """Exercise 3 (find the bugs): `fn(x, y, lr, steps)` -> (w, b, losses) fits y ≈ w x + b by hand.

    Data: 100 points of y = 2x + 0.3 plus noise (std 0.05), x in [-1, 1], on `get_device()`; lr 0.1,
    300 steps. Passes when w and b are within 1e-3 of the least-squares line and the loss never rises.
    """
    hints = ["each planted bug shows up as either an error or a loss that rises and falls: "
             "the chapter reproduces both in its update-mistakes section",
             "an in-place update of a leaf that requires grad must happen where autograd is not recording",
             "backward() adds into .grad; at lr 0.1 a loss that keeps bouncing means last step's gradient "
             "is still in there"]
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, 100).reshape(-1, 1)
    y = 2 * x + 0.3 + 0.05 * torch.randn(x.shape, generator=g)
    w_best, b_best = torch.linalg.lstsq(torch.cat([x, torch.ones_like(x)], 1), y).solution.flatten().tolist()
    device, steps = get_device(), 300
    result, error, _ = _run(fn, x.to(device), y.to(device), 0.1, steps)
    if error:
        return report_check("fit_line_by_hand", False, error, hints)
    try:
        w, b, losses = result
        tensors = any(isinstance(loss, torch.Tensor) for loss in losses)
        w, b, losses = float(w), float(b), [float(loss) for loss in losses]
    except (TypeError, ValueError, RuntimeError):
        return report_check("fit_line_by_hand", False,
                            f"your function returned {result!r:.100}; expected (w, b, losses) as floats", hints)
    if tensors:
        return report_check("fit_line_by_hand", False,
                            "the losses you return are tensors: each keeps its step's graph alive; "
                            "log Python floats", hints)
    rises = sum(later > earlier * (1 + 1e-5) for earlier, later in zip(losses, losses[1:]))  # beyond rounding
    close = abs(w - w_best) < 1e-3 and abs(b - b_best) < 1e-3
    passed = close and rises == 0 and len(losses) == steps
    observed = (f"on the check's data (least-squares line w = {w_best:.3f}, b = {b_best:.3f}) your loop ended "
                f"at w = {w:.3f}, b = {b:.3f}; its loss rose on {rises} of {len(losses) - 1} steps "
                f"(at lr 0.1 it should fall on every step)")
    return report_check("fit_line_by_hand", passed, None if passed else observed, hints)


@reference_solution("line_parameters", chapter=1)
def _line_parameters(n_features: int, dtype: torch.dtype,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    weight = (torch.randn(n_features, 1, dtype=dtype, device=device) * 0.01).requires_grad_()
    bias = torch.zeros(1, dtype=dtype, device=device, requires_grad=True)
    return weight, bias


def check_line_parameters(fn: Callable) -> Verdict:
    """Exercise 4 (find the bugs): `fn(n_features, dtype, device)` -> weight (n, 1) with std 0.01, bias (1,)
    of zeros.

    Asks for 64 features in float64 (a real conversion from the default float32; float32 on MPS, which
    has no float64) on `get_device()`, runs `((x @ weight + bias) ** 2).mean().backward()` and looks at
    what `backward()` filled in.
    """
    hints = ["after backward(), only leaf tensors that require grad get a .grad: look at is_leaf and "
             "grad_fn of both tensors",
             "any operation after requires_grad=True (a conversion, a multiplication) returns a new tensor "
             "computed from the one autograd tracks; the leaf is the one you no longer hold",
             "give a tensor its final dtype and values first, and make it require grad last"]
    n_features, device = 64, get_device()
    dtype = torch.float32 if device.type == "mps" else torch.float64
    result, error, _ = _run(fn, n_features, dtype, device)
    if error:
        return report_check("line_parameters", False, error, hints)
    try:
        weight, bias = result
        if not (isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)):
            raise TypeError
    except (TypeError, ValueError):
        return report_check("line_parameters", False,
                            f"your function returned {result!r:.100}; expected (weight, bias) tensors", hints)
    problems = [f"{name} has shape {tuple(t.shape)}, dtype {t.dtype} and device {t.device.type}, expected "
                f"{shape}, {dtype} and {device.type}"
                for name, t, shape in (("weight", weight, (n_features, 1)), ("bias", bias, (1,)))
                if tuple(t.shape) != shape or t.dtype != dtype or t.device.type != device.type]
    if not problems:
        std = weight.detach().std().item()
        if not 0.005 < std < 0.02:
            problems.append(f"weight's values have std {std:.3g}, the docstring asks for 0.01")
        if bias.detach().abs().max().item() != 0:
            problems.append(f"bias starts at {bias.detach().tolist()}, the docstring asks for zeros")
        x = torch.randn(8, n_features, dtype=dtype, generator=torch.Generator().manual_seed(0)).to(device)
        try:
            ((x @ weight + bias) ** 2).mean().backward()
        except RuntimeError as exc:
            problems.append(f"backward() through x @ weight + bias raised RuntimeError: {str(exc).splitlines()[0]}")
        else:
            for name, t in (("weight", weight), ("bias", bias)):
                if not t.is_leaf:
                    problems.append(f"{name}.grad is None after backward(): {name} is not a leaf "
                                    f"(its grad_fn is {type(t.grad_fn).__name__})")
                elif not t.requires_grad:
                    problems.append(f"{name}.grad is None after backward(): autograd never tracked {name}")
    observed = (f"asked for {dtype} parameters with {n_features} features on {device.type}: " + "; ".join(problems)
                if problems else None)
    return report_check("line_parameters", not problems, observed, hints)


@reference_solution("two_branch_forward", chapter=1)
def _two_branch_forward(x: torch.Tensor, W1: torch.Tensor, W2: torch.Tensor) -> torch.Tensor:
    h = x @ W1
    if x.mean() > 0:
        return h @ W2
    scale = h.abs().amax(dim=1, keepdim=True)
    return (h / scale) @ W2


def check_two_branch_forward(fn: Callable) -> Verdict:
    """Exercise 5 (find the bug): `fn(x, W1, W2)` with x (N, 4), W1 (4, 8), W2 (8, 2) -> (N, 2).

    Runs both branches (positive and negative batch mean) with N = 5 and N = 8 (where a broadcast
    of (N, 8) by (N,) runs without an error) on `get_device()`, against the reference computation.
    """
    hints = ["the check runs both branches: feed a batch with a negative mean yourself and print the shapes "
             "of every tensor on that branch",
             "broadcasting lines shapes up from the right: dividing (N, 8) by (N,) pairs the 8 columns "
             "with the N rows",
             "with exactly 8 rows it runs without an error and is still wrong: each row's scale has to "
             "line up with that row, as a column of shape (N, 1)"]
    g, device = torch.Generator().manual_seed(0), get_device()
    W1, W2 = torch.randn(4, 8, generator=g).to(device), torch.randn(8, 2, generator=g).to(device)
    problems = []
    for rows in (5, 8):
        for sign, branch in ((1, "positive"), (-1, "negative")):
            x = (sign * torch.rand(rows, 4, generator=g)).to(device)
            expected = _two_branch_forward(x, W1, W2)
            got, error, _ = _run(fn, x, W1, W2)
            case = f"a batch of {rows} rows with a {branch} mean"
            if error:
                problems.append(f"{case}: {error}")
            elif not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                problems.append(f"{case}: returned {shape}, expected {tuple(expected.shape)}")
            elif not torch.allclose(got, expected, atol=1e-5):
                worst = (got - expected).abs().max().item()
                problems.append(f"{case}: right shape {tuple(got.shape)}, but the values differ from the "
                                f"docstring's computation by up to {worst:.2f}")
    observed = "; ".join(problems) if problems else None
    return report_check("two_branch_forward", not problems, observed, hints)
