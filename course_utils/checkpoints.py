"""Chapter 4: checkpoints that survive crashes, resume exactly, and load only what matches."""
from __future__ import annotations

import copy
import glob
import io
import itertools
import json
import os
import pickle
import re
import socket
import tempfile
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.exercises import Verdict, reference_solution, report_check
from course_utils.rng import capture_rng_state, restore_rng_state

FORMAT = "course_utils.checkpoint/1"
TEMP_SUFFIX = ".partial"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used: corrupt, truncated, unsafe, or missing a part."""


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, scaler: torch.amp.GradScaler | None = None, **meta: Any) -> Path:
    """Atomically write model / optimizer / scheduler / scaler state, `meta` and every RNG state.

    `meta` (epoch, global step, best score, ...) must be JSON-serialisable. The file is written
    to a temporary file in the same folder, flushed and fsync'ed, then renamed over `path`
    (`os.replace` is atomic), so a crash or a full disk at any moment leaves the previous
    checkpoint intact. Everything stored loads with `torch.load(..., weights_only=True)`.
    """
    path = _checks.writable_file(path, "path")
    _checks.module(model)
    try:
        json.dumps(meta)
    except TypeError as error:
        raise TypeError(f"checkpoint meta must be JSON-like (numbers, strings, lists, dicts): {error}") from None
    payload = {
        "format": FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "meta": meta,
        "rng": capture_rng_state(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    # the writer's host and PID in the name: a later save can tell a dead writer's leftover from a live write
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{socket.gethostname()}.{os.getpid()}.",
                                     suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as temp:
            torch.save(payload, temp)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)  # make the rename itself durable
    return path


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)           # signal 0: nothing is sent, only existence is checked
    except ProcessLookupError:
        return False
    except PermissionError:
        return True               # it exists, under another user
    return True


def remove_stale_partials(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that killed writers left beside checkpoint `path`; return them.

    A temporary file is named `.NAME.HOST.PID.RANDOM.partial`. Only files written on this host by a
    process that no longer exists are removed: a live writer's file (this process's, another
    job's) and files from other hosts on a shared filesystem, whose writers cannot be checked from
    here, are left alone, as are temporary files of another naming.
    """
    path = Path(path)
    prefix, host, removed = f".{path.name}.", socket.gethostname(), []
    for candidate in path.parent.glob(f".{glob.escape(path.name)}.*{TEMP_SUFFIX}"):
        parts = candidate.name[len(prefix):].rsplit(".", 3)          # HOST (may hold dots), PID, RANDOM, partial
        if len(parts) != 4 or parts[0] != host or not parts[1].isdigit():
            continue
        if not _process_alive(int(parts[1])):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def _fsync_directory(folder: Path) -> None:
    if os.name == "posix":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _read(path: Path, map_location: Any) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}" + (" (it is a folder)" if path.exists() else ""))
    with open(path, "rb") as file:
        head = file.read(2)
    if not head:
        raise CheckpointError(f"{path} is truncated or corrupt (0 bytes): the write that produced it was "
                              "probably interrupted before any data reached the disk")
    if head[:2] != b"PK" and head[:1] != b"\x80":       # torch.save writes a zip archive (legacy: a pickle)
        raise CheckpointError(f"{path} is not a file torch.save wrote (it starts with {head!r}, neither a zip "
                              "archive nor a pickle): check the path")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{path} holds objects other than tensors and plain containers, which "
                              f"weights_only=True refuses to unpickle (only load such a file with "
                              f"weights_only=False if you trust its author):\n{error}") from error
    except (RuntimeError, OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        first_sentence = str(error).split(". ")[0]          # PyTorch's advice that follows is about this file
        raise CheckpointError(f"{path} is truncated or corrupt ({os.path.getsize(path):,} bytes): torch.load "
                              f"failed with {type(error).__name__}: {first_sentence}; if a save was interrupted, "
                              f"this is what it left (otherwise it is not a file torch.save wrote)") from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a checkpoint written by save_checkpoint "
                              f"(for a bare state_dict use model.load_state_dict(torch.load(...)))")
    return payload


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, scaler: torch.amp.GradScaler | None = None,
                    map_location: Any = None, restore_rng: bool = True) -> dict:
    """Restore what `save_checkpoint` wrote into the objects given, and return the meta dict.

    Always loads with `weights_only=True`. `map_location` defaults to the model's device, so a
    checkpoint written on `cuda:0` loads on a CPU-only machine. Raises `FileNotFoundError` for a
    missing file and `CheckpointError` naming the file for a corrupt or truncated one, one that
    lacks a part that was asked for, or one whose weights do not fit the model.
    """
    path = Path(path)
    _checks.module(model)
    remove_stale_partials(path)
    if map_location is None:
        first = next(iter(model.state_dict().values()), None)
        map_location = first.device if first is not None else torch.device("cpu")
    payload = _read(path, map_location)
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if target is not None and payload.get(name) is None:
            raise CheckpointError(f"{path} has no {name} state (it was saved without {name}=...); "
                                  f"resuming would restart the {name} from scratch")
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as error:
        raise CheckpointError(f"{path} does not fit this model; to load what matches, use "
                              f"load_matching_state_dict:\n{error}") from error
    if optimizer is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None:
        scaler.load_state_dict(payload["scaler"])
    if restore_rng:
        restore_rng_state(payload["rng"])
    return payload["meta"]


# --- loading weights whose keys or shapes do not match -------------------------------------

@dataclass
class LoadReport(ReadableResult):
    """What `load_matching_state_dict` did, key by key."""

    loaded: list[str] = field(default_factory=list)
    shape_mismatch: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # key, checkpoint, model
    missing: list[str] = field(default_factory=list)     # in the model, not in the checkpoint
    unexpected: list[str] = field(default_factory=list)  # in the checkpoint, not in the model
    stripped_prefix: str = ""

    def __str__(self) -> str:
        def few(keys: list[str]) -> str:
            return ", ".join(keys[:4]) + (f", ... ({len(keys)} in all)" if len(keys) > 4 else "")
        lines = [f"loaded            {len(self.loaded):>4}  {few(self.loaded)}"]
        lines.append(f"shape mismatch    {len(self.shape_mismatch):>4}  " + ", ".join(
            f"{k}: checkpoint {list(a)} vs model {list(b)}" for k, a, b in self.shape_mismatch))
        lines.append(f"missing (kept)    {len(self.missing):>4}  {few(self.missing)}")
        lines.append(f"unexpected        {len(self.unexpected):>4}  {few(self.unexpected)}")
        if self.stripped_prefix:
            lines.append(f"stripped prefix   {self.stripped_prefix!r}")
        return "\n".join(lines)


def load_matching_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], *,
                             strip_prefixes: tuple[str, ...] = ("module.", "_orig_mod.")) -> LoadReport:
    """Load every entry whose name and shape match the model; keep the model's values elsewhere.

    First strips each prefix in `strip_prefixes` that **all** keys share (left by
    DataParallel / DDP as `module.`, by `torch.compile` as `_orig_mod.`), using PyTorch's own
    `consume_prefix_in_state_dict_if_present`. Raises `ValueError` showing keys from both sides
    if nothing matches, so a mismatch never passes silently.
    """
    _checks.module(model)
    if not isinstance(state_dict, Mapping):
        hint = " — pass its .state_dict()" if isinstance(state_dict, nn.Module) else ""
        raise TypeError(f"state_dict must be a dict of tensors (model.state_dict(), or what torch.load returned), "
                        f"got a {type(state_dict).__name__}{hint}")
    state = OrderedDict(state_dict)
    if hasattr(state_dict, "_metadata"):
        state._metadata = state_dict._metadata.copy()  # type: ignore[attr-defined]
    stripped = []
    for prefix in strip_prefixes:
        if state and all(key.startswith(prefix) for key in state):
            consume_prefix_in_state_dict_if_present(state, prefix)
            stripped.append(prefix)
    own = model.state_dict()
    report = LoadReport(stripped_prefix="".join(stripped))
    matched = {}
    for key, value in state.items():
        if key not in own:
            report.unexpected.append(key)
        elif value.shape != own[key].shape:
            report.shape_mismatch.append((key, tuple(value.shape), tuple(own[key].shape)))
        else:
            matched[key] = value
            report.loaded.append(key)
    report.missing = [key for key in own if key not in state]
    if not matched:
        raise ValueError("no key of the state_dict matches the model (name and shape): nothing would load.\n"
                         f"  checkpoint keys: {list(state)[:5]}\n  model keys:      {list(own)[:5]}")
    model.load_state_dict(matched, strict=False)
    return report


_RELABEL: dict[str, str | None] = {"location": None}


@contextmanager
def saved_as_if_on(location: str) -> Iterator[None]:
    """Inside this block, `torch.save` tags every CPU storage with `location` (e.g. "cuda:0"),
    so the file loads exactly like one written on that device. For teaching and tests of
    `map_location` on machines without that device; uses torch.serialization.register_package."""
    _checks.device(location, "location")
    _RELABEL["location"] = location
    try:
        yield
    finally:
        _RELABEL["location"] = None


def _relabel_tagger(storage: Any) -> str | None:
    if _RELABEL["location"] is not None and storage.device.type == "cpu":
        return _RELABEL["location"]
    return None


# Registered once, ahead of PyTorch's own CPU tagger (priority 10); inert outside saved_as_if_on.
torch.serialization.register_package(1, _relabel_tagger, lambda storage, location: None)


# --- exercises ------------------------------------------------------------------------------
# The hand-written checkpoint of chapter 4, section 2: {"model", "optimizer", "scheduler", "epoch",
# "rng": {"torch", "cuda"}}, every part a state_dict or a tensor, so it loads with weights_only=True.

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


def _small_run(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """A model with dropout, Adam and a StepLR schedule, as in the chapter (CPU, seeded)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return model, optimizer, scheduler


def _trained_run(epochs: int = 2) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """`_small_run(0)` after `epochs` epochs of 4 steps on fixed random data."""
    model, optimizer, scheduler = _small_run(0)
    data = torch.randn(4, 8, 6), torch.randn(4, 8, 1)
    for _ in range(epochs):
        for x, y in zip(*data):
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


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


def _restored_differences(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                          saved: tuple[nn.Module, torch.optim.Optimizer, Any], rng: torch.Tensor) -> str | None:
    """What a resume left different from the saved run, in the learner's terms (None: nothing)."""
    saved_model, saved_optimizer, saved_scheduler = saved
    if not _same_tensors(model.state_dict(), saved_model.state_dict()):
        return "the model's weights are not the checkpoint's"
    if not optimizer.state:
        return ("the optimizer holds no state after your resume: Adam's moments and step counts start from zero, "
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


def _next_learning_rates(optimizer: torch.optim.Optimizer, scheduler: Any, epochs: int = 3) -> list[float]:
    """The learning rate of each of the next `epochs` epochs, stepping copies of the two objects."""
    optimizer, scheduler = copy.deepcopy((optimizer, scheduler))
    rates = [optimizer.param_groups[0]["lr"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "lr_scheduler.step() before optimizer.step()": on purpose here
        for _ in range(epochs - 1):
            scheduler.step()
            rates.append(optimizer.param_groups[0]["lr"])
    return rates


def _rates(rates: list[float]) -> str:
    return "[" + ", ".join(f"{rate:g}" for rate in rates) + "]"


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


@_keeps_rng
def check_resume_training(fn: Callable) -> Verdict:
    """Exercise: `fn(path, model, optimizer, scheduler)` restores the chapter's hand-written checkpoint
    at `path` into fresh objects and returns the epoch to continue from (a run saved after 2 epochs)."""
    saved = _trained_run(epochs=2)
    model, optimizer, scheduler = saved
    rng = torch.get_rng_state()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "scheduler": scheduler.state_dict(), "epoch": 2,
                  "rng": {"torch": rng, "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.pt"
        torch.save(checkpoint, path)
        fresh = _small_run(seed=1)
        torch.manual_seed(1)                          # "the next morning": another random state
        try:
            epoch = fn(path, *fresh)
        except Exception as error:
            observed = _raised(error)
        else:
            if epoch is None and not fresh[1].state and fresh[2].last_epoch == 0:
                observed = None                       # still `...`: nothing ran
            else:
                observed = _restored_differences(*fresh, saved, rng)
                if observed is None and epoch != 2:
                    observed = f"everything is restored, but it returned {epoch!r}; the checkpoint's epoch is 2"
    return report_check("resume_training", observed is None, observed,
                        ["list what decides the next step of training: the weights are only one of them",
                         "the learning rate comes from an object that has its own state_dict; the dropout masks "
                         "come from a generator whose state is in the checkpoint too"])


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


@_keeps_rng
def check_checkpoint_dict(fn: Callable) -> Verdict:
    """Exercise: `fn(model, optimizer, scheduler, epoch)` returns the chapter's checkpoint dict; the check
    saves it, loads it with weights_only=True and restores it into fresh objects."""
    saved = _trained_run(epochs=2)
    rng = torch.get_rng_state()
    observed = None
    try:
        checkpoint = fn(*saved, 2)
    except Exception as error:
        checkpoint, observed = None, _raised(error)
    if observed is None and checkpoint is not None:
        buffer = io.BytesIO()
        try:
            torch.save(checkpoint, buffer)
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=True)
        except pickle.UnpicklingError as error:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
            refused = f"it holds a {found.group(1)} object" if found else str(error).splitlines()[0]
            observed = f"torch.load(..., weights_only=True) refuses your checkpoint: {refused} (Unsupported global)"
        except Exception as error:
            observed = f"your checkpoint could not be saved and loaded back: {type(error).__name__}: {error}"
        else:
            missing = [key for key in ("model", "optimizer", "scheduler", "epoch", "rng")
                       if not isinstance(loaded, dict) or key not in loaded]
            if missing:
                observed = (f"your checkpoint has no {', '.join(repr(k) for k in missing)} entr"
                            f"{'y' if len(missing) == 1 else 'ies'}: a resume from it cannot restore "
                            + ("Adam's moments and step counts" if missing == ["optimizer"] else "the run"))
            else:
                fresh = _small_run(seed=1)
                try:
                    fresh[0].load_state_dict(loaded["model"])
                    fresh[1].load_state_dict(loaded["optimizer"])
                    fresh[2].load_state_dict(loaded["scheduler"])
                    torch.set_rng_state(loaded["rng"]["torch"])
                except Exception as error:
                    observed = f"restoring your checkpoint failed: {type(error).__name__}: {error}"
                else:
                    observed = _restored_differences(*fresh, saved, rng)
                    if observed is None and loaded["epoch"] != 2:
                        observed = f"its 'epoch' is {loaded['epoch']!r}; the function was given 2"
    return report_check("checkpoint_dict", observed is None, observed,
                        ["load what you saved the way the chapter does, with weights_only=True: what does it "
                         "accept, and what does it refuse?",
                         "which object's state decides how big Adam's next step is?"])


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
    def __init__(self, classes: int):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(x)))


@_keeps_rng
def check_load_matching(fn: Callable) -> Verdict:
    """Exercise: `fn(model, state_dict)` loads the entries whose name (without `module.` / `_orig_mod.`)
    and shape match, keeps the model's values elsewhere, and returns the loaded keys. The check passes a
    10-class classifier saved from DataParallel into a fresh 5-class one."""
    torch.manual_seed(0)
    pretrained, model = _Classifier(10), _Classifier(5)
    fresh = {key: value.clone() for key, value in model.state_dict().items()}
    wrapped = {f"module.{key}": value for key, value in pretrained.state_dict().items()}
    backbone = sorted(key for key in fresh if key.startswith("backbone."))
    observed = None
    try:
        returned = fn(model, wrapped)
    except Exception as error:
        mismatch = re.search(r"size mismatch for [^\n]*", str(error))   # the key line, whole
        observed = (f"your function raised {type(error).__name__}: {mismatch[0].strip()}" if mismatch
                    else _raised(error))
    else:
        now = model.state_dict()
        untouched = all(torch.equal(now[key], fresh[key]) for key in fresh)
        if returned is None and untouched:
            return report_check("load_matching", False, None, [])
        not_loaded = [key for key in backbone if not torch.equal(now[key], pretrained.state_dict()[key])]
        if not_loaded:
            observed = (f"{len(not_loaded)} of the {len(backbone)} backbone tensors were not loaded "
                        f"(e.g. {not_loaded[0]}): the model kept its random initialisation")
        elif not (torch.equal(now["head.weight"], fresh["head.weight"]) and torch.equal(now["head.bias"], fresh["head.bias"])):
            observed = "the new 5-class head changed: it should keep its fresh initialisation"
        elif sorted(returned or []) != backbone:
            observed = f"the weights are right, but it returned {returned!r}; expected the loaded keys {backbone}"
    return report_check("load_matching", observed is None, observed,
                        ["read the error: which keys does it name, and what does the model have there instead?",
                         "two entries can have the same name and still not fit; and load_state_dict by default "
                         "insists on every key of the model"])


@reference_solution("epoch_batches_from", chapter=4)
def _epoch_batches_from(loader: Any, generator: torch.Generator, epoch_start_state: torch.Tensor,
                        skip: int) -> list:
    generator.set_state(epoch_start_state)
    return list(itertools.islice(loader, skip, None))


@_keeps_rng
def check_epoch_batches_from(fn: Callable) -> Verdict:
    """Exercise: `fn(loader, generator, epoch_start_state, skip)` returns the batches of an interrupted
    epoch from batch `skip` on, in the order the uninterrupted epoch gave them. `loader` shuffles with
    `generator`; `epoch_start_state` is the generator's state saved when that epoch began."""
    from torch.utils.data import DataLoader, TensorDataset

    def make_loader(seed: int) -> tuple[DataLoader, torch.Generator]:
        generator = torch.Generator().manual_seed(seed)
        return DataLoader(TensorDataset(torch.arange(24)), batch_size=4, shuffle=True, generator=generator), generator

    loader, generator = make_loader(7)
    list(loader)                                          # epoch 0
    epoch_start_state = generator.get_state()
    expected = [batch[0].tolist() for batch in loader][2:]   # epoch 1, from its third batch
    resumed_loader, resumed_generator = make_loader(8)    # fresh objects in a new process
    observed = None
    try:
        got = fn(resumed_loader, resumed_generator, epoch_start_state.clone(), 2)
        if got is None:
            return report_check("epoch_batches_from", False, None, [])
        got = [batch[0].tolist() if isinstance(batch, (list, tuple)) else batch.tolist() for batch in got]
    except Exception as error:
        observed = _raised(error)
    else:
        seen = {i for batch in got for i in batch}
        if got == expected:
            observed = None
        elif len(got) != len(expected):
            observed = (f"it gave {len(got)} batches; the interrupted epoch had {len(expected)} left "
                        f"(6 batches of 4, 2 already trained on)")
        elif seen == {i for batch in expected for i in batch}:
            observed = (f"the right samples, in another order: first batch {got[0]}, the uninterrupted run's "
                        f"{expected[0]}")
        else:
            observed = (f"your first batch is {got[0]}, the uninterrupted run's third batch of that epoch was "
                        f"{expected[0]}: another shuffle")
    return report_check("epoch_batches_from", observed is None, observed,
                        ["the order of an epoch is decided when its iterator is created: by what state?",
                         "you need the same shuffle as then, and only the batches not yet trained on"])
