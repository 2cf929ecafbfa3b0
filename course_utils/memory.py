"""Chapter 3 (and 2): how much memory training needs, measured rather than guessed."""
from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from course_utils import _checks
from course_utils._display import ReadableResult, format_bytes
from course_utils.memory_simulation import OPTIMIZERS as _OPTIMIZERS
from course_utils.memory_simulation import SimulatedStep, simulate_training_step


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
    _checks.callable_(fn, "fn")
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


# --- estimating --------------------------------------------------------------------------

# Optimizer state per parameter element, in units of the parameter's size.
_OPTIMIZER_STATE = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}


@dataclass
class MemoryEstimate(ReadableResult):
    """Bytes a training step needs: the parts by kind (`total` is their sum) and, simulated, the
    peak of a real first step and who holds what at that moment (`simulated`)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    simulated: SimulatedStep | None = field(default=None, repr=False)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    @property
    def peak_bytes(self) -> int:
        """Predicted `measure_peak_memory(step).peak_bytes` of a first step, model/optimizer/batch made before."""
        return self.simulated.peak_bytes

    @property
    def by_module(self) -> dict[str, dict[str, int]]:
        """Per submodule, the bytes it holds at the peak (activations, gradients, optimizer state)."""
        return self.simulated.by_module

    def __str__(self) -> str:
        rows = [("parameters", self.parameters), ("gradients", self.gradients),
                ("optimizer state", self.optimizer_state), ("activations (saved for backward)", self.activations),
                ("sum of the parts", self.total)]
        lines = [f"{name:<36}{format_bytes(n):>12}" for name, n in rows]
        if self.simulated is not None:
            lines.append(f"{'simulated peak of a first step':<36}{format_bytes(self.peak_bytes):>12}"
                         "   (above the parameters and the batch)")
        return "\n".join(lines)


def estimate_training_memory(model: nn.Module, example_input: torch.Tensor, *, optimizer: str = "adam",
                             dtype: torch.dtype | None = None,
                             loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> MemoryEstimate:
    """Estimate the memory of one training step of `model` on `example_input` (a batch, shape (N, ...)).

    The parts: parameters, gradients (for parameters that require grad) and optimizer state (`sgd`:
    none, `sgd_momentum`: 1x, `adam`/`adamw`: 2x plus a step counter per tensor) counted from the
    parameters, in `dtype` if given; activations **measured** by one forward pass on the `meta`
    device while `saved_activation_bytes` counts what autograd saves for backward (input included,
    parameters excluded). The peak is not the sum of the parts (working memory in backward and in
    `step()`): `simulated` runs the whole first step on fake tensors (`simulate_training_step`,
    loss `loss_fn(output)`, default the mean of the squared output) and predicts its peak.
    Nothing is allocated either way; a `meta` batch of any size works.
    """
    _checks.module(model)
    if optimizer not in _OPTIMIZER_STATE:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZER_STATE)}, got {optimizer!r}")
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(f"example_input must be a tensor batch, got {type(example_input).__name__}")

    def meta_like(t: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        return torch.empty_like(t, device="meta", dtype=cast).requires_grad_(t.requires_grad)

    params = {name: meta_like(p) for name, p in model.named_parameters()}
    buffers = {name: meta_like(b) for name, b in model.named_buffers()}
    trainable = [p for p in params.values() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable)
    state_bytes = _OPTIMIZER_STATE[optimizer] * grad_bytes
    if optimizer.startswith("adam"):
        state_bytes += 4 * len(trainable)  # a float32 `step` per parameter tensor
    was_training = model.training
    model.train()
    try:
        activations, _ = saved_activation_bytes(torch.func.functional_call, model, {**params, **buffers},
                                                (meta_like(example_input),), exclude=trainable)
        simulated = simulate_training_step(model, example_input, optimizer=optimizer, loss_fn=loss_fn, dtype=dtype)
    finally:
        model.train(was_training)
    return MemoryEstimate(param_bytes, grad_bytes, state_bytes, activations, simulated)


# --- measuring ---------------------------------------------------------------------------

@dataclass
class MemoryReport(ReadableResult):
    """Peak memory of one call above the memory in use before it, and what the call returned."""

    peak_bytes: int
    device: torch.device
    result: Any = field(repr=False)
    method: str = ""

    def __str__(self) -> str:
        return f"peak {format_bytes(self.peak_bytes)} above baseline on {self.device} ({self.method})"


class _TensorAllocationTracker(TorchDispatchMode):
    """Counts bytes of tensor storages created by ATen ops while active, and frees them as they die.

    Written by hand because PyTorch's CPU allocator keeps no statistics (torch.cuda.memory_stats
    exists for CUDA only), and PyTorch's MemTracker (torch.distributed._tools, which the simulation
    uses) does not fit measurements of arbitrary code: it counts parameters it meets during the
    call as new allocations unless they were registered first, and refuses a module called twice
    in one context ("does not support memory tracking for multiple iterative calls"), which the
    chapter's loops do (both seen on torch 2.13). A new storage is one that no input of the op shares (views and
    in-place results are not allocations); `weakref.finalize` on the storage notices its release.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.alive: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if key and key not in inputs and key not in self.alive:
                self.alive.add(key)
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._release, key, size)
        return out

    def _release(self, key: int, size: int) -> None:
        if key in self.alive:
            self.alive.discard(key)
            self.live -= size


def _device_or_default(device: torch.device | str | None) -> torch.device:
    """`device`, or CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def measure_peak_memory(fn: Callable, *args, device: torch.device | str | None = None, **kwargs) -> MemoryReport:
    """Run `fn(*args, **kwargs)` and report its peak memory above the baseline on `device`
    (default: CUDA if available, else CPU).

    CUDA: `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()`, minus the
    memory allocated before; byte-exact for the caching allocator's allocations (the cache
    itself, `memory_reserved`, is larger).
    CPU: every tensor storage created by an ATen operator during the call is counted from its
    creation until it is freed, byte-exact for tensors; it does not see scratch memory inside a
    kernel, Python objects, or allocator overhead, so the process's RSS grows by somewhat more.
    """
    _checks.callable_(fn, "fn")
    device = _device_or_default(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        result = fn(*args, **kwargs)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - baseline
        return MemoryReport(peak, device, result, "torch.cuda peak statistics")
    if device.type != "cpu":
        raise ValueError(f"measure_peak_memory supports cuda and cpu, got {device}")
    gc.collect()
    tracker = _TensorAllocationTracker()
    with tracker:
        result = fn(*args, **kwargs)
    return MemoryReport(tracker.peak, device, result, "tensor storages tracked per ATen op")


# Out-of-memory errors that do not arrive as torch.OutOfMemoryError: cuDNN's plan search turns a
# workspace allocation failure into "unable to find an engine"; cuBLAS fails to create its handle.
_OOM_IN_DISGUISE = ("unable to find an engine", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def _is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or any(s in str(error) for s in _OOM_IN_DISGUISE)


def find_max_batch_size(make_step: Callable[[int], Any], *, start: int = 1, limit: int,
                        budget_bytes: int | None = None, margin: float = 0.1,
                        device: torch.device | str | None = None) -> int:
    """Largest batch size in [start, limit] whose step fits, found by doubling then binary search,
    then reduced by `margin` (10 % by default) because a size that fit once can still run out of
    memory later (fragmentation, longer sequences, other processes).

    `make_step(batch_size)` must run one full training step at that size. Without
    `budget_bytes` (CUDA only) a size fits if it raises no out-of-memory error; with it, a size
    fits if its measured peak (`measure_peak_memory` on `device`, default the CPU: a budget is
    the CPU counterpart) is at most `budget_bytes`. Raises `RuntimeError` if even `start` does
    not fit, or if a budgeted step allocates nothing on `device` (it runs somewhere else).
    """
    if not 1 <= start <= limit:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if budget_bytes is not None:
        # Not CUDA by default: on a GPU machine CUDA's counters would see 0 bytes of a CPU step.
        device = torch.device(device) if device is not None else torch.device("cpu")
    else:
        device = _device_or_default(device)
        if device.type != "cuda":
            raise ValueError("without CUDA there is no out-of-memory error to catch: pass budget_bytes")

    def fits(n: int) -> bool:
        if budget_bytes is not None:
            peak = measure_peak_memory(make_step, n, device=device).peak_bytes
            if peak == 0:
                raise RuntimeError(f"the step at batch size {n} allocated nothing on {device}: it runs on "
                                   "another device; pass device= the device make_step allocates on")
            return peak <= budget_bytes
        out_of_memory = False
        try:
            make_step(n)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not _is_out_of_memory(error):
                raise
            out_of_memory = True
        # freed here, outside the except block: its traceback would keep the step's tensors alive
        gc.collect()
        torch.cuda.empty_cache()
        return not out_of_memory

    if not fits(start):
        raise RuntimeError(f"even batch size {start} does not fit; shrink the model or the input")
    good, bad = start, None
    while bad is None and good < limit:  # doubling
        candidate = min(2 * good, limit)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > 1:  # binary search in (good, bad)
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return max(start, int(good * (1 - margin)))


# --- checking the estimate against a measurement --------------------------------------------

@dataclass
class EstimateCheck(ReadableResult):
    """Per batch size: the sum-of-parts estimate (gradients + optimizer state + activations), the
    simulated peak, and the measured peak of one real first step (which builds its batch) above
    the memory held before it. Bytes."""

    model_name: str
    device: torch.device
    rows: list[tuple[int, int, int, int]]  # (batch size, sum of parts, simulated, measured)

    @property
    def ratios(self) -> list[float]:
        """measured / simulated, per batch size."""
        return [measured / simulated for _, _, simulated, measured in self.rows]

    @property
    def parts_ratios(self) -> list[float]:
        """measured / sum of parts, per batch size."""
        return [measured / parts for _, parts, _, measured in self.rows]

    @property
    def worst_relative_error(self) -> float:
        """Of the simulated peak against the measured one."""
        return max(abs(r - 1) for r in self.ratios)

    def __str__(self) -> str:
        lines = [f"{self.model_name} on {self.device}: predicted vs measured peak of one training step",
                 f"{'batch':>6} {'sum of parts':>13} {'simulated':>11} {'measured':>11} {'meas/parts':>11} {'meas/sim':>9}"]
        lines += [f"{n:>6} {format_bytes(p):>13} {format_bytes(s):>11} {format_bytes(m):>11} {m / p:>11.2f} {m / s:>9.3f}"
                  for n, p, s, m in self.rows]
        return "\n".join(lines)


def check_memory_estimate(model: nn.Module, input_shape: tuple[int, ...], batch_sizes: Iterable[int], *,
                          optimizer: str = "adam", model_name: str = "",
                          device: torch.device | str | None = None) -> EstimateCheck:
    """Compare `estimate_training_memory` (on a meta batch: its sum of parts and its simulated peak)
    with `measure_peak_memory` of a real first step (fresh optimizer, so its state is allocated
    inside the step; the batch, of shape (N, *input_shape), is built inside it too; loss = mean of
    the squared output). The parameters exist before the step and are left out of every column.
    `model` must already be on `device`."""
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZERS)}, got {optimizer!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batch_sizes = list(batch_sizes)
    # One throwaway forward/backward first: libraries allocate lazily on first use (cuBLAS's
    # workspace, 32 MiB on compute capability 9.0; cuDNN's), which would land in the first row.
    model(torch.randn(min(batch_sizes), *input_shape, device=device)).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    rows = []
    for n in batch_sizes:
        batch = torch.empty(n, *input_shape, device="meta")
        estimate = estimate_training_memory(model, batch, optimizer=optimizer)
        model.zero_grad(set_to_none=True)
        opt = _OPTIMIZERS[optimizer](model.parameters())

        def step() -> None:
            model(torch.randn(n, *input_shape, device=device)).float().pow(2).mean().backward()
            opt.step()

        measured = measure_peak_memory(step, device=device).peak_bytes
        model.zero_grad(set_to_none=True)
        del opt
        rows.append((n, estimate.total - estimate.parameters, estimate.peak_bytes + batch.nbytes, measured))
    return EstimateCheck(model_name or type(model).__name__, device, rows)


@contextmanager
def cuda_memory_cap(fraction: float, device: int | str | torch.device = 0) -> Iterator[int]:
    """Cap this process at `fraction` of the GPU's memory (to reproduce a real OOM safely) and
    restore the full GPU on exit. Yields the cap in bytes."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_memory_cap needs a CUDA device; on CPU use a budget_bytes instead")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        yield int(fraction * torch.cuda.get_device_properties(device).total_memory)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        gc.collect()
        torch.cuda.empty_cache()


def _address_space_bytes() -> int:
    """This process's virtual address space now (VmSize), in bytes (Linux)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


@contextmanager
def cpu_memory_cap(headroom_bytes: int) -> Iterator[int]:
    """Cap this process's address space at its current size plus `headroom_bytes` (Linux,
    `RLIMIT_AS`), so a larger allocation fails for real — PyTorch's CPU allocator raises
    `RuntimeError: ... DefaultCPUAllocator: can't allocate memory` — without touching the
    machine's RAM. The previous limit is restored on exit. Yields the cap in bytes.
    """
    if not sys.platform.startswith("linux"):
        raise RuntimeError("cpu_memory_cap needs Linux (RLIMIT_AS is not enforced elsewhere); use a budget_bytes")
    if headroom_bytes <= 0:
        raise ValueError(f"headroom_bytes must be positive, got {headroom_bytes}")
    import resource  # POSIX only: imported here so the package imports on Windows
    previous = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + headroom_bytes
    if previous[1] != resource.RLIM_INFINITY:
        cap = min(cap, previous[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, previous[1]))
    try:
        yield cap
    finally:
        resource.setrlimit(resource.RLIMIT_AS, previous)
