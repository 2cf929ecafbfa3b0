"""Shared display behaviour for result dataclasses."""
from __future__ import annotations


class ReadableResult:
    """Mixin: a notebook cell that ends with the result shows its `__str__`, not the dataclass repr."""

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's display hook
        printer.text(str(self))

    def __init_subclass__(cls, **kwargs) -> None:
        # IPython's printer walks the MRO and takes the first class that defines `_repr_pretty_` *or*
        # `__repr__`: the one @dataclass writes into the subclass would win over ours, one level up.
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = ReadableResult._repr_pretty_


def format_bytes(n: float) -> str:
    """Human-readable bytes: 1536 -> '1.5 KiB'."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"
