"""Chapter 3: finding NaN and Inf — in a batch, and in the first module that produces them."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.devices import named_tensors


@dataclass
class NonFinite(ReadableResult):
    """A tensor with non-finite values: its path in the batch, counts, and the first positions."""

    path: str
    nan: int
    posinf: int
    neginf: int
    first_indices: list[tuple[int, ...]] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"{self.path}: {self.nan} nan, {self.posinf} +inf, {self.neginf} -inf; "
                f"first at {', '.join(map(str, self.first_indices))}")


def find_nonfinite(obj: Any, name: str = "batch", *, max_indices: int = 5) -> list[NonFinite]:
    """Walk a tensor or nested batch (dict / list / tuple) and report each tensor holding NaN or
    ±Inf, with counts and the indices (row, column, ...) of the first `max_indices` bad entries.
    Integer and bool tensors are always finite. Empty list when everything is finite."""
    if isinstance(obj, nn.Module):
        raise TypeError("find_nonfinite checks a batch (a tensor or a dict/list/tuple of them), got an nn.Module: "
                        "to find the layer that makes NaN, use locate_nonfinite(model, *inputs)")
    found = []
    for path, tensor in named_tensors(obj, name):
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        bad = ~torch.isfinite(tensor)
        if bad.any():
            positions = bad.nonzero()[:max_indices].tolist()
            found.append(NonFinite(path, int(torch.isnan(tensor).sum()), int(torch.isposinf(tensor).sum()),
                                   int(torch.isneginf(tensor).sum()), [tuple(p) for p in positions]))
    return found


def _stats(tensors: Any) -> str:
    parts = []
    for path, t in named_tensors(tensors, "t"):
        if not t.is_floating_point():
            continue
        finite = t[torch.isfinite(t)]
        span = f"finite range [{finite.min().item():.3g}, {finite.max().item():.3g}]" if finite.numel() else "no finite value"
        parts.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}: "
                     f"{int(torch.isnan(t).sum())} nan, {int(torch.isinf(t).sum())} inf, {span}")
    return "; ".join(parts) or "no floating-point tensor"


def _all_finite(tensors: Any) -> bool:
    return all(torch.isfinite(t).all() for _, t in named_tensors(tensors, "t") if t.is_floating_point())


@dataclass
class NonFiniteLocation(ReadableResult):
    """Where values first turned non-finite: the module's dotted name, the phase, and tensor stats."""

    module_name: str
    phase: str  # "forward" or "backward"
    input_stats: str
    output_stats: str
    inputs_were_finite: bool

    def __str__(self) -> str:
        origin = ("its inputs were finite: this module made the non-finite values" if self.inputs_were_finite
                  else "its inputs were already non-finite: look upstream (the data?)")
        what = "output" if self.phase == "forward" else "gradient w.r.t. its input"
        return (f"first non-finite {what} in {self.module_name!r} ({self.phase}); {origin}\n"
                f"  in:  {self.input_stats}\n  out: {self.output_stats}")


def locate_nonfinite(model: nn.Module, *inputs: Any, backward: bool = True) -> NonFiniteLocation | None:
    """Run `model(*inputs)` with hooks on every module and name the first one whose output is
    non-finite; if the forward pass is clean and `backward`, backpropagate `output.sum()` and name
    the first module (in backward order) whose input gradient is non-finite. `None` if all is
    finite. Leaves `.grad` of the parameters as that backward left them; hooks are always removed."""
    _checks.module(model)
    names = {module: (name or type(model).__name__) for name, module in model.named_modules()}
    found: list[NonFiniteLocation] = []

    def forward_hook(module, args, output):
        if not found and not _all_finite(output):
            found.append(NonFiniteLocation(names[module], "forward", _stats(args), _stats(output), _all_finite(args)))

    def backward_hook(module, grad_input, grad_output):
        if not found and not _all_finite([g for g in grad_input if g is not None]):
            found.append(NonFiniteLocation(names[module], "backward", _stats(grad_output),
                                           _stats([g for g in grad_input if g is not None]),
                                           _all_finite([g for g in grad_output if g is not None])))

    handles = [m.register_forward_hook(forward_hook) for m in names]
    if backward:
        handles += [m.register_full_backward_hook(backward_hook) for m in names]
    try:
        output = model(*inputs)
        if not found and backward:
            outputs = [t for _, t in named_tensors(output, "out") if t.requires_grad]
            if outputs:
                with warnings.catch_warnings():  # modules whose inputs need no grad: expected
                    warnings.filterwarnings("ignore", message="Full backward hook is firing")
                    torch.stack([t.sum() for t in outputs]).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None
