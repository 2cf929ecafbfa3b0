"""Argument checks shared by the public helpers: a wrong argument fails at once, naming the
argument, what it got and what to pass, instead of deep inside PyTorch."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def module(value: Any, name: str = "model") -> nn.Module:
    if not isinstance(value, nn.Module):
        hint = " (a tensor: did you swap the arguments?)" if isinstance(value, torch.Tensor) else ""
        raise TypeError(f"{name} must be an nn.Module, got {_kind(value)}{hint}")
    return value


def tensor(value: Any, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        hint = " (an nn.Module: did you swap the arguments?)" if isinstance(value, nn.Module) else ""
        raise TypeError(f"{name} must be a tensor, got {_kind(value)}{hint}")
    return value


def positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def callable_(value: Any, name: str) -> Callable:
    if not callable(value) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a function to call, got {_kind(value)}")
    return value


def existing_file(path: str | os.PathLike, name: str, what: str) -> Path:
    """`path` must name an existing file (not a folder)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{name} is a folder ({path}); give the path of {what}")
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no {what} at {path.resolve()}")
    return path


def writable_file(path: str | os.PathLike, name: str) -> Path:
    """`path` may be created or replaced: it must not be a folder."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{name} is a folder ({path}); give a file name inside it, e.g. {path / 'model.pt'}")
    return path


def device(value: Any, name: str = "device") -> torch.device:
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{name} must be a device such as 'cpu', 'cuda', 'cuda:0' or 'mps', got {value!r}") from error
