"""Chapter 2: the training step, gradient accumulation, evaluation and the `fit` loop."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.devices import to_device

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
    """One step: zero_grad → forward → backward → clip → step.

    Any order works that clears the gradients before the next backward and steps after this
    backward (and clips between the two); zero_grad first is the one that is right whatever the
    caller did before.

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
