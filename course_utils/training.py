"""Chapter 2: one correct training step, gradient accumulation, evaluation and the `fit` loop,
and the checks of the chapter's training exercises."""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.devices import to_device
from course_utils.exercises import Verdict, reference_solution, report_check
from course_utils.models import mlp

Batch = Sequence[torch.Tensor]  # (inputs, targets)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _model_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError("the model has no registered parameters (see find_unregistered_modules)")
    return first.device


def _unpack(batch: Batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        raise TypeError(f"a batch must be an (inputs, targets) pair, got {type(batch).__name__}"
                        + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else ""))
    # from pinned memory (a DataLoader with pin_memory=True) the copy to a GPU can return at once:
    # the model's kernels run after it on the same CUDA stream
    non_blocking = device.type == "cuda" and all(t.is_pinned() for t in batch if isinstance(t, torch.Tensor))
    inputs, targets = to_device(tuple(batch), device, non_blocking)
    return inputs, targets


def train_step(model: nn.Module, batch: Batch, loss_fn: LossFn, optimizer: torch.optim.Optimizer, *,
               max_norm: float | None = None, scaler: torch.amp.GradScaler | None = None) -> float:
    """One step in the only correct order: zero_grad → forward → backward → clip → step.

    `batch` is (inputs, targets), moved to the model's device (`non_blocking` when it is pinned
    and the device is a GPU). `max_norm` clips the global gradient norm (after unscaling, when a
    `torch.amp.GradScaler` is given). Returns the loss as a Python float, so the caller never
    keeps the graph alive.
    """
    _checks.module(model)
    inputs, targets = _unpack(batch, _model_device(model))
    if len(inputs) == 0:
        raise ValueError("the batch is empty (0 samples): its mean loss would be nan; check the DataLoader "
                         "(a dataset shorter than batch_size with drop_last=True yields no batch at all)")
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    if scaler is not None:
        scaler.scale(loss).backward()
        if max_norm is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        if max_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    return loss.item()


def train_accumulated(model: nn.Module, micro_batches: Sequence[Batch], loss_fn: LossFn,
                      optimizer: torch.optim.Optimizer, *, max_norm: float | None = None) -> float:
    """One optimizer step from several micro-batches, with the gradients of one big batch.

    Each micro-batch's mean loss is weighted by its share of the samples (that is, divided by
    the number of micro-batches when they are equal in size), so the summed gradients equal
    those of the concatenated batch. Then one `step`, then `zero_grad`. Returns the mean loss.
    """
    if len(micro_batches) == 0:
        raise ValueError("micro_batches is empty")
    device = _model_device(model)
    unpacked = [_unpack(b, device) for b in micro_batches]
    total = sum(len(inputs) for inputs, _ in unpacked)
    mean_loss = 0.0
    for inputs, targets in unpacked:
        weight = len(inputs) / total
        loss = loss_fn(model(inputs), targets) * weight
        loss.backward()  # gradients add up across micro-batches
        mean_loss += loss.item()
    if max_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss


def evaluate(model: nn.Module, loader: Iterable[Batch], loss_fn: LossFn, *,
             device: torch.device | str | None = None) -> float:
    """Mean loss per sample over `loader`, under `inference_mode` and `eval()`.

    `loss_fn` must average over its batch (reduction="mean"); batches are weighted by size, so
    a short last batch counts correctly. The model's previous train/eval mode is restored.
    """
    device = torch.device(device) if device is not None else _model_device(model)
    was_training = model.training
    total_loss, count = 0.0, 0
    model.eval()
    try:
        with torch.inference_mode():
            for batch in loader:
                inputs, targets = _unpack(batch, device)
                total_loss += loss_fn(model(inputs), targets).item() * len(inputs)
                count += len(inputs)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("the evaluation loader yielded no samples")
    return total_loss / count


@dataclass
class History(ReadableResult):
    """What `fit` recorded: the training loss of every step and the validation loss of every epoch."""

    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)

    def __str__(self) -> str:
        val = f", val loss {self.val_losses[-1]:.4f}" if self.val_losses else ""
        return f"{len(self.train_losses)} steps, last train loss {self.train_losses[-1]:.4f}{val}"


def fit(model: nn.Module, train_loader: Iterable[Batch], loss_fn: LossFn, optimizer: torch.optim.Optimizer,
        *, epochs: int = 1, val_loader: Iterable[Batch] | None = None, scheduler=None,
        max_norm: float | None = None, progress: bool = True, history: History | None = None) -> History:
    """Train for `epochs` with `train_step`, stepping `scheduler` once per epoch and evaluating on
    `val_loader` after each. A `tqdm.auto` bar shows progress. Pass `history` to continue one."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    history = history if history is not None else History()
    model.train()
    for epoch in range(epochs):
        bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{epochs}", disable=not progress, leave=False)
        for batch in bar:
            history.train_losses.append(train_step(model, batch, loss_fn, optimizer, max_norm=max_norm))
            bar.set_postfix(loss=f"{history.train_losses[-1]:.4f}")
        if scheduler is not None:
            scheduler.step()
        if val_loader is not None:
            history.val_losses.append(evaluate(model, val_loader, loss_fn))
    return history


# --- exercises ------------------------------------------------------------------------------

def _regression_problem(seed: int, n: int = 64, batch_size: int = 8):
    """A seeded (model, batches, full batch) regression: y = x·w + 0.1 with x (n, 4), y (n, 1)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = mlp([4, 16, 1])
    return model, list(zip(x.split(batch_size), y.split(batch_size))), (x, y)


def _largest_difference(model: nn.Module, reference: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))


def _modified_in_place(error: Exception) -> bool:
    """True for autograd's error when a tensor saved for backward was changed in place."""
    return isinstance(error, RuntimeError) and "modified by an inplace operation" in str(error)


def _raised(error: Exception, limit: int = 100) -> str:
    """The learner's exception in one short line (long PyTorch messages cut at a word)."""
    message = str(error).splitlines()[0] if str(error) else ""
    if len(message) > limit:
        message = message[:limit].rsplit(" ", 1)[0] + " …"
    return f"your function raised {type(error).__name__}: {message}"


@reference_solution("train_loop", chapter=2)
def _train_loop(model: nn.Module, loader: Iterable[Batch], loss_fn: LossFn, optimizer: torch.optim.Optimizer,
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


def check_train_loop(fn: Callable) -> Verdict:
    """Exercise: `fn(model, loader, loss_fn, optimizer, epochs)` trains for `epochs` and returns the
    per-step losses as floats; it must leave the weights a correct loop would (SGD, 3 epochs of 8 batches)."""
    model, loader, (x, y) = _regression_problem(seed=2)
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    loss_fn = nn.MSELoss()
    _train_loop(reference, loader, loss_fn, torch.optim.SGD(reference.parameters(), lr=0.05), 3)
    steps = 3 * len(loader)
    with torch.no_grad():
        start, expected = loss_fn(model(x), y).item(), loss_fn(reference(x), y).item()
    observed = None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps_taken = []
    optimizer.register_step_post_hook(lambda *_: steps_taken.append(1))
    try:
        losses = fn(model, loader, loss_fn, optimizer, 3)
    except Exception as error:  # the learner's bug, reported rather than raised
        if _modified_in_place(error) and steps_taken:
            observed = (f"the backward() of batch {len(steps_taken)} raised RuntimeError (\"one of the variables "
                        "needed for gradient computation has been modified by an inplace operation\"): an "
                        "optimizer step had updated the weights in place after that batch's forward pass used them")
        else:
            observed = _raised(error)
    else:
        with torch.no_grad():
            got = loss_fn(model(x), y).item()
        difference = _largest_difference(model, reference)
        if _largest_difference(model, initial) == 0.0:
            observed = f"no weight changed in {steps} steps: the loss stayed at {start:.3f}"
        elif not difference <= 1e-5:  # also catches NaN weights
            observed = (f"the loss went from {start:.3f} to {got:.3f}; a correct loop reaches {expected:.3f} "
                        f"on the same data (your weights differ from its weights by up to {difference:.3g})")
        elif not (isinstance(losses, list) and len(losses) == steps and all(isinstance(v, float) for v in losses)):
            kinds = sorted({type(v).__name__ for v in losses}) if isinstance(losses, list) else []
            got_kind = f"a list of {len(losses)} {'/'.join(kinds)}" if kinds else type(losses).__name__
            observed = (f"the weights are right, but it returned {got_kind} instead of a list of "
                        f"{steps} Python floats (one loss per step)")
    return report_check("train_loop", observed is None, observed,
                        ["compare the order of the calls with the training step of section 6: which call "
                         "needs the gradients of this batch to exist already?",
                         "backward() adds into .grad; what clears the previous batch's gradients, and where?"])


@reference_solution("accumulate_step", chapter=2)
def _accumulate_step(model: nn.Module, micro_batches: Sequence[Batch], loss_fn: LossFn,
                     optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        loss = loss_fn(model(inputs), targets) / len(micro_batches)
        loss.backward()
    optimizer.step()


def check_accumulate_step(fn: Callable) -> Verdict:
    """Exercise: `fn(model, micro_batches, loss_fn, optimizer)` makes one optimizer step whose gradients
    equal those of the concatenated batch (4 micro-batches of 8 samples, SGD)."""
    model, micro_batches, (x, y) = _regression_problem(seed=3, n=32)
    loss_fn = nn.MSELoss()
    reference = copy.deepcopy(model)
    big_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    loss_fn(reference(x), y).backward()
    big_batch = torch.cat([p.grad.flatten() for p in reference.parameters()])
    big_optimizer.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []
    optimizer.register_step_pre_hook(lambda *_: seen.append(
        torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])))
    observed = None
    try:
        fn(model, micro_batches, loss_fn, optimizer)
    except Exception as error:
        observed = _raised(error)
    else:
        k = len(micro_batches)
        if not seen:
            observed = "optimizer.step() was never called: the weights did not change"
        elif len(seen) != 1:
            observed = f"optimizer.step() ran {len(seen)} times for {k} micro-batches of one batch"
        elif not torch.allclose(seen[0], big_batch, rtol=1e-4, atol=1e-6):
            ratio = (seen[0].norm() / big_batch.norm()).item()
            observed = (f"at the step the gradient was {ratio:.2f}x as large as the gradient of the whole "
                        f"batch of {len(x)} (it should be the same)")
        elif not _largest_difference(model, reference) <= 1e-5:
            observed = "the gradients were right, but the weights after your step differ from one big-batch step"
    return report_check("accumulate_step", observed is None, observed,
                        ["each micro-batch loss is already a mean over its 8 samples; backward() adds "
                         "the gradients of all 4 together",
                         "the optimizer should see the gradients only once they hold every micro-batch"])


def _dropout_batchnorm_model(seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))


@reference_solution("predict_batches", chapter=2)
def _predict_batches(model: nn.Module, batches: Iterable[torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        return torch.cat([model(inputs) for inputs in batches])


def check_predict_batches(fn: Callable) -> Verdict:
    """Exercise: `fn(model, batches)` returns the model's outputs for every batch, concatenated, as an
    evaluation would: deterministic, BatchNorm statistics untouched, no graph (Dropout + BatchNorm model)."""
    model = _dropout_batchnorm_model(seed=4).train()   # as it is right after training
    generator = torch.Generator().manual_seed(4)
    batches = list(torch.randn(24, 6, generator=generator).split(8))
    expected = _dropout_batchnorm_model(seed=4).eval()(torch.cat(batches)).detach()
    running_mean = model[1].running_mean.clone()
    observed = None
    try:
        first = fn(model, batches)
        second = fn(model, batches)
    except Exception as error:
        observed = _raised(error)
    else:
        problems = []
        if not (isinstance(first, torch.Tensor) and first.shape == expected.shape):
            shape = tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
            problems.append(f"it returned {shape}, expected a tensor of shape {tuple(expected.shape)}")
        else:
            if not torch.equal(first, second):
                difference = (first - second).abs().max().item()
                problems.append(f"two calls on the same inputs gave different outputs (up to {difference:.3f} apart)")
            if not torch.equal(running_mean, model[1].running_mean):
                drift = (model[1].running_mean - running_mean).abs().max().item()
                problems.append(f"BatchNorm's running_mean moved by up to {drift:.3f} while you only predicted")
            if first.requires_grad:
                problems.append("the outputs require grad: autograd recorded a graph (and kept its activations) "
                                "for a backward() that never comes")
            if not problems and not torch.allclose(first.detach(), expected, rtol=1e-5, atol=1e-6):
                problems.append("the outputs differ from the model's evaluation outputs")
        observed = "; ".join(problems) or None
    return report_check("predict_batches", observed is None, observed,
                        ["two different switches matter here: one changes how some layers compute, "
                         "the other whether autograd records anything",
                         "section 8 showed that each switch alone leaves one of these symptoms"])
