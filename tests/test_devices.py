"""Chapter 3: check_devices and named_tensors."""
import pytest
import torch
from torch import nn

from course_utils.devices import DeviceMismatchError, check_devices, named_tensors, torch_threads
from course_utils.models import mlp


def test_named_tensors_paths():
    batch = {"x": torch.ones(1), "pair": (torch.zeros(1), "label")}
    assert [p for p, _ in named_tensors(batch)] == ["batch['x']", "batch['pair'][0]"]


def test_check_devices_passes_when_consistent():
    check_devices(mlp([2, 2]), torch.ones(3, 2), {"y": torch.ones(3)})


def test_check_devices_names_inputs_and_parameters_on_another_device():
    model = mlp([2, 3, 1])
    model[2].to("meta")        # half the model moved
    model.register_buffer("scale", torch.ones(1, device="meta"))
    with pytest.raises(DeviceMismatchError) as info:
        check_devices(model, torch.ones(3, 2, device="meta"), {"target": torch.ones(3)})
    message = str(info.value)
    assert "the model is on cpu" in message
    assert "model parameter 2.weight: meta" in message and "model buffer scale: meta" in message
    assert "input inputs[0]: meta" in message and "inputs[1]['target']" not in message
    assert "to_device(batch, device)" in message
    assert isinstance(info.value, RuntimeError)


def test_check_devices_bad_arguments():
    with pytest.raises(TypeError, match="nn.Module"):
        check_devices("model")
    with pytest.raises(ValueError, match="no parameters or buffers"):
        check_devices(nn.ReLU(), torch.ones(1))


def test_torch_threads_sets_and_restores_even_on_error():
    before = torch.get_num_threads()
    with torch_threads(1) as previous:
        assert torch.get_num_threads() == 1 and previous == before
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError):
        with torch_threads(1):
            raise KeyError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match=">= 1"):
        with torch_threads(0):
            pass
