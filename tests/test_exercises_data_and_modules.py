"""Chapter 2's exercise checks: each rejects the planted bugs and the plausible wrong answers (an answer
tuned to the sizes the chapter shows, the right result computed the wrong way), accepts the reference
and a differently written correct answer, and never crashes on a wrong answer that raises."""
import pytest
import torch
from torch import nn

from course_utils import exercises, train_accumulated
from course_utils.exercises.data_and_modules import (check_accumulate_step, check_build_normalised_mlp,
                                                     check_predict_batches, check_train_loop)


def reference(name):
    return exercises.reference(name)


# --- exercise 1: train_loop ------------------------------------------------------------------------

def loop_as_shipped(model, loader, loss_fn, optimizer, epochs):              # both planted bugs
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            optimizer.step()
            loss.backward()
            losses.append(loss.item())
    return losses


def loop_step_before_backward(model, loader, loss_fn, optimizer, epochs):   # planted bug 1 alone
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            optimizer.step()
            loss.backward()
            losses.append(loss.item())
    return losses


def loop_without_zero_grad(model, loader, loss_fn, optimizer, epochs):      # planted bug 2 alone
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def loop_zero_grad_between_backward_and_step(model, loader, loss_fn, optimizer, epochs):
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.zero_grad()
            optimizer.step()
            losses.append(loss.item())
    return losses


def loop_three_epochs_always(model, loader, loss_fn, optimizer, epochs):    # tuned to the chapter's 3 epochs
    return reference("train_loop")(model, loader, loss_fn, optimizer, 3)


def loop_returning_tensors(model, loader, loss_fn, optimizer, epochs):      # right weights, wrong losses
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss)
    return losses


def loop_losses_after_the_step(model, loader, loss_fn, optimizer, epochs):  # right weights, other losses
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
            with torch.no_grad():
                losses.append(loss_fn(model(inputs), targets).item())
    return losses


def loop_zero_grad_last(model, loader, loss_fn, optimizer, epochs):         # correct: the other valid order
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach().item())
    return losses


def loop_model_zero_grad(model, loader, loss_fn, optimizer, epochs):        # correct: model.zero_grad()
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            model.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


WRONG_LOOPS = {
    "as shipped: step before backward, no zero_grad": (loop_as_shipped, "the backward() of batch 2 raised"),
    "step before backward": (loop_step_before_backward, "no weight changed"),
    "no zero_grad": (loop_without_zero_grad, "differ from those of a correct loop"),
    "zero_grad between backward and step": (loop_zero_grad_between_backward_and_step, "no weight changed"),
    "tuned: always 3 epochs": (loop_three_epochs_always, "ran 15 times for 2 epochs"),
    "losses kept as tensors": (loop_returning_tensors, "Python floats"),
    "losses measured after the step": (loop_losses_after_the_step, "not the loss of each step's batch"),
}


@pytest.mark.parametrize("name", WRONG_LOOPS)
def test_check_train_loop_rejects(learner, name):
    answer, symptom = WRONG_LOOPS[name]
    verdict = check_train_loop(answer)
    assert not verdict, name
    assert symptom in str(verdict), str(verdict)


@pytest.mark.parametrize("answer", [reference("train_loop"), loop_zero_grad_last, loop_model_zero_grad])
def test_check_train_loop_accepts(learner, answer):
    assert check_train_loop(answer)


def test_check_train_loop_explains_the_shipped_error(learner):
    verdict = str(check_train_loop(loop_as_shipped))
    assert "updated the weights in place after that batch's forward pass" in verdict
    assert "zero_grad" not in verdict.splitlines()[0]          # the first verdict names no fix


# --- exercise 2: build_normalised_mlp --------------------------------------------------------------

def normalised_mlp(plain_list: bool, plain_tensors: bool):
    """The exercise's model with either planted bug left in (or both, or neither)."""
    class NormalisedMLP(nn.Module):
        def __init__(self, sizes, mean, std):
            super().__init__()
            hidden = [nn.Linear(a, b) for a, b in zip(sizes[:-2], sizes[1:-1])]
            self.hidden = hidden if plain_list else nn.ModuleList(hidden)
            self.head = nn.Linear(sizes[-2], sizes[-1])
            if plain_tensors:
                self.mean, self.std = mean, std
            else:
                self.register_buffer("mean", mean)
                self.register_buffer("std", std)

        def forward(self, x):
            x = (x - self.mean) / self.std
            for layer in self.hidden:
                x = torch.relu(layer(x))
            return self.head(x)
    return NormalisedMLP


class TwoHiddenLayersOnly(nn.Module):                 # tuned to the chapter's sizes [4, 16, 16, 1]
    def __init__(self, sizes, mean, std):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(sizes[0], sizes[1]), nn.Linear(sizes[1], sizes[2])
        self.head = nn.Linear(sizes[-2], sizes[-1])
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x):
        x = (x - self.mean) / self.std
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class BatchStatistics(normalised_mlp(False, False)):  # buffers saved, but each batch normalised by itself
    def forward(self, x):
        x = (x - x.mean(dim=0)) / x.std(dim=0)
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


class IgnoresItsBuffers(normalised_mlp(False, False)):  # buffers saved, never used
    def forward(self, x):
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


class TrainableStatistics(nn.Module):
    def __init__(self, sizes, mean, std):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-2], sizes[1:-1]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))
        self.mean, self.std = nn.Parameter(mean), nn.Parameter(std)

    def forward(self, x):
        return self.body((x - self.mean) / self.std)


class FrozenParameterStatistics(TrainableStatistics):
    def __init__(self, sizes, mean, std):
        super().__init__(sizes, mean, std)
        self.mean.requires_grad_(False)
        self.std.requires_grad_(False)


class SequentialWithBuffers(nn.Module):               # correct, written differently
    def __init__(self, sizes, mean, std):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-2], sizes[1:-1]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.body = nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())

    def forward(self, x):
        return self.body((x - self.mean) / self.std)


WRONG_MODELS = {
    "planted: layers in a plain list": (normalised_mlp(True, False), "did not change: hidden.0, hidden.1"),
    "planted: mean and std plain tensors": (normalised_mlp(False, True), "`mean` and `std` are not in state_dict()"),
    "as shipped: both": (normalised_mlp(True, True), "parameters() holds 2 tensors"),
    "tuned: two hidden layers whatever the sizes": (TwoHiddenLayersOnly, "with sizes [3, 8, 8, 8, 2]"),
    "each batch normalised by its own statistics": (BatchStatistics, "changes with the other samples"),
    "buffers saved but not used": (IgnoresItsBuffers, "does not follow its saved `mean`"),
    "trainable mean and std": (TrainableStatistics, "`mean` is a trainable parameter"),
    "frozen parameters": (FrozenParameterStatistics, "`mean` is a parameter (frozen with requires_grad=False)"),
}


@pytest.mark.parametrize("name", WRONG_MODELS)
def test_check_build_normalised_mlp_rejects(learner, name):
    answer, symptom = WRONG_MODELS[name]
    verdict = check_build_normalised_mlp(answer)
    assert not verdict, name
    assert symptom in str(verdict), str(verdict)


@pytest.mark.parametrize("answer", [reference("build_normalised_mlp"), normalised_mlp(False, False),
                                    SequentialWithBuffers])
def test_check_build_normalised_mlp_accepts(learner, answer):
    assert check_build_normalised_mlp(answer)


# --- exercise 3: accumulate_step -------------------------------------------------------------------

def accumulate_as_shipped(model, micro_batches, loss_fn, optimizer):         # both planted bugs
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        loss_fn(model(inputs), targets).backward()
        optimizer.step()


def accumulate_undivided(model, micro_batches, loss_fn, optimizer):          # planted bug 1 alone
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        loss_fn(model(inputs), targets).backward()
    optimizer.step()


def accumulate_stepping_every_micro_batch(model, micro_batches, loss_fn, optimizer):   # planted bug 2 alone
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        (loss_fn(model(inputs), targets) / len(micro_batches)).backward()
        optimizer.step()


def accumulate_divided_by_4(model, micro_batches, loss_fn, optimizer):       # tuned to the chapter's 4
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        (loss_fn(model(inputs), targets) / 4).backward()
    optimizer.step()


def accumulate_by_concatenating(model, micro_batches, loss_fn, optimizer):   # right gradient, the wrong way
    optimizer.zero_grad()
    inputs = torch.cat([inputs for inputs, _ in micro_batches])
    targets = torch.cat([targets for _, targets in micro_batches])
    loss_fn(model(inputs), targets).backward()
    optimizer.step()


def accumulate_weighted_by_samples(model, micro_batches, loss_fn, optimizer):   # correct, written differently
    total = sum(len(inputs) for inputs, _ in micro_batches)
    optimizer.zero_grad(set_to_none=False)
    for inputs, targets in micro_batches:
        (loss_fn(model(inputs), targets) * (len(inputs) / total)).backward()
    optimizer.step()


WRONG_ACCUMULATIONS = {
    "as shipped": (accumulate_as_shipped, "ran 4 times"),
    "planted: not divided": (accumulate_undivided, "4.00x as large"),
    "planted: a step per micro-batch": (accumulate_stepping_every_micro_batch, "ran 4 times"),
    "tuned: divided by 4 always": (accumulate_divided_by_4, "with 3 micro-batches of 10"),
    "one big batch instead of micro-batches": (accumulate_by_concatenating, "a batch of 32 samples at once"),
}


@pytest.mark.parametrize("name", WRONG_ACCUMULATIONS)
def test_check_accumulate_step_rejects(learner, name):
    answer, symptom = WRONG_ACCUMULATIONS[name]
    verdict = check_accumulate_step(answer)
    assert not verdict, name
    assert symptom in str(verdict), str(verdict)


@pytest.mark.parametrize("answer", [reference("accumulate_step"), accumulate_weighted_by_samples, train_accumulated])
def test_check_accumulate_step_accepts(learner, answer):
    assert check_accumulate_step(answer)


# --- exercise 4: predict_batches -------------------------------------------------------------------

def predict_as_shipped(model, batches):                                      # both planted bugs
    return torch.cat([model(inputs) for inputs in batches])


def predict_without_eval(model, batches):                                    # planted bug 1 alone
    with torch.no_grad():
        return torch.cat([model(inputs) for inputs in batches])


def predict_without_no_grad(model, batches):                                 # planted bug 2 alone
    model.eval()
    return torch.cat([model(inputs) for inputs in batches])


def predict_with_detach(model, batches):                  # the cheat: eval + detach, graph still built
    model.eval()
    return torch.cat([model(inputs).detach() for inputs in batches])


def predict_grad_switched_off_for_good(model, batches):
    model.eval()
    torch.set_grad_enabled(False)
    return torch.cat([model(inputs) for inputs in batches])


def predict_stacked_rows_of_3(model, batches):            # tuned to the chapter's equal batches and 3 outputs
    model.eval()
    with torch.no_grad():
        return torch.stack([model(inputs) for inputs in batches]).reshape(-1, 3)


def predict_with_no_grad_and_restore(model, batches):     # correct, written differently
    was_training = model.training
    model.train(False)
    outputs = []
    with torch.no_grad():
        for inputs in batches:
            outputs.append(model(inputs))
    model.train(was_training)
    return torch.cat(outputs)


WRONG_PREDICTIONS = {
    "as shipped": (predict_as_shipped, "different outputs"),
    "planted: no eval()": (predict_without_eval, "running_mean moved"),
    "planted: no no_grad": (predict_without_no_grad, "autograd was recording during the forward pass"),
    "eval() and detach(), without no_grad": (predict_with_detach, "detaching the outputs afterwards does not undo"),
    "grad mode switched off and never back": (predict_grad_switched_off_for_good, "autograd was still switched off"),
    "tuned: equal batches of 3 outputs": (predict_stacked_rows_of_3, "on a conv net"),
}


@pytest.mark.parametrize("name", WRONG_PREDICTIONS)
def test_check_predict_batches_rejects(learner, name):
    answer, symptom = WRONG_PREDICTIONS[name]
    verdict = check_predict_batches(answer)
    assert not verdict, name
    assert symptom in str(verdict), str(verdict)
    assert torch.is_grad_enabled()                        # the check left grad mode as it was


@pytest.mark.parametrize("answer", [reference("predict_batches"), predict_with_no_grad_and_restore])
def test_check_predict_batches_accepts(learner, answer):
    assert check_predict_batches(answer)


# --- all four ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("check, wrong", [
    (check_train_loop, lambda model, loader, loss_fn, optimizer, epochs: None),
    (check_train_loop, lambda model, loader, loss_fn, optimizer, epochs: 1 / 0),
    (check_build_normalised_mlp, lambda sizes, mean, std: None),
    (check_build_normalised_mlp, lambda sizes, mean, std: 1 / 0),
    (check_accumulate_step, lambda model, micro_batches, loss_fn, optimizer: None),
    (check_accumulate_step, lambda model, micro_batches, loss_fn, optimizer: 1 / 0),
    (check_predict_batches, lambda model, batches: [model(x) for x in batches]),
    (check_predict_batches, lambda model, batches: 1 / 0),
])
def test_checks_report_what_they_saw_and_never_crash(learner, check, wrong):
    verdict = check(wrong)
    assert not verdict and "(attempt 1)" in str(verdict)


def test_a_long_error_is_cut_to_one_short_line(learner):
    def raises(model, loader, loss_fn, optimizer, epochs):
        raise RuntimeError("word " * 100 + "\nsecond line")
    message = str(check_train_loop(raises)).splitlines()[0]
    assert message.endswith("…") and "second line" not in message and len(message) < 250


def test_checks_leave_the_random_stream_alone(learner):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check_predict_batches(predict_as_shipped)             # Dropout in training mode draws random numbers
    assert torch.equal(torch.rand(3), expected)
