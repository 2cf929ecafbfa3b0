"""One exercise protocol for every chapter.

A learner's cell defines a function decorated with `@exercise` whose body is `...`; a
`check_*` function in the chapter's topic module tests it, prints what it got, what it
expected and a hint, and returns a bool. Reference solutions live beside the checks,
registered with `@reference_solution`. With `COURSE_SOLUTIONS=1` in the environment (the
test command sets it) `@exercise` swaps in the reference, and a failing check raises, so
CI proves every exercise is solvable and every check is right.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)
SOLUTIONS_ENV = "COURSE_SOLUTIONS"
_REFERENCES: dict[str, Callable] = {}


def solutions_in_place() -> bool:
    """True when the reference solutions replace the learner's code (CI)."""
    return os.environ.get(SOLUTIONS_ENV, "") == "1"


def reference_solution(name: str) -> Callable[[F], F]:
    """Register the decorated function as the reference solution of exercise `name`."""
    def register(fn: F) -> F:
        _REFERENCES[name] = fn
        return fn
    return register


def exercise(fn: F) -> F:
    """Mark a learner's function as an exercise; under COURSE_SOLUTIONS=1 return the reference."""
    if not solutions_in_place():
        return fn
    if fn.__name__ not in _REFERENCES:
        raise KeyError(f"no reference solution is registered for exercise {fn.__name__!r}")
    print(f"(COURSE_SOLUTIONS=1: the reference solution of {fn.__name__} is in place)")
    return _REFERENCES[fn.__name__]  # type: ignore[return-value]


def report_check(name: str, passed: bool, got: object, expected: object, hint: str) -> bool:
    """Print a check's verdict; under COURSE_SOLUTIONS=1 a failure raises AssertionError."""
    if passed:
        print(f"{name}: correct.")
        return True
    if got is None:
        print(f"{name}: not attempted yet (your function returned None). Hint: {hint}")
    else:
        print(f"{name}: not yet. Got {got!r}, expected {expected!r}. Hint: {hint}")
    if solutions_in_place():
        raise AssertionError(f"the reference solution of {name} fails its own check")
    return False
