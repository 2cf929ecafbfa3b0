"""Chapter 4: checkpoints that survive crashes, resume exactly, and load only what matches."""
from __future__ import annotations

import glob
import numbers
import os
import pickle
import socket
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.rng import capture_rng_state, restore_rng_state

FORMAT = "course_utils.checkpoint/1"
TEMP_SUFFIX = ".partial"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used: corrupt, truncated, unsafe, or missing a part."""


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, scaler: torch.amp.GradScaler | None = None, **meta: Any) -> Path:
    """Atomically write model / optimizer / scheduler / scaler state, `meta` and every RNG state.

    `meta` (epoch, global step, best score, ...) must be plain JSON-like data (str, int, float, bool,
    None, lists and dicts of them; a `numpy.float64` or a tensor raises TypeError, naming the key,
    before anything is written). The file gets the permissions `torch.save(obj, path)` would give
    (the existing file's, else what the umask allows). It is written to a temporary file in the same
    folder, flushed and fsync'ed, then renamed over `path` (`os.replace` is atomic), so a crash or a
    full disk at any moment leaves the previous checkpoint intact. Everything stored loads with `torch.load(..., weights_only=True)`.
    """
    path = _checks.writable_file(path, "path")
    _checks.module(model)
    _check_meta(meta)          # before anything is written: a bad value never costs the previous file
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
            os.chmod(temp_name, _mode_for(path))   # mkstemp gives 0600; torch.save(obj, path) what the umask allows
            torch.save(payload, temp)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)  # make the rename itself durable
    return path


_PLAIN_TYPES = (str, int, float, bool, type(None))


def _check_meta(meta: Mapping[str, Any], where: str = "") -> None:
    """Raise TypeError naming the first value of `meta` that is not plain JSON-like data.

    Exact types only: `numpy.float64` is a subclass of float (so `json.dumps` takes it), but it
    pickles as a NumPy scalar, which `torch.load(..., weights_only=True)` refuses; the same goes for
    a tensor, a NumPy array, an enum or any other subclass of a plain type.
    """
    items = meta.items() if isinstance(meta, Mapping) else enumerate(meta)
    for key, value in items:
        name = f"{where}[{key!r}]" if where else repr(key)
        if isinstance(meta, Mapping) and type(key) not in _PLAIN_TYPES:
            raise TypeError(f"checkpoint meta {where or 'keys'}: the key {key!r} is a {type(key).__name__}; "
                            "meta data must be JSON-like, with str (or int) keys")
        if type(value) in (dict, OrderedDict, list, tuple):      # what weights_only loads back
            _check_meta(value, name)
        elif type(value) not in _PLAIN_TYPES:
            kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
            if isinstance(value, torch.Tensor) or getattr(value, "ndim", 0):
                plain = "x.item() for one number, x.tolist() for several"
            elif isinstance(value, numbers.Integral):
                plain = "int(x)"
            elif isinstance(value, numbers.Real):
                plain = "float(x)"
            else:
                plain = "str(x), or the plain values it holds"
            why = ("a tensor keeps its device and dtype" if isinstance(value, torch.Tensor)
                   else "torch.load(..., weights_only=True) refuses to load it")
            raise TypeError(f"checkpoint meta {name} is a {kind} ({value!r:.60}): {why}. Meta data must be "
                            f"JSON-like (str, int, float, bool, None, lists and dicts of them): pass {plain}")


def _current_umask() -> int:
    """The process umask, read without changing it where Linux exposes it (/proc), else set and put back."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The permission bits `open(path, "wb")` would give: the existing file's, else 0o666 minus the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_current_umask()


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
