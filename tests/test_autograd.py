"""Chapter 1: the manual regression, its pitfall, plots and the widget (exercises: test_exercises_tensors_autograd)."""
import math

import pytest
import torch

from course_utils import RegressionExplorer, fit_line
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
