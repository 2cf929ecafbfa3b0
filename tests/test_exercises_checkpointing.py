"""Chapter 4 exercises: each check rejects plausible wrong answers and accepts more than one right one.

The wrong answers are the ones a reader writes: a planted bug left in, an answer tuned to the case the
chapter shows (a hard-coded epoch, skip or layer name), and the right result reached the wrong way
(buffers dropped, a prefix stripped from every key, a counter set instead of a state restored).
"""
import copy
import itertools

import pytest
import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from course_utils.checkpoints import load_matching_state_dict
from course_utils.exercises import reference
from course_utils.exercises.checkpointing import (check_checkpoint_dict, check_epoch_batches_from,
                                                  check_load_matching, check_resume_training)


# --- exercise 1: resume_training ------------------------------------------------------------------

def _resume(path, model, optimizer, scheduler, *, scheduler_too=True, rng_too=True, epoch=None,
            counter_only=False):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if counter_only:
        scheduler.last_epoch = checkpoint["epoch"]
    elif scheduler_too:
        scheduler.load_state_dict(checkpoint["scheduler"])
    if rng_too:
        torch.set_rng_state(checkpoint["rng"]["torch"])
    return checkpoint["epoch"] if epoch is None else epoch


def _resume_reseeding(path, model, optimizer, scheduler):
    epoch = _resume(path, model, optimizer, scheduler, rng_too=False)
    torch.manual_seed(epoch)                        # "a fresh seed per epoch": not the saved stream
    return epoch


def _resume_parameters_only(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(checkpoint["model"][name])   # BatchNorm's running statistics stay fresh
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    torch.set_rng_state(checkpoint["rng"]["torch"])
    return checkpoint["epoch"]


RESUME_WRONG = {
    "planted: the scheduler is not restored": lambda *a: _resume(*a, scheduler_too=False),
    "planted: the RNG state is not restored": lambda *a: _resume(*a, rng_too=False),
    "tuned: returns the chapter's epoch 2": lambda *a: _resume(*a, epoch=2),
    "wrong way: sets the scheduler's counter instead of its state": lambda *a: _resume(*a, counter_only=True),
    "wrong way: reseeds instead of restoring the generator": _resume_reseeding,
    "wrong way: copies the parameters, drops the buffers": _resume_parameters_only,
    "raises": lambda path, *objects: torch.load(path, weights_only=True)["missing"],
}


@pytest.mark.parametrize("name", RESUME_WRONG)
def test_check_resume_training_rejects(learner, name):
    verdict = check_resume_training(RESUME_WRONG[name])
    assert not verdict and verdict.attempt == 1, name
    assert "hint 1" not in str(verdict), str(verdict)          # the first verdict observes, it does not advise


def _resume_deepcopy_style(path, model, optimizer, scheduler):
    state = torch.load(path, weights_only=True)            # no map_location: fine on a CPU checkpoint
    for obj, key in ((model, "model"), (optimizer, "optimizer"), (scheduler, "scheduler")):
        obj.load_state_dict(copy.deepcopy(state[key]))
    torch.random.set_rng_state(state["rng"]["torch"])
    return int(state["epoch"])


@pytest.mark.parametrize("answer", [reference("resume_training"), _resume_deepcopy_style])
def test_check_resume_training_accepts(learner, answer):
    assert check_resume_training(answer)


def test_resume_training_verdicts_say_what_they_observed(learner):
    assert "the schedule is at epoch 0 and the next epochs would use the learning rates [0.01, 0.01, 0.01]; " \
           "the uninterrupted run, at epoch 2, uses [0.01, 0.005, 0.005]" in str(
               check_resume_training(RESUME_WRONG["planted: the scheduler is not restored"]))
    assert "the next dropout mask" in str(check_resume_training(RESUME_WRONG["planted: the RNG state is not restored"]))
    tuned = str(check_resume_training(RESUME_WRONG["tuned: returns the chapter's epoch 2"]))
    assert "ReduceLROnPlateau" in tuned and "it returned 2; the checkpoint's epoch is 3" in tuned
    assert "running_mean" in str(check_resume_training(_resume_parameters_only))
    assert "your function raised KeyError" in str(check_resume_training(RESUME_WRONG["raises"]))


# --- exercise 2: checkpoint_dict ------------------------------------------------------------------

def _dict(model, optimizer, scheduler, epoch, *, whole_model=False, with_optimizer=True, parameters_only=False,
          fixed_epoch=None, rng_seed=False):
    checkpoint = {"model": model if whole_model else model.state_dict(),
                  "scheduler": scheduler.state_dict(), "epoch": epoch if fixed_epoch is None else fixed_epoch,
                  "rng": {"torch": torch.initial_seed() if rng_seed else torch.get_rng_state(), "cuda": []}}
    if parameters_only:
        checkpoint["model"] = {name: p.detach() for name, p in model.named_parameters()}
    if with_optimizer:
        checkpoint["optimizer"] = optimizer.state_dict()
    return checkpoint


DICT_WRONG = {
    "planted: the whole model object": lambda *a: _dict(*a, whole_model=True),
    "planted: no optimizer": lambda *a: _dict(*a, with_optimizer=False),
    "wrong way: the parameters without the buffers": lambda *a: _dict(*a, parameters_only=True),
    "tuned: the chapter's epoch 2": lambda *a: _dict(*a, fixed_epoch=2),
    "wrong way: the seed instead of the generator state": lambda *a: _dict(*a, rng_seed=True),
    "wrong way: the optimizer's per-parameter state only": lambda m, o, s, e: {**_dict(m, o, s, e),
                                                                            "optimizer": o.state_dict()["state"]},
    "raises": lambda model, optimizer, scheduler, epoch: {"model": model.state_dict(), "x": optimizer.missing},
}


@pytest.mark.parametrize("name", DICT_WRONG)
def test_check_checkpoint_dict_rejects(learner, name):
    verdict = check_checkpoint_dict(DICT_WRONG[name])
    assert not verdict and verdict.attempt == 1, name
    assert "hint 1" not in str(verdict), str(verdict)


def _dict_cloned(model, optimizer, scheduler, epoch):
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()), "scheduler": dict(scheduler.state_dict()),
            "epoch": int(epoch), "rng": {"torch": torch.random.get_rng_state(), "cuda": []}}


@pytest.mark.parametrize("answer", [reference("checkpoint_dict"), _dict_cloned])
def test_check_checkpoint_dict_accepts(learner, answer):
    assert check_checkpoint_dict(answer)


def test_checkpoint_dict_verdicts_say_what_they_observed(learner):
    assert "refuses your checkpoint: it holds a torch.nn.modules.container.Sequential object" in str(
        check_checkpoint_dict(DICT_WRONG["planted: the whole model object"]))
    assert "no 'optimizer' entry" in str(check_checkpoint_dict(DICT_WRONG["planted: no optimizer"]))
    buffers = str(check_checkpoint_dict(DICT_WRONG["wrong way: the parameters without the buffers"]))
    assert "BatchNorm" in buffers and "running_mean" in buffers


# --- exercise 3: load_matching --------------------------------------------------------------------

def _matching(model, state_dict, *, check_shapes=True, strict=False, strip=lambda key: key.removeprefix("module."),
              own_of=lambda model: model.state_dict(), skip_head=False, compile_prefix=True):
    own, matched = own_of(model), {}
    for key, value in state_dict.items():
        key = strip(key)
        if compile_prefix:
            key = key.removeprefix("_orig_mod.")
        if skip_head:
            if key in own and not key.startswith("head."):
                matched[key] = value
        elif key in own and (value.shape == own[key].shape or not check_shapes):
            matched[key] = value
    model.load_state_dict(matched, strict=strict)
    return sorted(matched)


MATCHING_WRONG = {
    "planted: no shape check": lambda m, s: _matching(m, s, check_shapes=False),
    "planted: strict loading": lambda m, s: _matching(m, s, strict=True),
    "wrong way: 'module.' cut from every key": lambda m, s: _matching(m, s, strip=lambda key: key[len("module."):]),
    "wrong way: 'module.' replaced anywhere in the key": lambda m, s: _matching(m, s, strip=lambda key: key.replace("module.", "")),
    "tuned: skips the layer named head instead of comparing shapes": lambda m, s: _matching(m, s, skip_head=True),
    "wrong way: parameters only, buffers dropped": lambda m, s: _matching(m, s, own_of=lambda model: dict(model.named_parameters())),
    "tuned: strips the chapter's 'module.' only, not torch.compile's": lambda m, s: _matching(m, s, compile_prefix=False),
    "silent no-op": lambda m, s: m.load_state_dict(s, strict=False) and [],
}


@pytest.mark.parametrize("name", MATCHING_WRONG)
def test_check_load_matching_rejects(learner, name):
    verdict = check_load_matching(MATCHING_WRONG[name])
    assert not verdict and verdict.attempt == 1, name
    assert "hint 1" not in str(verdict), str(verdict)


def _matching_with_pytorch(model, state_dict):
    state = dict(state_dict)
    for prefix in ("module.", "_orig_mod."):
        if all(key.startswith(prefix) for key in state):
            consume_prefix_in_state_dict_if_present(state, prefix)
    own = model.state_dict()
    keep = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(keep, strict=False)
    return list(keep)                                  # any order: the check sorts


@pytest.mark.parametrize("answer", [reference("load_matching"), _matching_with_pytorch,
                                    lambda model, state: load_matching_state_dict(model, state).loaded])
def test_check_load_matching_accepts(learner, answer):
    assert check_load_matching(answer)


def test_load_matching_verdicts_say_what_they_observed(learner):
    assert ("size mismatch for head.weight: copying a param with shape torch.Size([10, 16]) from checkpoint, "
            "the shape in current model is torch.Size([5, 16])") in str(
                check_load_matching(MATCHING_WRONG["planted: no shape check"]))
    assert "Missing key(s) in state_dict" in str(check_load_matching(MATCHING_WRONG["planted: strict loading"]))
    cut = str(check_load_matching(MATCHING_WRONG["wrong way: 'module.' cut from every key"]))
    assert "saved without a wrapper" in cut and "were not loaded" in cut
    assert "stem.1.running_mean" in str(check_load_matching(MATCHING_WRONG["wrong way: parameters only, buffers dropped"]))


# --- exercise 4: epoch_batches_from ---------------------------------------------------------------

def _rest_then_slice(loader, generator, state, skip):
    generator.set_state(state)
    return list(loader)[skip:]


def _rest_by_next(loader, generator, state, skip):
    generator.set_state(state)
    batches = iter(loader)
    for _ in range(skip):
        next(batches)
    return [batch for batch in batches]


EPOCH_WRONG = {
    "the generator is not restored": lambda loader, g, state, skip: list(itertools.islice(loader, skip, None)),
    "the epoch restarts": lambda loader, g, state, skip: (g.set_state(state), list(loader))[1],
    "tuned: skips the chapter's 2 batches": lambda loader, g, state, skip: (g.set_state(state), list(loader)[2:])[1],
    "wrong way: the global RNG instead of the loader's generator":
        lambda loader, g, state, skip: (torch.set_rng_state(state), list(loader)[skip:])[1],
    "wrong way: skips samples, not batches":
        lambda loader, g, state, skip: (g.set_state(state), list(itertools.islice(loader, skip * 4, None)))[1],
    "raises": lambda loader, g, state, skip: g.set_state(None),
}


@pytest.mark.parametrize("name", EPOCH_WRONG)
def test_check_epoch_batches_from_rejects(learner, name):
    verdict = check_epoch_batches_from(EPOCH_WRONG[name])
    assert not verdict and verdict.attempt == 1, name
    assert "hint 1" not in str(verdict), str(verdict)


@pytest.mark.parametrize("answer", [reference("epoch_batches_from"), _rest_then_slice, _rest_by_next])
def test_check_epoch_batches_from_accepts(learner, answer):
    assert check_epoch_batches_from(answer)


def test_epoch_batches_from_verdicts_say_what_they_observed(learner):
    assert "another shuffle" in str(check_epoch_batches_from(EPOCH_WRONG["the generator is not restored"]))
    assert "it gave 6 batches; 4 were left" in str(check_epoch_batches_from(EPOCH_WRONG["the epoch restarts"]))
    tuned = str(check_epoch_batches_from(EPOCH_WRONG["tuned: skips the chapter's 2 batches"]))
    assert "30 samples in batches of 7, killed after 3" in tuned


# --- all four ------------------------------------------------------------------------------------

@pytest.mark.parametrize("check", [check_resume_training, check_checkpoint_dict, check_load_matching,
                                   check_epoch_batches_from])
def test_an_untouched_exercise_is_not_an_attempt(learner, check):
    verdict = check(lambda *args: None)
    assert not verdict and verdict.attempt == 0 and "not attempted" in str(verdict)


def test_the_checks_leave_the_random_stream_alone(learner):
    before = torch.get_rng_state()
    check_resume_training(reference("resume_training"))
    check_checkpoint_dict(reference("checkpoint_dict"))
    check_load_matching(reference("load_matching"))
    check_epoch_batches_from(lambda *a: None)
    assert torch.equal(torch.get_rng_state(), before)


def test_hints_come_only_on_later_attempts(learner):
    wrong = RESUME_WRONG["planted: the scheduler is not restored"]
    first, second = check_resume_training(wrong), check_resume_training(wrong)
    assert "hint" not in str(first).split("(run the cell again")[0] and "hint 1:" in str(second)
