"""Choosing a device, and moving nested batches onto it."""
from __future__ import annotations

from typing import Any

import torch

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
    raises `RuntimeError` saying so. Prints nothing.
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
    if _mps_works():
        return torch.device("mps")
    return torch.device("cpu")


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Move every tensor inside a nested batch (dict / list / tuple / namedtuple) to `device`.

    Non-tensor leaves are returned unchanged; container types are preserved.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch
