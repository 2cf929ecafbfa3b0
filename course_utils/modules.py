"""Chapter 2: finding modules and tensors that an `nn.Module` holds but does not register, and the
check of the chapter's module exercise."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from course_utils import _checks
from course_utils.exercises import Verdict, reference_solution, report_check

# Attributes every nn.Module has that are not user state.
_INTERNAL = {"training"}


def _containers(value: object, path: str) -> Iterator[tuple[str, object]]:
    """Yield (dotted path, leaf) for each nn.Module / Tensor inside plain list/tuple/dict nesting."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _containers(item, f"{path}.{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _containers(item, f"{path}.{key}")


def _static_scan(model: nn.Module) -> list[tuple[str, object]]:
    found = []
    registered_tensors = {id(t) for t in (*model.parameters(), *model.buffers())}
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_") or attr in _INTERNAL:
                continue
            path = f"{prefix}.{attr}" if prefix else attr
            if isinstance(value, torch.Tensor):
                if id(value) not in registered_tensors:  # an alias of a parameter (tying) is fine
                    found.append((path, value))  # a plain tensor attribute: should be a buffer
            elif isinstance(value, (list, tuple, dict)):
                found.extend(_containers(value, path))
    return found


def find_unregistered_modules(model: nn.Module, *example_inputs: object) -> list[str]:
    """Dotted paths of state that `model` holds but PyTorch does not see.

    Reported: `nn.Module`s and `nn.Parameter`s kept in plain lists, tuples or dicts (nested too),
    in `model` or any registered child, e.g. `"layers.0"`; plain tensor attributes that should
    have been registered with `register_buffer`, e.g. `"mask"`. None of these are in
    `parameters()` / `state_dict()` or moved by `.to()`.

    With `example_inputs`, also runs one forward pass (eval mode, no grad; the mode is restored)
    with a global forward pre-hook and reports modules that ran without being part of `model`,
    e.g. one built inside `forward`, as `"<forward>:Linear"`. Empty list for a healthy model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    static = _static_scan(model)
    found = [path for path, _ in static]
    if example_inputs:
        found += _runtime_scan(model, example_inputs, already={id(v) for _, v in static})
    return found


def _runtime_scan(model: nn.Module, inputs: tuple, already: set[int]) -> list[str]:
    registered = {id(m) for m in model.modules()}
    ran: list[nn.Module] = []

    def record(module: nn.Module, _args: tuple) -> None:
        if id(module) not in registered and id(module) not in already and module not in ran:
            ran.append(module)

    was_training = model.training
    handle = nn.modules.module.register_module_forward_pre_hook(record)
    try:
        model.eval()
        with torch.no_grad():
            model(*inputs)
    finally:
        handle.remove()
        model.train(was_training)
    # only report the outermost stray modules (their children ran inside them)
    inner = {id(child) for m in ran for child in m.modules() if child is not m}
    return [f"<forward>:{type(m).__name__}" for m in ran if id(m) not in inner]


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter reachable from `model`, registered or not, keyed by dotted path."""
    _checks.module(model)
    tensors = {name: p.detach().clone() for name, p in model.named_parameters()}
    for path, value in _static_scan(model):
        if isinstance(value, nn.Module):
            tensors.update({f"{path}.{n}": p.detach().clone() for n, p in value.named_parameters()})
        elif isinstance(value, nn.Parameter):
            tensors[path] = value.detach().clone()
    return tensors


def unchanged(model: nn.Module, before: dict[str, torch.Tensor], names: list[str] | None = None) -> bool:
    """True if every parameter in `before` (or only those under the paths in `names`) is unchanged."""
    now = snapshot(model)
    keys = [k for k in before if names is None or any(k == n or k.startswith(n + ".") for n in names)]
    if not keys:
        raise ValueError(f"no parameter of the snapshot lies under {names}")
    return all(torch.equal(before[k], now[k]) for k in keys)


# --- exercise -------------------------------------------------------------------------------

class _NormalisedMLP(nn.Module):
    """(N, sizes[0]) -> (N, sizes[-1]): standardise the input with a fixed mean and std, then an MLP."""

    def __init__(self, sizes: list[int], mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-2], sizes[1:-1]))
        self.head = nn.Linear(sizes[-2], sizes[-1])
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


@reference_solution("build_normalised_mlp", chapter=2)
def _build_normalised_mlp(sizes: list[int], mean: torch.Tensor, std: torch.Tensor) -> nn.Module:
    return _NormalisedMLP(sizes, mean, std)


def check_build_normalised_mlp(fn: Callable) -> Verdict:
    """Exercise: `fn(sizes, mean, std)` builds a model whose every Linear layer is trained and saved,
    and whose `mean` / `std` are saved and moved with it but are not parameters (sizes [4, 16, 16, 1])."""
    sizes = [4, 16, 16, 1]
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4, generator=generator) * 3 + 2
    y = x.sum(dim=1, keepdim=True)
    mean, std = x.mean(dim=0), x.std(dim=0)
    expected_tensors = 2 * (len(sizes) - 1)
    observed = None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            model = fn(sizes, mean.clone(), std.clone())
        problems = []
        parameters = list(model.parameters())
        if len(parameters) != expected_tensors:
            problems.append(f"parameters() holds {len(parameters)} tensors; {len(sizes) - 1} Linear layers "
                            f"have {expected_tensors} (a weight and a bias each)")
        state = model.state_dict()
        unsaved = []
        for name, value in (("mean", mean), ("std", std)):
            as_parameter = [p for p in parameters if p.shape == value.shape and torch.equal(p.detach(), value)]
            if as_parameter and as_parameter[0].requires_grad:
                problems.append(f"`{name}` is a trainable parameter: every optimizer step would change the "
                                "normalisation")
            elif as_parameter:
                problems.append(f"`{name}` is a parameter (frozen with requires_grad=False): it is saved and moved, "
                                "but every optimizer built from model.parameters() receives it, and "
                                "model.requires_grad_() would make it trainable")
            elif not any(v.shape == value.shape and torch.equal(v, value) for v in state.values()):
                unsaved.append(f"`{name}`")
        if unsaved:
            problems.append(f"{' and '.join(unsaved)} {'is' if len(unsaved) == 1 else 'are'} not in state_dict() "
                            f"(its keys: {', '.join(state) or 'none'}): not saved, not moved by .to()")
        if parameters:
            before = snapshot(model)
            optimizer = torch.optim.SGD(parameters, lr=0.01)
            for _ in range(20):
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            now = snapshot(model)
            frozen = sorted({k.rsplit(".", 1)[0] for k in before if torch.equal(before[k], now[k])})
            if frozen:
                problems.append(f"in 20 training steps these layers did not change: {', '.join(frozen)}")
        observed = "; ".join(problems) or None
    except Exception as error:  # the learner's bug, reported rather than raised
        observed = f"your function raised {type(error).__name__}: {error}"
    return report_check("build_normalised_mlp", observed is None, observed,
                        ["compare model.parameters() and model.state_dict().keys() with what the model "
                         "holds, as section 4 did by hand",
                         "nn.Module registers what you assign as a Module, a Parameter or a buffer; a plain "
                         "Python list or a plain tensor is none of these"])
