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
    where = "on cuda" if torch.cuda.is_available() else "on the stand-in device"
    left_on_cpu = "" if torch.cuda.is_available() else "a CPU tensor of shape {}"
    batch_left = check_mean_kept_output(_mean_kept_output_with(False, True))        # the input stays on the CPU
    assert not batch_left and where in str(batch_left) and "your function raised RuntimeError" in str(batch_left)
    assert left_on_cpu.format("(6, 3)") in str(batch_left)
    weights_left = check_mean_kept_output(_mean_kept_output_with(True, False))      # the weights are made on the CPU
    assert not weights_left and where in str(weights_left) and "your function raised RuntimeError" in str(weights_left)
    assert left_on_cpu.format("(6,)") in str(weights_left)
    assert "not attempted" in str(check_mean_kept_output(lambda model, batch, device: None))


def _masked_mean(model, batch, device):
    """A correct answer that needs real values on the other device (a boolean mask, .item())."""
    model.to(device)
    batch = {key: value.to(device) for key, value in batch.items()}
    outputs = model(batch["x"]).squeeze(1)
    assert int(batch["keep"].sum().item()) == 4
    return outputs[batch["keep"]].mean()


def test_mean_kept_output_accepts_correct_answers_that_need_values(learner):
    assert check_mean_kept_output(_masked_mean)


def test_mean_kept_output_rejects_a_result_left_on_the_cpu_or_a_wrong_value(learner):
    verdict = check_mean_kept_output(lambda model, batch, device: reference("mean_kept_output")(model, batch, "cpu"))
    assert not verdict and "the result is on cpu" in str(verdict)

    def mean_of_all_rows(model, batch, device):
        model.to(device)
        return model(batch["x"].to(device)).squeeze(1).mean()
    verdict = check_mean_kept_output(mean_of_all_rows)
    assert not verdict and "expected 0.2762" in str(verdict)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-in device is for machines without a GPU")
def test_the_stand_in_device_keeps_values_and_refuses_to_mix_with_the_cpu():
    from course_utils.devices import _StandInDevice, _values
    with _StandInDevice():
        x = torch.arange(6.0).to("meta")
        doubled = x * 2
        assert doubled.device.type == "meta" and _values(doubled).tolist() == [0, 2, 4, 6, 8, 10]
        assert (x + torch.tensor(1.0)).device.type == "meta"          # a 0-dim CPU scalar is allowed, as on CUDA
        assert x[torch.tensor([True, False] * 3)].device.type == "meta"   # so is a CPU mask
        with pytest.raises(RuntimeError, match=r"a CPU tensor of shape \(6,\) was combined"):
            x + torch.ones(6)
        assert x.cpu().device.type == "cpu" and type(x.cpu()) is torch.Tensor
