"""Chapter 7 exercises (the broken project): write by hand the probes that `diagnose` runs.

Course scaffolding, not a tool a practitioner keeps: `course_utils.observe` holds the real observer.
Each exercise is a few lines of plain PyTorch hooks or checks that find one of the project's silent
bugs: parameters that run but are never updated, gradients that leak from one step into the next, an
evaluation that leaves the model in the wrong mode, probabilities fed to a loss that wants logits.
Each check runs the learner's function on models and training steps the chapter did not show (two
parameter groups, a frozen part, gradient accumulation, `zero_grad(set_to_none=False)`, a backbone
kept in eval mode) and returns a `Verdict`; a function that raises gets a failed verdict, never a
crash, and a hook the learner's code leaves behind is removed by the check after it has been reported.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

from course_utils.exercises import Verdict, _raised, _seeded, reference_solution, report_check

__all__ = ["check_accuracy_restoring_modes", "check_leaks_gradients", "check_outputs_are_probabilities",
           "check_parameters_left_out"]


_GLOBAL_HOOKS = [  # PyTorch's registries of global hooks (private: only the learner's code holds the handles)
    module_hooks._global_forward_pre_hooks, module_hooks._global_forward_hooks,
    module_hooks._global_backward_pre_hooks, module_hooks._global_backward_hooks,
    optimizer_hooks._global_optimizer_pre_hooks, optimizer_hooks._global_optimizer_post_hooks,
]


class _HooksLeft:
    """Counts the hooks a call leaves installed, globally and on `tensors` and `optimizers`, and removes
    the global ones afterwards (left in place, they would run on every model of the learner's kernel).
    `where` says in words where they were left ("" when none was)."""

    def __init__(self, tensors: Iterable[torch.Tensor] = (), optimizers: Iterable[torch.optim.Optimizer] = ()):
        self.tensors, self.optimizers = list(tensors), list(optimizers)

    def _count(self) -> tuple[int, int]:
        on_tensors = sum(len(t._backward_hooks or {}) + len(getattr(t, "_post_accumulate_grad_hooks", None) or {})
                         for t in self.tensors)
        on_optimizers = sum(len(o._optimizer_step_pre_hooks) + len(o._optimizer_step_post_hooks)
                            for o in self.optimizers)
        return on_tensors, on_optimizers

    def __enter__(self) -> _HooksLeft:
        self.before = [set(registry) for registry in _GLOBAL_HOOKS]
        self.local_before = self._count()
        self.left, self.where = 0, ""
        return self

    def __exit__(self, *exc) -> None:
        tensors, optimizers = (max(0, n - m) for n, m in zip(self._count(), self.local_before))
        global_ = 0
        for registry, before in zip(_GLOBAL_HOOKS, self.before):
            for key in set(registry) - before:
                del registry[key]
                global_ += 1
                for extra in (module_hooks._global_forward_hooks_always_called,
                              module_hooks._global_forward_hooks_with_kwargs):
                    extra.pop(key, None)
        self.left = tensors + optimizers + global_
        self.where = ", ".join(f"{n} {place}" for n, place in ((tensors, "on the parameters"),
                                                               (optimizers, "on the optimizer"),
                                                               (global_, "global (the check removed them)")) if n)


def _hooks_left(context: str, hooks: _HooksLeft) -> str:
    """What a check observed when the learner's function left hooks installed."""
    return f"{context}: after your function returned, hooks were still installed: {hooks.where}"


def _not_a_bool(got) -> str:
    return (f"it returned {type(got).__name__} {got!r}, expected True or False (`bool(...)` turns a one-element "
            "tensor into one)")


# --- exercise 1: parameters that run but are never updated --------------------------------------

@reference_solution("parameters_left_out", chapter=7)
def _parameters_left_out(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> list[torch.Tensor]:
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    left_out: dict[int, torch.Tensor] = {}

    def record(module, args, output):
        for p in module.parameters(recurse=False):
            if p.requires_grad and id(p) not in held:
                left_out.setdefault(id(p), p)

    handle = module_hooks.register_module_forward_hook(record)
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return list(left_out.values())


class _Listed(nn.Module):
    """The project's bug: two blocks in a plain list (they run, but are not registered), a head that is; the
    second block is applied twice (one module at two depths, as weight sharing does)."""

    def __init__(self):
        super().__init__()
        self.blocks = [nn.Sequential(nn.Linear(6, 12), nn.ReLU()), nn.Sequential(nn.Linear(12, 12), nn.ReLU())]
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        for block in (self.blocks[0], self.blocks[1], self.blocks[1]):
            x = block(x)
        return self.head(x)

    def labels(self) -> dict[int, str]:
        names = {id(p): f"blocks[{i}].{name}" for i, block in enumerate(self.blocks)
                 for name, p in block.named_parameters()}
        return names | {id(p): f"head.{name}" for name, p in self.head.named_parameters()}


class _BackboneAndHead(nn.Module):
    """(N, 6) -> (N, 3); `spare` is registered but never called (an auxiliary head switched off)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh())
        self.head = nn.Linear(12, 3)
        self.spare = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(self.backbone(x))


def _left_out_cases() -> list[tuple[str, nn.Module, torch.optim.Optimizer, dict[int, str]]]:
    """(description, model, optimizer, parameter labels), each with its own seed."""
    listed = _seeded(1, _Listed)
    groups, head_only, frozen = (_seeded(seed, _BackboneAndHead) for seed in (2, 3, 4))
    frozen.backbone.requires_grad_(False)
    trainable = [p for p in frozen.parameters() if p.requires_grad]
    cases = [
        ("blocks held in a plain list (the second applied twice), optimizer given model.parameters()", listed,
         torch.optim.SGD(listed.parameters(), lr=0.1)),
        ("every parameter in the optimizer, in two groups (the head at a higher learning rate)", groups,
         torch.optim.SGD([{"params": groups.backbone.parameters()},
                          {"params": [*groups.head.parameters(), *groups.spare.parameters()], "lr": 0.5}], lr=0.1)),
        ("an optimizer given only model.head (model.spare never runs)", head_only,
         torch.optim.Adam(head_only.head.parameters(), lr=1e-3)),
        ("a backbone frozen with requires_grad_(False), the optimizer given the parameters that train", frozen,
         torch.optim.Adam(trainable, lr=1e-3)),
    ]
    return [(description, model, optimizer,
             model.labels() if isinstance(model, _Listed) else {id(p): n for n, p in model.named_parameters()})
            for description, model, optimizer in cases]


def check_parameters_left_out(fn: Callable) -> Verdict:
    """Exercise: `fn(model, optimizer, x)` returns each parameter (the tensor itself) that requires a
    gradient, belongs to a module that ran in `model(x)`, and that `optimizer` does not hold: once
    each, in any order (a list, a tuple, a set); it leaves no hook installed and changes no parameter.
    Checked on four models: blocks in a plain list, two parameter groups, an optimizer given only the
    head (beside a registered module that never runs), and a backbone frozen with requires_grad."""
    name = "parameters_left_out"
    hints = ["`p in some_list` compares tensors with `==` (element by element) once identity fails; "
             "compare identities: `id(p)`",
             "`register_module_forward_hook` returns a handle; until `handle.remove()` the hook runs for "
             "every module of every model (a `try/finally` removes it even when the forward raises)",
             "an optimizer can hold several parameter groups: `optimizer.param_groups` is a list of them"]
    x = _seeded(4, lambda: torch.randn(5, 6))
    for description, model, optimizer, labels in _left_out_cases():
        before = [p.detach().clone() for p in model.parameters()]
        expected = _parameters_left_out(model, optimizer, x)
        try:
            with _HooksLeft() as hooks:
                got = fn(model, optimizer, x)
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        if got is None:
            return report_check(name, False, None, hints)
        if hooks.left:
            return report_check(name, False, _hooks_left(description, hooks) + " (a global one runs on every "
                                "module of every model from then on)", hints)
        if not all(torch.equal(p, q) for p, q in zip(model.parameters(), before)):
            return report_check(name, False, f"{description}: a parameter changed during your function", hints)
        if isinstance(got, torch.Tensor) or not isinstance(got, Iterable):
            return report_check(name, False, f"{description}: it returned {type(got).__name__}, expected a list "
                                "of the parameter tensors themselves", hints)
        got = list(got)
        got_ids, want_ids = [id(p) for p in got], {id(p) for p in expected}
        if len(got_ids) != len(set(got_ids)) or set(got_ids) != want_ids:
            shown = sorted(labels.get(i, "something that is not one of this model's parameters") for i in got_ids)
            want = sorted(labels[i] for i in want_ids)
            return report_check(name, False, f"{description}: it returned {shown or 'nothing'}, but the "
                                f"parameters that run, require a gradient and are never updated are "
                                f"{want or 'none'}", hints)
    return report_check(name, True, None, hints)


# --- exercise 2: gradients that leak from one optimizer step into the next ---------------------

@reference_solution("leaks_gradients", chapter=7)
def _leaks_gradients(train_step: Callable, model: nn.Module, optimizer: torch.optim.Optimizer,
                     batches: Iterable) -> bool:
    stepped: set[int] = set()      # parameters an optimizer step used since their last gradient arrived
    leaked = False

    def after_step(opt, args, kwargs):
        stepped.update(id(p) for group in opt.param_groups for p in group["params"])

    def on_gradient(p, grad):      # a leaf's hook runs before the new gradient is added into p.grad
        nonlocal leaked
        if id(p) in stepped and p.grad is not None and bool(p.grad.any()):
            leaked = True
        stepped.discard(id(p))

    handles = [p.register_hook(lambda grad, p=p: on_gradient(p, grad)) for p in model.parameters()]
    handles.append(optimizer.register_step_post_hook(after_step))
    try:
        for batch in batches:
            train_step(batch)
    finally:
        for handle in handles:
            handle.remove()
    return leaked


def _step_problem(seed: int, adam: bool = False):
    """A seeded 6 -> 16 -> 3 classifier, its optimizer and 6 batches of 8."""
    def build():
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(6)]
        return model, batches
    model, batches = _seeded(seed, build)
    optimizer = (torch.optim.Adam(model.parameters(), lr=1e-3) if adam
                 else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    return model, optimizer, batches


def _training_steps(kind: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable:
    """A `train_step(batch)` written one of several ways, right or wrong."""
    count = [0]

    def loss_of(batch):
        inputs, targets = batch
        return nn.functional.cross_entropy(model(inputs), targets)

    def step(batch):
        count[0] += 1
        if kind == "zero_grad first":
            optimizer.zero_grad()
            loss_of(batch).backward()
            optimizer.step()
        elif kind == "model.zero_grad() first":
            model.zero_grad()
            loss_of(batch).backward()
            optimizer.step()
        elif kind == "no zero_grad":
            loss_of(batch).backward()
            optimizer.step()
        elif kind == "zero_grad(set_to_none=False) after the step":
            loss_of(batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        elif kind.startswith("accumulating 2 micro-batches"):
            (loss_of(batch) / 2).backward()
            if count[0] % 2 == 0:
                optimizer.step()
                if kind.endswith("then zero_grad"):
                    optimizer.zero_grad()
    return step


STEP_CASES = {  # how the step is written -> does it leak gradients?
    "zero_grad first": False,
    "model.zero_grad() first": False,
    "no zero_grad": True,
    "zero_grad(set_to_none=False) after the step": False,
    "accumulating 2 micro-batches per step, then zero_grad": False,
    "accumulating 2 micro-batches per step, never zero_grad": True,
}


def check_leaks_gradients(fn: Callable) -> Verdict:
    """Exercise: `fn(train_step, model, optimizer, batches)` calls `train_step(batch)` for each batch and
    returns True when a backward pass adds its gradient onto one an optimizer step already used (a
    missing `zero_grad`), False otherwise: gradient accumulation on purpose and
    `zero_grad(set_to_none=False)` are not leaks. It leaves no hook on the parameters, the optimizer or
    anywhere else. Checked on six training steps with SGD (momentum) and with Adam."""
    name = "leaks_gradients"
    hints = ["every `register_*` returns a handle: remove each one, the optimizer's too",
             "`zero_grad(set_to_none=False)` leaves `p.grad` a tensor of zeros, not None",
             "several backward passes before one step is gradient accumulation, on purpose: a step's mark on a "
             "parameter is used up once that parameter's next gradient has arrived"]
    for adam in (False, True):
        for kind, leaks in STEP_CASES.items():
            model, optimizer, batches = _step_problem(5 + adam, adam)
            try:
                with _HooksLeft(model.parameters(), [optimizer]) as hooks:
                    got = fn(_training_steps(kind, model, optimizer), model, optimizer, batches)
            except Exception as error:  # the learner's code: report it, never crash
                return report_check(name, False, f"for a step written '{kind}': {_raised(error)}", hints)
            if got is None:
                return report_check(name, False, None, hints)
            if hooks.left:
                return report_check(name, False, _hooks_left(f"for a step written '{kind}'", hooks), hints)
            if not isinstance(got, bool):
                return report_check(name, False, _not_a_bool(got), hints)
            if got is not leaks:
                optimizer_name = type(optimizer).__name__
                return report_check(name, False, f"for a step written '{kind}' ({optimizer_name}) it returned "
                                    f"{got!r}; that step {'does' if leaks else 'does not'} leak gradients "
                                    "into the next step", hints)
    return report_check(name, True, None, hints)


# --- exercise 3: an evaluation that leaves every module in the mode it found it ----------------

@reference_solution("accuracy_restoring_modes", chapter=7)
def _accuracy_restoring_modes(model: nn.Module, loader: Iterable) -> float:
    modes = {module: module.training for module in model.modules()}
    model.eval()
    correct = total = 0
    try:
        with torch.no_grad():
            for images, labels in loader:
                correct += (model(images).argmax(dim=1) == labels).sum().item()
                total += len(labels)
    finally:
        for module, training in modes.items():
            module.train(training)
    return correct / total


def _classifier() -> nn.Sequential:
    """(N, 8) -> (N, 4) logits, with BatchNorm and Dropout (both behave differently in eval mode)."""
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))


def _evaluation_cases() -> list[tuple[str, nn.Module, list]]:
    def build(seed: int, mode: str):
        model = _classifier()
        x = torch.randn(100, 8)
        labels = (x[:, :4] + 0.3 * torch.randn(100, 4)).argmax(dim=1)
        with torch.no_grad():          # running statistics as if it had trained: eval differs from train
            model(torch.randn(64, 8) * 3 + 1)
        if mode == "eval":
            model.eval()
        elif mode == "frozen backbone":
            model[:3].eval()           # fine-tuning: BatchNorm's statistics kept fixed, the head trains
        sizes = [16] * 6 + [4]         # a last batch of 4 samples
        batches, start = [], 0
        for size in sizes:
            batches.append((x[start:start + size], labels[start:start + size]))
            start += size
        return model, batches
    return [(f"a model in {mode} mode" if mode != "frozen backbone" else
             "a model in training mode whose backbone (model[:3], with BatchNorm) is kept in eval mode",
             *_seeded(seed, lambda: build(seed, mode)))
            for seed, mode in ((6, "training"), (7, "eval"), (8, "frozen backbone"))]


def check_accuracy_restoring_modes(fn: Callable) -> Verdict:
    """Exercise: `fn(model, loader)` returns the fraction of samples whose largest logit is the label
    (a float), computed with every module in eval mode and without recording a graph, and leaves each
    module in the mode it found it. Checked on a model in training mode, one in eval mode, and one whose
    BatchNorm backbone is kept in eval mode while the head trains; batches of 16 and a last one of 4."""
    name = "accuracy_restoring_modes"
    hints = ["the logits are (N, C): the predicted class is the largest along the class axis",
             "a forward pass under `torch.no_grad()` (or `torch.inference_mode()`) records no graph",
             "`model.train()` sets *every* submodule to training mode, whatever mode each was in before",
             "record `{m: m.training for m in model.modules()}` first and give each module its own mode back"]
    for description, model, batches in _evaluation_cases():
        modes = [m.training for m in model.modules()]
        expected = _accuracy_restoring_modes(copy.deepcopy(model), batches)
        statistics = model[1].running_mean.clone()
        recorded, grad_mode = [], torch.is_grad_enabled()
        trainable = [p.requires_grad for p in model.parameters()]
        handle = model.register_forward_hook(lambda m, args, out: recorded.append(out.requires_grad))
        try:
            try:
                with _HooksLeft() as hooks:
                    got = fn(model, batches)
            finally:
                handle.remove()
                grad_mode_after = torch.is_grad_enabled()
                torch.set_grad_enabled(grad_mode)
        except Exception as error:  # the learner's code: report it, never crash
            return report_check(name, False, f"{description}: {_raised(error)}", hints)
        if got is None:
            return report_check(name, False, None, hints)
        if hooks.left:
            return report_check(name, False, _hooks_left(description, hooks), hints)
        if grad_mode_after != grad_mode:
            return report_check(name, False, f"{description}: afterwards autograd was switched off for the whole "
                                "program (the check switched it back on): a `with` block ends what it starts", hints)
        if [p.requires_grad for p in model.parameters()] != trainable:
            for p, flag in zip(model.parameters(), trainable):
                p.requires_grad_(flag)
            return report_check(name, False, f"{description}: afterwards some parameters no longer required a "
                                "gradient: the training that follows would not update them", hints)
        changed = [f"model[{i - 1}]" if i else "model" for i, (m, was) in enumerate(zip(model.modules(), modes))
                   if m.training != was]
        if changed:
            return report_check(name, False, f"{description}: afterwards {', '.join(changed)} "
                                f"{'was' if len(changed) == 1 else 'were'} in another mode than before", hints)
        if not torch.equal(model[1].running_mean, statistics):
            return report_check(name, False, f"{description}: BatchNorm's running statistics changed during your "
                                "function: it ran the batches in training mode", hints)
        if any(recorded):
            return report_check(name, False, f"{description}: the forward passes recorded a graph for a backward "
                                "pass that never comes", hints)
        if isinstance(got, torch.Tensor):
            return report_check(name, False, f"{description}: it returned a tensor ({got!r}); return a Python "
                                "number (`.item()`)", hints)
        if not isinstance(got, (float, int)) or isinstance(got, bool) or abs(got - expected) > 1e-9:
            return report_check(name, False, f"{description}: it returned {got!r}; in eval mode the model "
                                f"classifies {expected:.2f} of the samples right", hints)
    return report_check(name, True, None, hints)


# --- exercise 4: probabilities where the loss wants logits --------------------------------------

@reference_solution("outputs_are_probabilities", chapter=7)
def _outputs_are_probabilities(model: nn.Module, x: torch.Tensor) -> bool:
    with torch.no_grad():
        out = model(x)
    rows = out.sum(dim=1)
    return bool((out >= 0).all() and torch.allclose(rows, torch.ones_like(rows), atol=1e-4))


class _Head(nn.Module):
    """(N, 10) -> (N, 5) scores, finished by `last` (softmax, log_softmax, sigmoid, ... or nothing)."""

    def __init__(self, last: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.linear = nn.Linear(10, 5)
        self.last = last

    def forward(self, x):
        return self.last(self.linear(x))


def _rows_scaled(z: torch.Tensor) -> torch.Tensor:
    """Softmax rows scaled by 1, 0.5, 1.5, 1, 0.5, ...: over 64 rows the factors average exactly 1."""
    factors = torch.tensor([1.0, 0.5, 1.5])[torch.arange(len(z)) % 3]
    return z.softmax(dim=1) * factors[:, None]


# (what the head gives, the head, whether its rows are probabilities: True, False, or "only for a batch of one")
PROBABILITY_CASES: Sequence[tuple[str, Callable, bool | str]] = [
    ("logits (a plain Linear head)", lambda z: z, False),
    ("softmax over the classes (dim=1)", lambda z: z.softmax(dim=1), True),
    ("log_softmax over the classes", lambda z: z.log_softmax(dim=1), False),
    ("sigmoid (multi-label scores, rows do not sum to 1)", torch.sigmoid, False),
    ("softmax over the batch (dim=0)", lambda z: z.softmax(dim=0), False),
    ("softmax over the classes, then float64", lambda z: z.softmax(dim=1).double(), True),
    ("scores shifted so that each row sums to 1 (some of them negative)",
     lambda z: z - z.mean(dim=1, keepdim=True) + 0.2, False),
    ("softmax times 1.001 (each row sums to 1.001)", lambda z: z.softmax(dim=1) * 1.001, False),
    ("softmax with its rows scaled by 1, 0.5, 1.5, ... (the first row sums to 1, the rows average 1)", _rows_scaled,
     "only for a batch of one"),
]


def check_outputs_are_probabilities(fn: Callable) -> Verdict:
    """Exercise: `fn(model, x)` returns True when every row of `model(x)` (N, C) is a probability
    distribution (no negative entry, sums to 1 within 1e-4), what `nn.CrossEntropyLoss` must not be
    given, and False otherwise. Checked on nine heads and batches of 64 and 1."""
    name = "outputs_are_probabilities"
    hints = ["what must sum to 1 is each row (one sample's scores over the classes), not the whole batch",
             "floating-point sums are rarely exactly 1: compare within a tolerance "
             "(`torch.allclose(sums, torch.ones_like(sums), atol=1e-4)`, which also keeps the dtype)",
             "the question is about what the model returns: do not transform it before looking",
             "a probability is never negative, whatever the row sums to"]
    for n in (64, 1):
        for description, last, expected in PROBABILITY_CASES:
            expected = n == 1 if expected == "only for a batch of one" else expected
            model = _seeded(9, lambda: _Head(last))
            x = _seeded(10 + n, lambda: torch.randn(n, 10) * 3)
            try:
                with _HooksLeft():
                    got = fn(model, x)
            except Exception as error:  # the learner's code: report it, never crash
                return report_check(name, False, f"for {description}: {_raised(error)}", hints)
            if got is None:
                return report_check(name, False, None, hints)
            if not isinstance(got, bool):
                return report_check(name, False, _not_a_bool(got), hints)
            if got is not expected:
                with torch.no_grad():
                    out = model(x)
                rows = out.sum(dim=1)
                seen = (f"its smallest entry is {out.min().item():.3g} and its rows sum to "
                        + (f"{rows.min().item():.7g}" if len(rows) == 1 else
                           f"between {rows.min().item():.7g} and {rows.max().item():.7g}"))
                return report_check(name, False, f"for a head giving {description}, batch of {n} ({seen}), it "
                                    f"returned {got!r}; expected {expected}", hints)
    return report_check(name, True, None, hints)
