"""Chapter 6 exercises: each check rejects plausible wrong answers and accepts more than one right one.

The wrong answers are the ones a reader writes: a planted bug left in (or only one of two fixed), an
answer tuned to the sizes the chapter shows (a static batch 64, the batch sizes 2 and 8, a hard-coded
count), and the right result reached the wrong way (clipping one side only, per-column limits,
lines sorted instead of in order, a tolerance wide enough to pass a wrong file).
"""
import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

from course_utils.exercises import reference
from course_utils.exercises.inference import (check_clipped_forward, check_count_graph_breaks,
                                              check_export_for_any_batch, check_onnx_matches_torch)
from course_utils.inference import export_onnx


# --- exercise 1: export_for_any_batch ------------------------------------------------------

def _export(model, path, *, example=4, dim=0, external_data=False, dynamic=True):
    torch.onnx.export(model, (torch.randn(example, 8),), path, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({dim: Dim("batch")},) if dynamic else None, dynamo=True,
                      external_data=external_data)


def _export_rows_one_by_one(model, path):
    """Unrolls the batch: `torch.stack([model(row) for row in x])` exported for a batch of 64."""
    class PerRow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            return torch.stack([self.body(row) for row in x])
    _export(PerRow().eval(), path, example=64)


EXPORT_WRONG = {
    "planted: both bugs left in (batch on axis 1, weights in a side file)":
        lambda model, path: _export(model, path, dim=1, external_data=True),
    "one bug fixed: weights embedded, batch still on axis 1": lambda model, path: _export(model, path, dim=1),
    "one bug fixed: batch axis right, weights in a side file":
        lambda model, path: _export(model, path, external_data=True),
    "tuned: a static export at batch 64": lambda model, path: _export(model, path, example=64, dynamic=False),
    "wrong way: rows unrolled, exported for batch 64": _export_rows_one_by_one,
    "writes nothing": lambda model, path: path,
    "raises": lambda model, path: torch.onnx.export(model, (torch.randn(4, 9),), path, dynamo=True),
}

EXPORT_RIGHT = {
    "reference": reference("export_for_any_batch"),
    "Dim.DYNAMIC on a batch-1 example": lambda model, path: torch.onnx.export(
        model, (torch.randn(1, 8),), path, input_names=["input"], dynamic_shapes=({0: Dim.DYNAMIC},),
        dynamo=True, external_data=False),
    "course_utils.export_onnx": lambda model, path: export_onnx(model, (torch.randn(2, 8),), path),
}


@pytest.mark.parametrize("name", EXPORT_WRONG)
def test_check_export_for_any_batch_rejects(name, learner):
    verdict = check_export_for_any_batch(EXPORT_WRONG[name])
    assert not verdict.passed and "not attempted" not in str(verdict), name


@pytest.mark.parametrize("name", EXPORT_RIGHT)
def test_check_export_for_any_batch_accepts(name, learner):
    assert check_export_for_any_batch(EXPORT_RIGHT[name]).passed, name


def test_check_export_for_any_batch_says_what_it_observed_first(learner):
    static = str(check_export_for_any_batch(EXPORT_WRONG["tuned: a static export at batch 64"]))
    assert "ONNX Runtime rejected a batch of 1" in static and "hint 1" not in static
    apart = str(check_export_for_any_batch(EXPORT_WRONG["one bug fixed: batch axis right, weights in a side file"]))
    assert "it looked for model.onnx.data" in apart and "external_data" not in apart
    assert "not attempted" in str(check_export_for_any_batch(lambda model, path: None))


# --- exercise 2: onnx_matches_torch --------------------------------------------------------

def _matches(batch_sizes, atol=1e-4, rtol=0.0):
    def onnx_matches_torch(model, path):
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for n in batch_sizes:
            x = torch.randn(n, 8)
            got = session.run(None, {"input": x.numpy()})[0]
            with torch.no_grad():
                want = model(x)
            if not np.allclose(got, want.numpy(), rtol=rtol, atol=atol):
                return False
        return True
    return onnx_matches_torch


def _matches_with_assert_close(model, path):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in range(64, 0, -1):
        x = torch.randn(n, 8)
        with torch.inference_mode():
            want = model(x)
        try:
            torch.testing.assert_close(torch.from_numpy(session.run(None, {"input": x.numpy()})[0]), want,
                                       rtol=0, atol=1e-4)
        except AssertionError:
            return False
    return True


MATCHES_WRONG = {
    "planted: both bugs left in (batch 2 and 8, atol 0.1)": _matches((2, 8), atol=1e-1),
    "one bug fixed: every batch size, atol still 0.1": _matches(range(1, 65), atol=1e-1),
    "one bug fixed: atol 1e-4, batch 2 and 8 only": _matches((2, 8)),
    "tuned: batch 64 only": _matches((64,)),
    "tuned: the first and the last batch size": _matches((1, 64)),
    "wrong way: a tolerance of 1e-3": _matches(range(1, 65), atol=1e-3),
    "always True": lambda model, path: True,
    "raises": lambda model, path: ort.InferenceSession(path).run(None, {"x": np.zeros((1, 8), np.float32)}),
}

MATCHES_RIGHT = {"reference": reference("onnx_matches_torch"),
                 "assert_close, from 64 down": _matches_with_assert_close}


@pytest.mark.parametrize("name", MATCHES_WRONG)
def test_check_onnx_matches_torch_rejects(name, learner):
    verdict = check_onnx_matches_torch(MATCHES_WRONG[name])
    assert not verdict.passed and "not attempted" not in str(verdict), name


@pytest.mark.parametrize("name", MATCHES_RIGHT)
def test_check_onnx_matches_torch_accepts(name, learner):
    assert check_onnx_matches_torch(MATCHES_RIGHT[name]).passed, name


def test_check_onnx_matches_torch_says_what_it_observed_first(learner):
    tuned = str(check_onnx_matches_torch(MATCHES_WRONG["tuned: batch 64 only"]))
    assert "asked about a file whose outputs differ from its model's at some batch sizes, it answered True" in tuned
    assert "hint 1" not in tuned and "range" not in tuned
    assert "not attempted" in str(check_onnx_matches_torch(lambda model, path: None))


# --- exercise 3: clipped_forward -----------------------------------------------------------

def _clip_planted(layer, x):
    h = layer(x)
    limit = 3 * h.std()
    if (h.abs() > limit).any():
        print("clipping outliers")
        h = h.clamp(-limit, limit)
    return h


def _clip_with_if(layer, x):
    h = layer(x)
    limit = 3 * h.std()
    if (h.abs() > limit).any():
        h = h.clamp(-limit, limit)
    return h


def _clip_with_print(layer, x):
    h = layer(x)
    limit = 3 * h.std()
    print("clipping")
    return torch.clamp(h, -limit, limit)


def _clip_by_input_std(layer, x):
    h = layer(x)
    limit = 3 * x.std()                     # the spread of the inputs, not of the outputs
    return h.clamp(-limit, limit)


def _clip_above_only(layer, x):
    h = layer(x)
    return h.clamp(max=3 * h.std())


def _clip_per_column(layer, x):
    h = layer(x)
    limit = 3 * h.std(dim=0)
    return torch.maximum(torch.minimum(h, limit), -limit)


def _clip_with_where(layer, x):
    h = layer(x)
    limit = 3 * h.std()
    return torch.where(h > limit, limit, torch.where(h < -limit, -limit, h))


CLIP_WRONG = {
    "planted: both bugs left in (an `if` on values, a print)": _clip_planted,
    "one bug fixed: the print removed, the `if` kept": _clip_with_if,
    "one bug fixed: the `if` removed, the print kept": _clip_with_print,
    "wrong way: the limit from the inputs' standard deviation": _clip_by_input_std,
    "wrong way: clips large values only, not large negative ones": _clip_above_only,
    "wrong way: a limit per column": _clip_per_column,
    "not clipped at all": lambda layer, x: layer(x),
    "raises": lambda layer, x: layer(x.T),
}

CLIP_RIGHT = {"reference": reference("clipped_forward"), "torch.where twice": _clip_with_where}


@pytest.mark.parametrize("name", CLIP_WRONG)
def test_check_clipped_forward_rejects(name, learner):
    verdict = check_clipped_forward(CLIP_WRONG[name])
    assert not verdict.passed and "not attempted" not in str(verdict), name


@pytest.mark.parametrize("name", CLIP_RIGHT)
def test_check_clipped_forward_accepts(name, learner):
    assert check_clipped_forward(CLIP_RIGHT[name]).passed, name


def test_check_clipped_forward_names_what_it_saw_not_the_fix(learner):
    printed = str(check_clipped_forward(_clip_with_print))
    assert 'fullgraph=True) refused it at `print("clipping")`' in printed and "hint 1" not in printed
    one_sided = str(check_clipped_forward(_clip_above_only))
    assert "its outputs differ from clipping at 3 standard deviations" in one_sided
    assert "not attempted" in str(check_clipped_forward(lambda layer, x: None))


# --- exercise 4: count_graph_breaks --------------------------------------------------------

def _breaks(count="graph_break_count", frame=-1, order=lambda lines: lines):
    def count_graph_breaks(model, x):
        explanation = torch._dynamo.explain(model)(x)
        lines = [reason.user_stack[frame].line for reason in explanation.break_reasons]
        return getattr(explanation, count), order(lines)
    return count_graph_breaks


def _breaks_by_hand(model, x):
    """The reasons counted and read with a loop instead of the explanation's count."""
    lines = []
    for reason in torch._dynamo.explain(model)(x).break_reasons:
        innermost = reason.user_stack[len(reason.user_stack) - 1]
        lines.append(innermost.line)
    return len(lines), lines


BREAKS_WRONG = {
    "planted: both bugs left in (graph count, outermost frame)": _breaks("graph_count", frame=0),
    "one bug fixed: break count, outermost frame": _breaks(frame=0),
    "one bug fixed: innermost frame, graph count": _breaks("graph_count"),
    "tuned: the two breaks of the task, hard-coded":
        lambda model, x: (2, ['print("between layers")', "torch._dynamo.graph_break()"]),
    "wrong way: the lines sorted": _breaks(order=sorted),
    "wrong way: the reasons' messages instead of the lines": lambda model, x: (
        torch._dynamo.explain(model)(x).graph_break_count,
        [reason.reason for reason in torch._dynamo.explain(model)(x).break_reasons]),
    "raises": lambda model, x: torch._dynamo.explain(model)(x).break_reasons[0],
}

BREAKS_RIGHT = {"reference": reference("count_graph_breaks"), "counted by hand": _breaks_by_hand}


@pytest.mark.parametrize("name", BREAKS_WRONG)
def test_check_count_graph_breaks_rejects(name, learner):
    verdict = check_count_graph_breaks(BREAKS_WRONG[name])
    assert not verdict.passed and "not attempted" not in str(verdict), name


@pytest.mark.parametrize("name", BREAKS_RIGHT)
def test_check_count_graph_breaks_accepts(name, learner):
    assert check_count_graph_breaks(BREAKS_RIGHT[name]).passed, name


def test_check_count_graph_breaks_says_what_it_observed_first(learner):
    graphs = str(check_count_graph_breaks(BREAKS_WRONG["one bug fixed: innermost frame, graph count"]))
    assert "with 2 graph breaks it returned the count 3" in graphs and "hint 1" not in graphs
    outer = str(check_count_graph_breaks(BREAKS_WRONG["one bug fixed: break count, outermost frame"]))
    assert "is not the line Dynamo failed to trace" in outer
    assert "not attempted" in str(check_count_graph_breaks(lambda model, x: None))
