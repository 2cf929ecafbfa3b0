"""Chapter 3: check_devices and named_tensors."""
import pytest
import torch
from torch import nn

from course_utils.devices import (DeviceMismatchError, check_devices, check_mean_kept_output, named_tensors,
                                  torch_threads)
from course_utils.exercises import reference
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


# --- exercise: mean_kept_output ------------------------------------------------------------

def _mean_kept_output_with(store_moved_batch, weights_on_device):
    """The shipped function with each planted bug fixed or left."""
    def fn(model, batch, device):
        model.to(device)
        for key in batch:
            if store_moved_batch:
                batch[key] = batch[key].to(device)
            else:
                batch[key].to(device)
        outputs = model(batch["x"]).squeeze(1)
        weights = torch.zeros(len(outputs), device=device if weights_on_device else None)
        weights[batch["keep"]] = 1.0
        return (outputs * weights).sum() / weights.sum()
    return fn


def test_mean_kept_output_reference_passes_and_each_planted_bug_is_rejected(learner):
    assert check_mean_kept_output(reference("mean_kept_output"))
    assert check_mean_kept_output(_mean_kept_output_with(True, True))
    other = "cuda" if torch.cuda.is_available() else "meta"
    batch_left = check_mean_kept_output(_mean_kept_output_with(False, True))
    assert not batch_left and f"on device {other} your function raised" in str(batch_left)
    weights_left = check_mean_kept_output(_mean_kept_output_with(True, False))
    assert not weights_left and f"on device {other} your function raised" in str(weights_left)
    assert "not attempted" in str(check_mean_kept_output(lambda model, batch, device: None))


def test_mean_kept_output_rejects_a_result_left_on_the_cpu(learner):
    verdict = check_mean_kept_output(lambda model, batch, device: reference("mean_kept_output")(model, batch, "cpu"))
    assert not verdict and "the result is on cpu" in str(verdict)
