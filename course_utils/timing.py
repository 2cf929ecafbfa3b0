"""Comparing speeds honestly: variants timed interleaved, decided by whether their spreads overlap.

Two variants timed one after the other on a shared machine measure the machine as much as the
variants: a browser tab that wakes up during the second one makes it "slower". So every variant is
timed in the same measurement, in round-robin blocks (A B C, C A B, B C A, ... — the order rotates so
that no variant always runs first), after the same warm-up, CUDA synchronised around each block. A variant is called faster only when its whole
spread (first to third quartile of the blocks) lies below the other's; otherwise the verdict says the
measurement cannot tell them apart, which on a busy laptop is the honest answer.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from course_utils._display import ReadableResult
from course_utils.environment import hardware_summary

MIN_BLOCKS = 5   # fewer blocks than this and quartiles mean nothing


@dataclass
class VariantTiming:
    """One variant's blocks: seconds per call in each block, and its first (warm-up) call."""

    name: str
    block_s: list[float]    # seconds per call, one entry per timed block
    first_call_s: float     # the very first call alone (compilation, worker start-up show up here)

    @property
    def median_s(self) -> float:
        return statistics.median(self.block_s)

    @property
    def q1_s(self) -> float:
        return _quartiles(self.block_s)[0]

    @property
    def q3_s(self) -> float:
        return _quartiles(self.block_s)[2]


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


Outcome = Literal["faster", "slower", "no significant difference", "too few blocks"]


@dataclass
class SpeedComparison(ReadableResult):
    """Interleaved timings of several variants on this machine, and verdicts between them."""

    variants: dict[str, VariantTiming]
    hardware: str
    num_threads: int
    calls_per_block: dict[str, int]

    def __getitem__(self, name: str) -> VariantTiming:
        return self.variants[name]

    def _pair(self, name: str, baseline: str | None) -> tuple[VariantTiming, VariantTiming]:
        base = baseline or next(iter(self.variants))
        for n in (name, base):
            if n not in self.variants:
                raise KeyError(f"no variant named {n!r}; the variants are {list(self.variants)}")
        return self.variants[name], self.variants[base]

    def outcome(self, name: str, baseline: str | None = None) -> Outcome:
        """"faster" / "slower" only when the spreads (quartile 1 to 3) of `name` and `baseline` (default:
        the first variant) do not overlap; otherwise "no significant difference"."""
        row, base = self._pair(name, baseline)
        if min(len(row.block_s), len(base.block_s)) < MIN_BLOCKS:
            return "too few blocks"
        if row.q3_s < base.q1_s:
            return "faster"
        if row.q1_s > base.q3_s:
            return "slower"
        return "no significant difference"

    def speedup(self, name: str, baseline: str | None = None) -> float:
        """Median of `baseline` / median of `name` (above 1: `name` is quicker)."""
        row, base = self._pair(name, baseline)
        return base.median_s / row.median_s

    def verdict(self, name: str, baseline: str | None = None) -> str:
        """The comparison in words, e.g. "1.62x faster than eager (spreads apart)"."""
        row, base = self._pair(name, baseline)
        ratio, outcome = self.speedup(name, baseline), self.outcome(name, baseline)
        if outcome == "faster":
            return f"{ratio:.2f}x faster than {base.name} (spreads apart)"
        if outcome == "slower":
            return f"{ratio:.2f}x the speed of {base.name}: slower (spreads apart)"
        if outcome == "too few blocks":
            return f"cannot tell ({ratio:.2f}x, but fewer than {MIN_BLOCKS} blocks each)"
        return f"no significant difference from {base.name} ({ratio:.2f}x, the spreads overlap)"

    def __str__(self) -> str:
        width = max(len(n) for n in self.variants)
        blocks = min(len(v.block_s) for v in self.variants.values())
        unit, scale = ("ms", 1e3) if max(v.median_s for v in self.variants.values()) < 1 else ("s", 1.0)
        lines = [f"{self.hardware}; {self.num_threads} thread(s); {blocks} interleaved blocks per variant",
                 f"{'variant':<{width}}  {'median':>10}  {'spread (Q1-Q3)':>21}  {'first call':>11}"]
        for v in self.variants.values():
            lines.append(f"{v.name:<{width}}  {v.median_s * scale:7.3f} {unit:<2}  "
                         f"{v.q1_s * scale:8.3f}-{v.q3_s * scale:<8.3f}{unit:<3}  {v.first_call_s * scale:8.3f} {unit}")
        first = next(iter(self.variants))
        lines += [f"{name}: {self.verdict(name)}" for name in self.variants if name != first]
        return "\n".join(lines)


def compare_speed(variants: dict[str, Callable[[], Any]], *, blocks: int = 7, block_s: float = 0.05,
                  warmup_calls: int = 2) -> SpeedComparison:
    """Time each zero-argument callable in `variants` in `blocks` interleaved rounds.

    Every variant first gets `warmup_calls` untimed calls (the first of them timed alone as
    `first_call_s`); the number of calls per block is then chosen from the slowest of three more calls
    so that one block takes at most about `block_s` seconds; each round times one block of every variant, rotating the order, in this
    process's thread count.
    """
    if not isinstance(variants, dict) or not variants:
        raise TypeError("variants must be a non-empty dict of name -> zero-argument callable, "
                        "e.g. {'eager': lambda: model(x), 'compiled': lambda: compiled(x)}")
    for name, fn in variants.items():
        if not callable(fn):
            raise TypeError(f"variant {name!r} is a {type(fn).__name__}, not a callable; wrap it: lambda: model(x)")
    if blocks < 1 or block_s <= 0 or warmup_calls < 1:
        raise ValueError(f"blocks and warmup_calls must be at least 1 and block_s positive, got "
                         f"blocks={blocks}, block_s={block_s}, warmup_calls={warmup_calls}")
    first_call, calls = {}, {}
    for name, fn in variants.items():
        first_call[name] = _seconds_per_call(fn, 1)
        for _ in range(warmup_calls - 1):
            fn()
        # The slowest of three warm calls sizes a block: on a busy machine one quick call would pack a block
        # with far more calls than `block_s` allows once the machine slows down again.
        slowest = max(_seconds_per_call(fn, 1) for _ in range(3))
        calls[name] = max(1, round(block_s / max(slowest, 1e-9)))
    names = list(variants)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(blocks):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            per_call[name].append(_seconds_per_call(variants[name], calls[name], stop_after_s=3 * block_s))
    timings = {name: VariantTiming(name, per_call[name], first_call[name]) for name in names}
    return SpeedComparison(timings, hardware_summary(), torch.get_num_threads(), calls)


def _seconds_per_call(fn: Callable[[], Any], calls: int, stop_after_s: float | None = None) -> float:
    """Mean seconds per call over `calls` back-to-back calls, CUDA synchronised at both ends; the block
    ends early, after the call that passes `stop_after_s`, so a machine that slows down mid-measurement
    (another program takes a core) cannot stretch a 0.05 s block into seconds.

    Written by hand rather than with `torch.utils.benchmark.Timer.timeit`: that runs max(calls // 100, 2)
    untimed warm-up calls before every block, which triples the cost of a block of one call (a whole
    DataLoader epoch); here the warm-up is done once per variant, before the rounds. The Timer's other
    service, setting the thread count, is not needed: every block runs in this process's own threads.
    """
    _synchronize()
    start = time.perf_counter()
    done = 0
    while done < calls:
        fn()
        done += 1
        if stop_after_s is not None and time.perf_counter() - start > stop_after_s:
            break
    _synchronize()
    return (time.perf_counter() - start) / done


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
