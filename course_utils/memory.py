"""Chapter 3 (and 2): how much memory training needs, measured rather than guessed."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def _storage_key(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    # meta tensors have no address: each storage object stands for itself
    return (t.device.type, ptr) if ptr else ("id", id(storage))


def saved_activation_bytes(fn: Callable, *args, exclude: Iterable[torch.Tensor] = (), **kwargs) -> tuple[int, object]:
    """Run `fn(*args, **kwargs)` and count the bytes autograd saves for backward meanwhile.

    Counts each distinct storage once (views and repeated saves share one), and skips the
    storages of `exclude` (pass the model's parameters: they are not activations).
    Returns (bytes, what fn returned). Works on meta tensors too (nothing is allocated).
    """
    seen = {_storage_key(t) for t in exclude}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(*args, **kwargs)
    return total, result
