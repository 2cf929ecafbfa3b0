"""Chapter 2 exercises (the DataLoader, nn.Module pitfalls and the training loop): the checks and their
reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules (`course_utils.modules`,
`course_utils.training`) hold those.

Each check runs the learner's function on a case like the chapter's **and** on cases the chapter did
not show (another model and loss, Adam instead of SGD, other layer sizes, another number of
micro-batches, uneven batches, a convolutional model with `BatchNorm2d`, the GPU when there is one),
so an answer tuned to one case fails. A wrong answer that raises gets a failed verdict, never a crash;
the first verdict says what was observed, the hints come on later attempts. Every check leaves the
notebook's random stream and grad mode as it found them.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils.exercises import Verdict, reference_solution, report_check
from course_utils.models import mlp
from course_utils.modules import snapshot

__all__ = ["check_accumulate_step", "check_build_normalised_mlp", "check_predict_batches", "check_train_loop"]

Batch = Sequence[torch.Tensor]  # (inputs, targets)


def _raised(error: BaseException, limit: int = 100) -> str:
    """The learner's exception in one short line (long PyTorch messages cut at a word)."""
    message = str(error).splitlines()[0] if str(error) else ""
    if len(message) > limit:
        message = message[:limit].rsplit(" ", 1)[0] + " …"
    return f"your function raised {type(error).__name__}: {message}"


def _keeps_rng_and_grad_mode(check: Callable[[Callable], Verdict]) -> Callable[[Callable], Verdict]:
    """Run a check without disturbing the notebook: its random stream is restored afterwards (the
    check seeds its own), and so is the grad mode, even if the learner's code switched it off."""
    def wrapped(fn: Callable) -> Verdict:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            return check(fn)
    wrapped.__name__, wrapped.__doc__ = check.__name__, check.__doc__
    return wrapped


def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _largest_difference(model: nn.Module, reference: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))


def _modified_in_place(error: Exception) -> bool:
    """True for autograd's error when a tensor saved for backward was changed in place."""
    return isinstance(error, RuntimeError) and "modified by an inplace operation" in str(error)


# --- exercise 1: the training loop --------------------------------------------------------------

@reference_solution("train_loop", chapter=2)
def _train_loop(model: nn.Module, loader: Iterable[Batch], loss_fn: Callable, optimizer: torch.optim.Optimizer,
                epochs: int) -> list[float]:
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


@dataclass
class _LoopCase:
    described: str
    model: Callable[[], nn.Module]
    loader: Callable[[], Iterable[Batch]]     # a fresh loader with the same (seeded) order each time
    loss_fn: nn.Module
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    epochs: int


def _loop_cases() -> list[_LoopCase]:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    regression = list(zip(x.split(8), y.split(8)))
    features = torch.randn(30, 5, generator=generator)
    classes = (features[:, 0] > 0).long() + (features[:, 1] > 0).long()        # 3 classes
    return [
        _LoopCase("a regression MLP, SGD, 3 epochs of 8 batches", lambda: _seeded(2, lambda: mlp([4, 16, 1])),
                  lambda: regression, nn.MSELoss(), lambda m: torch.optim.SGD(m.parameters(), lr=0.05), 3),
        _LoopCase("a 3-class classifier, Adam, a shuffling DataLoader, 2 epochs of 5 batches",
                  lambda: _seeded(7, lambda: mlp([5, 12, 3])),
                  lambda: DataLoader(TensorDataset(features, classes), batch_size=6, shuffle=True,
                                     generator=torch.Generator().manual_seed(7)),
                  nn.CrossEntropyLoss(), lambda m: torch.optim.Adam(m.parameters(), lr=0.01), 2),
    ]


def _train_loop_problem(fn: Callable, case: _LoopCase) -> str | None:
    model = case.model()
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    expected_losses = _train_loop(reference, case.loader(), case.loss_fn, case.optimizer(reference), case.epochs)
    steps = len(expected_losses)
    batches = steps // case.epochs
    optimizer = case.optimizer(model)
    steps_taken: list[int] = []
    optimizer.register_step_post_hook(lambda *_: steps_taken.append(1))
    try:
        losses = fn(model, case.loader(), case.loss_fn, optimizer, case.epochs)
    except Exception as error:  # the learner's bug, reported rather than raised
        if _modified_in_place(error) and steps_taken:
            return (f"the backward() of batch {len(steps_taken)} raised RuntimeError (\"one of the variables "
                    "needed for gradient computation has been modified by an inplace operation\"): an "
                    "optimizer step had updated the weights in place after that batch's forward pass used them")
        return _raised(error)
    difference = _largest_difference(model, reference)
    if _largest_difference(model, initial) == 0.0:
        return f"no weight changed in {steps} steps"
    if len(steps_taken) != steps:
        return (f"optimizer.step() ran {len(steps_taken)} times for {case.epochs} epochs of {batches} batches "
                f"({steps} expected)")
    if not difference <= 1e-5:  # also catches NaN weights
        return (f"after {steps} steps your weights differ from those of a correct loop on the same data by up "
                f"to {difference:.3g}")
    if not (isinstance(losses, list) and len(losses) == steps and all(isinstance(v, float) for v in losses)):
        kinds = sorted({type(v).__name__ for v in losses}) if isinstance(losses, list) else []
        got_kind = f"a list of {len(losses)} {'/'.join(kinds)}" if kinds else type(losses).__name__
        return (f"the weights are right, but it returned {got_kind} instead of a list of {steps} Python floats "
                "(one loss per step)")
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, expected_losses))
    if worst > 1e-5:
        return "the weights are right, but the losses returned are not the loss of each step's batch"
    return None


@_keeps_rng_and_grad_mode
def check_train_loop(fn: Callable) -> Verdict:
    """Exercise: `fn(model, loader, loss_fn, optimizer, epochs)` trains for `epochs` passes over `loader`
    and returns the loss of every step as a Python float. Checked on the chapter's kind of regression
    (SGD, 3 epochs) and on a classifier trained with Adam from a shuffling DataLoader (2 epochs): the
    weights must be those a correct loop leaves."""
    observed = None
    for case in _loop_cases():
        problem = _train_loop_problem(fn, case)
        if problem is not None:
            observed = f"on {case.described}: {problem}"
            break
    return report_check("train_loop", observed is None, observed,
                        ["compare the order of the calls with the training step of section 6: which call "
                         "needs the gradients of this batch to exist already?",
                         "backward() adds into .grad; what clears the previous batch's gradients, and when?"])


# --- exercise 2: a model PyTorch must fully see --------------------------------------------------

class _NormalisedMLP(nn.Module):
    """(N, sizes[0]) -> (N, sizes[-1]): standardise the input with a fixed mean and std, then an MLP."""

    def __init__(self, sizes: list[int], mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-2], sizes[1:-1]))
        self.head = nn.Linear(sizes[-2], sizes[-1])
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


@reference_solution("build_normalised_mlp", chapter=2)
def _build_normalised_mlp(sizes: list[int], mean: torch.Tensor, std: torch.Tensor) -> nn.Module:
    return _NormalisedMLP(sizes, mean, std)


def _normalised_mlp_problems(fn: Callable, sizes: list[int], seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64, sizes[0], generator=generator) * 3 + 2
    y = x @ torch.randn(sizes[0], sizes[-1], generator=generator)
    mean, std = x.mean(dim=0), x.std(dim=0)
    expected_tensors = 2 * (len(sizes) - 1)
    model = _seeded(seed, lambda: fn(list(sizes), mean.clone(), std.clone()))
    problems = []
    parameters = list(model.parameters())
    if len(parameters) != expected_tensors:
        problems.append(f"parameters() holds {len(parameters)} tensors; {len(sizes) - 1} Linear layers have "
                        f"{expected_tensors} (a weight and a bias each)")
    state = model.state_dict()
    unsaved, keys = [], {}
    for name, value in (("mean", mean), ("std", std)):
        as_parameter = [p for p in parameters if p.shape == value.shape and torch.equal(p.detach(), value)]
        in_state = [k for k, v in state.items() if v.shape == value.shape and torch.equal(v, value)]
        if as_parameter and as_parameter[0].requires_grad:
            problems.append(f"`{name}` is a trainable parameter: every optimizer step would change the normalisation")
        elif as_parameter:
            problems.append(f"`{name}` is a parameter (frozen with requires_grad=False): it is saved and moved, but "
                            "every optimizer built from model.parameters() receives it, and model.requires_grad_() "
                            "would make it trainable")
        elif not in_state:
            unsaved.append(f"`{name}`")
        else:
            keys[name] = in_state[0]
    if unsaved:
        problems.append(f"{' and '.join(unsaved)} {'is' if len(unsaved) == 1 else 'are'} not in state_dict() "
                        f"(its keys: {', '.join(state) or 'none'}): not saved, not moved by .to()")
    model.eval()
    with torch.no_grad():
        alone, in_batch = model(x[:3]), model(x)[:3]
        if not torch.allclose(alone, in_batch, rtol=1e-4, atol=1e-5):
            problems.append("the output for the same 3 samples changes with the other samples of the batch: the "
                            "normalisation depends on the batch, not on the fixed mean and std")
        elif "mean" in keys:
            shifted = copy.deepcopy(model)
            shifted.state_dict()[keys["mean"]].add_(1.5)         # the buffer itself (state_dict shares storage)
            if not torch.allclose(shifted(x + 1.5), model(x), rtol=1e-4, atol=1e-5):
                problems.append("the model's output does not follow its saved `mean`: moving the inputs and the "
                                "mean together by 1.5 changed the output, so the forward pass does not compute "
                                "(x - mean) / std with the tensors it saves")
    model.train()
    if parameters:
        before = snapshot(model)
        optimizer = torch.optim.SGD(parameters, lr=0.01)
        for _ in range(20):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        now = snapshot(model)
        frozen = sorted({k.rsplit(".", 1)[0] for k in before if torch.equal(before[k], now[k])})
        if frozen:
            problems.append(f"in 20 training steps these layers did not change: {', '.join(frozen)}")
    return problems


@_keeps_rng_and_grad_mode
def check_build_normalised_mlp(fn: Callable) -> Verdict:
    """Exercise: `fn(sizes, mean, std)` builds a model whose every Linear layer is trained and saved, and
    whose `mean` / `std` are saved and moved with it but are not parameters, and that normalises each
    sample with them. Checked with the sizes [4, 16, 16, 1] and [3, 8, 8, 8, 2] (three hidden layers)."""
    observed = None
    for sizes, seed in (([4, 16, 16, 1], 5), ([3, 8, 8, 8, 2], 6)):
        try:
            problems = _normalised_mlp_problems(fn, sizes, seed)
        except Exception as error:  # the learner's bug, reported rather than raised
            problems = [_raised(error)]
        if problems:
            observed = f"with sizes {sizes}: " + "; ".join(problems)
            break
    return report_check("build_normalised_mlp", observed is None, observed,
                        ["compare model.parameters() and model.state_dict().keys() with what the model "
                         "holds, as section 4 did by hand",
                         "nn.Module registers what you assign as a Module, a Parameter or a buffer; a plain "
                         "Python list or a plain tensor is none of these"])


# --- exercise 3: gradient accumulation -----------------------------------------------------------

@reference_solution("accumulate_step", chapter=2)
def _accumulate_step(model: nn.Module, micro_batches: Sequence[Batch], loss_fn: Callable,
                     optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        loss = loss_fn(model(inputs), targets) / len(micro_batches)
        loss.backward()
    optimizer.step()


def _accumulate_problem(fn: Callable, seed: int, micro_batch: int, count: int, sizes: list[int]) -> str | None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(micro_batch * count, sizes[0], generator=generator)
    y = x.sum(dim=1, keepdim=True).repeat(1, sizes[-1]) + 0.1
    model = _seeded(seed, lambda: mlp(sizes))
    micro_batches = list(zip(x.split(micro_batch), y.split(micro_batch)))
    loss_fn = nn.MSELoss()
    reference = copy.deepcopy(model)
    loss_fn(reference(x), y).backward()
    big_batch = torch.cat([p.grad.flatten() for p in reference.parameters()])
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []
    optimizer.register_step_pre_hook(lambda *_: seen.append(
        torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])))
    largest: list[int] = [0]

    def record(_module: nn.Module, args: tuple) -> None:
        largest[0] = max(largest[0], len(args[0]))
    handle = model.register_forward_pre_hook(record)
    try:
        fn(model, micro_batches, loss_fn, optimizer)
    except Exception as error:
        return _raised(error)
    finally:
        handle.remove()
    if not seen:
        return "optimizer.step() was never called: the weights did not change"
    if len(seen) != 1:
        return f"optimizer.step() ran {len(seen)} times for {count} micro-batches of one batch"
    if largest[0] > micro_batch:
        return (f"the model received a batch of {largest[0]} samples at once, though the micro-batches hold "
                f"{micro_batch}: the whole batch went through one forward pass, which is what accumulation is "
                "there to avoid (it would not fit in memory)")
    if not torch.allclose(seen[0], big_batch, rtol=1e-4, atol=1e-6):
        ratio = (seen[0].norm() / big_batch.norm()).item()
        return (f"at the step the gradient was {ratio:.2f}x as large as the gradient of the whole batch of "
                f"{len(x)} (it should be the same)")
    if not _largest_difference(model, reference) <= 1e-5:
        return "the gradients were right, but the weights after your step differ from one big-batch step"
    return None


@_keeps_rng_and_grad_mode
def check_accumulate_step(fn: Callable) -> Verdict:
    """Exercise: `fn(model, micro_batches, loss_fn, optimizer)` makes one optimizer step whose gradients
    equal those of the concatenated batch, feeding the model one micro-batch at a time. Checked with 4
    micro-batches of 8 samples and with 3 micro-batches of 10 (another MLP, two outputs)."""
    observed = None
    for seed, micro_batch, count, sizes in ((3, 8, 4, [4, 16, 1]), (8, 10, 3, [6, 12, 12, 2])):
        problem = _accumulate_problem(fn, seed, micro_batch, count, sizes)
        if problem is not None:
            observed = f"with {count} micro-batches of {micro_batch}: {problem}"
            break
    return report_check("accumulate_step", observed is None, observed,
                        ["each micro-batch loss is already a mean over its samples; backward() adds the "
                         "gradients of all the micro-batches together",
                         "the optimizer should see the gradients only once they hold every micro-batch"])


# --- exercise 4: predictions ---------------------------------------------------------------------

@reference_solution("predict_batches", chapter=2)
def _predict_batches(model: nn.Module, batches: Iterable[torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        return torch.cat([model(inputs) for inputs in batches])


def _predict_cases() -> list[tuple[str, nn.Module, list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(4)
    mlp_model = _seeded(4, lambda: nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5),
                                                 nn.Linear(16, 3)))
    conv_model = _seeded(9, lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    images = torch.randn(15, 3, 8, 8, generator=generator)
    return [("an MLP with BatchNorm1d and Dropout, 3 batches of 8", mlp_model,
             list(torch.randn(24, 6, generator=generator).split(8))),
            (f"a conv net with BatchNorm2d and Dropout on {device.type}, batches of 5, 3 and 7 images",
             conv_model.to(device), [b.to(device) for b in images.split([5, 3, 7])])]


def _predict_problems(fn: Callable, model: nn.Module, batches: list[torch.Tensor]) -> list[str]:
    model.train()                                          # as it is right after training
    bn = next(m for m in model.modules() if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)))
    evaluator = copy.deepcopy(model).eval()
    with torch.no_grad():
        expected = torch.cat([evaluator(b) for b in batches])
    running_mean = bn.running_mean.clone()
    grad_modes: list[bool] = []
    first_layer = next(m for m in model.modules() if not list(m.children()))
    handle = first_layer.register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    try:
        first = fn(model, batches)
        grad_after_first = torch.is_grad_enabled()
        torch.set_grad_enabled(True)
        second = fn(model, batches)
    except Exception as error:
        return [_raised(error)]
    finally:
        handle.remove()
    problems = []
    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.shape == expected.shape):
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
        return [f"it returned {shape}, expected a tensor of shape {tuple(expected.shape)}"]
    if not torch.allclose(first, second, rtol=1e-5, atol=1e-6):
        difference = (first - second).abs().max().item()
        problems.append(f"two calls on the same inputs gave different outputs (up to {difference:.3f} apart)")
    if not torch.equal(running_mean, bn.running_mean):
        drift = (bn.running_mean - running_mean).abs().max().item()
        problems.append(f"BatchNorm's running_mean moved by up to {drift:.3f} while you only predicted")
    if any(grad_modes):
        problems.append("autograd was recording during the forward pass (torch.is_grad_enabled() was True inside "
                        "it): a graph was built, and its activations kept alive, for a backward() that never "
                        "comes" + (" — detaching the outputs afterwards does not undo that"
                                   if not first.requires_grad else ""))
    if not grad_after_first:
        problems.append("after your function returned, autograd was still switched off (torch.is_grad_enabled() "
                        "was False): every training step after it in this process would compute no gradients")
    if not problems and not torch.allclose(first.detach(), expected, rtol=1e-5, atol=1e-6):
        problems.append("the outputs differ from the model's evaluation outputs")
    return problems


@_keeps_rng_and_grad_mode
def check_predict_batches(fn: Callable) -> Verdict:
    """Exercise: `fn(model, batches)` returns the model's outputs for every batch, concatenated, as an
    evaluation would: deterministic, BatchNorm statistics untouched, no graph recorded during the forward
    pass, grad mode as it was afterwards. Checked on an MLP with BatchNorm1d and Dropout, and on a conv
    net with BatchNorm2d and Dropout fed uneven batches (on the GPU when there is one); both arrive in
    training mode."""
    observed = None
    for described, model, batches in _predict_cases():
        problems = _predict_problems(fn, model, batches)
        if problems:
            observed = f"on {described}: " + "; ".join(problems)
            break
    return report_check("predict_batches", observed is None, observed,
                        ["two different switches matter here: one changes how some layers compute, "
                         "the other whether autograd records anything",
                         "section 8 showed that each switch alone leaves one of these symptoms; a switch "
                         "that is a context manager also switches itself back"])
