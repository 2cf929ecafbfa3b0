"""Context managers for pitfall cells: run the broken code, show its real error, prove it happened."""
from __future__ import annotations

import os
import re
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Caught:
    """What a pitfall cell caught: the exception (or warning) object, filled in on exit."""

    value: BaseException | Warning | None = None


def _check_types(kind: object, base: type) -> None:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not kinds or not all(isinstance(k, type) and issubclass(k, base) for k in kinds):
        raise TypeError(f"expected a {base.__name__} subclass (or a tuple of them), got {kind!r}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # terminal colour codes some PyTorch messages carry


def key_line(message: str, width: int = 160) -> str:
    """The part of a long warning or error a learner needs: its first sentence, with a note of
    how much was left out (the whole text stays in `Caught.value`)."""
    text = message.strip()
    first = text.splitlines()[0] if text else ""
    end = first.find(". ", 40)
    if len(first) > width and end != -1:
        first = first[:end + 1]
    left_out = len(text) - len(first)
    return first + (f" [... {left_out} more characters in .value]" if left_out > 0 else "")


@contextmanager
def expect_error(exc_type: type[BaseException] | tuple[type[BaseException], ...],
                 match: str | None = None) -> Iterator[Caught]:
    """Let the code inside raise `exc_type`, print the error as the learner would see it, go on.

    Raises `AssertionError` if nothing was raised, or if the message does not match the
    regular expression `match` (searched, like `pytest.raises`). Any other exception type
    propagates unchanged: it is a real bug, not the pitfall being shown.
    """
    _check_types(exc_type, BaseException)
    caught = Caught()
    try:
        yield caught
    except exc_type as exc:  # type: ignore[misc]
        message = str(exc)
        shown = _ANSI.sub("", "".join(traceback.format_exception_only(type(exc), exc)).rstrip())
        # keep the exception but not its frames: they would keep the failed code's tensors
        # alive (after a CUDA OOM, exactly the memory you want back)
        caught.value = exc.with_traceback(None)
        print(f"Reproduced the pitfall -> {shown}", file=sys.stdout)
        if match is not None and not re.search(match, message):
            raise AssertionError(
                f"{type(exc).__name__} was raised, but its message does not match {match!r}:\n"
                f"{message}") from exc
        return
    names = exc_type.__name__ if isinstance(exc_type, type) else " or ".join(t.__name__ for t in exc_type)
    raise AssertionError(f"expected {names} to be raised, but the code ran without it")


@contextmanager
def expect_warning(category: type[Warning] = Warning, match: str | None = None) -> Iterator[Caught]:
    """Like `expect_error`, for a warning: records it, prints it, and asserts that it was issued."""
    _check_types(category, Warning)
    caught = Caught()
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        yield caught
    for record in records:
        if issubclass(record.category, category) and (match is None or re.search(match, str(record.message))):
            caught.value = record.message  # type: ignore[assignment]
            print(f"Reproduced the pitfall -> {record.category.__name__}: {key_line(str(record.message))}")
            return
    seen = [f"{r.category.__name__}: {r.message}" for r in records] or ["no warning at all"]
    raise AssertionError(f"expected a {category.__name__} matching {match!r}; saw: " + "; ".join(seen))


@dataclass
class CapturedText:
    """Text captured by `capture_process_output`, filled in on exit."""

    text: str = ""

    @property
    def last_line(self) -> str:
        lines = [line for line in self.text.splitlines() if line.strip()]
        return lines[-1] if lines else ""


@contextmanager
def capture_process_output(stream: str = "stderr") -> Iterator[CapturedText]:
    """Capture what is written to file descriptor 2 ("stderr") or 1 ("stdout") by this process, its C++
    code and the child processes it starts (DataLoader workers), which Python's `sys.stderr` never sees:
    e.g. to show a worker's crash reason in one line, or keep a C++ log out of a cell's output."""
    if stream not in ("stderr", "stdout"):
        raise ValueError(f"stream must be 'stderr' or 'stdout', got {stream!r}")
    fd = 2 if stream == "stderr" else 1
    (sys.stderr if fd == 2 else sys.stdout).flush()
    saved = os.dup(fd)
    captured = CapturedText()
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield captured
        finally:
            (sys.stderr if fd == 2 else sys.stdout).flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode(errors="replace")
