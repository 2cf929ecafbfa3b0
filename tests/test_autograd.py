"""Chapter 1: the manual regression, its pitfall, the exercises' checks, plots and the widget."""
import contextlib
import math
import re

import pytest
import torch

from course_utils import (RegressionExplorer, check_fit_line_by_hand, check_grad_of_cube, check_line_parameters,
                          check_sgd_update, check_two_branch_forward, fit_line)
from course_utils import exercises
from course_utils.plotting import plot_line_fit, plot_losses


@pytest.fixture
def line_data():
    x = torch.linspace(-1, 1, 200).reshape(-1, 1)
    return x, 2 * x + 0.3 + torch.randn(x.shape) * 0.02


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_fit_line_recovers_w_and_b(line_data, seed):
    fit = fit_line(*line_data, lr=0.1, steps=1000, seed=seed)
    assert abs(fit.w - 2) < 0.02 and abs(fit.b - 0.3) < 0.02
    assert len(fit.losses) == len(fit.path) == 1000 and not fit.diverged
    assert fit.path[0] == (torch.randn(1, generator=torch.Generator().manual_seed(seed)).item(), 0.0)
    assert str(fit).startswith(f"w = {fit.w:.3f}, b = {fit.b:.3f} after 1000 steps")


def test_fit_line_matches_autograd_free_closed_form(line_data):
    x, y = line_data
    design = torch.cat([x, torch.ones_like(x)], dim=1)
    w, b = torch.linalg.lstsq(design, y).solution.flatten().tolist()
    fit = fit_line(x, y, lr=0.1, steps=3000)
    assert math.isclose(fit.w, w, abs_tol=1e-4) and math.isclose(fit.b, b, abs_tol=1e-4)


def test_forgetting_zero_grad_makes_the_loss_oscillate(line_data):
    good = fit_line(*line_data, steps=200)
    bad = fit_line(*line_data, steps=200, zero_grad=False)
    rises = sum(b > a for a, b in zip(bad.losses, bad.losses[1:]))
    assert all(b <= a + 1e-9 for a, b in zip(good.losses, good.losses[1:]))  # monotone
    assert rises > 10 and bad.losses[-1] > 10 * good.losses[-1]


def _rises(losses):
    return sum(later > earlier * (1 + 1e-5) for earlier, later in zip(losses, losses[1:]))


def test_learning_rate_regimes_of_the_line_fit(line_data):
    """Chapter 1 §7: the loss's curvature along b is 2, so plain GD has a hard limit at lr = 1."""
    b_star = fit_line(*line_data, lr=0.1, steps=1000).b

    def crossings(fit, steps=10):                 # how often b jumps to the other side of its optimum
        side = [b > b_star for _, b in fit.path[:steps]]
        return sum(a != b for a, b in zip(side, side[1:]))
    slow, bouncing, edge, over = (fit_line(*line_data, lr=lr, steps=200) for lr in (0.3, 0.9, 1.0, 1.01))
    assert _rises(slow.losses) == _rises(bouncing.losses) == _rises(edge.losses) == 0
    assert crossings(slow) == 0 and crossings(bouncing) == 9 and crossings(edge) == 9
    assert bouncing.losses[-1] < 1.01 * slow.losses[-1] and edge.losses[-1] > 100 * slow.losses[-1]
    assert _rises(over.losses) > 190 and not over.diverged and over.losses[-1] > over.losses[0]


def test_fit_line_stops_on_divergence(line_data):
    fit = fit_line(*line_data, lr=1.5, steps=1000)
    assert fit.diverged and len(fit.losses) < 1000
    assert "diverged" in str(fit)


@pytest.mark.parametrize("kwargs, match", [({"lr": 0}, "lr > 0"), ({"steps": 0}, "steps >= 1")])
def test_fit_line_rejects_bad_hyperparameters(line_data, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_line(*line_data, **kwargs)


def test_fit_line_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"shape \(N, 1\)"):
        fit_line(torch.ones(5), torch.ones(5))


# --- exercises: each reference passes its check; each planted bug alone is rejected ----------

def _reference(name):
    return exercises.reference(name)


def _observed(verdict) -> str:
    """The verdict's first line: what the check observed, without the hints of later attempts."""
    return str(verdict).splitlines()[0]


def test_grad_of_cube(learner):
    assert check_grad_of_cube(_reference("grad_of_cube"))
    assert "not attempted" in str(check_grad_of_cube(lambda x: None))
    wrong = check_grad_of_cube(lambda x: 3.0 * x)
    assert not wrong and "at x = 2.0 your function returned 6.0" in str(wrong)
    by_hand = check_grad_of_cube(lambda x: 3 * x ** 2)            # right numbers, no autograd
    assert not by_hand and "autograd computed none of them" in str(by_hand)
    by_hand_in_torch = check_grad_of_cube(lambda x: (3 * torch.tensor(x) ** 2).item())
    assert not by_hand_in_torch and "autograd computed none of them" in str(by_hand_in_torch)

    def with_autograd_grad(x):
        t = torch.tensor(x, requires_grad=True)
        return torch.autograd.grad(t ** 3, t)[0].item()
    assert check_grad_of_cube(with_autograd_grad)

    def returns_the_tensor(x):
        t = torch.tensor(x, requires_grad=True)
        (t ** 3).backward()
        return t.grad
    assert "not a Python float" in str(check_grad_of_cube(returns_the_tensor))

    def raises(x):
        return torch.tensor(x).grad.item()
    assert "raised AttributeError" in str(check_grad_of_cube(raises))


def test_sgd_update(learner):
    assert check_sgd_update(_reference("sgd_update"))

    def set_to_none(params, lr):                  # what optimizer.zero_grad() does by default
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
        for p in params:
            p.grad = None
    assert check_sgd_update(set_to_none)

    def rebinds_instead_of_updating(params, lr):
        for p in params:
            p = p - lr * p.grad  # noqa: F841  (the classic mistake: the leaf is untouched)
    verdict = check_sgd_update(rebinds_instead_of_updating)
    assert not verdict and "not attempted" not in str(verdict) and "w is [1.0, -2.0]" in str(verdict)

    def forgets_zero(params, lr):
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    assert "w.grad is still [2.0, -4.0]" in str(check_sgd_update(forgets_zero))

    def only_the_first(params, lr):
        _reference("sgd_update")(params[:1], lr)
    assert "b is [0.5], expected [-0.25]" in str(check_sgd_update(only_the_first))

    def outside_no_grad(params, lr):
        for p in params:
            p -= lr * p.grad
    assert "raised RuntimeError: a leaf Variable" in str(check_sgd_update(outside_no_grad))


def _fit_line_by_hand(*, no_grad: bool, zero_grad: bool):
    """The exercise's loop with each planted bug switchable: update outside no_grad, no grad.zero_()."""
    def fit(x, y, lr, steps):
        w = torch.zeros(1, device=x.device, requires_grad=True)
        b = torch.zeros(1, device=x.device, requires_grad=True)
        losses = []
        for _ in range(steps):
            loss = ((w * x + b - y) ** 2).mean()
            loss.backward()
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                w -= lr * w.grad
                b -= lr * b.grad
            if zero_grad:
                w.grad.zero_()
                b.grad.zero_()
            losses.append(loss.item())
        return w.item(), b.item(), losses
    return fit


def test_fit_line_by_hand(learner):
    assert check_fit_line_by_hand(_reference("fit_line_by_hand"))
    assert check_fit_line_by_hand(_fit_line_by_hand(no_grad=True, zero_grad=True))
    outside = check_fit_line_by_hand(_fit_line_by_hand(no_grad=False, zero_grad=True))
    assert not outside and "leaf Variable that requires grad is being used in an in-place" in str(outside)
    no_zero = check_fit_line_by_hand(_fit_line_by_hand(no_grad=True, zero_grad=False))
    assert not no_zero and re.search(r"loss rose on \d{2,} of 299 steps", str(no_zero))

    def logs_tensors(x, y, lr, steps):
        w, b, losses = _reference("fit_line_by_hand")(x, y, lr, steps)
        return w, b, [torch.tensor(loss) for loss in losses]
    assert "tensors" in str(check_fit_line_by_hand(logs_tensors))
    assert "expected (w, b, losses)" in str(check_fit_line_by_hand(lambda x, y, lr, steps: None))


def _line_parameters(*, scale_after: bool, convert_after: bool):
    """The exercise's parameters with each planted bug switchable: `* 0.01` and `.to(device, dtype)` after
    requires_grad."""
    def make(n_features, dtype, device):
        if scale_after:
            weight = torch.randn(n_features, 1, dtype=dtype, device=device, requires_grad=True) * 0.01
        else:
            weight = (torch.randn(n_features, 1, dtype=dtype, device=device) * 0.01).requires_grad_()
        if convert_after:
            bias = torch.zeros(1, requires_grad=True).to(device, dtype)
        else:
            bias = torch.zeros(1, dtype=dtype, device=device, requires_grad=True)
        return weight, bias
    return make


def test_line_parameters(learner):
    assert check_line_parameters(_reference("line_parameters"))
    assert check_line_parameters(_line_parameters(scale_after=False, convert_after=False))
    scaled = _observed(check_line_parameters(_line_parameters(scale_after=True, convert_after=False)))
    assert "weight is not a leaf (its grad_fn is MulBackward0)" in scaled and "bias" not in scaled
    converted = _observed(check_line_parameters(_line_parameters(scale_after=False, convert_after=True)))
    assert "bias is not a leaf (its grad_fn is ToCopyBackward0)" in converted and "weight" not in converted

    def drops_the_scale(n_features, dtype, device):
        return (torch.randn(n_features, 1, dtype=dtype, device=device, requires_grad=True),
                torch.zeros(1, dtype=dtype, device=device, requires_grad=True))
    assert "std" in str(check_line_parameters(drops_the_scale))

    def bias_untracked(n_features, dtype, device):
        weight, _ = _reference("line_parameters")(n_features, dtype, device)
        return weight, torch.zeros(1, dtype=dtype, device=device)
    assert "autograd never tracked bias" in str(check_line_parameters(bias_untracked))

    def float16(n_features, dtype, device):
        return _reference("line_parameters")(n_features, torch.float16, device)
    assert "dtype torch.float16" in str(check_line_parameters(float16))


def test_two_branch_forward(learner):
    assert check_two_branch_forward(_reference("two_branch_forward"))

    def broadcast_bug(x, W1, W2):                 # the planted bug: (N, 8) / (N,)
        h = x @ W1
        if x.mean() > 0:
            return h @ W2
        return (h / h.abs().amax(dim=1)) @ W2
    verdict = _observed(check_two_branch_forward(broadcast_bug))
    assert "5 rows with a negative mean: your function raised RuntimeError" in verdict
    assert "8 rows with a negative mean: right shape (8, 2), but the values differ" in verdict
    assert "positive" not in verdict

    def wrong_axis(x, W1, W2):                     # runs for every N, wrong values on the negative branch only
        h = x @ W1
        if x.mean() > 0:
            return h @ W2
        return (h / h.abs().amax(dim=0, keepdim=True)) @ W2
    verdict = _observed(check_two_branch_forward(wrong_axis))
    assert "values differ" in verdict and "positive" not in verdict

    def positive_branch_broken(x, W1, W2):
        if x.mean() > 0:
            return (x @ W1).T @ W2
        return _reference("two_branch_forward")(x, W1, W2)
    verdict = _observed(check_two_branch_forward(positive_branch_broken))
    assert "positive mean" in verdict and "negative" not in verdict


def test_plots_draw_one_line_per_history(line_data):
    ax = plot_losses({"a": [3.0, 2.0, 1.0], "b": [1.0, float("nan")]})
    assert len(ax.get_lines()) == 2 and ax.get_yscale() == "log"
    ax = plot_line_fit(*line_data, 2.0, 0.3)
    assert ax.get_lines()[0].get_label().startswith("fit: 2.00x")
    with pytest.raises(ValueError, match="empty"):
        plot_losses({})


def test_regression_explorer_refits_when_the_slider_moves(line_data):
    explorer = RegressionExplorer(*line_data, lr=0.1, steps=200)
    before = explorer.last_fit
    assert not before.diverged
    explorer.lr.value = 1.5
    assert explorer.last_fit is not before and explorer.last_fit.diverged
    explorer.steps.value = 50
    assert len(explorer.last_fit.losses) <= 50
