"""Chapter 7 exercises: each check rejects the planted bugs one at a time and accepts other right answers.

The wrong answers are the ones a reader writes on the way: one planted bug fixed and the others left,
the right result reached by looking at the registered modules only (which misses a plain list), a
hook left installed, a test of `.grad` that mistakes accumulation or `set_to_none=False` for a leak,
`model.train()` at the end, a check that transforms the output before looking at it.
"""
import functools

import pytest
import torch
from torch.nn.modules import module as module_hooks
from torch.optim.optimizer import register_optimizer_step_post_hook

from course_utils.exercises import reference
from course_utils.exercises.broken_project import (check_accuracy_restoring_modes, check_leaks_gradients,
                                                   check_outputs_are_probabilities, check_parameters_left_out)


# --- exercise 5: parameters_left_out --------------------------------------------------------

def _left_out(*, all_groups: bool, by_identity: bool, remove_hook: bool, registered_only: bool = False,
              frozen_too: bool = False, recurse: bool = False):
    def fn(model, optimizer, x):
        groups = optimizer.param_groups if all_groups else optimizer.param_groups[:1]
        held = [p for group in groups for p in group["params"]]
        if registered_only:
            return [p for p in model.parameters() if p.requires_grad and id(p) not in {id(q) for q in held}]
        left_out = []

        def record(module, args, output):
            for p in module.parameters(recurse=recurse):
                if not (p.requires_grad or frozen_too):
                    continue
                if by_identity:
                    if id(p) not in {id(q) for q in held} and id(p) not in {id(q) for q in left_out}:
                        left_out.append(p)
                elif p not in held and p not in left_out:
                    left_out.append(p)

        handle = module_hooks.register_module_forward_hook(record)
        with torch.no_grad():
            model(x)
        if remove_hook:
            handle.remove()
        return left_out
    return fn


LEFT_OUT_WRONG = {
    "planted: all three bugs": _left_out(all_groups=False, by_identity=False, remove_hook=False),
    "identity fixed, first group only, hook left": _left_out(all_groups=False, by_identity=True, remove_hook=False),
    "identity and hook fixed, first group only": _left_out(all_groups=False, by_identity=True, remove_hook=True),
    "groups and identity fixed, hook left": _left_out(all_groups=True, by_identity=True, remove_hook=False),
    "registered modules only (misses the plain list)":
        _left_out(all_groups=True, by_identity=True, remove_hook=True, registered_only=True),
    "frozen parameters reported too": _left_out(all_groups=True, by_identity=True, remove_hook=True, frozen_too=True),
    "parameters of modules that never ran (recursing from a module that ran)":
        _left_out(all_groups=True, by_identity=True, remove_hook=True, recurse=True),
    "returns every parameter that ran": lambda model, optimizer, x: list(model.parameters()),
    "a parameter once per call of its module": lambda model, optimizer, x: _once_per_call(model, optimizer, x),
    "right, through a forward pre-hook it never removes": lambda model, optimizer, x: _with_pre_hook_left(
        model, optimizer, x),
}


def _once_per_call(model, optimizer, x):
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    found = []
    handle = module_hooks.register_module_forward_hook(lambda module, args, output: found.extend(
        p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in held))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return found


def _with_pre_hook_left(model, optimizer, x):
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    found = {}
    module_hooks.register_module_forward_pre_hook(lambda module, args: found.update(
        (id(p), p) for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in held))
    with torch.no_grad():
        model(x)
    return list(found.values())


@pytest.mark.parametrize("wrong", LEFT_OUT_WRONG.values(), ids=LEFT_OUT_WRONG.keys())
def test_parameters_left_out_rejects(wrong, learner, capsys):
    hooks = dict(module_hooks._global_forward_hooks), dict(module_hooks._global_forward_pre_hooks)
    assert not check_parameters_left_out(wrong)
    assert (dict(module_hooks._global_forward_hooks), dict(module_hooks._global_forward_pre_hooks)) == hooks, \
        "the check must remove a hook the learner left"


def test_parameters_left_out_accepts(learner):
    assert check_parameters_left_out(reference("parameters_left_out"))
    assert check_parameters_left_out(_left_out(all_groups=True, by_identity=True, remove_hook=True))
    as_set = _left_out(all_groups=True, by_identity=True, remove_hook=True)
    assert check_parameters_left_out(lambda model, optimizer, x: set(as_set(model, optimizer, x)))


# --- exercise 6: leaks_gradients ------------------------------------------------------------

def _leaks(*, nonzero: bool, after_step: bool, clear_mark: bool = True, remove_step_hook: bool = True):
    def fn(train_step, model, optimizer, batches):
        stepped, leaked = set(), False

        def on_gradient(p, grad):
            nonlocal leaked
            if (id(p) in stepped or not after_step) and p.grad is not None and (p.grad.any() or not nonzero):
                leaked = True
            if clear_mark:
                stepped.discard(id(p))

        handles = [p.register_hook(functools.partial(on_gradient, p)) for p in model.parameters()]
        step_hook = optimizer.register_step_post_hook(
            lambda opt, args, kwargs: stepped.update(id(p) for g in opt.param_groups for p in g["params"]))
        if remove_step_hook:
            handles.append(step_hook)
        try:
            for batch in batches:
                train_step(batch)
        finally:
            for handle in handles:
                handle.remove()
        return leaked
    return fn


def _leaks_global_hook(train_step, model, optimizer, batches):
    """Right, except that it watches every optimizer through a global hook and never removes it."""
    stepped, leaked = set(), [False]
    register_optimizer_step_post_hook(
        lambda opt, args, kwargs: stepped.update(id(p) for g in opt.param_groups for p in g["params"]))

    def on_gradient(p, grad):
        leaked[0] |= bool(id(p) in stepped and p.grad is not None and p.grad.any())
        stepped.discard(id(p))
    handles = [p.register_hook(functools.partial(on_gradient, p)) for p in model.parameters()]
    for batch in batches:
        train_step(batch)
    for handle in handles:
        handle.remove()
    return leaked[0]


def _leaks_hook_left(train_step, model, optimizer, batches):
    leaked = [False]
    for p in model.parameters():
        p.register_hook(lambda grad, p=p: leaked.__setitem__(0, leaked[0] or bool(p.grad is not None and p.grad.any())))
    for batch in batches:
        train_step(batch)
    return leaked[0]


LEAKS_WRONG = {
    "planted: `.grad is not None`, the mark never cleared, the step hook left":
        _leaks(nonzero=False, after_step=True, clear_mark=False, remove_step_hook=False),
    "step hook removed, `.grad is not None`, the mark never cleared":
        _leaks(nonzero=False, after_step=True, clear_mark=False),
    "nonzero tested, the mark never cleared": _leaks(nonzero=True, after_step=True, clear_mark=False),
    "no notion of a step": _leaks(nonzero=True, after_step=False),
    "set_to_none=False still a leak": _leaks(nonzero=False, after_step=True),
    "hooks left on the parameters": _leaks_hook_left,
    "a global optimizer hook left": _leaks_global_hook,
    "a one-element tensor instead of a bool": lambda *args: torch.tensor(_leaks(nonzero=True, after_step=True)(*args)),
    "always True": lambda train_step, model, optimizer, batches: True,
    "never runs the steps": lambda train_step, model, optimizer, batches: False,
}


def _leaks_by_counting_calls(train_step, model, optimizer, batches):
    """Counts optimizer.step() calls between optimizer.zero_grad() calls: blind to model.zero_grad()."""
    steps, leaked = [0], [False]
    step, zero_grad = optimizer.step, optimizer.zero_grad

    def counted_step(*args, **kwargs):
        steps[0] += 1
        leaked[0] |= steps[0] > 1
        return step(*args, **kwargs)

    def counted_zero_grad(*args, **kwargs):
        steps[0] = 0
        return zero_grad(*args, **kwargs)
    optimizer.step, optimizer.zero_grad = counted_step, counted_zero_grad
    try:
        for batch in batches:
            train_step(batch)
    finally:
        optimizer.step, optimizer.zero_grad = step, zero_grad
    return leaked[0]


LEAKS_WRONG["counts steps between optimizer.zero_grad() calls"] = _leaks_by_counting_calls


@pytest.mark.parametrize("wrong", LEAKS_WRONG.values(), ids=LEAKS_WRONG.keys())
def test_leaks_gradients_rejects(wrong, learner):
    assert not check_leaks_gradients(wrong)


def test_a_global_optimizer_hook_left_behind_is_named_and_removed(learner):
    from torch.optim import optimizer as optimizer_hooks
    before = dict(optimizer_hooks._global_optimizer_post_hooks)
    verdict = check_leaks_gradients(_leaks_global_hook)
    assert not verdict and "global (the check removed them)" in str(verdict)
    assert dict(optimizer_hooks._global_optimizer_post_hooks) == before


def test_leaks_gradients_accepts(learner):
    assert check_leaks_gradients(reference("leaks_gradients"))
    assert check_leaks_gradients(_leaks(nonzero=True, after_step=True))


# --- exercise 7: accuracy_restoring_modes ---------------------------------------------------

def _accuracy(*, dim: int, restore: str, grad_off: bool):
    def fn(model, loader):
        modes = {m: m.training for m in model.modules()}
        if restore != "never eval":
            model.eval()
        correct = total = 0
        with torch.no_grad() if grad_off else torch.enable_grad():
            for images, labels in loader:
                correct += (model(images).argmax(dim=dim) == labels).sum().item()
                total += len(labels)
        if restore == "model.train()":
            model.train()
        elif restore == "each module":
            for module, training in modes.items():
                module.train(training)
        return correct / total
    return fn


ACCURACY_WRONG = {
    "planted: dim 0, model.train(), a graph": _accuracy(dim=0, restore="model.train()", grad_off=False),
    "dim fixed": _accuracy(dim=1, restore="model.train()", grad_off=False),
    "dim and graph fixed, model.train() at the end": _accuracy(dim=1, restore="model.train()", grad_off=True),
    "dim and modes fixed, a graph recorded": _accuracy(dim=1, restore="each module", grad_off=False),
    "left in eval mode": _accuracy(dim=1, restore="nothing", grad_off=True),
    "never switched to eval mode": _accuracy(dim=1, restore="never eval", grad_off=True),
    "a 0-d tensor, not a float": lambda model, loader: torch.tensor(
        _accuracy(dim=1, restore="each module", grad_off=True)(model, loader)),
    "grad mode switched off for good": lambda model, loader: (torch.set_grad_enabled(False), _accuracy(
        dim=1, restore="each module", grad_off=True)(model, loader))[1],
    "parameters frozen for good": lambda model, loader: (model.requires_grad_(False), _accuracy(
        dim=1, restore="each module", grad_off=True)(model, loader))[1],
    "a count instead of a fraction": lambda model, loader: _accuracy(dim=1, restore="each module", grad_off=True)(
        model, loader) * 100,
}


@pytest.mark.parametrize("wrong", ACCURACY_WRONG.values(), ids=ACCURACY_WRONG.keys())
def test_accuracy_restoring_modes_rejects(wrong, learner):
    assert not check_accuracy_restoring_modes(wrong)
    assert torch.is_grad_enabled(), "the check must switch autograd back on"


def test_accuracy_restoring_modes_accepts(learner):
    assert check_accuracy_restoring_modes(reference("accuracy_restoring_modes"))
    assert check_accuracy_restoring_modes(_accuracy(dim=1, restore="each module", grad_off=True))

    def under_inference_mode(model, loader):
        with torch.inference_mode():
            return _accuracy(dim=-1, restore="each module", grad_off=False)(model, loader)
    assert check_accuracy_restoring_modes(under_inference_mode)


# --- exercise 8: outputs_are_probabilities --------------------------------------------------

def _probabilities(*, softmax_first: bool, per_row: bool, tolerance: bool, non_negative: bool):
    def fn(model, x):
        with torch.no_grad():
            out = model(x)
        if softmax_first:
            out = out.softmax(dim=1)
        sums = out.sum(dim=1) if per_row else out.sum().reshape(1)
        close = torch.allclose(sums, torch.ones_like(sums), atol=1e-4) if tolerance else bool((sums == 1).all())
        return bool(close and (not non_negative or (out >= 0).all()))
    return fn


PROBABILITIES_WRONG = {
    "planted: softmax first, whole batch, exact": _probabilities(softmax_first=True, per_row=False, tolerance=False,
                                                                 non_negative=True),
    "a tolerance of 0.2": lambda model, x: bool(torch.allclose(model(x).sum(1), torch.ones_like(model(x).sum(1)),
                                                               atol=0.2) and (model(x) >= 0).all()),
    "softmax removed, whole batch": _probabilities(softmax_first=False, per_row=False, tolerance=True,
                                                   non_negative=True),
    "per row within a tolerance, softmax still first": _probabilities(softmax_first=True, per_row=True,
                                                                      tolerance=True, non_negative=True),
    "per row, exact": _probabilities(softmax_first=False, per_row=True, tolerance=False, non_negative=True),
    "sums only, negatives allowed": _probabilities(softmax_first=False, per_row=True, tolerance=True,
                                                   non_negative=False),
    "the batch sums to its length": lambda model, x: bool(abs(model(x).sum().item() - len(x)) < 1e-3
                                                          and (model(x) >= 0).all()),
    "the rows' mean sum is 1": lambda model, x: bool(abs(model(x).sum(1).mean().item() - 1) < 1e-4
                                                     and (model(x) >= 0).all()),
    "the first row only": lambda model, x: bool(abs(model(x)[0].sum().item() - 1) < 1e-4 and (model(x) >= 0).all()),
}


@pytest.mark.parametrize("wrong", PROBABILITIES_WRONG.values(), ids=PROBABILITIES_WRONG.keys())
def test_outputs_are_probabilities_rejects(wrong, learner):
    assert not check_outputs_are_probabilities(wrong)


def test_outputs_are_probabilities_accepts(learner):
    assert check_outputs_are_probabilities(reference("outputs_are_probabilities"))
    assert check_outputs_are_probabilities(_probabilities(softmax_first=False, per_row=True, tolerance=True,
                                                          non_negative=True))
