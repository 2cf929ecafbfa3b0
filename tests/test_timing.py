"""compare_speed: interleaved blocks, verdicts only when the spreads do not overlap."""
import time

import pytest
import torch

from course_utils.timing import SpeedComparison, VariantTiming, compare_speed


def _comparison(a: list[float], b: list[float]) -> SpeedComparison:
    return SpeedComparison({"a": VariantTiming("a", a, a[0]), "b": VariantTiming("b", b, b[0])}, "cpu", 1,
                           {"a": 1, "b": 1})


def test_a_clearly_quicker_variant_is_called_faster():
    slow = lambda: time.sleep(0.004)
    quick = lambda: time.sleep(0.0005)
    result = compare_speed({"slow": slow, "quick": quick}, blocks=5, block_s=0.02)
    assert result.outcome("quick") == "faster" and result.outcome("slow", "quick") == "slower"
    assert result.speedup("quick") > 2
    assert "faster than slow" in str(result)


def test_overlapping_spreads_are_no_significant_difference():
    result = _comparison([1.0, 1.1, 1.2, 1.3, 1.4], [1.05, 1.15, 1.25, 1.35, 1.45])
    assert result.outcome("b") == "no significant difference"
    assert "the spreads overlap" in result.verdict("b")


def test_apart_spreads_decide_even_with_a_small_gap():
    result = _comparison([1.0, 1.0, 1.01, 1.01, 1.02], [0.9, 0.9, 0.91, 0.91, 0.92])
    assert result.outcome("b") == "faster" and result.outcome("a", "b") == "slower"


def test_too_few_blocks_decide_nothing():
    assert _comparison([1.0, 1.0], [0.1, 0.1]).outcome("b") == "too few blocks"


def test_blocks_are_interleaved_in_rotating_order():
    order = []
    variants = {name: (lambda name=name: order.append(name)) for name in "abc"}
    compare_speed(variants, blocks=3, block_s=1e-9, warmup_calls=1)
    assert order[:12] == ["a"] * 4 + ["b"] * 4 + ["c"] * 4       # warm-up: the first call, three that size a block
    assert order[12:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # then one call per block, the order rotating


def test_a_block_makes_exactly_its_calls():
    calls = []
    result = compare_speed({"epoch": lambda: calls.append(1)}, blocks=5, block_s=1e-9, warmup_calls=2)
    assert len(calls) == 2 + 3 + 5 and result.calls_per_block == {"epoch": 1}   # warm-up, sizing, 1 per block


def test_a_block_is_sized_by_the_slowest_warm_call():
    durations = iter([0.0, 0.0, 0.001, 0.02, 0.001] + [0.0] * 100)     # one slow call among the sizing calls
    result = compare_speed({"jittery": lambda: time.sleep(next(durations))}, blocks=5, block_s=0.04,
                           warmup_calls=2)
    assert result.calls_per_block["jittery"] <= 2                        # 0.04 s / 0.02 s, not 0.04 s / 0.001 s


def test_a_block_that_overruns_ends_early():
    durations = iter([0.001] * 5 + [0.02] * 1000)          # warm calls quick, then the machine slows down
    start = time.perf_counter()
    result = compare_speed({"slowing": lambda: time.sleep(next(durations))}, blocks=5, block_s=0.01,
                           warmup_calls=2)
    assert time.perf_counter() - start < 1.0                    # not 5 blocks x 10 calls x 20 ms
    assert 0.015 < result["slowing"].median_s < 0.05            # and the time per call is still right


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="non-empty dict"):
        compare_speed({})
    with pytest.raises(TypeError, match="lambda"):
        compare_speed({"model": torch.zeros(1)})
    with pytest.raises(KeyError, match="no variant named"):
        _comparison([1.0] * 5, [1.0] * 5).verdict("c")
