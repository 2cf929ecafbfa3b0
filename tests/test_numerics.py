"""Chapter 3: find_nonfinite and locate_nonfinite."""
import math

import pytest
import torch
from torch import nn

from course_utils.models import mlp
from course_utils.numerics import NonFiniteLocation, find_nonfinite, locate_nonfinite


def test_find_nonfinite_in_nested_batch_with_paths_counts_and_positions():
    features = torch.randn(5, 3)
    features[3, 1] = float("nan")
    features[4, 0] = float("inf")
    features[4, 2] = -float("inf")
    batch = {"features": features, "labels": torch.arange(5), "extra": [torch.ones(2), torch.tensor([math.nan])]}
    found = find_nonfinite(batch)
    assert [f.path for f in found] == ["batch['features']", "batch['extra'][1]"]
    first = found[0]
    assert (first.nan, first.posinf, first.neginf) == (1, 1, 1)
    assert first.first_indices == [(3, 1), (4, 0), (4, 2)]
    assert "batch['features']: 1 nan, 1 +inf, 1 -inf" in str(first)


def test_find_nonfinite_clean_and_bare_tensor():
    assert find_nonfinite({"x": torch.randn(3), "y": torch.tensor([1, 2])}) == []
    found = find_nonfinite(torch.tensor([1.0, float("nan")]), name="x")
    assert found[0].path == "x" and found[0].first_indices == [(1,)]


def test_find_nonfinite_works_on_views_and_half():
    base = torch.zeros(4, 4, dtype=torch.float16)
    base[2, 3] = float("inf")
    assert find_nonfinite(base[:, 2:], name="v")[0].first_indices == [(2, 1)]


class ExplodesAt(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = mlp([4, 8, 8])
        self.log = LogLayer()
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.log(self.encoder(x)))


class LogLayer(nn.Module):
    def forward(self, x):
        return torch.log(x)   # log of negative numbers: nan


class SqrtLayer(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)  # finite at 0, but its gradient there is inf


def test_locate_names_first_module_in_forward_and_removes_hooks():
    model = ExplodesAt()
    location = locate_nonfinite(model, torch.randn(16, 4))
    assert isinstance(location, NonFiniteLocation)
    assert location.module_name == "log" and location.phase == "forward"
    assert location.inputs_were_finite and "this module made the non-finite values" in str(location)
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())


def test_locate_points_upstream_when_the_input_is_already_bad():
    x = torch.randn(4, 4)
    x[0, 0] = float("nan")
    location = locate_nonfinite(mlp([4, 3]), x)
    assert location.module_name == "0" and not location.inputs_were_finite
    assert "look upstream" in str(location)


def test_locate_finds_a_gradient_that_turns_infinite():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), SqrtLayer(), nn.Linear(3, 1))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()        # relu output 0 -> sqrt(0) = 0 fine, d sqrt / dx = inf
    location = locate_nonfinite(model, torch.randn(2, 3))
    assert location.phase == "backward" and location.module_name == "2"
    assert locate_nonfinite(model, torch.randn(2, 3), backward=False) is None


def test_locate_returns_none_when_all_is_finite():
    assert locate_nonfinite(mlp([4, 8, 1]), torch.randn(3, 4)) is None


def test_locate_removes_hooks_when_the_model_raises():
    model = mlp([4, 2])
    with pytest.raises(RuntimeError):
        locate_nonfinite(model, torch.randn(3, 5))
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())
