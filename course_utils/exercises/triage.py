"""Triage drills: a symptom, a short plain-PyTorch function, and the cause to find from the symptom alone.

Course scaffolding, not a tool a practitioner keeps. Each drill is the kind of code a learner writes on
a real project, with one cause behind one row of the triage table: `backward()` through the graph a
second time (a hidden state carried across chunks), a loss that turns `nan` once the model is confident
(log of a sigmoid that rounded to 0 or 1), a crash on the last batch of an epoch (BatchNorm given one
sample), and a deep network that predicts the mean (an initialisation that shrinks the signal). Each
check runs the learner's function on cases the page does not show and returns a `Verdict`; a function
that raises gets a failed verdict that names the line, never a crash.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from course_utils.exercises import Verdict, _raised, _seeded, reference_solution, report_check

__all__ = ["check_binary_loss", "check_deep_regressor", "check_train_on_chunks", "check_train_one_epoch"]

TRIAGE = 0      # the progress record's "chapter" of the triage page


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def _floats(got, count: int, what: str) -> str | None:
    """None when `got` is a list or tuple of `count` Python floats; else what is wrong with it."""
    if not isinstance(got, (list, tuple)):
        return f"it returned {type(got).__name__}, expected a list with the loss of each {what} as a float"
    if len(got) != count:
        return f"it returned {len(got)} losses for {count} {what}s"
    if not all(isinstance(v, float) for v in got):
        other = next(v for v in got if not isinstance(v, float))
        why = ", not tensors that hold their graph" if isinstance(other, torch.Tensor) else ""
        return f"it returned losses of type {type(other).__name__}; keep Python floats (`loss.item()`){why}"
    return None


# --- drill 1: backward through the graph a second time ------------------------------------------

def _chunked(cell: nn.RNNCellBase, head: nn.Module, chunks, lr: float,
             start_of_chunk: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
    """One SGD step per chunk; each chunk starts from `start_of_chunk(h)`, h the last chunk's final state."""
    optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=lr)
    h = torch.zeros(chunks[0][0].shape[1], cell.hidden_size)
    losses = []
    for x, y in chunks:
        h = start_of_chunk(h)
        optimizer.zero_grad()
        outputs = []
        for x_t in x:
            h = cell(x_t, h)
            outputs.append(head(h))
        loss = F.mse_loss(torch.stack(outputs), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@reference_solution("train_on_chunks", chapter=TRIAGE)
def _train_on_chunks(cell: nn.RNNCellBase, head: nn.Module, chunks, lr: float) -> list[float]:
    # carry the hidden state's value into the next chunk, not the graph that made it
    return _chunked(cell, head, chunks, lr, start_of_chunk=torch.Tensor.detach)


def _stream(seed: int, chunks: int, length: int, batch: int, features: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A noisy sine wave per sequence, cut into `chunks` pieces of (length, batch, features) inputs and
    (length, batch, 1) targets (the next value of the first feature)."""
    def build():
        steps = chunks * length + 1
        phase = torch.rand(batch, 1) * 6.28
        t = torch.arange(steps).float()[None, :] * 0.3 + phase
        wave = torch.sin(t)[..., None] + 0.05 * torch.randn(batch, steps, features)
        x, y = wave[:, :-1].transpose(0, 1), wave[:, 1:, :1].transpose(0, 1)
        return [(x[i * length:(i + 1) * length], y[i * length:(i + 1) * length]) for i in range(chunks)]
    return _seeded(seed, build)


def _chunk_cases() -> list[tuple[str, nn.RNNCellBase, nn.Module, list, float]]:
    """(description, cell, head, chunks, lr), models seeded; none of them is the page's."""
    def case(seed, cell_type, features, hidden, chunks, length, batch, lr, description):
        cell = _seeded(seed, lambda: cell_type(features, hidden))
        head = _seeded(seed + 1, lambda: nn.Linear(hidden, 1))
        return description, cell, head, _stream(seed, chunks, length, batch, features), lr
    return [
        case(11, nn.GRUCell, 3, 8, 4, 5, 2, 0.1, "a GRUCell(3, 8), 4 chunks of 5 steps, batch 2"),
        case(12, nn.RNNCell, 2, 6, 6, 3, 4, 0.05, "an RNNCell(2, 6), 6 chunks of 3 steps, batch 4"),
        case(13, nn.GRUCell, 1, 16, 3, 10, 1, 0.2, "a GRUCell(1, 16), 3 chunks of 10 steps, batch 1"),
    ]


def check_train_on_chunks(fn: Callable) -> Verdict:
    """Exercise: `fn(cell, head, chunks, lr)` trains an RNN cell and a linear head with SGD on a long
    sequence cut into chunks, one optimizer step per chunk, the hidden state carried from one chunk into
    the next but gradients stopped at each chunk's start (truncated backpropagation through time); returns
    the loss of each chunk as a float. Checked against a correct loop on three cells, chunk counts, lengths
    and batch sizes the page does not use."""
    name = "train_on_chunks"
    hints = ["the error comes from the second chunk's `backward()`: which tensor of the second chunk's graph "
             "reaches back into the first chunk's graph, which the first `backward()` freed?",
             "`retain_graph=True` keeps that old graph, but the optimizer has changed the weights it saved since "
             "(the next error says so); and a hidden state reset to zeros forgets the sequence: you want the "
             "hidden state's *value*, without its *history*",
             "a tensor's `.detach()` is its values with no history behind them (chapter 1 §6, a value carried from one "
             "step into the next)"]
    for description, cell, head, chunks, lr in _chunk_cases():
        untrained = copy.deepcopy(cell), copy.deepcopy(head)
        expected_cell, expected_head = copy.deepcopy(cell), copy.deepcopy(head)
        with torch.enable_grad():       # whatever grad mode the notebook (or the last case) left behind
            expected = _train_on_chunks(expected_cell, expected_head, chunks, lr)
        try:
            with torch.enable_grad():
                got = fn(cell, head, chunks, lr)
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        if got is None:
            return report_check(name, False, None, hints)
        wrong = _floats(got, len(chunks), "chunk")
        if wrong:
            return report_check(name, False, f"{description}: {wrong}", hints)
        with torch.enable_grad():
            forgetting = _chunked(*untrained, chunks, lr, start_of_chunk=torch.zeros_like)   # a fresh state per chunk
        if _close(torch.tensor(got), torch.tensor(forgetting)):
            return report_check(name, False, f"{description}: every chunk starts from a zero hidden state, so "
                                             "nothing the model saw in one chunk reaches the next", hints)
        for i, (a, b) in enumerate(zip(got, expected)):
            if abs(a - b) > 1e-4 * max(1.0, abs(b)):
                return report_check(name, False, f"{description}: the loss of chunk {i + 1} is {a:.4g}, a correct "
                                                 f"loop gives {b:.4g}", hints)
        trained = [*cell.parameters(), *head.parameters()]
        if not all(_close(p, q) for p, q in zip(trained, [*expected_cell.parameters(), *expected_head.parameters()])):
            return report_check(name, False, f"{description}: the losses are right but the weights after the last "
                                             "chunk are not those of one SGD step per chunk", hints)
    return report_check(name, True, None, hints)


# --- drill 2: a loss that turns nan once the model is confident -----------------------------------

@reference_solution("binary_loss", chapter=TRIAGE)
def _binary_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, targets)     # log(sigmoid) in log space: never log(0)


def _binary_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(description, logits, targets); targets are probabilities (0, 1, or smoothed between)."""
    def build():
        moderate = torch.randn(64) * 2
        sure = torch.cat([torch.full((6,), 40.0), torch.full((6,), -40.0)])
        return [
            ("64 logits between about -6 and 6", moderate, (torch.rand(64) < torch.sigmoid(moderate)).float()),
            ("a confident model, right every time (logits ±40)", sure, (sure > 0).float()),
            ("a confident model, wrong on two examples (logits ±100)", torch.tensor([100.0, -100.0, 3.0, -2.0]),
             torch.tensor([0.0, 1.0, 1.0, 0.0])),
            ("smoothed targets (0.05 and 0.95), logits ±25, float64", torch.tensor([25.0, -25.0, 25.0, 0.5],
             dtype=torch.float64), torch.tensor([0.95, 0.05, 0.05, 0.95], dtype=torch.float64)),
            ("a (4, 3) multi-label batch with logits up to ±60", torch.randn(4, 3) * 30,
             (torch.rand(4, 3) < 0.5).float()),
        ]
    return _seeded(21, build)


def check_binary_loss(fn: Callable) -> Verdict:
    """Exercise: `fn(logits, targets)` returns binary cross-entropy as a 0-dim tensor, the mean over all
    elements of -(t log σ(z) + (1 - t) log(1 - σ(z))), that backpropagates to `logits`. Its value and its
    gradient must be those of a numerically stable computation of it (PyTorch's), finite, for logits of any
    size (±100 included), for
    targets between 0 and 1, in float32 and float64, in any shape; `logits` must not be changed."""
    name = "binary_loss"
    hints = ["print `torch.sigmoid(torch.tensor(40.))` and `1 - torch.sigmoid(torch.tensor(40.))`: what is the log "
             "of each, and what is 0 times that?",
             "clamping the probability or adding an epsilon removes the `nan` but not the damage: past the clamp the "
             "gradient is 0 and a confidently wrong example teaches nothing. Compute the logarithm without ever "
             "forming σ(z) (chapter 3 §5 does it for softmax)",
             "log σ(z) is `F.logsigmoid(z)`, and log(1 - σ(z)) = log σ(-z); PyTorch also has the whole loss as one "
             "function that takes logits"]
    for description, logits, targets in _binary_cases():
        with torch.enable_grad():       # whatever grad mode the notebook (or the last case) left behind
            mine = logits.clone().requires_grad_()
            expected = _binary_loss(mine, targets)
            (expected_grad,) = torch.autograd.grad(expected, mine)
        theirs, before = logits.clone().requires_grad_(), logits.clone()
        try:
            with torch.enable_grad():
                got = fn(theirs, targets.clone())
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        if got is None:
            return report_check(name, False, None, hints)
        if not isinstance(got, torch.Tensor) or got.dim() != 0:
            shape = f"a tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else type(got).__name__
            return report_check(name, False, f"{description}: it returned {shape}, expected a 0-dim tensor (the "
                                             "mean over every element)", hints)
        if not got.requires_grad:
            return report_check(name, False, f"{description}: the loss does not backpropagate to the logits (it "
                                             "has no `grad_fn`: was it computed under no_grad, or from `.item()`?)",
                                hints)
        if not torch.equal(theirs.detach(), before):
            return report_check(name, False, f"{description}: your function changed `logits` in place", hints)
        if not torch.isclose(got.detach().double(), expected.detach().double(), rtol=1e-4, atol=1e-6):
            return report_check(name, False, f"{description}: the loss is {got.item():.4g}, a numerically stable "
                                             f"computation gives {expected.item():.4g}", hints)
        try:
            (grad,) = torch.autograd.grad(got, theirs, allow_unused=True)
        except RuntimeError as error:
            return report_check(name, False, f"{description}: the returned loss cannot be backpropagated ("
                                             f"{str(error).splitlines()[0][:80]} …): did your function call "
                                             "`backward()` on it already?", hints)
        if grad is None:
            return report_check(name, False, f"{description}: the loss does not depend on `logits`", hints)
        if not torch.isfinite(grad).all() or not _close(grad.double(), expected_grad.double()):
            i = int((grad.double() - expected_grad.double()).abs().nan_to_num(1e9).argmax())
            return report_check(name, False, f"{description}: the loss is right but the gradient for the logit "
                                             f"{logits.flatten()[i].item():.3g} (target "
                                             f"{targets.flatten()[i].item():.3g}) is {grad.flatten()[i].item():.3g}, "
                                             f"a numerically stable computation gives "
                                             f"{expected_grad.flatten()[i].item():.3g}", hints)
    return report_check(name, True, None, hints)


# --- drill 3: the last batch of an epoch crashes in BatchNorm --------------------------------------

@reference_solution("train_one_epoch", chapter=TRIAGE)
def _train_one_epoch(model: nn.Module, dataset: Dataset, batch_size: int,
                     optimizer: torch.optim.Optimizer) -> list[float]:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)   # never a batch of one
    model.train()
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _batchnorm_cases() -> list[tuple[str, nn.Module, Callable, TensorDataset, int]]:
    """(description, model, optimizer factory, dataset, batch size), seeded; every input row is distinct."""
    def mlp(sizes: list[int]) -> nn.Sequential:
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-2], sizes[1:-1]):
            layers += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))

    def data(seed: int, n: int, features: int, classes: int) -> TensorDataset:
        x = _seeded(seed, lambda: torch.randn(n, features))
        return TensorDataset(x, (x[:, 0] * classes).long().clamp(-1, classes - 2) + 1)
    return [
        ("49 samples in batches of 16", _seeded(31, lambda: mlp([6, 16, 3])),
         lambda p: torch.optim.SGD(p, lr=0.1), data(32, 49, 6, 3), 16),
        ("64 samples in batches of 8", _seeded(33, lambda: mlp([5, 12, 12, 2])),
         lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), data(34, 64, 5, 2), 8),
        ("29 samples in batches of 4, two BatchNorm layers", _seeded(35, lambda: mlp([4, 10, 10, 3])),
         lambda p: torch.optim.Adam(p, lr=1e-2), data(36, 29, 4, 3), 4),
        ("45 samples in batches of 11", _seeded(37, lambda: mlp([3, 8, 4])),
         lambda p: torch.optim.Adam(p, lr=1e-2), data(38, 45, 3, 4), 11),
    ]


class _Batches:
    """Watches which samples of `dataset` a model is trained on, batch by batch. Every module's forward
    pre-hook looks for a batch of the dataset's input rows (so a `DataLoader` with worker processes, or a
    loop over the layers, is seen too) while grad mode is on, with each BatchNorm layer's mode on it; the
    batch counts as trained on when `optimizer` steps next (a forward that raised, or one never stepped on,
    is dropped). `extra_steps` counts steps taken with no new batch."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, dataset: TensorDataset) -> None:
        self.row_index = {row.numpy().tobytes(): i for i, row in enumerate(dataset.tensors[0])}
        self.batches: list[list[int]] = []                   # sample indices of each batch trained on
        self.norms_training: list[bool] = []                 # every BatchNorm layer in training mode on it
        self.extra_steps = 0
        self._pending: tuple[list[int], list[bool]] | None = None
        self._last_input: torch.Tensor | None = None
        self.handles = [m.register_forward_pre_hook(self._forward, with_kwargs=True) for m in model.modules()]
        self.handles.append(optimizer.register_step_post_hook(self._step))

    def _forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled():
            return                                           # an evaluation pass: nothing is trained on it
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and self._pending:
            self._pending[1].append(module.training)
        x = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x is self._last_input:
            return
        indices = [self.row_index.get(row.detach().cpu().numpy().tobytes()) for row in x]
        if indices and None not in indices:
            self._last_input = x
            self._pending = (indices, [])                    # type: ignore[assignment]

    def _step(self, *_) -> None:
        if self._pending is None:
            self.extra_steps += 1
            return
        indices, modes = self._pending
        self.batches.append(indices)
        self.norms_training.append(all(modes))
        self._pending = None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _replay(model: nn.Module, make_optimizer: Callable, dataset: TensorDataset,
            batches: list[list[int]]) -> list[float]:
    """Train `model` as a correct loop would on exactly these batches; returns each step's loss."""
    optimizer = make_optimizer(model.parameters())
    model.train()
    inputs, targets = dataset.tensors
    losses = []
    for indices in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs[indices]), targets[indices])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def check_train_one_epoch(fn: Callable) -> Verdict:
    """Exercise: `fn(model, dataset, batch_size, optimizer)` trains a model with BatchNorm for one epoch in
    shuffled batches of about `batch_size`, BatchNorm in training mode, one optimizer step per batch (in
    the order zero_grad, forward, backward, step), and returns each step's loss as a float. It must not
    crash when the last batch would hold a single sample, must use every sample at most once and leave out
    fewer than `batch_size`, and must leave the model's weights and BatchNorm statistics as a correct loop
    over the same batches does. Checked on four dataset sizes, batch sizes and models the page does not
    use; the batches are read from the model's forward passes, so any loader or sampler may be used."""
    name = "train_one_epoch"
    hints = ["in training mode BatchNorm normalises each feature with the batch's own mean and variance: what is "
             "the variance of a batch that holds one sample, and which batch of the epoch can hold one?",
             "switching the model (or BatchNorm) to `eval()` hides the error and stops BatchNorm from learning; "
             "the fix is in which batches the loader makes",
             "`DataLoader` has an argument for the last, incomplete batch (chapter 2 §3)"]
    for seed, (description, model, make_optimizer, dataset, batch_size) in enumerate(_batchnorm_cases(), start=39):
        untrained = copy.deepcopy(model)
        optimizer = make_optimizer(model.parameters())
        watch = _Batches(model, optimizer, dataset)
        try:
            with torch.enable_grad():
                got = _seeded(seed, lambda: fn(model, dataset, batch_size, optimizer))   # one shuffle per attempt
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        finally:
            watch.remove()
        if got is None:
            return report_check(name, False, None, hints)
        steps = len(watch.batches) + watch.extra_steps
        if not steps:
            return report_check(name, False, f"{description}: the optimizer passed to your function took no step "
                                             "(did it build another one?)", hints)
        wrong = _floats(got, steps, "optimizer step")
        if wrong:
            return report_check(name, False, f"{description}: {wrong}", hints)
        if [type(m) for m in model.modules()] != [type(m) for m in untrained.modules()]:
            return report_check(name, False, f"{description}: the model's layers were changed; keep them (its "
                                             "BatchNorm layers included)", hints)
        n, used = len(dataset), [i for batch in watch.batches for i in batch]
        if not all(watch.norms_training):
            return report_check(name, False, f"{description}: BatchNorm ran in eval mode, so it used its running "
                                             "statistics instead of the batch's and learned nothing from that batch",
                                hints)
        if len(set(used)) != len(used):
            return report_check(name, False, f"{description}: some samples were trained on twice in one epoch",
                                hints)
        if len(used) <= n - batch_size:
            return report_check(name, False, f"{description}: the epoch trained on {len(used)} of {n} samples; a "
                                             f"batch of {batch_size} leaves out at most {batch_size - 1}", hints)
        if used == sorted(used):
            return report_check(name, False, f"{description}: the samples came in order 0, 1, 2, …: unshuffled, "
                                             "every epoch leaves out the same last samples and sees the rest in "
                                             "the same order", hints)
        if watch.extra_steps:
            return report_check(name, False, f"{description}: {steps} optimizer steps for {len(watch.batches)} "
                                             "batches; one step per batch", hints)
        with torch.enable_grad():
            expected = _replay(untrained, make_optimizer, dataset, watch.batches)
        for i, (a, b) in enumerate(zip(got, expected)):
            if abs(a - b) > 1e-4 * max(1.0, abs(b)):
                return report_check(name, False, f"{description}: the loss returned for step {i + 1} is {a:.4g}; "
                                                 f"a correct loop over the same batches gives {b:.4g}", hints)
        if not all(_close(p.double(), q.double()) for p, q in zip(model.parameters(), untrained.parameters())):
            return report_check(name, False, f"{description}: the losses are right but the weights after the epoch "
                                             "are not those of a correct loop (zero_grad, forward, backward, step) "
                                             "over the same batches", hints)
        # `num_batches_tracked` also counts a forward that BatchNorm refused (a caught one-sample batch): unused
        # with the default momentum, so not compared
        buffers = [(p, q) for (buffer_name, p), (_, q) in zip(model.named_buffers(), untrained.named_buffers())
                   if not buffer_name.endswith("num_batches_tracked")]
        if not all(_close(p.double(), q.double()) for p, q in buffers):
            return report_check(name, False, f"{description}: the weights are right but BatchNorm's running "
                                             "statistics are not: a forward pass in training mode outside the training "
                                             "step (even under no_grad) updates them", hints)
    return report_check(name, True, None, hints)


# --- drill 4: a deep network that predicts the mean ----------------------------------------------

@reference_solution("deep_regressor", chapter=TRIAGE)
def _deep_regressor(n_in: int, width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(depth):
        linear = nn.Linear(n_in if i == 0 else width, width)
        nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")     # std sqrt(2 / fan_in): keeps the spread
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.ReLU()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


@dataclass
class _Layers:
    """What a deep MLP does to a batch of inputs, hidden Linear layer by hidden Linear layer (the output layer
    excluded): `signal`, how much a layer's output varies with the input (standard deviation over the batch,
    averaged over its units; a constant output such as a large bias counts 0); `size`, its root mean square,
    as chapter 3 §6 measures it; `varying`, the share of its units whose output varies at all; `directions`,
    how many independent directions the first hidden layer's units span (the participation ratio of their
    covariance: 1 when every unit is the same function of the input); and the model's output."""

    signal: list[float]
    size: list[float]
    varying: list[float]
    directions: float
    output: torch.Tensor

    def factor(self, values: list[float]) -> float:
        """The geometric mean factor per layer from the first hidden layer to the last."""
        return (max(values[-1], 1e-30) / max(values[0], 1e-30)) ** (1 / (len(values) - 1))


def _layers(model: nn.Module, x: torch.Tensor) -> _Layers:
    outputs: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
               for m in [m for m in model.modules() if isinstance(m, nn.Linear)][:-1]]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for handle in handles:
            handle.remove()
    unit_spread = [o.std(dim=0) for o in outputs]
    centred = outputs[0] - outputs[0].mean(dim=0)
    eigenvalues = torch.linalg.eigvalsh(centred.T @ centred / len(centred)).clamp(min=0)
    directions = (eigenvalues.sum() ** 2 / (eigenvalues ** 2).sum()).item() if eigenvalues.sum() > 0 else 0.0
    return _Layers(signal=[u.mean().item() for u in unit_spread], size=[o.pow(2).mean().sqrt().item() for o in outputs],
                   varying=[(u > 1e-6 * max(u.max().item(), 1e-30)).float().mean().item() for u in unit_spread],
                   directions=directions, output=out)


def check_deep_regressor(fn: Callable) -> Verdict:
    """Exercise: `fn(n_in, width, depth)` returns an `nn.Sequential` of `depth` hidden Linear(·, width) +
    ReLU layers and a Linear(width, 1) output (Linear and ReLU only), initialised so that the signal
    neither fades nor grows layer after layer and the units start different. Built for (n_in, width, depth)
    = (8, 64, 12), (3, 32, 24) and (20, 128, 6), each on its own seed, and fed inputs of unit variance.
    For each network: how much a hidden layer's output varies with the input shrinks by no more than × 0.8
    per layer, its size grows by no more than × 1.15 per layer (geometric means from the first hidden layer
    to the last), at least 90 % of every layer's units vary with the input, and the first hidden layer's
    units span at least half as many directions as it has inputs; over all three, the size grows by no
    more than × 1.06 per layer. Measured over 60 seeds of the three networks: Kaiming's initialisation
    (normal, uniform, truncated normal, or orthogonal with gain sqrt(2)) gave a signal factor of 0.85-1.02,
    a size factor of 0.88-1.08 (0.93-1.04 over all three) and was never refused; Xavier's (0.60-0.72),
    PyTorch's default (0.35-0.44), Kaiming's with tanh's gain or 1.2 times its std (1.09-1.23 over all
    three), one std for every width (Kaiming's for width 64, or 0.19: a narrow net fades while a wide one
    grows), an identity (9 % of the units vary) and a constant (0.05 of the directions) were always refused.
    Some signal is lost with any initialisation (the ReLUs make the inputs' representations alike layer
    after layer), so 1 is the ideal, not the mean."""
    name = "deep_regressor"
    hints = ["print how much each layer's output varies across a batch of random inputs: a forward hook on each "
             "`nn.Linear` (chapter 3 §5) records it, and chapter 3 §6 plots it layer by layer. Where does the "
             "signal go?",
             "after a ReLU, each layer multiplies the signal's size by about sqrt(fan_in / 2) × (weight std); "
             "for it to survive many layers that factor must be 1, whatever the width. Keep the layers as they "
             "are: a normalisation layer would hide the problem, not fix it",
             "PyTorch's default initialisation does not give that factor either; `torch.nn.init` has a function "
             "named after the author who worked it out for ReLU, and it asks which nonlinearity follows"]
    size_logs, layers = 0.0, 0
    for seed, (n_in, width, depth) in enumerate(((8, 64, 12), (3, 32, 24), (20, 128, 6)), start=41):
        description = f"{depth} hidden layers of width {width}, {n_in} inputs"
        x = _seeded(seed, lambda: torch.randn(512, n_in))
        try:
            with torch.enable_grad():              # a builder that turns grad mode off leaves it as it was
                model = _seeded(seed, lambda: fn(n_in, width, depth))
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        if model is None:
            return report_check(name, False, None, hints)
        if not isinstance(model, nn.Module):
            return report_check(name, False, f"{description}: it returned {type(model).__name__}, expected the "
                                             "model (`nn.Sequential(*layers)`)", hints)
        others = sorted({type(m).__name__ for m in model.modules()
                         if not list(m.children()) and not isinstance(m, (nn.Linear, nn.ReLU))})
        if others:
            return report_check(name, False, f"{description}: the model holds {', '.join(others)}; keep the "
                                             "drill's layers, Linear and ReLU only (the bug is in how they start)",
                                hints)
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if len(linears) != depth + 1 or any(m.out_features != width for m in linears[:-1]):
            return report_check(name, False, f"{description}: expected {depth} hidden Linear layers of width {width} "
                                             f"and one output; got {len(linears)} Linear layers", hints)
        try:
            seen = _layers(model, x)
        except Exception as error:  # the learner's model: report it, never crash
            return report_check(name, False, f"{description}: the model it returned "
                                             f"{_raised(error).removeprefix('your function ')}", hints)
        if seen.output.shape != (512, 1):
            return report_check(name, False, f"{description}: expected one number per input, got an output of "
                                             f"shape {tuple(seen.output.shape)}", hints)
        where = (f"{description}: the signal goes from {seen.signal[0]:.2g} (layer 1) to {seen.signal[-1]:.2g} "
                 f"(layer {depth}) and the size from {seen.size[0]:.2g} to {seen.size[-1]:.2g}; the outputs vary by "
                 f"{seen.output.std().item():.2g} across 512 different inputs")
        signal_factor, size_factor = seen.factor(seen.signal), seen.factor(seen.size)
        if signal_factor < 0.8:
            return report_check(name, False, f"the signal fades × {signal_factor:.2f} per layer; {where}", hints)
        if size_factor > 1.15:
            return report_check(name, False, f"the size grows × {size_factor:.2f} per layer; {where}", hints)
        layer, share = min(enumerate(seen.varying, start=1), key=lambda item: item[1])
        if share < 0.9:
            return report_check(name, False, f"{description}: only {share:.0%} of layer {layer}'s units vary with the "
                                             "input; the others output a constant and get no gradient", hints)
        if seen.directions < 0.5 * min(n_in, width):
            return report_check(name, False, f"{description}: the first hidden layer's {width} units span "
                                             f"{seen.directions:.1f} directions of the {n_in} inputs: units that "
                                             "start alike get alike gradients and stay alike", hints)
        size_logs += math.log(size_factor) * (depth - 1)
        layers += depth - 1
    if math.exp(size_logs / layers) > 1.06:
        return report_check(name, False, f"the size grows × {math.exp(size_logs / layers):.2f} per layer over the "
                                         "three networks (12, 24 and 6 hidden layers)", hints)
    return report_check(name, True, None, hints)
