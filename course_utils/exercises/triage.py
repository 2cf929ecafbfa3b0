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
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from course_utils.exercises import Verdict, reference_solution, report_check
from course_utils.exercises.broken_project import _raised, _seeded

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
        kind = type(next(v for v in got if not isinstance(v, float))).__name__
        return f"it returned losses of type {kind}; keep floats (`loss.item()`), not tensors that hold their graph"
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
             "a tensor's `.detach()` is its values with no history behind them (chapter 1 §3)"]
    for description, cell, head, chunks, lr in _chunk_cases():
        untrained = copy.deepcopy(cell), copy.deepcopy(head)
        expected_cell, expected_head = copy.deepcopy(cell), copy.deepcopy(head)
        expected = _train_on_chunks(expected_cell, expected_head, chunks, lr)
        try:
            got = fn(cell, head, chunks, lr)
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        if got is None:
            return report_check(name, False, None, hints)
        wrong = _floats(got, len(chunks), "chunk")
        if wrong:
            return report_check(name, False, f"{description}: {wrong}", hints)
        forgetting = _chunked(*untrained, chunks, lr, start_of_chunk=torch.zeros_like)    # a fresh state per chunk
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
    gradient must be those of the exact formula, finite, for logits of any size (±100 included), for
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
        mine = logits.clone().requires_grad_()
        expected = _binary_loss(mine, targets)
        (expected_grad,) = torch.autograd.grad(expected, mine)
        theirs, before = logits.clone().requires_grad_(), logits.clone()
        try:
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
            return report_check(name, False, f"{description}: the loss is {got.item():.4g}, the exact formula "
                                             f"gives {expected.item():.4g}", hints)
        (grad,) = torch.autograd.grad(got, theirs, allow_unused=True)
        if grad is None or not torch.isfinite(grad).all() or not _close(grad.double(), expected_grad.double()):
            i = 0 if grad is None else int((grad.double() - expected_grad.double()).abs().nan_to_num(1e9).argmax())
            shown = "none" if grad is None else f"{grad.flatten()[i].item():.3g}"
            return report_check(name, False, f"{description}: the loss is right but the gradient for the logit "
                                             f"{logits.flatten()[i].item():.3g} (target "
                                             f"{targets.flatten()[i].item():.3g}) is {shown}, the exact formula "
                                             f"gives {expected_grad.flatten()[i].item():.3g}", hints)
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


class _Recorded(Dataset):
    """A dataset that records which indices were read, in order."""

    def __init__(self, data: TensorDataset) -> None:
        self.data, self.read = data, []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        self.read.append(int(i))
        return self.data[i]


def _batchnorm_cases() -> list[tuple[str, nn.Module, Callable, _Recorded, int]]:
    """(description, model, optimizer factory, dataset, batch size), seeded."""
    def mlp(sizes: list[int]) -> nn.Sequential:
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-2], sizes[1:-1]):
            layers += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))

    def data(seed: int, n: int, features: int, classes: int) -> _Recorded:
        x = _seeded(seed, lambda: torch.randn(n, features))
        return _Recorded(TensorDataset(x, (x[:, 0] * classes).long().clamp(-1, classes - 2) + 1))
    return [
        ("49 samples in batches of 16 (three batches of 16, then one of 1)", _seeded(31, lambda: mlp([6, 16, 3])),
         lambda p: torch.optim.SGD(p, lr=0.1), data(32, 49, 6, 3), 16),
        ("64 samples in batches of 8 (eight full batches)", _seeded(33, lambda: mlp([5, 12, 12, 2])),
         lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), data(34, 64, 5, 2), 8),
        ("29 samples in batches of 4, two BatchNorm layers", _seeded(35, lambda: mlp([4, 10, 10, 3])),
         lambda p: torch.optim.Adam(p, lr=1e-2), data(36, 29, 4, 3), 4),
        ("45 samples in batches of 11", _seeded(37, lambda: mlp([3, 8, 4])),
         lambda p: torch.optim.Adam(p, lr=1e-2), data(38, 45, 3, 4), 11),
    ]


def check_train_one_epoch(fn: Callable) -> Verdict:
    """Exercise: `fn(model, dataset, batch_size, optimizer)` trains a model with BatchNorm for one epoch in
    shuffled batches of about `batch_size`, in training mode, one optimizer step per batch, and returns
    each step's loss as a float. It must not crash when the last batch would hold a single sample, must
    use every sample at most once and leave out fewer than `batch_size`, and must train BatchNorm (its
    running statistics change). Checked on four dataset sizes, batch sizes and models the page does not use."""
    name = "train_one_epoch"
    hints = ["which batch raises? Count how many samples the dataset holds, and how many the last batch gets",
             "in training mode BatchNorm normalises with the batch's own mean and variance, and one sample has "
             "no variance. Switching the model to `eval()` hides the error and stops BatchNorm from learning",
             "`DataLoader` has an argument for the last, incomplete batch (chapter 2 §3)"]
    for seed, (description, model, make_optimizer, dataset, batch_size) in enumerate(_batchnorm_cases(), start=39):
        norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm1d)]
        running_before = [m.running_mean.clone() for m in norms]
        batches: list[tuple[int, bool]] = []            # (samples, model in training mode) of each forward
        handle = model.register_forward_pre_hook(lambda module, args: batches.append((len(args[0]), module.training)))
        optimizer = make_optimizer(model.parameters())
        steps = []
        step_handle = optimizer.register_step_post_hook(lambda *_: steps.append(1))
        try:
            got = _seeded(seed, lambda: fn(model, dataset, batch_size, optimizer))   # the same shuffle each attempt
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        finally:
            handle.remove()
            step_handle.remove()
        if got is None:
            return report_check(name, False, None, hints)
        wrong = _floats(got, len(steps), "optimizer step")
        if wrong:
            return report_check(name, False, f"{description}: {wrong}", hints)
        n, read, used = len(dataset), dataset.read, sum(size for size, _ in batches)
        if any(not training for _, training in batches):
            return report_check(name, False, f"{description}: the model ran in eval mode, so BatchNorm used its "
                                             "running statistics instead of the batch's and learned nothing", hints)
        if used > n or len(set(read)) != len(read):
            return report_check(name, False, f"{description}: some samples were used twice in one epoch", hints)
        if used <= n - batch_size:
            return report_check(name, False, f"{description}: the epoch trained on {used} of {n} samples; a batch "
                                             f"of {batch_size} leaves out at most {batch_size - 1}", hints)
        if read and read == sorted(read):       # (`read` stays empty when worker processes read the samples)
            return report_check(name, False, f"{description}: the samples came in order 0, 1, 2, …: unshuffled, "
                                             "every epoch leaves out the same last samples and sees the rest in "
                                             "the same order", hints)
        if len(steps) != len(batches) or not steps:
            return report_check(name, False, f"{description}: {len(batches)} forward passes but {len(steps)} "
                                             "optimizer steps; one step per batch", hints)
        if any(torch.equal(m.running_mean, before) for m, before in zip(norms, running_before)):
            return report_check(name, False, f"{description}: a BatchNorm layer's running mean did not change",
                                hints)
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


def _layer_spreads(model: nn.Module, x: torch.Tensor) -> tuple[list[float], torch.Tensor]:
    """How much each Linear layer's output (all but the last) varies with the input: its standard deviation
    over the batch, averaged over the layer's units (a constant output, such as a large bias, counts 0);
    and the model's output."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)][:-1]
    spreads: list[float] = []
    record = lambda module, args, out: spreads.append(out.std(dim=0).mean().item())   # noqa: E731
    handles = [m.register_forward_hook(record) for m in linears]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for handle in handles:
            handle.remove()
    return spreads, out


def check_deep_regressor(fn: Callable) -> Verdict:
    """Exercise: `fn(n_in, width, depth)` returns an MLP of `depth` hidden Linear(·, width) + ReLU layers
    and a Linear(width, 1) output, initialised so that the signal keeps its spread through the layers:
    on inputs of unit variance, how much a hidden layer's output varies with the input changes by a factor
    between 0.8 and 1.25 per layer (geometric mean from the first hidden layer to the last). Checked for
    (n_in, width, depth) = (8, 64, 12), (3, 32, 24) and (20, 128, 6), each on its own seed. Over 150
    seeds of each, Kaiming's initialisation gave 0.84-1.03 per layer, Xavier's 0.60-0.72 and PyTorch's
    default 0.36-0.45 (some spread is lost with any initialisation: the ReLUs make the inputs'
    representations alike layer after layer, so 1 is the ideal, not the mean)."""
    name = "deep_regressor"
    hints = ["print the standard deviation of each layer's output on a batch of random inputs (a forward hook "
             "on each `nn.Linear`, chapter 3 §6): where does the signal go?",
             "after a ReLU, each layer multiplies the signal's spread by about sqrt(fan_in / 2) × (weight std); "
             "for the spread to survive many layers that factor must be 1, whatever the width",
             "PyTorch's default initialisation does not give that factor either; `torch.nn.init` has a function "
             "named after the author who worked it out for ReLU, and it asks which nonlinearity follows"]
    for seed, (n_in, width, depth) in enumerate(((8, 64, 12), (3, 32, 24), (20, 128, 6)), start=41):
        description = f"{depth} hidden layers of width {width}, {n_in} inputs"
        x = _seeded(seed, lambda: torch.randn(512, n_in))
        try:
            model = _seeded(seed, lambda: fn(n_in, width, depth))
            if model is None:
                return report_check(name, False, None, hints)
            spreads, out = _layer_spreads(model, x)
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if out.shape != (512, 1) or len(linears) != depth + 1 or any(m.out_features != width for m in linears[:-1]):
            return report_check(name, False, f"{description}: expected {depth} hidden Linear layers of width {width} "
                                             f"and one output, each input giving one number; got {len(linears)} "
                                             f"Linear layers and an output of shape {tuple(out.shape)}", hints)
        per_layer = (spreads[-1] / spreads[0]) ** (1 / (depth - 1)) if spreads[0] > 0 else 0.0
        if not 0.8 <= per_layer <= 1.25:
            return report_check(name, False, f"{description}: the spread of the layer outputs goes from "
                                             f"{spreads[0]:.2g} (layer 1) to {spreads[-1]:.2g} (layer {depth}), × "
                                             f"{per_layer:.2f} per layer; the outputs vary by {out.std().item():.2g} "
                                             "across 512 different inputs", hints)
    return report_check(name, True, None, hints)
