"""The child side of `diagnose`: run an unchanged training script with observation installed first.

    python course_utils/observe.py EVIDENCE.json [--max-steps N] SCRIPT [ARGS...]

(run by path, so the child imports torch and this file only, not the whole course_utils package)

The script runs as `__main__` (its own `sys.argv`, its folder first on `sys.path`). Before it starts,
`Observer.install` puts in:
- PyTorch's global hooks: `register_module_forward_pre_hook` / `register_module_forward_hook` (every
  module call: which model ran, in which mode, non-finite outputs, ReLU/sigmoid/tanh statistics) and
  `register_optimizer_step_pre_hook` / `_post_hook` (every optimizer step: which parameters hold a
  gradient, its norm);
- per-parameter tensor hooks, added the first time a parameter is seen: `register_hook` (a gradient
  arrives: was the previous one ever cleared?) and `register_post_accumulate_grad_hook`;
- thin wrappers where PyTorch has no hook: `torch.autograd.backward` (the loss), the loss functions of
  `torch.nn.functional` (what they were fed), `DataLoader` / `DistributedSampler` iteration,
  `torch.save` / `torch.load` / `load_state_dict`, `GradScaler.scale`, and `warnings.showwarning`.

Only statistics are kept (a few numbers per step and per parameter, never activations). The evidence is
written as JSON every second and when the script ends, crashes, or is stopped (SIGTERM), so a script
stopped at its timeout still reports what was seen. `course_utils.diagnosis_rules` reads it.
"""
from __future__ import annotations

import functools
import json
import math
import os
import runpy
import signal
import sys
import time
import traceback
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as dataloader_module
from torch.utils.data.distributed import DistributedSampler

FLUSH_EVERY_S = 1.0
DEAD_WINDOW = 8              # a ReLU unit is dead when no sample of 8 consecutive batches made it fire
MAX_SERIES = 1000            # per-step series keep at most this many points (then every 2nd, 4th, ... step)
MODE_DEPENDENT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)
# Saturated: the activation's input is beyond +-5 (DeepDiagnosis, Wardat et al. ICSE 2022,
# callback/callbacks.py), i.e. |tanh| > tanh(5) = 0.9999, sigmoid outside (0.0067, 0.9933)
TANH_SATURATED, SIGMOID_SATURATED = math.tanh(5.0), 1 / (1 + math.exp(-5.0))
CLASSIFICATION_LOSSES = ("cross_entropy", "nll_loss")
REGRESSION_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                     "binary_cross_entropy_with_logits")


class StepBudgetReached(BaseException):
    """Raised from the optimizer hook after `--max-steps` steps; a BaseException so that the script's own
    `except Exception` cannot swallow it."""


@dataclass
class ParamRecord:
    """What was seen of one parameter. `carried_over`: optimizer steps whose gradient was added onto the
    gradient of an earlier update, never cleared in between."""
    shape: list[int]
    requires_grad: bool
    in_optimizer: bool = False
    forward_seen: bool = False
    grad_arrivals: int = 0
    nonzero_grad_steps: int = 0
    carried_over: int = 0
    first_carry_step: int | None = None


@dataclass
class Series:
    """A per-step series thinned to at most MAX_SERIES points: (step, value) pairs."""
    steps: list[int] = field(default_factory=list)
    values: list = field(default_factory=list)
    stride: int = 1

    def add(self, step: int, value) -> None:
        if step % self.stride:
            return
        self.steps.append(step)
        self.values.append(value)
        if len(self.steps) > MAX_SERIES:
            keep = [i for i, s in enumerate(self.steps) if s % (2 * self.stride) == 0]
            self.steps = [self.steps[i] for i in keep]
            self.values = [self.values[i] for i in keep]
            self.stride *= 2


def _floats(value) -> list[torch.Tensor]:
    """The floating-point tensors in a (possibly nested) module output or batch."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _floats(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _floats(item)]
    return []


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    # detached: on a tensor that requires grad, isfinite's decomposition (abs) would record a graph
    return all(bool(torch.isfinite(t.detach()).all()) for t in tensors if t.numel())


def _caller() -> str:
    """`file:line (function)` of the first frame outside PyTorch and this module: the script's line."""
    frame = sys._getframe(2)
    while frame and (frame.f_code.co_filename.startswith(_LIBRARY_DIRS) or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name})"


_LIBRARY_DIRS = (str(Path(torch.__file__).parent), str(Path(functools.__file__).parent))


def _compiling() -> bool:
    """Inside torch.compile's tracing (its hooks must not enter the graph), or a forward that backward
    re-runs (torch.utils.checkpoint's recomputation: observed once already, and it must save exactly what
    the first run saved)."""
    return torch.compiler.is_compiling() or torch._C._current_graph_task_id() != -1


def _safe(hook):
    """Observation must never break the script: an error inside a hook is recorded, not raised."""
    @functools.wraps(hook)
    def guarded(self, *args, **kwargs):
        try:
            return hook(self, *args, **kwargs)
        except StepBudgetReached:
            raise
        except Exception as error:  # noqa: BLE001 - see the docstring
            if len(self.observer_errors) < 10:
                self.observer_errors.append(f"{hook.__name__}: {type(error).__name__}: {error}")
    return guarded


class Observer:
    """Collects the evidence of one run. Hooks must never change what the script computes: they read
    tensors (detached, under no_grad) and return None."""

    def __init__(self, out: Path, max_steps: int | None = None):
        self.out, self.max_steps, self.pid = out, max_steps, os.getpid()
        self.started = time.perf_counter()
        self.last_flush = self.started
        self.status, self.crash = "running", None
        self.steps = self.backwards = 0
        self.backward_since_step = 0
        self.depth = 0
        self.params: dict[int, torch.Tensor] = {}
        self.records: dict[int, ParamRecord] = {}
        self.initial: dict[int, torch.Tensor] = {}
        self.after_update: dict[int, tuple[int, int, int]] = {}   # pid -> (id(grad), grad version, param version)
        self.stale: set[int] = set()                              # params whose .grad an update already used
        self.modules: dict[int, nn.Module] = {}                   # every module seen in a forward
        self.roots: dict[int, nn.Module] = {}
        self.root_modes_since_step: set[tuple[int, bool]] = set()
        self.eval_root_steps: dict[int, list[int]] = defaultdict(list)
        self.train_root_steps: dict[int, int] = defaultdict(int)
        self.eval_graph_forwards = self.eval_graph_unused = 0     # model forwards in eval mode recording a graph
        self.pending_eval_graphs, self.last_root_eval_graph = 0, False
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        self.no_grad_steps: list[int] = []
        self.zeroed_before_step: list[int] = []
        self.grad_norms = Series()
        self.norm_names: list[int] = []
        self.losses = Series()
        self.nonfinite: dict[str, dict] = {}
        self.loss_checks: dict[str, dict] = {}
        self.broadcasts: dict[str, dict] = {}
        self.labels = {"calls": 0, "single_class": 0, "classes": set(), "sequence": []}
        self.loaders: dict[int, dict] = {}
        self.iterator_loader: dict[int, int] = {}
        self.batch_loader: int | None = None
        self.dist_samplers: dict[int, dict] = {}
        self.activations: dict[str, dict] = {}
        self.fp16 = {"half_grad_steps": 0, "zero_fraction": [], "scaler_used": False, "autocast_fp16_forwards": 0}
        self.checkpoints = {"loads": [], "saves": 0, "optimizer_loads": 0, "model_loads": 0}
        self.graph_nodes = Series()
        self.warnings: list[dict] = []
        self.cuda_memory = Series()
        self.observer_errors: list[str] = []

    # --- installation ---------------------------------------------------------------------------

    def install(self) -> None:
        module_hooks.register_module_forward_pre_hook(self.on_forward_pre)
        module_hooks.register_module_forward_hook(self.on_forward, always_call=True)
        optimizer_hooks.register_optimizer_step_pre_hook(self.on_step_pre)
        optimizer_hooks.register_optimizer_step_post_hook(self.on_step_post)
        self._wrap(torch.autograd, "backward", self._before_backward)
        for name in CLASSIFICATION_LOSSES + REGRESSION_LOSSES:
            self._wrap(F, name, functools.partial(self._before_loss, name))
        for owner, name in ((F, "relu"), (torch, "relu"), (torch, "sigmoid"), (torch, "tanh"),
                            (F, "sigmoid"), (F, "tanh")):
            self._wrap_activation(owner, name)
        self._wrap_after(DataLoader, "__iter__", self._loader_epoch)
        self._wrap_after(dataloader_module._BaseDataLoaderIter, "__next__", self._after_batch)
        self._wrap(DistributedSampler, "__iter__", self._before_sampler_epoch)
        self._wrap_after(torch, "load", self._after_load)
        self._wrap(torch, "save", self._before_save)
        self._wrap(torch.optim.Optimizer, "load_state_dict", self._count("optimizer_loads"))
        self._wrap(nn.Module, "load_state_dict", self._count("model_loads"))
        self._wrap(torch.amp.GradScaler, "scale", self._scaler_used)
        self._show_warning = warnings.showwarning
        warnings.showwarning = self._on_warning

    @staticmethod
    def _wrap(owner, name, before) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if not _compiling():
                before(*args, **kwargs)
            return original(*args, **kwargs)
        setattr(owner, name, wrapper)

    @staticmethod
    def _wrap_after(owner, name, after) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            if not _compiling():
                after(result, *args, **kwargs)
            return result
        setattr(owner, name, wrapper)

    def _wrap_activation(self, owner, name) -> None:
        def after(out, *args, **kwargs):
            if not sys._getframe(2).f_code.co_filename.startswith(_LIBRARY_DIRS):   # nn.ReLU & co: seen as modules
                self._activation(_caller(), name, out)
        self._wrap_after(owner, name, after)

    def _count(self, key: str):
        def count(*args, **kwargs):
            self.checkpoints[key] += 1          # cannot fail: no _safe needed
        return count

    @_safe
    def _scaler_used(self, *args, **kwargs) -> None:
        self.fp16["scaler_used"] = True

    # --- parameters -----------------------------------------------------------------------------

    def track(self, p: torch.Tensor) -> ParamRecord:
        """The record of parameter `p`, created (with its hooks) the first time it is seen."""
        pid = id(p)
        if pid not in self.records:
            self.params[pid] = p
            self.records[pid] = ParamRecord(list(p.shape), p.requires_grad)
            self.initial[pid] = p.detach().clone()
            if p.requires_grad:
                p.register_hook(functools.partial(self._on_grad, pid))
                p.register_post_accumulate_grad_hook(functools.partial(self._after_grad, pid))
        return self.records[pid]

    @_safe
    def _on_grad(self, pid: int, grad: torch.Tensor) -> None:
        """A gradient is about to be added to `p.grad`. If `p.grad` is the very tensor the last backward left
        (same object, same version), it is being accumulated; if `p` was updated since, the sum now holds a
        gradient an update already used: stale, until something clears it (None, zero_(), a new tensor).
        A step that uses a stale gradient is what `carried_over` counts (on_step_pre)."""
        p, record = self.params[pid], self.records[pid]
        record.grad_arrivals += 1
        seen = self.after_update.get(pid)
        if seen is None or p.grad is None or (id(p.grad), p.grad._version) != seen[:2]:
            self.stale.discard(pid)
        elif p._version != seen[2]:
            self.stale.add(pid)

    @_safe
    def _after_grad(self, pid: int, p: torch.Tensor) -> None:
        if p.grad is not None:
            self.after_update[pid] = (id(p.grad), p.grad._version, p._version)

    # --- modules --------------------------------------------------------------------------------

    @_safe
    def on_forward_pre(self, module: nn.Module, args) -> None:
        if _compiling():
            return
        self.depth += 1
        if self.depth != 1 or not any(True for _ in module.parameters()):
            return
        root = getattr(module, "_orig_mod", module)                  # torch.compile's wrapper
        self.roots.setdefault(id(module), module)
        self.root_modes_since_step.add((id(module), root.training))
        inputs = _floats(args)
        if "data" not in self.nonfinite and inputs and not _all_finite(inputs):
            self.nonfinite["data"] = {"step": self.steps + 1, "where": "the model's input"}
        if any(torch.is_autocast_enabled(d) and torch.get_autocast_dtype(d) == torch.float16
               for d in ("cpu", "cuda") if d != "cuda" or torch.cuda.is_available()):
            self.fp16["autocast_fp16_forwards"] += 1

    @_safe
    def on_forward(self, module: nn.Module, args, output) -> None:
        if _compiling():
            return
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and id(module) in self.roots:
            self._root_output(module, output)
        self.modules.setdefault(id(module), module)
        own = list(module.parameters(recurse=False))
        if own:
            for p in own:
                self.track(p).forward_seen = True
        if not torch.is_grad_enabled():
            return
        if "activation" not in self.nonfinite:
            outputs = _floats(output)
            if outputs and not _all_finite(outputs) and _all_finite(_floats(args)):
                self.nonfinite["activation"] = {"step": self.steps + 1, "module": id(module),
                                                "type": type(module).__name__}
        kind = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}.get(type(module))
        if kind:
            self._activation(id(module), kind, output)

    def _root_output(self, module: nn.Module, output) -> None:
        """A model's forward in eval mode whose output records a graph (frozen models' do not)."""
        root = getattr(module, "_orig_mod", module)
        self.last_root_eval_graph = (not root.training and torch.is_grad_enabled()
                                     and any(t.requires_grad for t in _floats(output)))
        if self.last_root_eval_graph:
            self.eval_graph_forwards += 1
            self.pending_eval_graphs += 1

    @_safe
    def _activation(self, site, kind: str, y) -> None:
        """Per step: the share of ReLU units that did not fire for any sample of the last DEAD_WINDOW
        batches (dead), or of sigmoid/tanh outputs in the flat ends (saturated). Non-finite outputs are
        left to the non-finite checks."""
        if not (isinstance(y, torch.Tensor) and y.is_floating_point() and y.dim() >= 2 and torch.is_grad_enabled()
                and y.requires_grad):
            return
        entry = self.activations.setdefault(site, {"kind": kind, "series": Series(), "alive": None, "batches": 0})
        with torch.no_grad():
            if not bool(torch.isfinite(y).all()):
                return
            if kind == "relu":
                unit_dim = 1 if y.dim() >= 4 else y.dim() - 1
                alive = (y > 0).movedim(unit_dim, -1).reshape(-1, y.shape[unit_dim]).any(0)
                if entry["alive"] is None or entry["alive"].shape != alive.shape:
                    entry["alive"], entry["batches"] = alive, 0
                entry["alive"] = entry["alive"] | alive
                entry["batches"] += 1
                if entry["batches"] < DEAD_WINDOW:
                    return
                value = 1.0 - float(entry["alive"].float().mean())
                entry["alive"], entry["batches"] = None, 0
            elif kind == "sigmoid":
                value = float(((y < 1 - SIGMOID_SATURATED) | (y > SIGMOID_SATURATED)).float().mean())
            else:
                value = float((y.abs() > TANH_SATURATED).float().mean())
        entry["series"].add(self.steps, round(value, 4))

    # --- backward, losses -----------------------------------------------------------------------

    @_safe
    def _before_backward(self, tensors, *args, **kwargs) -> None:
        self.backwards += 1
        self.backward_since_step += 1
        # the graphs of eval-mode forwards since the last backward were never used, except the latest
        # forward's when it is the one this backward goes through
        self.eval_graph_unused += self.pending_eval_graphs - int(self.last_root_eval_graph)
        self.pending_eval_graphs = 0
        loss = tensors[0] if isinstance(tensors, (list, tuple)) else tensors
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            value = float(loss.detach())
            self.losses.add(self.backwards, value if math.isfinite(value) else str(value))
            if not math.isfinite(value) and "loss" not in self.nonfinite:
                self.nonfinite["loss"] = {"step": self.steps + 1, "value": str(value), "line": _caller()}

    @_safe
    def _before_loss(self, name: str, input, target, *args, **kwargs) -> None:
        if not (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor) and input.is_floating_point()):
            return
        line = _caller()
        with torch.no_grad():
            if name in CLASSIFICATION_LOSSES:
                self._classification_input(name, line, input, target)
            elif input.shape != target.shape:
                try:
                    broadcast = torch.broadcast_shapes(input.shape, target.shape)
                except RuntimeError:
                    return                                   # PyTorch itself will raise
                if broadcast != input.shape or broadcast != target.shape:
                    entry = self.broadcasts.setdefault(line, {"function": name, "calls": 0, "input": list(input.shape),
                                                              "target": list(target.shape), "result": list(broadcast)})
                    entry["calls"] += 1
            if name in ("binary_cross_entropy_with_logits", "binary_cross_entropy") and input.requires_grad:
                check = self.loss_checks.setdefault(f"{name}@{line}", {"function": name, "line": line, "calls": 0,
                                                                       "in_unit_interval": 0, "sigmoid_grad_fn": 0})
                check["calls"] += 1
                check["in_unit_interval"] += bool(((input >= 0) & (input <= 1)).all())
                check["sigmoid_grad_fn"] += type(input.grad_fn).__name__ == "SigmoidBackward0"
                self._labels(target)

    def _classification_input(self, name: str, line: str, x: torch.Tensor, target: torch.Tensor) -> None:
        if x.dim() < 2 or x.shape[1] < 2:
            return
        check = self.loss_checks.setdefault(f"{name}@{line}", {"function": name, "line": line, "calls": 0,
                                                               "probabilities": 0, "log_probabilities": 0,
                                                               "softmax_grad_fn": 0})
        check["calls"] += 1
        check["softmax_grad_fn"] += type(x.grad_fn).__name__ == "SoftmaxBackward0"
        training, x = x.requires_grad, x.detach().float()
        rows_sum_to_one = bool(((x >= 0).all() & ((x.sum(1) - 1).abs() < 1e-3).all()))
        check["probabilities"] += rows_sum_to_one
        check["log_probabilities"] += bool(((x <= 1e-6).all() & (torch.logsumexp(x, 1).abs() < 1e-3).all()))
        if training and not target.is_floating_point():     # a training batch's class indices
            self._labels(target)

    def _labels(self, target: torch.Tensor) -> None:
        """How many classes each training batch holds (label-sorted data gives one per batch)."""
        if target.numel() < 4 or target.numel() > 1_000_000:
            return
        classes = target.detach().flatten().unique()
        if len(classes) > 50:
            return                                           # a regression target, not labels
        self.labels["calls"] += 1
        self.labels["single_class"] += len(classes) == 1
        if len(self.labels["sequence"]) < MAX_SERIES:        # each batch's class, or None for a mixed batch
            self.labels["sequence"].append(float(classes[0]) if len(classes) == 1 else None)
        self.labels["classes"].update(float(c) for c in classes[:50])

    # --- optimizer steps ------------------------------------------------------------------------

    @_safe
    def on_step_pre(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self.steps += 1
        if self.batch_loader in self.loaders:
            self.loaders[self.batch_loader]["steps"] += 1
        self.optimizers.setdefault(id(optimizer), optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for p in params:
            self.track(p).in_optimizer = True
        grads = [p.grad for p in params if p.grad is not None]
        with torch.no_grad():    # one device-to-host copy for all the norms
            norms = torch.stack([torch.linalg.vector_norm(g.to_dense() if g.is_sparse else g, dtype=torch.float32)
                                 .to(grads[0].device) for g in grads]).tolist() if grads else []
        if not any(n > 0 or not math.isfinite(n) for n in norms):
            self.no_grad_steps.append(self.steps)
            if self.backward_since_step:
                self.zeroed_before_step.append(self.steps)
        by_id = dict(zip([id(p) for p in params if p.grad is not None], norms))
        for p in params:
            if id(p) in self.stale and p.grad is not None:
                record = self.records[id(p)]
                record.carried_over += 1
                if record.first_carry_step is None:
                    record.first_carry_step = self.steps
        for p in params:
            if by_id.get(id(p), 0) != 0:
                self.records[id(p)].nonzero_grad_steps += 1
        weights = [id(p) for p in params if p.dim() >= 2] or [id(p) for p in params]
        for pid in weights:
            if pid not in self.norm_names:
                self.norm_names.append(pid)
        self.grad_norms.add(self.steps, [by_id.get(pid) for pid in self.norm_names])
        if "gradient" not in self.nonfinite and not all(math.isfinite(n) for n in norms):
            bad = next(pid for pid, n in by_id.items() if not math.isfinite(n))
            self.nonfinite["gradient"] = {"step": self.steps, "param": bad}
        half = grads if self.fp16["autocast_fp16_forwards"] else [g for g in grads if g.dtype == torch.float16]
        if half:
            self.fp16["half_grad_steps"] += 1
            if len(self.fp16["zero_fraction"]) < MAX_SERIES:
                zeros = sum(int((g == 0).sum()) for g in half) / sum(g.numel() for g in half)
                self.fp16["zero_fraction"].append(round(zeros, 4))
        for root_id, training in self.root_modes_since_step:
            if training:
                self.train_root_steps[root_id] += 1
            else:
                self.eval_root_steps[root_id].append(self.steps)
        self.root_modes_since_step = set()
        self.backward_since_step = 0

    @_safe
    def on_step_post(self, optimizer, args, kwargs) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.cuda_memory.add(self.steps, torch.cuda.memory_allocated())
        if self.steps % (10 if self.steps <= 100 else 50) == 0:
            self.graph_nodes.add(self.steps, _live_graph_nodes())
        if time.perf_counter() - self.last_flush > FLUSH_EVERY_S:
            self.write()
        if self.max_steps and self.steps >= self.max_steps:
            raise StepBudgetReached

    # --- data, checkpoints, warnings ------------------------------------------------------------

    @_safe
    def _loader_epoch(self, iterator, loader: DataLoader) -> None:
        entry = self.loaders.setdefault(id(loader), {"sampler": type(loader.sampler).__name__, "epochs": 0,
                                                     "steps": 0})
        entry["epochs"] += 1
        self.iterator_loader[id(iterator)] = id(loader)

    @_safe
    def _after_batch(self, batch, iterator) -> None:
        self.batch_loader = self.iterator_loader.get(id(iterator))       # the next step trains on its batch
        if "data" not in self.nonfinite:
            tensors = _floats(batch)
            if tensors and not _all_finite(tensors):
                self.nonfinite["data"] = {"step": self.steps + 1, "where": "a DataLoader batch"}

    @_safe
    def _before_sampler_epoch(self, sampler: DistributedSampler) -> None:
        entry = self.dist_samplers.setdefault(id(sampler), {"shuffle": sampler.shuffle, "epochs": []})
        entry["epochs"].append(sampler.epoch)

    @_safe
    def _after_load(self, loaded, *args, **kwargs) -> None:
        summary = {"step": self.steps, "optimizer_state": _holds_optimizer_state(loaded),
                   "keys": sorted(map(str, loaded))[:20] if isinstance(loaded, dict) else []}
        self.checkpoints["loads"].append(summary)

    @_safe
    def _before_save(self, obj, *args, **kwargs) -> None:
        self.checkpoints["saves"] += 1

    def _on_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        if len(self.warnings) < 50:
            self.warnings.append({"category": category.__name__, "message": str(message)[:500],
                                  "where": f"{Path(filename).name}:{lineno}"})
        self._show_warning(message, category, filename, lineno, file, line)

    # --- the evidence file ----------------------------------------------------------------------

    def names(self) -> tuple[dict[int, str], dict[int, str], dict[int, str]]:
        """Readable names: parameter id -> `Model.layer.weight`, module id -> `Model.layer`; and for the
        parameters of modules that ran but are not registered in any model, where they are kept
        (`Model.blocks (a plain list)`)."""
        param_names, module_names, unregistered = {}, {}, {}
        counts: dict[str, int] = defaultdict(int)
        for root in self.roots.values():
            inner = getattr(root, "_orig_mod", None) or getattr(root, "module", None)
            model = inner if isinstance(inner, nn.Module) else root
            label = type(model).__name__
            counts[label] += 1
            label += f"#{counts[label]}" if counts[label] > 1 else ""
            for name, module in model.named_modules():
                module_names.setdefault(id(module), f"{label}.{name}" if name else label)
            module_names.setdefault(id(root), label)
            for name, p in model.named_parameters():
                param_names.setdefault(id(p), f"{label}.{name}")
        kept = {mid: _container_of(module, self.roots.values(), module_names) for mid, module in self.modules.items()
                if mid not in module_names}
        for mid, place in kept.items():                     # a module found in a plain list, and its submodules
            if place:
                label, container = place
                for name, p in self.modules[mid].named_parameters():
                    param_names.setdefault(id(p), f"{label}.{name}")
                    unregistered.setdefault(id(p), container)
        for mid, module in self.modules.items():            # created elsewhere (in forward, in a global)
            for name, p in module.named_parameters(recurse=False):
                if id(p) not in param_names:
                    param_names[id(p)] = f"an unregistered {type(module).__name__}.{name}"
                    unregistered[id(p)] = f"an unregistered {type(module).__name__}"
        for k, pid in enumerate(self.records):
            param_names.setdefault(pid, f"parameter {tuple(self.records[pid].shape)} #{k}")
        return param_names, module_names, unregistered

    def evidence(self) -> dict:
        param_names, module_names, unregistered = self.names()
        params = []
        for pid, record in self.records.items():
            p = self.params[pid]
            params.append({"name": param_names[pid], **asdict(record), "container": unregistered.get(pid),
                           "changed": not torch.equal(p.detach(), self.initial[pid])})
        roots = []
        for rid, root in self.roots.items():
            trains = any(p.requires_grad and id(p) in self.records and self.records[id(p)].grad_arrivals
                         for p in root.parameters())
            roots.append({"name": module_names[rid], "trains": trains, "train_steps": self.train_root_steps[rid],
                          "eval_steps": self.eval_root_steps[rid][:MAX_SERIES],
                          "mode_dependent": [f"{module_names.get(id(m), '?')} ({type(m).__name__})"
                                             for m in root.modules() if isinstance(m, MODE_DEPENDENT)][:10]})
        nonfinite = {}
        for kind, event in self.nonfinite.items():
            event = dict(event)
            if "module" in event:
                event["module"] = module_names.get(event["module"], event.get("type", "a module"))
            if "param" in event:
                event["param"] = param_names.get(event["param"], "a parameter")
            nonfinite[kind] = event
        activations = {}
        for site, entry in self.activations.items():
            name = module_names.get(site, str(site)) if isinstance(site, int) else site
            activations[name] = {"kind": entry["kind"], "steps": entry["series"].steps, "values": entry["series"].values}
        labels = dict(self.labels, classes=len(self.labels["classes"]))
        return {
            "status": self.status, "crash": self.crash, "elapsed_s": round(time.perf_counter() - self.started, 3),
            "steps": self.steps, "backwards": self.backwards, "optimizers": len(self.optimizers),
            "optimizer_state": any(opt.state for opt in self.optimizers.values()),
            "params": params, "roots": roots,
            "no_grad_steps": self.no_grad_steps[:MAX_SERIES], "zeroed_before_step": self.zeroed_before_step[:MAX_SERIES],
            "grad_norms": {"names": [param_names[pid] for pid in self.norm_names], "steps": self.grad_norms.steps,
                           "values": self.grad_norms.values},
            "losses": {"steps": self.losses.steps, "values": self.losses.values},
            "nonfinite": nonfinite, "loss_checks": list(self.loss_checks.values()),
            "broadcasts": [dict(entry, line=line) for line, entry in self.broadcasts.items()],
            "labels": labels, "loaders": list(self.loaders.values()), "dist_samplers": list(self.dist_samplers.values()),
            "activations": activations, "fp16": self.fp16, "checkpoints": self.checkpoints,
            "eval_graph_forwards": self.eval_graph_forwards,
            "eval_graph_unused": self.eval_graph_unused + self.pending_eval_graphs,
            "graph_nodes": {"steps": self.graph_nodes.steps, "values": self.graph_nodes.values},
            "cuda_memory": {"steps": self.cuda_memory.steps, "values": self.cuda_memory.values},
            "dynamo": _dynamo_counters(), "warnings": self.warnings, "observer_errors": self.observer_errors,
        }

    def write(self) -> None:
        """Write the evidence atomically (a reader never sees half a file)."""
        if os.getpid() != self.pid:                          # a forked DataLoader worker
            return
        self.last_flush = time.perf_counter()
        partial = self.out.with_suffix(".partial")
        partial.write_text(json.dumps(self.evidence(), default=str))
        os.replace(partial, self.out)


def _single_process_defaults() -> None:
    """A script written for torchrun, run as `python script.py`: when it calls init_process_group without
    torchrun's environment variables, give it a one-process group (RANK=0, WORLD_SIZE=1) rather than a
    crash. Set only at that call, so a script that checks `"RANK" in os.environ` runs as it would alone."""
    import torch.distributed as dist
    if not dist.is_available():
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if "RANK" not in os.environ and not kwargs.get("init_method") and "store" not in kwargs:
            import socket
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
                os.environ.setdefault(key, value)
        return original(*args, **kwargs)
    dist.init_process_group = init_process_group


def _holds_optimizer_state(obj, depth: int = 0) -> bool:
    """Does a loaded checkpoint hold an optimizer's `state_dict()` (a dict with `state` and `param_groups`)?"""
    if not isinstance(obj, dict) or depth > 3:
        return False
    if "state" in obj and "param_groups" in obj:
        return True
    return any(_holds_optimizer_state(v, depth + 1) for v in obj.values())


def _container_of(module: nn.Module, roots, module_names: dict[int, str]) -> tuple[str, str] | None:
    """Where a module that is not registered is kept: a plain list, tuple or dict attribute of a model.
    Returns (`Model.blocks[1]`, `Model.blocks (a plain list)`), or None."""
    for root in roots:
        for owner in root.modules():
            for attr, value in vars(owner).items():
                items = value.items() if isinstance(value, dict) else enumerate(value) \
                    if isinstance(value, (list, tuple)) else ()
                for key, item in items:
                    if item is module:
                        kind = {dict: "dict", tuple: "tuple"}.get(type(value), "list")
                        key = f"'{key}'" if isinstance(key, str) else key
                        where = f"{module_names.get(id(owner), type(owner).__name__)}.{attr}"
                        return f"{where}[{key}]", f"{where} (a plain {kind})"
    return None


def _live_graph_nodes(limit: int = 200_000) -> int:
    """Autograd graph nodes reachable from live tensors: graphs a script keeps alive after backward
    (a `total += loss`, a list of losses) make this grow step after step."""
    import gc
    seen: set[int] = set()
    stack = []
    with warnings.catch_warnings():            # isinstance() on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.grad_fn is not None:
                    stack.append(obj.grad_fn)
            except ReferenceError:             # a weakref.proxy whose object is gone
                continue
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def _dynamo_counters() -> dict:
    """torch._dynamo's counters (compiled graphs, recompiles), when the script used torch.compile."""
    if "torch._dynamo" not in sys.modules:
        return {}
    from torch._dynamo.utils import counters
    return {group: dict(values) for group, values in counters.items() if group in ("stats", "frames", "recompiles")}


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    max_steps = None
    if rest[:1] == ["--max-steps"]:
        max_steps, rest = int(rest[1]), rest[2:]
    script, script_args = rest[0], rest[1:]
    observer = Observer(out, max_steps)

    def stop(signum, frame):
        if os.getpid() == observer.pid:
            observer.status = "stopped at the timeout"
            observer.write()
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    _single_process_defaults()
    sys.argv = [script, *script_args]
    sys.path[0] = str(Path(script).resolve().parent)         # as `python SCRIPT` would have it
    observer.install()
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
        observer.status = "finished"
    except StepBudgetReached:
        observer.status = f"stopped after {observer.steps} optimizer steps (the step budget)"
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        observer.status = "finished" if code == 0 else f"exited with code {code}"
    except BaseException:  # noqa: BLE001 - the script's own crash is evidence, reported and re-printed
        observer.status, observer.crash, code = "crashed", traceback.format_exc(), 1
        traceback.print_exc()
    finally:
        observer.write()
    return code


if __name__ == "__main__":
    # Run a copy of this module registered under its own name, not `__main__`: the script becomes
    # `__main__`, and torch.compile, tracing through the hooks, looks their globals up by module name.
    import importlib.util
    spec = importlib.util.spec_from_file_location("course_utils_observe", __file__)
    observe = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(observe)
    sys.exit(observe.main(sys.argv[1:]))
