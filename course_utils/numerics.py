"""Chapter 3: finding NaN and Inf — in a batch, and in the first module that produces them."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.devices import named_tensors
from course_utils.exercises import Verdict, reference_solution, report_check


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


# --- exercises -------------------------------------------------------------------------------

def _raised(error: Exception) -> str:
    return f"your function raised {type(error).__name__}: {error}"


@reference_solution("sensor_dataset", chapter=3)
def _sensor_dataset(readings: torch.Tensor) -> torch.utils.data.Dataset:
    class SensorRows(torch.utils.data.Dataset):
        def __init__(self, readings):
            self.mean = readings.nanmean(dim=0)
            filled = torch.where(torch.isnan(readings), self.mean, readings)
            std = filled.std(dim=0)
            self.std = torch.where(std > 0, std, torch.ones_like(std))
            self.rows = filled

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, index):
            return (self.rows[index] - self.mean) / self.std
    return SensorRows(readings)


def _sensor_readings() -> torch.Tensor:
    """(200, 4) float32 readings: column 1 has 5 missing values (NaN), column 3 is stuck at 5.0."""
    readings = 3 + 2 * torch.randn(200, 4, generator=torch.Generator().manual_seed(5))
    readings[:, 3] = 5.0
    readings[[7, 40, 41, 90, 150], 1] = float("nan")
    return readings


def check_sensor_dataset(fn: Callable) -> Verdict:
    """Exercise: `fn(readings)` returns a Dataset whose samples are the rows of `readings` (N, 4),
    missing values (NaN) filled with their column's mean, standardised per column: every sample
    finite, each varying column with mean 0 and std 1, a constant column mapped to 0."""
    name = "sensor_dataset"
    hints = ["print one sample and the dataset's mean and std: which column goes wrong first?",
             "two statistics must survive the data: a column with a missing value, and a column that never moves",
             "torch has NaN-aware reductions; and a scale of 0 has no meaningful inverse"]
    readings = _sensor_readings()
    try:
        dataset = fn(readings.clone())
        if dataset is None:
            return report_check(name, False, None, hints)
        samples = torch.stack([torch.as_tensor(dataset[i]) for i in range(len(dataset))])
    except Exception as error:
        return report_check(name, False, _raised(error), hints)
    if samples.shape != readings.shape:
        return report_check(name, False, f"the samples stack to shape {tuple(samples.shape)}, expected (200, 4)", hints)
    bad = ~torch.isfinite(samples)
    if bad.any():
        rows = int(bad.any(dim=1).sum())
        columns = bad.any(dim=0).nonzero().flatten().tolist()
        observed = (f"{rows} of {len(samples)} samples hold a NaN or Inf, in column(s) {columns} "
                    f"(e.g. sample 0 is {[round(v, 3) for v in samples[0].tolist()]})")
        return report_check(name, False, observed, hints)
    expected = torch.stack([_sensor_dataset(readings)[i] for i in range(len(readings))])
    if not torch.allclose(samples, expected, atol=1e-4):
        column = int((samples - expected).abs().amax(dim=0).argmax())
        observed = (f"every sample is finite now, but column {column} is not standardised: its values have "
                    f"mean {samples[:, column].mean():.3f} and std {samples[:, column].std():.3f} "
                    f"(a varying column should give 0 and 1, a constant one all 0)")
        return report_check(name, False, observed, hints)
    return report_check(name, True, None, hints)


@reference_solution("rms_normalise", chapter=3)
def _rms_normalise(x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 / torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + 1e-6)).to(x.dtype)


def check_rms_normalise(fn: Callable) -> Verdict:
    """Exercise: `fn(x)` for float16 activations x (N, D) returns x / sqrt(mean(x**2 over D) + 1e-6)
    in float16, finite and accurate also for activations of a few hundred (whose squares pass
    float16's largest value, 65504)."""
    name = "rms_normalise"
    hints = ["look at the largest intermediate value, and at the largest number float16 can hold",
             "it is the same in float16 mixed-precision training: some reductions are done in float32"]
    generator = torch.Generator().manual_seed(6)
    small = torch.randn(8, 64, generator=generator).half()
    large = (300 * torch.randn(8, 64, generator=generator)).half()     # squares up to ~1e6 > 65504
    results = {}
    for label, x in (("small", small), ("large", large)):
        try:
            out = fn(x.clone())
        except Exception as error:
            return report_check(name, False, _raised(error), hints)
        if out is None:
            return report_check(name, False, None, hints)
        results[label] = out
    problems = []
    for label, x in (("small", small), ("large", large)):
        out, expected = results[label], _rms_normalise(x)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != torch.float16:
            what = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
            problems.append(f"for the {label} activations it returned {what}, expected (8, 64) torch.float16")
        elif not torch.isfinite(out).all():
            problems.append(f"for activations up to {x.abs().max():.0f} the output holds "
                            f"{int((~torch.isfinite(out)).sum())} non-finite values of {out.numel()} "
                            f"(and {int((out == 0).sum())} zeros)")
        elif not torch.allclose(out.float(), expected.float(), rtol=1e-2, atol=1e-2):
            error = (out.float() - expected.float()).abs().max().item()
            problems.append(f"for activations up to {x.abs().max():.0f} the output is off by up to {error:.3f} "
                            f"({int((out == 0).sum())} of {out.numel()} outputs are exactly 0)")
    return report_check(name, not problems, "; ".join(problems) or None, hints)
