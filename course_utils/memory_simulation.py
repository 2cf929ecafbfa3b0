"""Chapter 3: predict the peak memory of one training step by running it on fake tensors.

Under `FakeTensorMode` every operator returns tensors with the right shape, dtype and device but no
storage, so a whole first step — forward, loss, `backward()`, `optimizer.step()` — runs without
allocating, for a batch of any size. PyTorch's `MemTracker` follows every storage such a step
creates and frees, by kind (activations, gradients, optimizer state, backward temporaries). Its peak
above what existed before the step is the prediction of `measure_peak_memory(step).peak_bytes`.

Both are private PyTorch APIs (`torch._subclasses`, `torch.distributed._tools`) with no public
equivalent; each is used through one function here (`_fake_mode`, `_peak_tracker_class`), tested in
tests/test_memory_simulation.py, so an upgrade that moves them fails one clear test.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           FakeTensorMode, UnsupportedOperatorException)

from course_utils._display import ReadableResult, format_bytes

OptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]
OPTIMIZERS: dict[str, OptimizerFactory] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-3),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
}
OUTSIDE = "(outside any module: loss and its gradient, optimizer)"


class SimulationError(RuntimeError):
    """The step cannot run on fake tensors (an operator whose output depends on tensor values)."""


def _fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=False)


@functools.cache
def _peak_tracker_class() -> type:
    """Build the tracker class on first use: importing torch.distributed._tools costs ~2 s, which
    every `import course_utils` would otherwise pay."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _UpdateType

    class _PeakTracker(MemTracker):
        """MemTracker plus, at the moment of the peak, the bytes each module holds.

        Two additions to torch 2.13's MemTracker: it registers gradient hooks on every parameter,
        frozen ones included, which PyTorch refuses ("cannot register a hook on a tensor that doesn't
        require gradient") — frozen parameters are skipped here; and it attributes each activation and
        backward temporary to the innermost module running when it was created, and each gradient and
        optimizer state to the module owning the parameter, so the breakdown at the peak is per module.
        """

        def __init__(self, owner_of: dict[int, str], device: torch.device) -> None:
            super().__init__()
            self._owner_of, self._device = owner_of, device                  # id(parameter) -> its module's name
            self._made_by: dict[int, tuple[str, str, int]] = {}   # id(winfo) -> (module name, kind, bytes)
            self._live: dict[tuple[str, str], int] = {}           # (module name, kind) -> bytes alive now
            self.peak_by_module: dict[str, dict[str, int]] = {}

        def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True):
            frozen = [p for p in module.parameters() if not p.requires_grad and p not in self._param_to_grad_hook_handles]
            for p in frozen:
                self._param_to_grad_hook_handles[p] = "frozen"    # looks installed: no hook is registered
            try:
                return super()._track_module_params_and_buffers(module, install_grad_hooks)
            finally:
                for p in frozen:
                    del self._param_to_grad_hook_handles[p]

        def _innermost_module(self) -> str:
            parents = self._mod_tracker.parents - {"Global"}
            return max(parents, key=lambda name: name.count("."), default=OUTSIDE)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            """Follow what the step creates on the model's device: activations and backward temporaries
            by the module running at the time, optimizer tensors as one bucket (split at the peak)."""
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if winfo.device != self._device:
                return
            key, created = id(winfo), {_MemRefType.ACT: "activations", _MemRefType.TEMP: "activations",
                                       _MemRefType.OPT: "optimizer"}
            if u_type == _UpdateType.ADD and winfo.reftype in created:
                owner = OUTSIDE if winfo.reftype == _MemRefType.OPT else self._innermost_module()
                self._made_by[key] = (owner, created[winfo.reftype], winfo.mem_consumed)
                self._add(*self._made_by[key])
            elif key in self._made_by and (u_type == _UpdateType.DEL or winfo.reftype not in created):
                owner, kind, size = self._made_by.pop(key)     # freed, or re-labelled a gradient (per parameter)
                self._add(owner, kind, -size)
            elif key in self._made_by and u_type == _UpdateType.SIZE:
                owner, kind, size = self._made_by[key]
                self._made_by[key] = (owner, kind, winfo.mem_consumed)
                self._add(owner, kind, winfo.mem_consumed - size)

        def _add(self, owner: str, kind: str, size: int) -> None:
            self._live[owner, kind] = self._live.get((owner, kind), 0) + size

        def _update_peak_stats(self, peak_state) -> None:
            before = self._peak_mem.get(self._device)
            super()._update_peak_stats(peak_state)
            if self._peak_mem.get(self._device) != before:      # a new peak on the model's device
                self._record_peak_by_module()

        def record_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
            self._optimizer = optimizer

        def _bytes(self, t: torch.Tensor) -> int:
            """What the tracker counts for this tensor's storage (CUDA rounds up to 512 B), 0 elsewhere."""
            if t.device != self._device:
                return 0
            winfo = self._WINFO.get(t.untyped_storage(), (None, None))[0]
            return winfo.mem_consumed if winfo is not None else 0

        def _record_peak_by_module(self) -> None:
            rows: dict[str, dict[str, int]] = {}
            for (owner, kind), size in self._live.items():
                if size:
                    rows.setdefault(owner, {})[kind] = size
            outside = rows.setdefault(OUTSIDE, {})
            optimizer = getattr(self, "_optimizer", None)
            for group in (optimizer.param_groups if optimizer else []):
                for p in group["params"]:
                    row = rows.setdefault(self._owner_of.get(id(p), OUTSIDE), {})
                    if p.grad is not None:
                        row["gradients"] = row.get("gradients", 0) + self._bytes(p.grad)
                    state = sum(self._bytes(v) for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor))
                    if state:           # created inside step(): move it from the optimizer bucket to its module
                        row["optimizer state"] = row.get("optimizer state", 0) + state
                        outside["optimizer"] = outside.get("optimizer", 0) - state
            if "optimizer" in outside:
                outside["optimizer step temporaries"] = outside.pop("optimizer")
            self.peak_by_module = {owner: {k: v for k, v in kinds.items() if v} for owner, kinds in rows.items()}

    _PeakTracker.KINDS = {_MemRefType.ACT: "activations", _MemRefType.TEMP: "backward temporaries",
                          _MemRefType.GRAD: "gradients", _MemRefType.OPT: "optimizer state"}
    return _PeakTracker


@dataclass
class SimulatedStep(ReadableResult):
    """One simulated first training step: the predicted peak above what existed before it, what is
    alive at that moment by kind, and per module (activations and backward temporaries it created,
    gradients and optimizer state of its own parameters). Bytes throughout."""

    peak_bytes: int
    device: torch.device
    by_kind: dict[str, int]
    by_module: dict[str, dict[str, int]] = field(repr=False)
    seconds: float = 0.0

    def module_table(self, top: int = 10) -> list[tuple[str, int]]:
        """The `top` modules holding the most at the peak, largest first: (name, bytes)."""
        totals = [(name, sum(kinds.values())) for name, kinds in self.by_module.items()]
        return sorted(totals, key=lambda row: -row[1])[:top]

    def __str__(self) -> str:
        kinds = ", ".join(f"{kind} {format_bytes(size)}" for kind, size in self.by_kind.items() if size)
        lines = [f"predicted peak of one training step on {self.device}: {format_bytes(self.peak_bytes)} "
                 f"above the model and batch (simulated in {self.seconds:.2f} s, nothing allocated)",
                 f"alive at the peak: {kinds}", "largest holders at the peak:"]
        lines += [f"  {name:<40} {format_bytes(size):>10}" for name, size in self.module_table(8)]
        return "\n".join(lines)


def _model_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError("the model has no parameters: there is no training step to simulate")
    return first.device


def simulate_training_step(model: nn.Module, example_input: torch.Tensor, *,
                           optimizer: str | OptimizerFactory = "adam",
                           loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
                           dtype: torch.dtype | None = None) -> SimulatedStep:
    """Predict `measure_peak_memory(step).peak_bytes` of one real *first* training step, run when the
    model, a fresh optimizer and the batch already exist: forward, loss (`loss_fn(output)`, default
    the mean of the squared output), `backward()`, `optimizer.step()`.

    example_input: a tensor of the batch's shape and dtype (float images, int64 token ids, ...), on
    any device, `meta` included: only its shape and dtype are used, so a batch of any size costs
    nothing. The model is not modified and nothing is allocated: parameters, buffers, input and
    every intermediate are fake tensors on the model's device (in `dtype`, if given, for the
    floating-point ones: "what if I trained in bfloat16?").
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(f"example_input must be a tensor (a meta tensor of the batch's shape works), "
                        f"got {type(example_input).__name__}")
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)} or a callable params -> optimizer, "
                             f"got {optimizer!r}")
        optimizer = OPTIMIZERS[optimizer]
    loss_fn = loss_fn or (lambda output: output.float().pow(2).mean())
    device = _model_device(model)
    start = time.perf_counter()
    with _fake_mode() as fake:
        def fake_of(t: torch.Tensor) -> torch.Tensor:
            f = fake.from_tensor(t)
            return f.to(dtype).detach() if dtype is not None and f.is_floating_point() else f

        state = {name: fake_of(t) for name, t in model.named_parameters(remove_duplicate=False)}
        for name, p in model.named_parameters(remove_duplicate=False):
            state[name].requires_grad_(p.requires_grad)
        tied = {}
        for name, p in model.named_parameters(remove_duplicate=False):   # tied weights: one fake tensor
            state[name] = tied.setdefault(id(p), state[name])
        state.update({name: fake_of(b) for name, b in model.named_buffers()})
        root = type(model).__name__                  # ModTracker's names: Root, Root.child, Root.child.grandchild
        owner_of = {id(state[name]): ".".join(filter(None, (root, name.rpartition(".")[0])))
                    for name, _ in model.named_parameters(remove_duplicate=False)}
        batch_dtype = dtype if dtype is not None and example_input.is_floating_point() else example_input.dtype
        batch = torch.empty(example_input.shape, dtype=batch_dtype, device=device)
        leaves = list({id(t): t for name, t in state.items() if t.requires_grad}.values())
        opt = optimizer(leaves)
        tracker = _peak_tracker_class()(owner_of, device)
        tracker.track_external(opt, batch, *state.values())
        tracker.record_optimizer(opt)
        try:
            with tracker:
                before = tracker.get_tracker_snapshot("current").get(device, {}).get("Total", 0)
                loss_fn(torch.func.functional_call(model, state, (batch,), tie_weights=False)).backward()
                opt.step()
        except (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException) as error:
            raise SimulationError(f"the step cannot be simulated: operator {error.func} needs real tensor values "
                                  f"({type(error).__name__}); measure it with measure_peak_memory on a small batch "
                                  "instead") from None
        peak = tracker.get_tracker_snapshot("peak").get(device, {})
    by_kind = {label: peak.get(kind, 0) for kind, label in tracker.KINDS.items()}
    by_module = {_readable(name, model): kinds for name, kinds in tracker.peak_by_module.items() if sum(kinds.values())}
    return SimulatedStep(peak.get("Total", 0) - before, device, by_kind, by_module, time.perf_counter() - start)


def _readable(name: str, model: nn.Module) -> str:
    """ModTracker names modules `Root.child.grandchild`; show `child.grandchild (ClassName)`."""
    root = type(model).__name__
    if not name.startswith(root + "."):
        return name if name != root else f"(the model's own forward, {root})"
    path = name[len(root) + 1:]
    return f"{path} ({type(model.get_submodule(path)).__name__})"


def max_batch_size_by_simulation(model: nn.Module, example_input: torch.Tensor, *, budget_bytes: int,
                                 optimizer: str | OptimizerFactory = "adam",
                                 loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
                                 limit: int = 2**20) -> int:
    """The largest batch size N in [1, limit] whose first training step fits in `budget_bytes`, found
    by simulating steps (doubling, then binary search) — no trial step runs, nothing is allocated.

    A batch "fits" when the simulated peak plus the batch itself (N x example_input.shape[1:], the
    batch's dtype) is at most `budget_bytes`: the peak of a step that builds its batch, as
    `measure_peak_memory` would measure it. On CUDA pass `torch.cuda.mem_get_info()[0]` (free bytes).
    No safety margin is applied: leave one yourself (fragmentation, other processes).
    """
    if budget_bytes <= 0 or limit < 1:
        raise ValueError(f"need budget_bytes > 0 and limit >= 1, got {budget_bytes} and {limit}")
    if example_input.dim() == 0:
        raise ValueError("example_input needs a batch dimension first: shape (N, ...)")
    sample_shape = tuple(example_input.shape[1:])

    def need(n: int) -> int:
        batch = torch.empty((n, *sample_shape), dtype=example_input.dtype, device="meta")
        return simulate_training_step(model, batch, optimizer=optimizer, loss_fn=loss_fn).peak_bytes + batch.nbytes

    if need(1) > budget_bytes:
        raise ValueError(f"even a batch of 1 needs {format_bytes(need(1))}, more than the budget of "
                         f"{format_bytes(budget_bytes)}: shrink the model or the input")
    good, bad = 1, None
    while bad is None and good < limit:          # doubling
        candidate = min(2 * good, limit)
        good, bad = (candidate, None) if need(candidate) <= budget_bytes else (good, candidate)
    while bad is not None and bad - good > 1:   # binary search in (good, bad)
        middle = (good + bad) // 2
        good, bad = (middle, bad) if need(middle) <= budget_bytes else (good, middle)
    return good
