"""Chapter 4 exercises (checkpoints): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.

Each check runs the learner's function on a case like the chapter's **and** on cases the chapter did
not show (SGD with momentum and `ReduceLROnPlateau`, a model with BatchNorm buffers, a file saved
without a prefix or by `torch.compile`, other dataset and batch sizes and interruption points), so
an answer tuned to one case fails. A wrong answer that raises gets a failed verdict, never a crash;
the first verdict says what was observed, the hints come on later attempts.
"""
from __future__ import annotations

import copy
import io
import itertools
import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils.exercises import Verdict, reference_solution, report_check

__all__ = ["check_checkpoint_dict", "check_epoch_batches_from", "check_load_matching", "check_resume_training"]


def _raised(error: BaseException, limit: int = 160) -> str:
    """The learner's exception in one short line (long PyTorch messages joined, cut at a word)."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if len(message) > limit:
        message = message[:limit].rsplit(" ", 1)[0] + " …"
    return f"your function raised {type(error).__name__}: {message}"


def _keeps_rng(check: Callable[[Callable], Verdict]) -> Callable[[Callable], Verdict]:
    """Run a check without disturbing the notebook's random stream (it seeds and restores states)."""
    def wrapped(fn: Callable) -> Verdict:
        with torch.random.fork_rng():
            return check(fn)
    wrapped.__name__, wrapped.__doc__ = check.__name__, check.__doc__
    return wrapped


def _same_tensors(a: Any, b: Any) -> bool:
    """Equal nested structures of tensors and plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b))
    return a == b


# --- the runs a checkpoint is taken from ------------------------------------------------------------

@dataclass(frozen=True)
class _Run:
    """One kind of training run: the chapter's (Adam, StepLR, dropout) or one it did not show."""

    name: str
    epochs: int

    def build(self, seed: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        torch.manual_seed(seed)
        if self.name == "chapter":
            model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
            return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        model = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Dropout(0.3), nn.Linear(12, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, optimizer, torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2, factor=0.5)

    @property
    def described(self) -> str:
        return ("a run like the chapter's (Adam, StepLR, dropout)" if self.name == "chapter" else
                "a run the chapter did not show (SGD with momentum, ReduceLROnPlateau, BatchNorm and dropout)")

    def trained(self) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        """`build(0)` after `epochs` epochs of 4 steps on fixed random data."""
        model, optimizer, scheduler = self.build(0)
        data = torch.randn(4, 8, 6), torch.randn(4, 8, 1)
        for epoch in range(self.epochs):
            for x, y in zip(*data):
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            _step_schedule(scheduler, metric=1.0 + 0.1 * epoch)   # plateau: best at epoch 0, then worse
        return model, optimizer, scheduler


_RUNS = (_Run("chapter", epochs=2), _Run("unseen", epochs=3))


def _step_schedule(scheduler: Any, metric: float) -> None:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(metric)
    else:
        scheduler.step()


def _next_learning_rates(optimizer: torch.optim.Optimizer, scheduler: Any, epochs: int = 3) -> list[float]:
    """The learning rate of each of the next `epochs` epochs (validation loss getting worse), stepping
    copies of the two objects."""
    optimizer, scheduler = copy.deepcopy((optimizer, scheduler))
    rates = [optimizer.param_groups[0]["lr"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "lr_scheduler.step() before optimizer.step()": on purpose here
        for epoch in range(epochs - 1):
            _step_schedule(scheduler, metric=10.0 + epoch)
            rates.append(optimizer.param_groups[0]["lr"])
    return rates


def _rates(rates: list[float]) -> str:
    return "[" + ", ".join(f"{rate:g}" for rate in rates) + "]"


def _restored_differences(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                          saved: tuple[nn.Module, torch.optim.Optimizer, Any], rng: torch.Tensor) -> str | None:
    """What a resume left different from the saved run, in the learner's terms (None: nothing)."""
    saved_model, saved_optimizer, saved_scheduler = saved
    own, theirs = model.state_dict(), saved_model.state_dict()
    differ = [key for key in theirs if key not in own or not _same_tensors(own[key], theirs[key])]
    if differ:
        return f"{len(differ)} of the model's {len(theirs)} state_dict entries are not the checkpoint's (e.g. {differ[0]})"
    if not optimizer.state:
        return ("the optimizer holds no state after your resume: its moments / momentum buffers start from zero, "
                "so its next steps are not the ones the uninterrupted run takes")
    if not _same_tensors(optimizer.state_dict(), saved_optimizer.state_dict()):
        return "the optimizer's state is not the checkpoint's"
    upcoming, saved_upcoming = _next_learning_rates(optimizer, scheduler), _next_learning_rates(*saved[1:])
    if upcoming != saved_upcoming or scheduler.last_epoch != saved_scheduler.last_epoch:
        return (f"after your resume the schedule is at epoch {scheduler.last_epoch} and the next epochs would use "
                f"the learning rates {_rates(upcoming)}; the uninterrupted run, at epoch "
                f"{saved_scheduler.last_epoch}, uses {_rates(saved_upcoming)}")
    if not torch.equal(torch.get_rng_state(), rng):
        return ("the weights, optimizer and schedule are right, but the next dropout mask (and the next shuffle) "
                "would differ from the ones the uninterrupted run draws")
    return None


# --- exercise 1: resume_training ------------------------------------------------------------------

@reference_solution("resume_training", chapter=4)
def _resume_training(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                     scheduler: Any) -> int:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    torch.set_rng_state(checkpoint["rng"]["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
    return checkpoint["epoch"]


def _resume_case(fn: Callable, run: _Run, folder: Path) -> tuple[bool, str | None]:
    """(attempted, observed) for one run: save it as in the chapter, resume it with `fn` into fresh objects."""
    saved = run.trained()
    model, optimizer, scheduler = saved
    rng = torch.get_rng_state()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "scheduler": scheduler.state_dict(), "epoch": run.epochs,
                  "rng": {"torch": rng, "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}
    path = folder / f"{run.name}.pt"
    torch.save(checkpoint, path)
    fresh = run.build(seed=1)
    torch.manual_seed(1)                          # "the next morning": another random state
    try:
        epoch = fn(path, *fresh)
        if epoch is None and not fresh[1].state and fresh[2].last_epoch == 0:
            return False, None                    # still `...`: nothing ran
        observed = _restored_differences(*fresh, saved, rng)
        if observed is None and epoch != run.epochs:
            observed = f"everything is restored, but it returned {epoch!r}; the checkpoint's epoch is {run.epochs}"
    except Exception as error:
        observed = _raised(error)
    return True, observed and f"on {run.described}, saved after {run.epochs} epochs: {observed}"


@_keeps_rng
def check_resume_training(fn: Callable) -> Verdict:
    """Exercise: `fn(path, model, optimizer, scheduler)` restores the chapter's hand-written checkpoint
    at `path` into fresh objects and returns the epoch to continue from. Two runs: one like the
    chapter's (Adam, StepLR, saved after 2 epochs) and one it did not show (SGD with momentum,
    ReduceLROnPlateau counting bad epochs, BatchNorm; saved after 3)."""
    observed = None
    with tempfile.TemporaryDirectory() as folder:
        for run in _RUNS:
            attempted, observed = _resume_case(fn, run, Path(folder))
            if not attempted:
                return report_check("resume_training", False, None, [])
            if observed:
                break
    return report_check("resume_training", observed is None, observed,
                        ["list what decides the next step of training: the weights are only one of them",
                         "the learning rate comes from an object that has its own state_dict (setting one of "
                         "its counters is not its whole state); the dropout masks come from a generator whose "
                         "state is in the checkpoint too"])


# --- exercise 2: checkpoint_dict ------------------------------------------------------------------

@reference_solution("checkpoint_dict", chapter=4)
def _checkpoint_dict(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, epoch: int) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": epoch,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
    }


def _checkpoint_case(fn: Callable, run: _Run) -> tuple[bool, str | None]:
    saved = run.trained()
    rng = torch.get_rng_state()
    try:
        checkpoint = fn(*saved, run.epochs)
    except Exception as error:
        return True, f"on {run.described}: {_raised(error)}"
    if checkpoint is None:
        return False, None
    buffer = io.BytesIO()
    try:
        torch.save(checkpoint, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        refused = f"it holds a {found.group(1)} object" if found else str(error).splitlines()[0]
        return True, f"torch.load(..., weights_only=True) refuses your checkpoint: {refused} (Unsupported global)"
    except Exception as error:
        return True, f"your checkpoint could not be saved and loaded back: {type(error).__name__}: {error}"
    missing = [key for key in ("model", "optimizer", "scheduler", "epoch", "rng")
               if not isinstance(loaded, dict) or key not in loaded]
    if missing:
        return True, (f"your checkpoint has no {', '.join(repr(k) for k in missing)} entr"
                      f"{'y' if len(missing) == 1 else 'ies'}: a resume from it cannot restore "
                      + ("the optimizer's moments and step counts" if missing == ["optimizer"] else "the run"))
    fresh = run.build(seed=1)
    try:
        fresh[0].load_state_dict(loaded["model"])
        fresh[1].load_state_dict(loaded["optimizer"])
        fresh[2].load_state_dict(loaded["scheduler"])
        torch.set_rng_state(loaded["rng"]["torch"])
        observed = _restored_differences(*fresh, saved, rng)
    except Exception as error:
        observed = f"restoring your checkpoint into fresh objects failed: {_raised(error)[len('your function raised '):]}"
    if observed is None and loaded["epoch"] != run.epochs:
        observed = f"its 'epoch' is {loaded['epoch']!r}; the function was given {run.epochs}"
    return True, observed and f"on {run.described}: {observed}"


@_keeps_rng
def check_checkpoint_dict(fn: Callable) -> Verdict:
    """Exercise: `fn(model, optimizer, scheduler, epoch)` returns the chapter's checkpoint dict; the check
    saves it, loads it with weights_only=True and restores it into fresh objects — for a run like the
    chapter's and for one with BatchNorm, SGD with momentum and ReduceLROnPlateau, at another epoch."""
    observed = None
    for run in _RUNS:
        attempted, observed = _checkpoint_case(fn, run)
        if not attempted:
            return report_check("checkpoint_dict", False, None, [])
        if observed:
            break
    return report_check("checkpoint_dict", observed is None, observed,
                        ["load what you saved the way the chapter does, with weights_only=True, into a fresh "
                         "model with strict loading: what does it accept, and what does it refuse or miss?",
                         "a model's state is more than its parameters; and which object's state decides how big "
                         "the optimizer's next step is?"])


# --- exercise 3: load_matching --------------------------------------------------------------------

@reference_solution("load_matching", chapter=4)
def _load_matching(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> list[str]:
    own = model.state_dict()
    matched = {}
    for key, value in state_dict.items():
        for prefix in ("module.", "_orig_mod."):
            key = key.removeprefix(prefix)
        if key in own and value.shape == own[key].shape:
            matched[key] = value
    model.load_state_dict(matched, strict=False)
    return sorted(matched)


class _Classifier(nn.Module):
    """The chapter's case: a backbone and a head whose number of classes changes."""

    def __init__(self, classes: int):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(x)))


class _Residual(nn.Module):
    """A wrapper whose inner layer is an attribute named `module` (its keys hold `.module.`)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.module(x)


class _Tagger(nn.Module):
    """A case the chapter did not show: BatchNorm buffers, a wrapped block, a head named `fc`."""

    def __init__(self, tags: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12))
        self.blocks = nn.Sequential(_Residual(nn.Linear(12, 12)))
        self.fc = nn.Linear(12, tags)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(torch.relu(self.stem(x))))


def _pretrained(model: nn.Module) -> nn.Module:
    """`model` with every parameter and buffer changed, as after training (BatchNorm statistics included)."""
    with torch.no_grad():
        for value in model.state_dict().values():
            value.add_(torch.rand_like(value.float()).to(value.dtype) + 1)
    return model


def _matching_cases() -> list[tuple[str, nn.Module, dict[str, torch.Tensor], nn.Module]]:
    """(description, pretrained model, the state_dict as saved, the fresh model to load into)."""
    torch.manual_seed(0)
    classifier, tagger = _pretrained(_Classifier(10)), _pretrained(_Tagger(7))
    compiled = _pretrained(_Tagger(7))
    return [
        ("a 10-class classifier saved from DataParallel (keys 'module.…') loaded into a 5-class one",
         classifier, {f"module.{key}": value for key, value in classifier.state_dict().items()}, _Classifier(5)),
        ("a model the chapter did not show (BatchNorm, a wrapped block, a head named 'fc'), saved without a "
         "wrapper, loaded into one with 3 outputs", tagger, dict(tagger.state_dict()), _Tagger(3)),
        ("the same model saved after torch.compile (keys '_orig_mod.…')", compiled,
         {f"_orig_mod.{key}": value for key, value in compiled.state_dict().items()}, _Tagger(3)),
    ]


def _matching_case(fn: Callable, described: str, pretrained: nn.Module, saved: dict, model: nn.Module
                   ) -> tuple[bool, str | None]:
    fresh = {key: value.clone() for key, value in model.state_dict().items()}
    source = pretrained.state_dict()
    expected = sorted(key for key in fresh if source[key].shape == fresh[key].shape)
    try:
        returned = fn(model, dict(saved))
    except Exception as error:
        mismatch = re.search(r"size mismatch for [^\n]*", str(error))   # the key line, whole
        return True, f"with {described}: " + (f"your function raised {type(error).__name__}: {mismatch[0].strip()}"
                                               if mismatch else _raised(error))
    now = model.state_dict()
    if returned is None and all(torch.equal(now[key], fresh[key]) for key in fresh):
        return False, None
    not_loaded = [key for key in expected if not torch.equal(now[key], source[key])]
    changed = [key for key in fresh if key not in expected and not torch.equal(now[key], fresh[key])]
    if not_loaded:
        named = ", ".join(not_loaded[:3]) + (", …" if len(not_loaded) > 3 else "")
        observed = (f"{len(not_loaded)} of the {len(expected)} entries that fit were not loaded ({named}): "
                    "the model kept its own values there")
    elif changed:
        observed = f"{', '.join(changed)} changed although the checkpoint's do not fit: they should keep their fresh values"
    else:
        try:
            listed = sorted(returned)
        except Exception:
            listed = returned
        observed = (None if listed == expected else
                    f"the weights are right, but it returned {returned!r}; the loaded keys are {expected}")
    return True, observed and f"with {described}: {observed}"


@_keeps_rng
def check_load_matching(fn: Callable) -> Verdict:
    """Exercise: `fn(model, state_dict)` loads the entries whose name (without `module.` / `_orig_mod.`)
    and shape match, keeps the model's values elsewhere, and returns the loaded keys. Three cases: the
    chapter's 10-class classifier saved from DataParallel into a 5-class one; a model with BatchNorm
    buffers, a wrapped block and another head saved without a prefix; the same saved by torch.compile."""
    observed = None
    for case in _matching_cases():
        attempted, observed = _matching_case(fn, *case)
        if not attempted:
            return report_check("load_matching", False, None, [])
        if observed:
            break
    return report_check("load_matching", observed is None, observed,
                        ["read the error, or compare the keys on both sides: which does it name, and what does "
                         "the model have there instead?",
                         "two entries can have the same name and still not fit; a prefix is only there when the "
                         "file was saved from a wrapper; and load_state_dict by default insists on every key"])


# --- exercise 4: epoch_batches_from ---------------------------------------------------------------

@reference_solution("epoch_batches_from", chapter=4)
def _epoch_batches_from(loader: Any, generator: torch.Generator, epoch_start_state: torch.Tensor,
                        skip: int) -> list:
    generator.set_state(epoch_start_state)
    return list(itertools.islice(loader, skip, None))


# (samples, batch size, epoch interrupted, batches done): the chapter's case, then others
_EPOCH_CASES = ((24, 4, 1, 2), (30, 7, 2, 3), (20, 5, 1, 0), (17, 4, 0, 4))


def _batch_values(batch: Any) -> list[int]:
    if isinstance(batch, (list, tuple)) and len(batch) == 1:
        batch = batch[0]
    return batch.tolist() if isinstance(batch, torch.Tensor) else list(batch)


def _epoch_case(fn: Callable, samples: int, batch_size: int, epoch: int, skip: int) -> tuple[bool, str | None]:
    def make_loader(seed: int) -> tuple[DataLoader, torch.Generator]:
        generator = torch.Generator().manual_seed(seed)
        return (DataLoader(TensorDataset(torch.arange(samples)), batch_size=batch_size, shuffle=True,
                           generator=generator), generator)

    loader, generator = make_loader(7)
    for _ in range(epoch):
        list(loader)                                      # the epochs before the interrupted one
    epoch_start_state = generator.get_state()
    full_epoch = [batch[0].tolist() for batch in loader]
    expected = full_epoch[skip:]
    resumed_loader, resumed_generator = make_loader(8)    # fresh objects in a new process
    where = (f"{samples} samples in batches of {batch_size}, killed after {skip} of the {len(full_epoch)} batches "
             f"of epoch {epoch}")
    try:
        got = fn(resumed_loader, resumed_generator, epoch_start_state.clone(), skip)
        if got is None:
            return False, None
        got = [_batch_values(batch) for batch in got]
    except Exception as error:
        return True, f"with {where}: {_raised(error)}"
    if got == expected:
        return True, None
    if len(got) != len(expected):
        observed = f"it gave {len(got)} batches; {len(expected)} were left"
    elif sorted(i for b in got for i in b) == sorted(i for b in expected for i in b):
        observed = f"the right samples, in another order: first batch {got[0]}, the uninterrupted run's {expected[0]}"
    else:
        observed = (f"your first batch is {got[0]}, the uninterrupted run's batch {skip + 1} of that epoch was "
                    f"{expected[0]}: another shuffle")
    return True, f"with {where}: {observed}"


@_keeps_rng
def check_epoch_batches_from(fn: Callable) -> Verdict:
    """Exercise: `fn(loader, generator, epoch_start_state, skip)` returns the batches of an interrupted
    epoch from batch `skip` on, in the order the uninterrupted epoch gave them. `loader` shuffles with
    `generator`; `epoch_start_state` is the generator's state saved when that epoch began. Checked on the
    chapter's case (24 samples, batches of 4, 2 done) and on other sizes, epochs and interruption points."""
    observed = None
    for case in _EPOCH_CASES:
        attempted, observed = _epoch_case(fn, *case)
        if not attempted:
            return report_check("epoch_batches_from", False, None, [])
        if observed:
            break
    return report_check("epoch_batches_from", observed is None, observed,
                        ["the order of an epoch is decided when its iterator is created: by what state?",
                         "you need the same shuffle as then, and only the batches not yet trained on — however "
                         "many that is"])
