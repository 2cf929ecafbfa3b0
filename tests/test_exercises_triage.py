"""Triage drills: each check rejects the planted bug and the fixes that only hide its symptom, and accepts
the different right answers a learner writes.

The wrong answers are the ones met on the forums: `retain_graph=True` or a hidden state reset to zeros
for "backward through the graph a second time"; a clamp, an epsilon or `binary_cross_entropy` on
probabilities for a `nan` loss; `model.eval()` or an unshuffled loader for BatchNorm's one-sample batch;
PyTorch's default or Xavier's initialisation for a deep ReLU network.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from course_utils.exercises import reference
from course_utils.exercises.triage import (check_binary_loss, check_deep_regressor, check_train_on_chunks,
                                           check_train_one_epoch)


# --- drill 1: train_on_chunks -------------------------------------------------------------------

def _chunks(*, carry: str = "detach", retain: bool = False, zero_grad: bool = True, as_float: bool = True):
    """A chunked loop; carry: "detach" (right), "detach_" (right, in place), "none" (planted), "reset"."""
    def fn(cell, head, chunks, lr):
        optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=lr)
        h = torch.zeros(chunks[0][0].shape[1], cell.hidden_size)
        losses = []
        for x, y in chunks:
            if carry == "detach":
                h = h.detach()
            elif carry == "detach_":
                h.detach_()
            elif carry == "reset":
                h = torch.zeros(x.shape[1], cell.hidden_size)
            if zero_grad:
                optimizer.zero_grad()
            outputs = []
            for x_t in x:
                h = cell(x_t, h)
                outputs.append(head(h))
            loss = F.mse_loss(torch.stack(outputs), y)
            loss.backward(retain_graph=retain)
            optimizer.step()
            losses.append(loss.item() if as_float else loss)
        return losses
    return fn


CHUNKS_WRONG = {
    "planted: the hidden state carries its graph": (_chunks(carry="none"), "backward through the graph a second"),
    "retain_graph=True": (_chunks(carry="none", retain=True), "modified by an inplace operation"),
    "a zero hidden state in every chunk": (_chunks(carry="reset"), "zero hidden state"),
    "detached, but gradients never cleared": (_chunks(zero_grad=False), "the loss of chunk 3"),
    "the losses kept as tensors": (_chunks(as_float=False), "floats"),
}


@pytest.mark.parametrize("wrong, observed", CHUNKS_WRONG.values(), ids=CHUNKS_WRONG.keys())
def test_train_on_chunks_rejects(wrong, observed, learner):
    verdict = check_train_on_chunks(wrong)
    assert not verdict and observed in str(verdict).lower()


def test_train_on_chunks_accepts(learner):
    assert check_train_on_chunks(reference("train_on_chunks"))
    assert check_train_on_chunks(_chunks(carry="detach_"))


# --- drill 2: binary_loss -----------------------------------------------------------------------

def _clamped(logits, targets):
    p = torch.sigmoid(logits).clamp(1e-7, 1 - 1e-7)
    return -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p)).mean()


def _with_epsilon(logits, targets):
    p = torch.sigmoid(logits)
    return -(targets * torch.log(p + 1e-8) + (1 - targets) * torch.log(1 - p + 1e-8)).mean()


BINARY_WRONG = {
    "planted: log of a sigmoid": (lambda z, t: -(t * torch.log(torch.sigmoid(z))
                                                 + (1 - t) * torch.log(1 - torch.sigmoid(z))).mean(), "nan"),
    "the probability clamped to [1e-7, 1 - 1e-7]": (_clamped, "the loss is"),
    "an epsilon inside the log": (_with_epsilon, "the loss is"),
    "binary_cross_entropy on sigmoid's output (its log is floored at -100)":
        (lambda z, t: F.binary_cross_entropy(torch.sigmoid(z), t), "gradient for the logit 100"),
    "a sum instead of a mean": (lambda z, t: F.binary_cross_entropy_with_logits(z, t, reduction="sum"), "the loss is"),
    "no reduction": (lambda z, t: F.binary_cross_entropy_with_logits(z, t, reduction="none"), "0-dim"),
    "the loss as a Python float": (lambda z, t: F.binary_cross_entropy_with_logits(z, t).item(), "float"),
    "computed under no_grad": (lambda z, t: _no_grad(F.binary_cross_entropy_with_logits, z, t), "grad_fn"),
    "logits clamped in place": (lambda z, t: F.binary_cross_entropy_with_logits(_no_grad(z.clamp_, -20, 20), t),
                                "in place"),
}


def _no_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


@pytest.mark.parametrize("wrong, observed", BINARY_WRONG.values(), ids=BINARY_WRONG.keys())
def test_binary_loss_rejects(wrong, observed, learner):
    verdict = check_binary_loss(wrong)
    assert not verdict and observed in str(verdict)


def _by_hand_stable(z, t):
    """max(z, 0) - z t + log(1 + exp(-|z|)): the textbook form that never exponentiates a large number."""
    return (z.clamp(min=0) - z * t + torch.log1p(torch.exp(-z.abs()))).mean()


@pytest.mark.parametrize("right", [
    reference("binary_loss"),
    lambda z, t: nn.BCEWithLogitsLoss()(z, t),
    lambda z, t: -(t * F.logsigmoid(z) + (1 - t) * F.logsigmoid(-z)).mean(),
    _by_hand_stable,
], ids=["reference", "BCEWithLogitsLoss", "logsigmoid", "by hand, stable"])
def test_binary_loss_accepts(right, learner):
    assert check_binary_loss(right)


# --- drill 3: train_one_epoch -------------------------------------------------------------------

def _epoch(*, drop_last: bool = True, shuffle: bool = True, skip_single: bool = False, evaluate: bool = False,
           as_float: bool = True):
    def fn(model, dataset, batch_size, optimizer):
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
        model.eval() if evaluate else model.train()
        losses = []
        for x, y in loader:
            if skip_single and len(x) == 1:
                continue
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item() if as_float else loss)
        return losses
    return fn


EPOCH_WRONG = {
    "planted: a last batch of one sample": (_epoch(drop_last=False), "Expected more than 1 value per channel"),
    "the model in eval mode": (_epoch(drop_last=False, evaluate=True), "eval mode"),
    "drop_last without shuffling": (_epoch(shuffle=False), "in order"),
    "the losses kept as tensors": (_epoch(as_float=False), "floats"),
}


@pytest.mark.parametrize("wrong, observed", EPOCH_WRONG.values(), ids=EPOCH_WRONG.keys())
def test_train_one_epoch_rejects(wrong, observed, learner):
    verdict = check_train_one_epoch(wrong)
    assert not verdict and observed in str(verdict)


def test_train_one_epoch_rejects_an_epoch_that_leaves_out_a_batch(learner):
    def two_batches_short(model, dataset, batch_size, optimizer):
        subset = torch.utils.data.Subset(dataset, range(len(dataset) - 2 * batch_size))
        return _epoch()(model, subset, batch_size, optimizer)
    verdict = check_train_one_epoch(two_batches_short)
    assert not verdict and "trained on" in str(verdict)


def test_train_one_epoch_accepts(learner):
    assert check_train_one_epoch(reference("train_one_epoch"))
    assert check_train_one_epoch(_epoch(drop_last=False, skip_single=True))


# --- drill 4: deep_regressor --------------------------------------------------------------------

def _mlp(init):
    def fn(n_in, width, depth):
        layers = []
        for i in range(depth):
            linear = nn.Linear(n_in if i == 0 else width, width)
            init(linear)
            layers += [linear, nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, 1))
    return fn


DEEP_WRONG = {
    "planted: weights of std 0.01": _mlp(lambda m: nn.init.normal_(m.weight, std=0.01)),
    "PyTorch's default initialisation": _mlp(lambda m: None),
    "Xavier's (made for tanh, not ReLU)": _mlp(lambda m: nn.init.xavier_normal_(m.weight)),
    "weights of std 0.5 (the signal explodes)": _mlp(lambda m: nn.init.normal_(m.weight, std=0.5)),
}


@pytest.mark.parametrize("wrong", DEEP_WRONG.values(), ids=DEEP_WRONG.keys())
def test_deep_regressor_rejects(wrong, learner):
    verdict = check_deep_regressor(wrong)
    assert not verdict and "spread of the layer outputs" in str(verdict)


def test_deep_regressor_rejects_another_shape(learner):
    verdict = check_deep_regressor(lambda n_in, width, depth: reference("deep_regressor")(n_in, width, depth - 1))
    assert not verdict and "hidden Linear layers" in str(verdict)


@pytest.mark.parametrize("right", [
    reference("deep_regressor"),
    _mlp(lambda m: nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")),
    _mlp(lambda m: nn.init.normal_(m.weight, std=math.sqrt(2 / m.in_features))),
    _mlp(lambda m: nn.init.orthogonal_(m.weight, gain=math.sqrt(2))),
], ids=["reference", "kaiming_uniform_", "std sqrt(2 / fan_in) by hand", "orthogonal, gain sqrt(2)"])
def test_deep_regressor_accepts(right, learner):
    assert check_deep_regressor(right)


def test_the_spread_per_layer_separates_kaiming_from_xavier_on_seeds_the_check_does_not_use():
    """The check's fixed seeds are not lucky ones: on 20 other seeds of each case, every Kaiming network
    keeps at least 0.8 of the spread per layer and no Xavier or default one does."""
    from course_utils.exercises.triage import _layer_spreads, _seeded
    kaiming = reference("deep_regressor")
    xavier = _mlp(lambda m: nn.init.xavier_normal_(m.weight))
    default = _mlp(lambda m: None)
    for n_in, width, depth in ((8, 64, 12), (3, 32, 24), (20, 128, 6)):
        for seed in range(500, 520):
            x = _seeded(seed, lambda: torch.randn(512, n_in))
            for build, keeps in ((kaiming, True), (xavier, False), (default, False)):
                spreads, _ = _layer_spreads(_seeded(seed + 1, lambda: build(n_in, width, depth)), x)
                factor = (spreads[-1] / spreads[0]) ** (1 / (depth - 1))
                assert (0.8 <= factor <= 1.25) == keeps, (build, n_in, width, depth, seed, factor)
