"""Chapter 2: finding modules and tensors that an `nn.Module` holds but does not register."""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from course_utils import _checks

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
