"""Chapter 1 exercises (tensors and autograd): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic module `course_utils.autograd` holds
those. Each check runs the learner's function on its own seeded inputs, of sizes, dtypes and
values the chapter did not show (so an answer tuned to one size fails), on `get_device()`, and
reports what it *observed*; a wrong answer that raises never crashes a check (the exception is the
observation). Hints, mildest first, come one per later attempt and never give the solution.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from course_utils.devices import get_device
from course_utils.exercises import Verdict, reference_solution, report_check

__all__ = ["check_fit_linear_by_hand", "check_line_parameters", "check_per_loss_gradients", "check_sgd_update",
           "check_slopes_of_cube", "check_two_branch_forward"]

_AUTOGRAD_ENTRY_POINTS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


class _TorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called while active (did any code run?), the calls
    that ask autograd for gradients (`Tensor.backward`, `torch.autograd.backward` / `grad`), and each
    function by name (`calls.named("tanh")`). Calls made inside a torch function are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.autograd = 0
        self.by_name: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.autograd += func in _AUTOGRAD_ENTRY_POINTS
        self.by_name[getattr(func, "__name__", "")] += 1
        return func(*args, **(kwargs or {}))

    def named(self, name: str) -> int:
        return self.by_name[name]


def _run_counted(fn: Callable, *args) -> tuple[object, str | None, _TorchCalls]:
    """Call the learner's `fn(*args)`: (result, the error it raised as one line or None, what it called)."""
    with _TorchCalls() as calls:
        try:
            return fn(*args), None, calls
        except Exception as exc:  # any mistake of the learner's is an observation, not a crash
            first_line = (str(exc).strip().splitlines() or [""])[0]
            first_sentence = first_line.split(". ")[0].rstrip(".")   # PyTorch's advice, if any, follows
            return None, f"your function raised {type(exc).__name__}: {first_sentence}", calls


def _untouched(result: object, calls: _TorchCalls) -> bool:
    """The exercise is still `...`: it returned None and ran no torch code."""
    return result is None and calls.count == 0


def _tensor_problem(got: object, like: torch.Tensor, what: str) -> str | None:
    """Why `got` is not a tensor of `like`'s shape, dtype and device, or None."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is {type(got).__name__}, not a tensor"
    if got.shape != like.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(like.shape)}"
    if got.dtype != like.dtype:
        return f"{what} is {got.dtype}, expected {like.dtype} (the dtype of the input)"
    if got.device.type != like.device.type:
        return f"{what} is on {got.device.type}, expected {like.device.type} (the device of the input)"
    return None


def _largest_difference(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.detach() - expected.detach()).abs().max().item()


# --- exercise 1: slopes_of_cube (write it) ------------------------------------------------------

@reference_solution("slopes_of_cube", chapter=1)
def _slopes_of_cube(xs: torch.Tensor) -> torch.Tensor:
    t = xs.detach().clone().requires_grad_()
    (t ** 3).sum().backward()          # element-wise: vᵀJ with v = 1 is each point's own derivative
    return t.grad


def check_slopes_of_cube(fn: Callable[[torch.Tensor], torch.Tensor]) -> Verdict:
    """Exercise 1 (write it): `fn(xs)` returns d/dx x**3 at every point of `xs` (any shape), as a tensor of
    xs's shape, dtype and device, computed by autograd with one backward pass.

    Inputs the learner did not see: 7 points in float32, a (3, 4) grid in float64 and a single point, on
    `get_device()` (float32 only on MPS). Each call must ask autograd once (`backward()` or
    `torch.autograd.grad`), so a derivative worked out by hand, or one backward per point, is rejected.
    """
    hints = ["the numbers have to come from autograd: the points must become a leaf tensor autograd tracks, "
             "and backward() needs a single number to start from",
             "which weighted sum of the outputs has, as its gradient, each point's own derivative? Every "
             "output here depends on its own point only",
             "backward(gradient=...) and torch.autograd.grad(..., grad_outputs=...) take that weight vector; "
             "its shape must be the output's shape, whatever that is"]
    device = get_device()
    wide = torch.float32 if device.type == "mps" else torch.float64
    g = torch.Generator().manual_seed(11)
    cases = [(4 * torch.rand(7, generator=g) - 2).to(device),
             (4 * torch.rand(3, 4, generator=g, dtype=torch.float64) - 2).to(device, wide),
             torch.tensor([0.7], device=device)]
    observed = None
    for i, xs in enumerate(cases):
        got, error, calls = _run_counted(fn, xs.clone())
        where = f"for xs of shape {tuple(xs.shape)} ({xs.dtype})"
        if error:
            observed = f"{where} {error}"
        elif i == 0 and _untouched(got, calls):
            return report_check("slopes_of_cube", False, None, hints)
        elif (problem := _tensor_problem(got, xs, "the result")) is not None:
            observed = f"{where} {problem}"
        elif not torch.allclose(got, 3 * xs ** 2, rtol=1e-5 if xs.dtype == torch.float32 else 1e-10, atol=0):
            worst = (got - 3 * xs ** 2).abs().argmax()
            at = xs.flatten()[worst].item()
            observed = (f"{where} your slope at x = {at:.3f} is {got.flatten()[worst].item():.4g}; "
                        f"d/dx x**3 there is {3 * at ** 2:.4g}")
        elif calls.autograd == 0:
            observed = (f"{where} the numbers are right, but autograd computed none of them: neither backward() "
                        "nor torch.autograd.grad ran")
        elif calls.autograd > 1:
            observed = (f"{where} the numbers are right, but your function asked autograd {calls.autograd} "
                        f"times for {xs.numel()} points; the exercise asks for one backward pass")
        if observed:
            break
    return report_check("slopes_of_cube", observed is None, observed, hints)


# --- exercise 2: sgd_update (write it) ----------------------------------------------------------

@reference_solution("sgd_update", chapter=1)
def _sgd_update(params: list[torch.Tensor], lr: float) -> None:
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad.zero_()


def _sgd_params(device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(2, 3, generator=g).to(device).requires_grad_(),    # a matrix
            torch.randn(3, generator=g).to(device).requires_grad_(),       # a vector
            torch.tensor(0.5, device=device, requires_grad=True)]          # a 0-d scalar


def _sgd_loss(params: list[torch.Tensor]) -> torch.Tensor:
    W, v, s = params
    return (W ** 2).sum() + (W @ v).sum() + 3 * s * v.sum()


def check_sgd_update(fn: Callable[[list[torch.Tensor], float], None]) -> Verdict:
    """Exercise 2 (write it): `fn(params, lr)` updates each leaf in place by `-lr * grad`, then zeroes its grad.

    Inputs the learner did not see: three leaves of different shapes (2×3, 3 and a 0-d scalar) on
    `get_device()`, two steps (lr 0.05, then 0.2), each after a fresh `backward()`, compared with the same
    update on copies. A gradient reset to None (as `optimizer.zero_grad()` does by default) counts as
    zeroed. The check keeps its own references to the tensors, so replacing them in the list is seen.
    """
    hints = ["the update must change the very tensor objects in `params` (the caller holds them), and leave "
             "their gradients at zero",
             "`p = p - ...` only rebinds a local name; an in-place operator on a leaf that requires grad needs "
             "autograd switched off",
             "the list can hold any number of tensors, of any shape"]
    device = get_device()
    params, expected = _sgd_params(device), _sgd_params(device)
    names = ["the 2×3 matrix", "the vector", "the 0-d scalar"]
    observed = None
    for step, lr in enumerate((0.05, 0.2), 1):
        for group in (params, expected):
            _sgd_loss(group).backward()
        _sgd_update(expected, lr)
        before = [p.detach().clone() for p in params]
        returned, error, calls = _run_counted(fn, list(params), lr)
        if error:
            observed = f"at step {step} (lr {lr}) {error}"
        elif step == 1 and _untouched(returned, calls):
            return report_check("sgd_update", False, None, hints)
        else:
            problems = []
            for name, p, e, b in zip(names, params, expected, before):
                if not (p.is_leaf and p.requires_grad):
                    problems.append(f"{name} is no longer a leaf that requires grad")
                elif torch.equal(p.detach(), b):
                    problems.append(f"{name} did not change")
                elif not torch.allclose(p.detach(), e.detach(), atol=1e-6):
                    problems.append(f"{name} moved by {_largest_difference(p, b):.4g} at most, the update "
                                    f"-lr * grad moves it by {_largest_difference(e, b):.4g}")
                if p.grad is not None and p.grad.abs().max().item() != 0:
                    problems.append(f"{name}'s .grad still holds {p.grad.abs().max().item():.3g} at its largest")
            if problems:
                observed = f"after update {step} (lr {lr}) of three tensors: " + "; ".join(problems)
        if observed:
            break
    return report_check("sgd_update", observed is None, observed, hints)


# --- exercise 3: fit_linear_by_hand (find the bugs) ---------------------------------------------

@reference_solution("fit_linear_by_hand", chapter=1)
def _fit_linear_by_hand(x: torch.Tensor, y: torch.Tensor, lr: float,
                        steps: int) -> tuple[list[float], float, list[float]]:
    w = torch.zeros(x.shape[1], 1, device=x.device, requires_grad=True)
    b = torch.zeros(1, device=x.device, requires_grad=True)
    losses = []
    for _ in range(steps):
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
        losses.append(loss.item())
    return w.flatten().tolist(), b.item(), losses


def _plane_data(n: int, k: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(n, k, generator=g) - 1
    true_w = torch.linspace(2.0, -1.0, k).reshape(k, 1)
    y = x @ true_w + 0.3 + 0.05 * torch.randn(n, 1, generator=g)
    return x.to(device), y.to(device)


def check_fit_linear_by_hand(fn: Callable) -> Verdict:
    """Exercise 3 (find the bugs): `fn(x, y, lr, steps)` -> (w as k floats, b, losses) fits y ≈ x @ w + b
    by plain gradient descent from w = 0, b = 0.

    Inputs the learner did not see: 100 points with 1 feature (lr 0.1, 300 steps) and 37 points with 3
    features (lr 0.3, 40 steps, far from converged), on `get_device()`. Compared step by step with the same
    descent done by the check: a closed-form answer, a fixed lr or step count, or a one-feature `w * x`
    does not match.
    """
    hints = ["each planted bug shows up as either an error or a loss that rises and falls: the chapter "
             "reproduces both in its update-mistakes section",
             "an in-place update of a leaf that requires grad must happen where autograd is not recording",
             "backward() adds into .grad; a loss that keeps bouncing means last step's gradient is still in there"]
    device = get_device()
    observed = None
    for n, k, lr, steps, seed in ((100, 1, 0.1, 300, 1), (37, 3, 0.3, 40, 2)):
        x, y = _plane_data(n, k, seed, device)
        w_ref, b_ref, losses_ref = _fit_linear_by_hand(x, y, lr, steps)
        where = f"on {n} points with {k} feature{'s' * (k > 1)} (lr {lr}, {steps} steps)"
        result, error, _ = _run_counted(fn, x, y, lr, steps)
        if error:
            observed = f"{where} {error}"
            break
        try:
            w, b, losses = result
            tensors = any(isinstance(loss, torch.Tensor) for loss in losses)
            w = [float(v) for v in (w.flatten().tolist() if isinstance(w, torch.Tensor) else w)]
            b, losses = float(b), [float(loss) for loss in losses]
        except (TypeError, ValueError, RuntimeError, AttributeError):
            observed = f"{where} your function returned {result!r:.100}; expected (w, b, losses) as floats"
            break
        rises = sum(later > earlier * (1 + 1e-5) for earlier, later in zip(losses, losses[1:]))  # beyond rounding
        if tensors:
            observed = (f"{where} the losses you return are tensors: each one holds on to its step's graph "
                        "(look at its grad_fn)")
        elif len(w) != k:
            observed = f"{where} your w has {len(w)} value{'s' * (len(w) != 1)} for {k} features"
        elif len(losses) != steps:
            observed = f"{where} your function returned {len(losses)} losses for {steps} steps"
        else:
            ends_apart = not all(abs(a - e) < 1e-4 for a, e in zip(w + [b], w_ref + [b_ref]))
            first = next((i for i, (a, e) in enumerate(zip(losses, losses_ref))
                          if not math.isclose(a, e, rel_tol=1e-3, abs_tol=1e-6)), None)
            if ends_apart or first is not None:
                ends = (f"your loop ended at w = {[round(v, 3) for v in w]}, b = {b:.3f}, where gradient descent "
                        f"from zero ends at w = {[round(v, 3) for v in w_ref]}, b = {b_ref:.3f}; " if ends_apart
                        else "w and b match gradient descent from zero, but ")
                losses_seen = ("the losses match" if first is None else
                               f"your losses first differ from the descent's at step {first} (yours "
                               f"{losses[first]:.4g}, the descent's {losses_ref[first]:.4g})")
                observed = f"{where} {ends}{losses_seen}; your loss rose on {rises} of {steps - 1} steps"
        if observed:
            break
    return report_check("fit_linear_by_hand", observed is None, observed, hints)


# --- exercise 4: line_parameters (find the bugs) ------------------------------------------------

@reference_solution("line_parameters", chapter=1)
def _line_parameters(n_features: int, dtype: torch.dtype,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    weight = (torch.randn(n_features, 1, dtype=dtype, device=device) * 0.01).requires_grad_()
    bias = torch.zeros(1, dtype=dtype, device=device, requires_grad=True)
    return weight, bias


def check_line_parameters(fn: Callable) -> Verdict:
    """Exercise 4 (find the bugs): `fn(n_features, dtype, device)` -> weight (n, 1) with std 0.01, bias (1,)
    of zeros, both learnable leaves.

    Inputs the learner did not see: 257 features in float64 (a real conversion from the default float32;
    float32 on MPS, which has no float64) and 3 features in float32, on `get_device()`. Runs
    `((x @ weight + bias) ** 2).mean().backward()` and looks at what `backward()` filled in; the std is
    judged on the 257 values only.
    """
    hints = ["after backward(), only leaf tensors that require grad get a .grad: look at is_leaf and "
             "grad_fn of both tensors",
             "any operation after requires_grad=True (a conversion, a multiplication) returns a new tensor "
             "computed from the one autograd tracks; the leaf is the one you no longer hold",
             "give a tensor its final dtype and values first, and make it require grad last"]
    device = get_device()
    wide = torch.float32 if device.type == "mps" else torch.float64
    observed = None
    for n_features, dtype in ((257, wide), (3, torch.float32)):
        where = f"asked for {dtype} parameters with {n_features} features on {device.type}:"
        result, error, calls = _run_counted(fn, n_features, dtype, device)
        if error:
            observed = f"{where} {error}"
            break
        if n_features == 257 and _untouched(result, calls):
            return report_check("line_parameters", False, None, hints)
        try:
            weight, bias = result
            if not (isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)):
                raise TypeError
        except (TypeError, ValueError):
            observed = f"{where} your function returned {result!r:.100}; expected (weight, bias) tensors"
            break
        problems = [f"{name} has shape {tuple(t.shape)}, dtype {t.dtype} and device {t.device.type}, expected "
                    f"{shape}, {dtype} and {device.type}"
                    for name, t, shape in (("weight", weight, (n_features, 1)), ("bias", bias, (1,)))
                    if tuple(t.shape) != shape or t.dtype != dtype or t.device.type != device.type]
        if not problems:
            std = weight.detach().std().item()
            if n_features > 100 and not 0.007 < std < 0.013:
                problems.append(f"weight's values have std {std:.3g}, the docstring asks for 0.01")
            if bias.detach().abs().max().item() != 0:
                problems.append(f"bias starts at {bias.detach().tolist()}, the docstring asks for zeros")
            x = torch.randn(8, n_features, dtype=dtype, generator=torch.Generator().manual_seed(0)).to(device)
            try:
                ((x @ weight + bias) ** 2).mean().backward()
            except RuntimeError as exc:
                problems.append("backward() through x @ weight + bias raised RuntimeError: "
                                f"{str(exc).splitlines()[0]}")
            else:
                for name, t in (("weight", weight), ("bias", bias)):
                    if not t.is_leaf:
                        problems.append(f"{name}.grad is None after backward(): {name} is not a leaf "
                                        f"(its grad_fn is {type(t.grad_fn).__name__})")
                    elif not t.requires_grad:
                        problems.append(f"{name}.grad is None after backward(): autograd never tracked {name}")
        if problems:
            observed = f"{where} " + "; ".join(problems)
            break
    return report_check("line_parameters", observed is None, observed, hints)


# --- exercise 5: two_branch_forward (find the bug) ----------------------------------------------

@reference_solution("two_branch_forward", chapter=1)
def _two_branch_forward(x: torch.Tensor, W1: torch.Tensor, W2: torch.Tensor) -> torch.Tensor:
    h = x @ W1
    if x.mean() > 0:
        return h @ W2
    scale = h.abs().amax(dim=1, keepdim=True)
    return (h / scale) @ W2


def check_two_branch_forward(fn: Callable) -> Verdict:
    """Exercise 5 (find the bug): `fn(x, W1, W2)` with x (N, 4), W1 (4, 8), W2 (8, 2) -> (N, 2).

    Inputs the learner did not see: both branches (positive and negative batch mean) with N = 3, 8 (where
    a broadcast of (N, 8) by (N,) runs without an error) and 11, on `get_device()`, against the docstring's
    computation.
    """
    hints = ["the check runs both branches: feed a batch with a negative mean yourself and print the shapes "
             "of every tensor on that branch",
             "broadcasting lines shapes up from the right: dividing (N, 8) by (N,) pairs the 8 columns "
             "with the N rows",
             "with exactly 8 rows it runs without an error and is still wrong: each row's scale has to "
             "line up with that row, whatever the number of rows"]
    g, device = torch.Generator().manual_seed(0), get_device()
    W1, W2 = torch.randn(4, 8, generator=g).to(device), torch.randn(8, 2, generator=g).to(device)
    problems = []
    for rows in (3, 8, 11):
        for sign, branch in ((1, "positive"), (-1, "negative")):
            x = (sign * torch.rand(rows, 4, generator=g)).to(device)
            expected = _two_branch_forward(x, W1, W2)
            got, error, _ = _run_counted(fn, x, W1, W2)
            case = f"a batch of {rows} rows with a {branch} mean"
            if error:
                problems.append(f"{case}: {error}")
            elif not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                problems.append(f"{case}: returned {shape}, expected {tuple(expected.shape)}")
            elif not torch.allclose(got, expected, atol=1e-5):
                problems.append(f"{case}: right shape {tuple(got.shape)}, but the values differ from the "
                                f"docstring's computation by up to {_largest_difference(got, expected):.2f}")
    observed = "; ".join(problems) if problems else None
    return report_check("two_branch_forward", not problems, observed, hints)


# --- exercise 6: per_loss_gradients (find the bugs) ---------------------------------------------

@reference_solution("per_loss_gradients", chapter=1)
def _per_loss_gradients(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.tanh(x @ w)                          # the forward pass, once
    fit = ((h - y) ** 2).mean()
    penalty = (h ** 2).mean()
    (grad_fit,) = torch.autograd.grad(fit, w, retain_graph=True)   # penalty still needs the graph
    (grad_penalty,) = torch.autograd.grad(penalty, w)              # the last pass may free it
    return grad_fit, grad_penalty


def _two_losses(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two true gradients, each from its own forward (the check's oracle; no retained graph)."""
    grads = []
    for loss_of in (lambda h: ((h - y) ** 2).mean(), lambda h: (h ** 2).mean()):
        leaf = w.detach().clone().requires_grad_()
        (grad,) = torch.autograd.grad(loss_of(torch.tanh(x @ leaf)), leaf)
        grads.append(grad)
    return grads[0], grads[1]


def check_per_loss_gradients(fn: Callable) -> Verdict:
    """Exercise 6 (find the bugs): `fn(w, x, y)` -> the gradient of each of two losses with respect to w,
    separately, from one forward pass h = tanh(x @ w): fit = mean((h - y)**2), penalty = mean(h**2).

    Inputs the learner did not see: w of shape (3, 2) with N = 16, then (5, 1) with N = 7 and a stale
    gradient already in `w.grad` (as a training loop leaves it), on `get_device()`. Each true gradient is
    computed from its own forward; the learner's function must run `tanh` once per call.
    """
    hints = ["two things go wrong, one after the other: the second backward() finds part of the graph freed, "
             "and what you return for the fit loss changes after you read it",
             "the first pass must leave the graph for the second one; the last one may free it",
             ".grad is one tensor that every backward() adds into: a name bound to it sees every later pass, "
             "including an earlier step's gradient that was already there"]
    device = get_device()
    g = torch.Generator().manual_seed(3)
    observed = None
    for k, m, n, stale in ((3, 2, 16, False), (5, 1, 7, True)):
        x, y = torch.randn(n, k, generator=g).to(device), torch.rand(n, m, generator=g).to(device)
        w = torch.randn(k, m, generator=g).to(device).requires_grad_()
        if stale:
            w.grad = torch.randn(k, m, generator=g).to(device)       # an earlier step's gradient
        true_fit, true_penalty = _two_losses(w, x, y)
        where = f"for w of shape {(k, m)} and {n} samples" + (" (w.grad held an earlier gradient)" if stale else "")
        result, error, calls = _run_counted(fn, w, x, y)
        if error:
            observed = f"{where} {error}"
            break
        try:
            got_fit, got_penalty = result
        except (TypeError, ValueError):
            observed = f"{where} your function returned {result!r:.100}; expected two gradients"
            break
        problems = []
        for name, got in (("fit", got_fit), ("penalty", got_penalty)):
            problem = _tensor_problem(got, w, f"the {name} gradient")
            if problem:
                problems.append(problem)
                continue
            if torch.allclose(got, {"fit": true_fit, "penalty": true_penalty}[name], atol=1e-5):
                continue
            same_as = [label for label, value in (("the fit loss's", true_fit), ("the penalty's", true_penalty),
                                                  ("fit + penalty's", true_fit + true_penalty))
                       if torch.allclose(got, value, atol=1e-5)]
            problems.append(f"the {name} gradient you return differs from the {name} loss's own gradient by up "
                            f"to {_largest_difference(got, {'fit': true_fit, 'penalty': true_penalty}[name]):.3g}"
                            + (f"; it equals {same_as[0]} gradient" if same_as else ""))
        if not problems and calls.named("tanh") != 1:
            problems.append(f"the gradients are right, but the forward pass (tanh) ran {calls.named('tanh')} "
                            "times in one call; the docstring asks for one forward pass")
        if problems:
            observed = f"{where}: " + "; ".join(problems)
            break
    return report_check("per_loss_gradients", observed is None, observed, hints)
