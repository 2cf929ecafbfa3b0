"""Chapter 2: find_unregistered_modules, snapshot and unchanged."""
import pytest
import torch
from torch import nn

from course_utils.models import SmallConvNet, TransformerBlock, mlp
from course_utils.modules import find_unregistered_modules, snapshot, unchanged


class ListModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 4), nn.Linear(4, 2)]        # not registered
        self.heads = {"a": [nn.Linear(2, 1)], "b": (nn.Parameter(torch.ones(1)),)}
        self.mask = torch.ones(4)                                # should be a buffer

    def forward(self, x):
        for layer in self.layers:
            x = layer(x * self.mask[: x.shape[1]])
        return x


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ListModel()          # registered child holding the bad state
        self.fine = nn.ModuleList([nn.Linear(2, 2)])

    def forward(self, x):
        return self.fine[0](self.inner(x))


class BuildsInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)

    def forward(self, x):
        head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))   # new weights every call
        return head(self.first(x))


@pytest.mark.parametrize("model", [mlp([4, 8, 2]), SmallConvNet(), TransformerBlock(16, 2), nn.LSTM(3, 4)])
def test_healthy_models_report_nothing(model):
    assert find_unregistered_modules(model) == []


def test_finds_modules_parameters_and_tensors_in_plain_containers():
    found = find_unregistered_modules(ListModel())
    assert sorted(found) == ["heads.a.0", "heads.b.0", "layers.0", "layers.1", "mask"]


def test_recurses_through_registered_children():
    assert sorted(find_unregistered_modules(Outer())) == [
        "inner.heads.a.0", "inner.heads.b.0", "inner.layers.0", "inner.layers.1", "inner.mask"]


def test_alias_of_a_registered_buffer_is_not_reported_but_a_copy_is():
    model = mlp([4, 4])
    model.register_buffer("scale", torch.ones(4))
    model.scale_alias = model.scale           # the same tensor object as a buffer: fine
    model.bias_copy = model[0].bias.detach()  # a new plain tensor: not moved, not saved
    assert find_unregistered_modules(model) == ["bias_copy"]


def test_runtime_check_finds_a_module_built_in_forward_and_restores_mode():
    model = BuildsInForward().train()
    assert find_unregistered_modules(model) == []          # the static scan cannot see it
    assert find_unregistered_modules(model, torch.randn(2, 4)) == ["<forward>:Sequential"]
    assert model.training
    assert not nn.modules.module._global_forward_pre_hooks  # the global hook was removed


def test_runtime_check_removes_its_hook_when_forward_raises():
    with pytest.raises(RuntimeError):
        find_unregistered_modules(BuildsInForward(), torch.randn(2, 5))
    assert not nn.modules.module._global_forward_pre_hooks


def test_rejects_non_modules():
    with pytest.raises(TypeError, match="nn.Module"):
        find_unregistered_modules([nn.Linear(1, 1)])


def test_snapshot_sees_unregistered_parameters_and_unchanged_compares():
    model = ListModel()
    before = snapshot(model)
    assert "layers.0.weight" in before and "heads.b.0" in before
    assert unchanged(model, before, names=["layers"])
    with torch.no_grad():
        model.layers[1].bias += 1
    assert unchanged(model, before, names=["layers.0"])
    assert not unchanged(model, before, names=["layers"])
    with pytest.raises(ValueError, match="no parameter"):
        unchanged(model, before, names=["nope"])
