"""Choosing a device, and moving nested batches onto it."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from course_utils import _checks
from course_utils.exercises import Verdict, reference_solution, report_check

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


# --- exercise: a batch and a tensor left behind on the CPU --------------------------------------

@reference_solution("mean_kept_output", chapter=3)
def _mean_kept_output(model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    model.to(device)
    batch = to_device(batch, device)
    outputs = model(batch["x"]).squeeze(1)
    weights = torch.zeros(len(outputs), device=device)
    weights[batch["keep"]] = 1.0
    return (outputs * weights).sum() / weights.sum()


def _kept_output_problem() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A seeded 3 -> 8 -> 1 MLP on the CPU and a batch of 6 rows, 4 of them kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
        batch = {"x": torch.randn(6, 3), "keep": torch.tensor([True, False, True, True, False, True])}
    return model, batch


class _Elsewhere(torch.Tensor):
    """A CPU tensor that reports the `meta` device: real values, another device as far as code can tell."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> "_Elsewhere":
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype,
                                                   storage_offset=data.storage_offset(), device="meta",
                                                   requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor) -> None:
        self.values = data

    def __repr__(self) -> str:
        return f"{self.values!r} (on the stand-in device)"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run_elsewhere(func, args, kwargs or {})


# Like CUDA, these accept CPU index tensors for a tensor on the other device.
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
             torch.ops.aten._index_put_impl_.default}


def _run_elsewhere(func, args: tuple, kwargs: dict) -> Any:
    """Run `func` on the CPU values; refuse, as CUDA would, to combine a stand-in tensor with a CPU tensor
    that is not a 0-dim scalar; label the results as on the stand-in device when an input was, or when
    `device=meta` was asked for."""
    elsewhere = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, _Elsewhere)]
    asked = kwargs.get("device")
    moving_there = asked is not None and torch.device(asked).type == "meta"
    moving_back = asked is not None and not moving_there
    if elsewhere and not moving_back:
        operands = [args[0], *args[2:]] if func in _INDEXING else tree_flatten((args, kwargs))[0]
        left = [t for t in operands if isinstance(t, torch.Tensor) and not isinstance(t, _Elsewhere) and t.dim()]
        if left:
            raise RuntimeError(f"{func}: a CPU tensor of shape {tuple(left[0].shape)} was combined with tensors "
                               "on the other device (on a GPU: 'Expected all tensors to be on the same device')")
    if moving_there:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    wrapper_of = {id(t.values): t for t in elsewhere}
    out = func(*tree_map(_values, args), **tree_map(_values, kwargs))
    if moving_back or not (elsewhere or moving_there):
        return out

    def label(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return wrapper_of[id(t)] if id(t) in wrapper_of else _Elsewhere(t)   # in-place ops return their input
    return tree_map(label, out)


def _values(t: Any) -> Any:
    return t.values if isinstance(t, _Elsewhere) else t


class _StandInDevice(TorchDispatchMode):
    """While active, `device="meta"` (in `.to`, `model.to`, factories) gives `_Elsewhere` tensors: a second
    device with real values for machines without a GPU (a real `meta` tensor has no values, so masks
    and `.item()` would fail there)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run_elsewhere(func, args, kwargs or {})


def check_mean_kept_output(fn: Callable) -> Verdict:
    """Exercise: `fn(model, batch, device)` moves the model and the batch to `device` and returns the mean
    model output over the kept rows as a 0-dim tensor on `device`. Run on the CPU, then on another
    device: CUDA when there is one; else a stand-in that keeps real values on the CPU, reports the
    `meta` device and, as CUDA would, refuses to combine its tensors with CPU tensors."""
    name = "mean_kept_output"
    on_gpu = torch.cuda.is_available()
    other = torch.device("cuda" if on_gpu else "meta")
    where = "on cuda" if on_gpu else "on the stand-in device (another device with real values, reported as meta)"
    hints = ["read the error: which tensor is on which device? print .device of the model's parameters, "
             "of every tensor in the batch, and of what you create",
             "moving a module changes it in place; moving a tensor does not",
             "a tensor created inside the function lands on the default device unless told otherwise"]
    model, batch = _kept_output_problem()
    expected = _mean_kept_output(*_kept_output_problem(), torch.device("cpu"))
    try:
        on_cpu = fn(model, dict(batch), torch.device("cpu"))
    except Exception as error:
        return report_check(name, False, f"on the CPU your function raised {type(error).__name__}: {error}", hints)
    if on_cpu is None:
        return report_check(name, False, None, hints)
    try:
        if on_gpu:
            on_other = fn(*_kept_output_problem(), other)
        else:
            with _StandInDevice():
                on_other = fn(*_kept_output_problem(), other)
    except Exception as error:
        return report_check(name, False, f"{where} your function raised {type(error).__name__}: {error}", hints)
    problems = []
    if not (isinstance(on_cpu, torch.Tensor) and on_cpu.shape == () and torch.allclose(on_cpu, expected)):
        problems.append(f"on the CPU it returned {on_cpu!r}, expected {expected!r}")
    if not (isinstance(on_other, torch.Tensor) and on_other.device.type == other.type and on_other.shape == ()):
        got = on_other.device if isinstance(on_other, torch.Tensor) else type(on_other).__name__
        problems.append(f"asked for device {other}, the result is on {got}")
    elif not torch.allclose(_values(on_other).detach().cpu(), expected.detach()):
        problems.append(f"{where} it returned {_values(on_other).item():.4f}, expected {expected.item():.4f}")
    return report_check(name, not problems, "; ".join(problems) or None, hints)
