"""One exercise protocol for every chapter.

A learner's cell defines a function decorated with `@exercise`. Its body is either `...` (write it)
or working-looking code with planted bugs (find the bug). A `check_*` function in the chapter's
module of this package (`course_utils/exercises/debugging.py` for chapter 3, ...) runs it and returns a `Verdict`: what it *observed* on the first failed attempt, one
more nudge on each later attempt, never the solution. Reference solutions live beside the checks,
registered with `@reference_solution`. With `COURSE_SOLUTIONS=1` in the environment (the test
command sets it) `@exercise` swaps in the reference and a failing check raises, so CI proves every
exercise is solvable and every check accepts the right answer.

Attempts and solved exercises are recorded in a small JSON file (`COURSE_PROGRESS_FILE`, default
`~/.pytorch-field-guide/progress.json`); `progress()` shows it per chapter.
"""
from __future__ import annotations

import json
import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from course_utils._display import ReadableResult

F = TypeVar("F", bound=Callable)
SOLUTIONS_ENV = "COURSE_SOLUTIONS"
PROGRESS_ENV = "COURSE_PROGRESS_FILE"


@dataclass(frozen=True)
class _Registered:
    fn: Callable
    chapter: int


_REFERENCES: dict[str, _Registered] = {}


def solutions_in_place() -> bool:
    """True when the reference solutions replace the learner's code (CI)."""
    return os.environ.get(SOLUTIONS_ENV, "") == "1"


def reference_solution(name: str, *, chapter: int) -> Callable[[F], F]:
    """Register the decorated function as the reference solution of exercise `name` of `chapter`."""
    def register(fn: F) -> F:
        _REFERENCES[name] = _Registered(fn, chapter)
        return fn
    return register


def reference(name: str) -> Callable:
    """The reference solution of exercise `name` (for tests)."""
    return _REFERENCES[name].fn


def exercise(fn: F) -> F:
    """Mark a learner's function as an exercise; under COURSE_SOLUTIONS=1 return the reference."""
    if not solutions_in_place():
        return fn
    if fn.__name__ not in _REFERENCES:
        raise KeyError(f"no reference solution is registered for exercise {fn.__name__!r}")
    print(f"(COURSE_SOLUTIONS=1: the reference solution of {fn.__name__} is in place)")
    return _REFERENCES[fn.__name__].fn  # type: ignore[return-value]


# --- helpers the checks share ---------------------------------------------------------------

def _raised(error: BaseException, limit: int = 120) -> str:
    """The learner's exception in one short line, with the line of their code that raised it."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if len(message) > limit:
        message = message[:limit].rsplit(" ", 1)[0] + " …"
    theirs = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not any(part in frame.filename for part in ("/torch/", "course_utils"))]
    where = f" at `{theirs[-1].line.strip()}`" if theirs and theirs[-1].line else ""
    return f"your function raised {type(error).__name__}{where}: {message}"


def _seeded(seed: int, build: Callable[[], object]):
    """`build()` under its own seed, leaving the notebook's random stream as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


# --- verdicts and progressive hints -------------------------------------------------------

@dataclass
class Verdict(ReadableResult):
    """A check's answer: truthy when solved; a cell ending with it shows only its message."""

    name: str
    passed: bool
    message: str
    attempt: int

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message

    __repr__ = __str__


def report_check(name: str, passed: bool, observed: str | None, hints: Sequence[str]) -> Verdict:
    """Record an attempt at exercise `name` and say how it went.

    observed: what the check saw go wrong, in the learner's terms ("layer 2's weights did not
    change"), or None when the function is still `...` (returned None, nothing ran).
    hints: nudges, mildest first; attempt k (k >= 2) adds hint k-1. None of them is the solution.
    Under COURSE_SOLUTIONS=1 a failure raises AssertionError (the reference must pass its check).
    """
    if passed:
        attempt = _record(name, solved=True)
        return Verdict(name, True, f"✓ {name}: correct — solved.", attempt)
    if solutions_in_place():
        raise AssertionError(f"the reference solution of {name} fails its own check: {observed}")
    if observed is None:                     # still `...`: not an attempt, no hint
        return Verdict(name, False, f"· {name}: not attempted yet — replace the `...` with your code and run "
                                    "the cell again.", 0)
    attempt = _record(name, solved=False)
    message = f"✗ {name} (attempt {attempt}): {observed}"
    shown = hints[:max(0, attempt - 1)]
    if shown:
        message += "\n  " + "\n  ".join(f"hint {i}: {hint}" for i, hint in enumerate(shown, 1))
    elif hints:
        message += "\n  (run the cell again after a change; each further attempt adds a hint)"
    return Verdict(name, False, message, attempt)


# --- progress -----------------------------------------------------------------------------

def progress_file() -> Path:
    """Where attempts are recorded: $COURSE_PROGRESS_FILE, else ~/.pytorch-field-guide/progress.json."""
    default = Path.home() / ".pytorch-field-guide" / "progress.json"
    return Path(os.environ.get(PROGRESS_ENV) or default)


def _load() -> dict[str, dict]:
    try:
        data = json.loads(progress_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}           # no file yet, or an unreadable one: start afresh rather than fail a check


def _record(name: str, *, solved: bool) -> int:
    """Count one attempt (and a solve) for `name`; returns the attempt number. Never raises on I/O."""
    if solutions_in_place():
        return 1            # CI runs the references: leave the learner's record alone
    data = _load()
    entry = data.setdefault(name, {"attempts": 0, "solved": False})
    entry["attempts"] += 1
    entry["solved"] = entry["solved"] or solved
    path = progress_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump(data, tmp, indent=1)
        os.replace(tmp.name, path)
    except OSError:
        pass                # a read-only home must not break an exercise; only the record is lost
    return entry["attempts"]


@dataclass
class Progress(ReadableResult):
    """Exercises per chapter (0: the triage page): (name, attempts, solved) rows; `solved` and `total` overall."""

    chapters: dict[int, list[tuple[str, int, bool]]] = field(default_factory=dict)

    @property
    def solved(self) -> int:
        return sum(done for rows in self.chapters.values() for _, _, done in rows)

    @property
    def total(self) -> int:
        return sum(len(rows) for rows in self.chapters.values())

    def __str__(self) -> str:
        lines = [f"Exercises solved: {self.solved} of {self.total}"]
        for chapter, rows in sorted(self.chapters.items()):
            done = sum(solved for _, _, solved in rows)
            lines.append(f"{'Triage' if chapter == 0 else f'Chapter {chapter}'}: {done}/{len(rows)}")
            for name, attempts, solved in rows:
                mark = "✓" if solved else ("✗" if attempts else "·")
                tries = f"{attempts} attempt{'s' * (attempts != 1)}" if attempts else "not tried"
                lines.append(f"  {mark} {name:<28} {tries}")
        return "\n".join(lines)


def progress(chapter: int | None = None) -> Progress:
    """Which exercises of which chapter (default: every chapter; 0: the triage page) you have solved, from the
    progress file."""
    import course_utils  # noqa: F401  (importing the package registers every chapter's exercises)
    data = _load()
    chapters: dict[int, list[tuple[str, int, bool]]] = {}
    for name, registered in _REFERENCES.items():
        if chapter is not None and registered.chapter != chapter:
            continue
        entry = data.get(name, {})
        chapters.setdefault(registered.chapter, []).append(
            (name, int(entry.get("attempts", 0)), bool(entry.get("solved", False))))
    return Progress(chapters)
