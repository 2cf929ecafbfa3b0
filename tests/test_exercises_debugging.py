"""Chapter 3 exercises: each check rejects plausible wrong answers and accepts more than one right one.

The wrong answers are the ones a reader writes: a planted bug left in (or only one of two fixed), an
answer tuned to the sizes the chapter or the check happens to use (a hard-coded number of batches, a
hard-coded clip length, a fixed pre-scale, a hard-coded batch size), and the right result reached the wrong
way (detached instead of no-grad, computed on the CPU and moved at the end, NaN hidden with nan_to_num).
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from course_utils.devices import to_device
from course_utils.exercises import reference
from course_utils.exercises.debugging import (_StandInDevice, _values, check_clip_loudness, check_mean_kept_output,
                                              check_rms_normalise, check_validation_losses)


# --- exercise 1: validation_losses ------------------------------------------------------------

def _validation_losses_with(keep_tensors, record_graph):
    """The shipped loop with each planted bug fixed or left: losses kept as tensors; autograd recording."""
    def fn(model, batches):
        losses = []
        with torch.set_grad_enabled(record_graph):
            for inputs, targets in batches:
                loss = F.mse_loss(model(inputs), targets)
                losses.append(loss if keep_tensors else loss.item())
        return losses, sum(losses) / len(losses)
    return fn


def _detached_instead_of_no_grad(model, batches):
    losses = [F.mse_loss(model(inputs), targets).detach().item() for inputs, targets in batches]
    return losses, sum(losses) / len(losses)


def _mean_over_six_batches(model, batches):                # tuned: the check's count of batches
    with torch.no_grad():
        losses = [F.mse_loss(model(inputs), targets).item() for inputs, targets in batches]
    return losses, sum(losses) / 6


def _mean_over_samples(model, batches):                    # the mean weighted by batch size: not the batches' mean
    with torch.no_grad():
        losses = [F.mse_loss(model(inputs), targets).item() for inputs, targets in batches]
        total = sum(F.mse_loss(model(inputs), targets, reduction="sum").item() for inputs, targets in batches)
    return losses, total / sum(len(targets) for _, targets in batches)


def _inference_mode_tensors(model, batches):               # no graph, but tensors returned
    with torch.inference_mode():
        losses = [F.mse_loss(model(inputs), targets) for inputs, targets in batches]
    return losses, sum(losses) / len(losses)


VALIDATION_WRONG = {
    "planted: both bugs left in": _validation_losses_with(keep_tensors=True, record_graph=True),
    "one bug fixed: floats, but autograd records": _validation_losses_with(keep_tensors=False, record_graph=True),
    "one bug fixed: no_grad, but tensors kept": _validation_losses_with(keep_tensors=True, record_graph=False),
    "wrong way: .detach() instead of no_grad": _detached_instead_of_no_grad,
    "wrong way: inference_mode, tensors returned": _inference_mode_tensors,
    "tuned: divides by the 6 batches the check uses": _mean_over_six_batches,
    "wrong number: the mean over samples": _mean_over_samples,
}


def _validation_losses_inference_mode(model, batches):
    with torch.inference_mode():
        losses = [float(F.mse_loss(model(x), y)) for x, y in batches]
    return losses, sum(losses) / len(losses)


VALIDATION_RIGHT = {"reference": reference("validation_losses"),
                    "shipped code with both bugs fixed": _validation_losses_with(False, False),
                    "inference_mode and float()": _validation_losses_inference_mode}


@pytest.mark.parametrize("name", VALIDATION_WRONG)
def test_check_validation_losses_rejects(name, learner):
    assert not check_validation_losses(VALIDATION_WRONG[name]), name


@pytest.mark.parametrize("name", VALIDATION_RIGHT)
def test_check_validation_losses_accepts(name, learner):
    assert check_validation_losses(VALIDATION_RIGHT[name]), name


def test_validation_losses_first_verdicts_say_what_was_observed(learner):
    shipped = check_validation_losses(VALIDATION_WRONG["planted: both bugs left in"])
    assert "memory grows by 128.5 KiB per batch" in str(shipped) and "float" not in str(shipped)
    graph = check_validation_losses(VALIDATION_WRONG["one bug fixed: floats, but autograd records"])
    assert "autograd saved 273.0 KiB of tensors for a backward pass" in str(graph)
    kept = check_validation_losses(VALIDATION_WRONG["one bug fixed: no_grad, but tensors kept"])
    assert "losses of type Tensor and a mean of type Tensor" in str(kept)
    tuned = check_validation_losses(VALIDATION_WRONG["tuned: divides by the 6 batches the check uses"])
    assert "for 2 batches the mean is" in str(tuned)


def test_validation_losses_reports_not_attempted_and_exceptions(learner):
    assert "not attempted" in str(check_validation_losses(lambda model, batches: None))

    def broken(model, batches):
        raise KeyError("oops")
    assert "your function raised KeyError" in str(check_validation_losses(broken))


# --- exercise 2: clip_loudness ----------------------------------------------------------------

def _loudness_with(guard_silent_clip, floor_energy):
    """The shipped dataset with each planted bug fixed or left."""
    class ClipLoudness(Dataset):
        def __init__(self, clips):
            self.clips = clips

        def __len__(self):
            return len(self.clips)

        def __getitem__(self, index):
            clip = self.clips[index]
            peak = clip.abs().max()
            clip = clip / peak if (peak > 0 or not guard_silent_clip) else clip
            energy = clip.unfold(0, 16, 16).pow(2).mean(dim=-1)
            return 10 * torch.log10(energy.clamp(min=1e-10) if floor_energy else energy)
    return ClipLoudness


class _NanToNumLoudness(_loudness_with(False, False)):
    def __getitem__(self, index):                        # hides NaN and -inf instead of avoiding them
        return torch.nan_to_num(super().__getitem__(index))


class _TenFrames(_loudness_with(True, True)):            # tuned: the 160-sample clips one tries first
    def __getitem__(self, index):
        clip = self.clips[index]
        clip = clip / clip.abs().max() if clip.abs().max() > 0 else clip
        return 10 * torch.log10(clip.view(10, 16).pow(2).mean(dim=-1).clamp(min=1e-10))


class _PeakOfTheDataset(_loudness_with(True, True)):     # wrong way: one peak for every clip
    def __getitem__(self, index):
        clip = self.clips[index] / self.clips.abs().max()
        return 10 * torch.log10(clip.unfold(0, 16, 16).pow(2).mean(dim=-1).clamp(min=1e-10))


class _AmplitudeFloored(_loudness_with(True, True)):     # wrong way: the amplitude floored, not the energy
    def __getitem__(self, index):
        clip = self.clips[index]
        clip = clip / clip.abs().max() if clip.abs().max() > 0 else clip
        return 10 * torch.log10(clip.abs().clamp(min=1e-10).unfold(0, 16, 16).pow(2).mean(dim=-1))


class _SilenceAsZeroDb(_loudness_with(True, False)):     # a silent frame read as 0 dB instead of the floor
    def __getitem__(self, index):
        loudness = super().__getitem__(index)
        return torch.where(torch.isfinite(loudness), loudness, torch.zeros_like(loudness))


LOUDNESS_WRONG = {
    "planted: both bugs left in": _loudness_with(False, False),
    "one bug fixed: silent clip guarded, energy not floored": _loudness_with(True, False),
    "one bug fixed: energy floored, silent clip divided by 0": _loudness_with(False, True),
    "hides NaN and -inf with nan_to_num": _NanToNumLoudness,
    "tuned: 10 frames of 16 samples": _TenFrames,
    "wrong way: one peak for the whole dataset": _PeakOfTheDataset,
    "wrong way: the amplitude floored": _AmplitudeFloored,
    "wrong number: silence read as 0 dB": _SilenceAsZeroDb,
}


class _LoudnessPlusEpsilon(Dataset):                     # differently written: eps added, clamp on the peak
    def __init__(self, clips):
        peaks = clips.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
        self.loudness = 10 * torch.log10((clips / peaks).unfold(1, 16, 16).pow(2).mean(dim=-1) + 1e-10)

    def __len__(self):
        return len(self.loudness)

    def __getitem__(self, index):
        return self.loudness[index].tolist()


LOUDNESS_RIGHT = {"reference": reference("clip_loudness"),
                  "shipped code with both bugs fixed": _loudness_with(True, True),
                  "all clips at once, eps added, samples as lists": _LoudnessPlusEpsilon}


@pytest.mark.parametrize("name", LOUDNESS_WRONG)
def test_check_clip_loudness_rejects(name, learner):
    assert not check_clip_loudness(LOUDNESS_WRONG[name]), name


@pytest.mark.parametrize("name", LOUDNESS_RIGHT)
def test_check_clip_loudness_accepts(name, learner):
    assert check_clip_loudness(LOUDNESS_RIGHT[name]), name


def test_clip_loudness_first_verdicts_say_what_was_observed(learner):
    shipped = str(check_clip_loudness(LOUDNESS_WRONG["planted: both bugs left in"]))
    assert "3 of 12 samples hold NaN or -inf: sample 3 is [nan" in shipped and "clamp" not in shipped
    no_floor = str(check_clip_loudness(LOUDNESS_WRONG["one bug fixed: silent clip guarded, energy not floored"]))
    assert "-inf" in no_floor and "1e-10" not in no_floor
    assert "(7, 256)" in str(check_clip_loudness(_TenFrames))             # caught on the clips not shown
    assert "not the loudness in dB" in str(check_clip_loudness(_NanToNumLoudness))
    assert "not attempted" in str(check_clip_loudness(lambda clips: None))


# --- exercise 3: rms_normalise ----------------------------------------------------------------

def _rms_in_half(x):                                     # the planted bug: squares in float16
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


def _fixed_prescale(x):                                  # tuned: a fixed pre-scale that fits the check's hundreds
    y = x / 256
    return y / torch.sqrt(y.pow(2).mean(dim=-1, keepdim=True) + 1e-6 / 256**2)


def _clamped_squares(x):                                 # hides the overflow: squares clamped at float16's max
    squares = x.float().pow(2).clamp(max=65504).half()
    return x / torch.sqrt(squares.mean(dim=-1, keepdim=True) + 1e-6)


def _rms_over_batch(x):                                  # the right formula on the wrong axis
    x32 = x.float()
    return (x32 / torch.sqrt(x32.pow(2).mean(dim=0, keepdim=True) + 1e-6)).half()


RMS_WRONG = {
    "planted: the squares in float16": _rms_in_half,
    "float32 all the way, float32 returned": lambda x: _rms_in_half(x.float()),
    "tuned: a fixed pre-scale of 1/256": _fixed_prescale,
    "hides the overflow: squares clamped": _clamped_squares,
    "wrong axis: mean over the batch": _rms_over_batch,
}

RMS_RIGHT = {
    "reference": reference("rms_normalise"),
    "F.rms_norm in float32": lambda x: F.rms_norm(x.float(), (x.shape[-1],), eps=1e-6).half(),
    "rsqrt in float64": lambda x: (x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6)).to(x.dtype),
}


@pytest.mark.parametrize("name", RMS_WRONG)
def test_check_rms_normalise_rejects(name, learner):
    assert not check_rms_normalise(RMS_WRONG[name]), name


@pytest.mark.parametrize("name", RMS_RIGHT)
def test_check_rms_normalise_accepts(name, learner):
    assert check_rms_normalise(RMS_RIGHT[name]), name


def test_rms_normalise_first_verdicts_say_what_was_observed(learner):
    verdict = check_rms_normalise(_rms_in_half)
    assert "512 of 512 outputs are exactly 0" in str(verdict) and "float32" not in str(verdict)
    assert "expected (8, 64) torch.float16" in str(check_rms_normalise(RMS_WRONG["float32 all the way, float32 returned"]))
    assert "not attempted" in str(check_rms_normalise(lambda x: None))


# --- exercise 4: mean_kept_output -------------------------------------------------------------

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


def _all_on_the_cpu_then_moved(model, batch, device):   # the cheat of issue 22: right number, wrong device
    outputs = model(batch["x"]).squeeze(1)
    return outputs[batch["keep"]].mean().to(device)


def _there_and_back(model, batch, device):              # moves everything, then computes the mean on the CPU
    model.to(device)
    batch = to_device(batch, device)
    outputs = model(batch["x"]).squeeze(1).cpu()
    return outputs[batch["keep"].cpu()].mean().to(device)


def _six_rows(model, batch, device):                    # tuned: the batch size of the first problem
    model.to(device)
    batch = to_device(batch, device)
    outputs = model(batch["x"]).squeeze(1)
    weights = torch.zeros(6, device=device)
    weights[batch["keep"]] = 1.0
    return (outputs * weights).sum() / weights.sum()


def _mean_of_all_rows(model, batch, device):
    model.to(device)
    return model(batch["x"].to(device)).squeeze(1).mean()


MEAN_KEPT_WRONG = {
    "planted: both bugs left in": _mean_kept_output_with(False, False),
    "one bug fixed: batch stored, weights made on the CPU": _mean_kept_output_with(True, False),
    "one bug fixed: weights on the device, batch not stored": _mean_kept_output_with(False, True),
    "wrong way: everything on the CPU, result moved": _all_on_the_cpu_then_moved,
    "wrong way: moved there, computed back on the CPU": _there_and_back,
    "tuned: weights for 6 rows": _six_rows,
    "result left on the CPU": lambda model, batch, device: reference("mean_kept_output")(model, batch, "cpu"),
    "wrong number: the mean of all rows": _mean_of_all_rows,
}


def _masked_mean(model, batch, device):
    """A correct answer that needs real values on the other device (a boolean mask, .item())."""
    model.to(device)
    batch = {key: value.to(device) for key, value in batch.items()}
    outputs = model(batch["x"]).squeeze(1)
    assert int(batch["keep"].sum().item()) >= 1
    return outputs[batch["keep"]].mean()


def _weights_made_then_moved(model, batch, device):     # creates on the CPU, moves before computing: accepted
    model.to(device)
    batch = to_device(batch, device)
    outputs = model(batch["x"]).squeeze(1)
    weights = batch["keep"].float().to(device)
    return (outputs * weights).sum() / weights.sum()


MEAN_KEPT_RIGHT = {"reference": reference("mean_kept_output"),
                   "shipped code with both bugs fixed": _mean_kept_output_with(True, True),
                   "a boolean mask and mean()": _masked_mean,
                   "weights from the moved mask": _weights_made_then_moved}


@pytest.mark.parametrize("name", MEAN_KEPT_WRONG)
def test_check_mean_kept_output_rejects(name, learner):
    assert not check_mean_kept_output(MEAN_KEPT_WRONG[name]), name


@pytest.mark.parametrize("name", MEAN_KEPT_RIGHT)
def test_check_mean_kept_output_accepts(name, learner):
    assert check_mean_kept_output(MEAN_KEPT_RIGHT[name]), name


def test_mean_kept_output_first_verdicts_say_what_was_observed(learner):
    where = "on cuda" if torch.cuda.is_available() else "on the stand-in device"
    batch_left = check_mean_kept_output(MEAN_KEPT_WRONG["one bug fixed: weights on the device, batch not stored"])
    assert where in str(batch_left) and "your function raised RuntimeError" in str(batch_left)
    cheat = check_mean_kept_output(_all_on_the_cpu_then_moved)
    assert "operations ran on CPU tensors (addmm" in str(cheat) and "the work was done on the CPU" in str(cheat)
    assert "with a batch of 11 rows" in str(check_mean_kept_output(_six_rows))
    assert "the result is () on cpu" in str(check_mean_kept_output(MEAN_KEPT_WRONG["result left on the CPU"]))
    assert "not attempted" in str(check_mean_kept_output(lambda model, batch, device: None))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-in device is for machines without a GPU")
def test_the_stand_in_device_keeps_values_and_refuses_to_mix_with_the_cpu():
    with _StandInDevice():
        x = torch.arange(6.0).to("meta")
        doubled = x * 2
        assert doubled.device.type == "meta" and _values(doubled).tolist() == [0, 2, 4, 6, 8, 10]
        assert (x + torch.tensor(1.0)).device.type == "meta"          # a 0-dim CPU scalar is allowed, as on CUDA
        assert x[torch.tensor([True, False] * 3)].device.type == "meta"   # so is a CPU mask
        with pytest.raises(RuntimeError, match=r"a CPU tensor of shape \(6,\) was combined"):
            x + torch.ones(6)
        assert x.cpu().device.type == "cpu" and type(x.cpu()) is torch.Tensor
