"""Choosing a device, and moving nested batches onto it."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from course_utils import _checks

_DEVICE_KINDS = ("cpu", "cuda", "mps")


def _mps_works() -> bool:
    """MPS can report itself available and still fail on first use (old macOS, VMs)."""
    if not (torch.backends.mps.is_available() and torch.backends.mps.is_built()):
        return False
    try:
        torch.ones(1, device="mps").add_(1)
    except RuntimeError:
        return False
    return True


def get_device(prefer: str | None = None) -> torch.device:
    """Return the best device here: CUDA if available, else MPS where it works, else CPU.

    `prefer` forces a kind ("cpu", "cuda" or "mps"); asking for one that is not usable
    raises `RuntimeError` saying so. With COURSE_REQUIRE_CUDA=1 (the GPU test runner) a missing
    GPU raises instead of falling back. Prints nothing.
    """
    if prefer is not None:
        if not isinstance(prefer, str) or prefer.split(":")[0] not in _DEVICE_KINDS:
            raise ValueError(f"prefer must be one of {_DEVICE_KINDS} (or None), got {prefer!r}")
        kind = prefer.split(":")[0]
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("prefer='cuda' but no CUDA device is usable here; "
                               "run `python -m course_utils doctor` to see why, or use prefer=None.")
        if kind == "mps" and not _mps_works():
            raise RuntimeError("prefer='mps' but MPS is not usable here; use prefer=None.")
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("COURSE_REQUIRE_CUDA") == "1":  # the GPU runner: falling back would hide a broken setup
        raise RuntimeError("COURSE_REQUIRE_CUDA=1 but no CUDA device is usable; run `python -m course_utils doctor`")
    if _mps_works():
        return torch.device("mps")
    return torch.device("cpu")


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Move every tensor inside a nested batch (dict / list / tuple / namedtuple) to `device`.

    Non-tensor leaves are returned unchanged; container types are preserved.
    """
    device = _checks.device(device)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch


def named_tensors(obj: Any, name: str = "batch") -> list[tuple[str, torch.Tensor]]:
    """Every tensor inside a nested batch with its path: `batch[0]`, `batch['features']`, ..."""
    if isinstance(obj, torch.Tensor):
        return [(name, obj)]
    if isinstance(obj, dict):
        return [pair for key, value in obj.items() for pair in named_tensors(value, f"{name}[{key!r}]")]
    if isinstance(obj, (list, tuple)):
        return [pair for i, value in enumerate(obj) for pair in named_tensors(value, f"{name}[{i}]")]
    return []


class DeviceMismatchError(RuntimeError):
    """Raised by `check_devices`: lists every tensor that is not on the model's device."""


def check_devices(model: nn.Module, *tensors_or_batches: Any) -> None:
    """Raise `DeviceMismatchError` naming every parameter, buffer and input tensor that is not on
    the model's device (that of its first parameter), with the fix. Silent when all agree.
    Inputs are named `inputs[0]`, `inputs[1]['x']`, ... in the order given."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    named = list(model.named_parameters()) + list(model.named_buffers())
    if not named:
        raise ValueError("the model has no parameters or buffers, so it has no device to check against")
    device = named[0][1].device
    wrong = [f"  model {kind} {n}: {t.device}" for kind, group in
             (("parameter", model.named_parameters()), ("buffer", model.named_buffers()))
             for n, t in group if t.device != device]
    wrong += [f"  input {path}: {t.device}" for path, t in named_tensors(list(tensors_or_batches), "inputs")
              if t.device != device]
    if wrong:
        raise DeviceMismatchError(
            f"the model is on {device}, but these tensors are not:\n" + "\n".join(wrong) +
            f"\nFix: move the model once with model.to(device) and every batch with "
            f"to_device(batch, device) before the forward pass (device = {device}).")


@contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """Run the block with `n` intra-op CPU threads (`torch.set_num_threads`), restoring the previous
    count on exit, even on error. Yields the previous count.

    Tiny models (a few thousand values per op) gain nothing from several threads, and on a busy
    laptop they lose a lot: each op waits at a barrier for a thread whose core is taken.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield previous
    finally:
        torch.set_num_threads(previous)
