"""Chapter 6 exercises (inference): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic module `course_utils.inference` holds
those. Each check runs the learner's function on cases the chapter did not show (other batch sizes,
other models, other inputs) and returns a `Verdict`; a function that raises gets a failed verdict,
never a crash.
"""
from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_utils.exercises import Verdict, reference_solution, report_check
from course_utils.inference import _quiet_exporter

__all__ = ["check_clipped_forward", "check_count_graph_breaks", "check_export_for_any_batch",
           "check_onnx_matches_torch"]


def _raised(error: BaseException, limit: int = 160) -> str:
    """The first line of an exception, in the learner's terms."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"your function raised {type(error).__name__}: {first[:limit]}"


def _seeded_classifier(seed: int) -> nn.Module:
    """(N, 8) -> (N, 3), seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


# --- exercise 1: export_for_any_batch --------------------------------------------------------

# batch sizes the exported file must serve: the task names none of them, and most are sizes the
# chapter never used (an export tuned to one batch, e.g. a static 64, fails at the others)
SERVED_BATCH_SIZES = (1, 3, 5, 17, 64, 100, 333)


@reference_solution("export_for_any_batch", chapter=6)
def _export_for_any_batch(model: nn.Module, path: str) -> None:
    torch.onnx.export(model, (torch.randn(4, 8),), path, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True, external_data=False)


def check_export_for_any_batch(fn: Callable) -> Verdict:
    """Exercise: `fn(model, path)` writes an ONNX file of `model` ((N, 8) -> (N, 3)) that, copied alone to
    another folder (as to a server), ONNX Runtime runs at every batch size in SERVED_BATCH_SIZES with the
    model's outputs."""
    import onnxruntime as ort

    model = _seeded_classifier(seed=6).eval()
    passed, observed = False, None
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as server:
        path = Path(folder) / "model.onnx"
        try:
            with _quiet_exporter():
                returned = fn(model, str(path))
        except Exception as error:
            observed = _raised(error)
        else:
            if path.exists():
                shipped = Path(server) / path.name
                shipped.write_bytes(path.read_bytes())       # only the .onnx file travels
                try:
                    session = ort.InferenceSession(str(shipped), providers=["CPUExecutionProvider"])
                except Exception as error:
                    side_files = sorted(f.name for f in Path(folder).iterdir() if f != path)
                    observed = ("copied alone to another folder, model.onnx did not load in ONNX Runtime"
                                + (f": it looked for {', '.join(side_files)}" if side_files
                                   else f" ({type(error).__name__})"))
                else:
                    observed = _first_batch_mismatch(session, model, SERVED_BATCH_SIZES, features=8)
                    passed = observed is None
            elif returned is not None:               # `...` returns None and writes nothing: not an attempt
                observed = "no file was written at `path`"
    return report_check("export_for_any_batch", passed, observed,
                        ["the check copies only the .onnx file, as a deployment would; look at what else your "
                         "export wrote next to it",
                         "compare the input shape ONNX Runtime expects (session.get_inputs()[0].shape) with "
                         "the shapes you want it to accept: which dimension is the batch?"])


def _first_batch_mismatch(session, model: nn.Module, batch_sizes: Sequence[int], features: int) -> str | None:
    """None if the session matches `model` at every batch size, else what went wrong at the first that did not."""
    name = session.get_inputs()[0].name
    generator = torch.Generator().manual_seed(0)
    for n in batch_sizes:
        x = torch.randn(n, features, generator=generator)
        try:
            got = session.run(None, {name: x.numpy()})
        except Exception as error:
            first = (str(error).strip().splitlines() or [""])[0]
            return (f"ONNX Runtime rejected a batch of {n} (the file expects input shape "
                    f"{session.get_inputs()[0].shape}): {first[:120]}")
        with torch.no_grad():
            want = model(x).numpy()
        if got[0].shape != want.shape or not np.allclose(got[0], want, rtol=1e-3, atol=1e-4):
            gap = np.abs(got[0] - want).max() if got[0].shape == want.shape else float("inf")
            return f"at batch {n} the file's outputs differ from the model's by up to {gap:.3f}"
    return None


# --- exercise 2: onnx_matches_torch ----------------------------------------------------------

class _SoftmaxForLargeBatches(nn.Module):
    """(N, 8) -> (N, 3): logits for up to 10 samples, probabilities above (a branch on the batch size)."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.body(x)
        if x.shape[0] > 10:
            return logits.softmax(-1)
        return logits


class _OffAtSomeBatchSizes(nn.Module):
    """(N, 8) -> (N, 3): `body`'s logits, shifted by `shift` when N % 7 == 3 (batch 3, 10, 17, ..., 59).

    The batch size is read with tensor operations (a sum of ones), so the exported file keeps the rule:
    a file that is right at the batch sizes people try first (1, 2, 8, 32, 64) and wrong in between."""

    def __init__(self, body: nn.Module, shift: float):
        super().__init__()
        self.body, self.shift = body, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.new_ones(x.shape[0]).sum()
        return self.body(x) + self.shift * (torch.remainder(n, 7) == 3).to(x.dtype)


@reference_solution("onnx_matches_torch", chapter=6)
def _onnx_matches_torch(model: nn.Module, path: str) -> bool:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in range(1, 65):
        x = torch.randn(n, 8)
        got = session.run(None, {"input": x.numpy()})[0]
        with torch.no_grad():
            want = model(x)
        if not np.allclose(got, want.numpy(), rtol=0, atol=1e-4):
            return False
    return True


def check_onnx_matches_torch(fn: Callable) -> Verdict:
    """Exercise: `fn(model, path)` says whether the ONNX file at `path` gives `model`'s outputs (within
    1e-4) at every batch size from 1 to 64. Asked about two correct files (two models), a file that is
    wrong above batch 10 (a shape branch baked in at export), a file that is wrong only at batch sizes
    3, 10, 17, ..., 59, and a file whose outputs are all 5e-4 off."""
    model, other = _seeded_classifier(seed=7).eval(), _seeded_classifier(seed=17).eval()
    branched = _SoftmaxForLargeBatches(model).eval()
    shifted = copy.deepcopy(model)
    with torch.no_grad():
        shifted[-1].bias += 5e-4
    cases = [(model, model, True, "a correct file"),
             (branched, branched, False, "a file whose outputs differ from its model's at some batch sizes"),
             (model, _OffAtSomeBatchSizes(model, 0.05).eval(), False,
              "a file whose outputs differ from its model's at some batch sizes"),
             (model, shifted, False, "a file whose outputs are all 5e-4 off its model's"),
             (other, other, True, "another correct file")]
    dynamic = ({0: torch.export.Dim("batch")},)
    observed = None
    with tempfile.TemporaryDirectory() as folder:
        for index, (truth, exported, expected, what) in enumerate(cases):
            path = str(Path(folder) / f"case{index}.onnx")
            with _quiet_exporter():
                torch.onnx.export(exported, (torch.randn(2, 8),), path, input_names=["input"],
                                  output_names=["output"], dynamic_shapes=dynamic, dynamo=True, external_data=False)
            try:
                answer = fn(truth, path)
                said = None if answer is None else bool(answer)
            except Exception as error:
                observed = _raised(error)
                break
            if said is None:
                break                       # `...`: not attempted
            if said != expected:
                observed = f"asked about {what}, it answered {answer!r}"
                break
        else:
            return report_check("onnx_matches_torch", True, None, [])
    return report_check("onnx_matches_torch", False, observed,
                        ["which batch sizes does your function actually try? The task says every one from 1 to 64.",
                         "how far apart may two numbers be and still count as equal under your tolerance?"])


# --- exercise 3: clipped_forward -------------------------------------------------------------

@reference_solution("clipped_forward", chapter=6)
def _clipped_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = layer(x)
    limit = 3 * h.std()
    return torch.clamp(h, -limit, limit)


def _clipping_cases() -> list[tuple[str, nn.Module, torch.Tensor]]:
    """Layers and inputs the chapter never showed: outliers above, below, and none at all."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(8)
        layer, x = nn.Linear(6, 6), torch.randn(32, 6)
        x[0] *= 40                                     # one outlier row: large values of both signs
        identity = nn.Linear(5, 5)
        with torch.no_grad():
            identity.weight.copy_(torch.eye(5))
            identity.bias.zero_()
        low = torch.randn(20, 5)
        low[3, 2] = -60.0                              # one large negative value, nothing large above
        plain = torch.randn(9, 6)                      # nothing beyond 3 standard deviations
    return [("an input with one outlier row", layer, x),
            ("an input whose only outlier is negative", identity, low),
            ("an input without outliers", layer, plain)]


def check_clipped_forward(fn: Callable) -> Verdict:
    """Exercise: `fn(layer, x)` returns `layer(x)` clipped to +-3 standard deviations of all its values,
    (N, D) -> (N, D), and compiles as one graph: `torch.compile(fn, fullgraph=True)` accepts it. Tried on
    three layer/input pairs (outliers above and below, and none) of other shapes than the chapter's."""
    passed, observed = False, None
    for what, layer, x in _clipping_cases():
        want = _clipped_forward(layer, x).detach()
        try:
            with redirect_stdout(StringIO()):
                got = fn(layer, x)
        except Exception as error:
            observed = _raised(error)
            break
        if got is None:
            break                                      # `...`: not attempted
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            observed = (f"on {what} it returned {type(got).__name__} {tuple(getattr(got, 'shape', ()))}, "
                        f"expected a tensor {tuple(want.shape)}")
            break
        if not torch.allclose(got.detach().float(), want, rtol=1e-4, atol=1e-5):
            gap = (got.detach().float() - want).abs().max().item()
            observed = f"on {what} its outputs differ from clipping at 3 standard deviations by up to {gap:.3f}"
            break
    else:
        _, layer, x = _clipping_cases()[1]
        torch._dynamo.reset()
        try:
            with redirect_stdout(StringIO()):
                torch.compile(fn, fullgraph=True, backend="eager")(layer, x)
        except Exception as error:
            message = (str(error).strip().splitlines() or [""])[0]
            observed = (f"the outputs are right, but torch.compile(fullgraph=True) refused it"
                        f"{_first_break_line(fn, layer, x)}: {message[:160]}")
        else:
            passed = True
        finally:
            torch._dynamo.reset()
    return report_check("clipped_forward", passed, observed,
                        ["each refusal names one thing Dynamo cannot put in a graph; there may be more than one",
                         "a Python `if` needs a True or False while tracing, which the values of `h` cannot give; "
                         "what does clamping do to values that are already inside the limits?"])


def _first_break_line(fn: Callable, *args: Any) -> str:
    """" at `<source line>`" for the first graph break `torch._dynamo.explain` finds in `fn(*args)`, or ""."""
    torch._dynamo.reset()
    try:
        with redirect_stdout(StringIO()):
            reasons = torch._dynamo.explain(fn)(*args).break_reasons
    except Exception:
        return ""
    finally:
        torch._dynamo.reset()
    frames = reasons[0].user_stack if reasons else []
    return f" at `{frames[-1].line.split('#')[0].strip()}`" if frames and frames[-1].line else ""


# --- exercise 4: count_graph_breaks ----------------------------------------------------------

@reference_solution("count_graph_breaks", chapter=6)
def _count_graph_breaks(model: nn.Module, x: torch.Tensor) -> tuple[int, list[str]]:
    explanation = torch._dynamo.explain(model)(x)
    return explanation.graph_break_count, [reason.user_stack[-1].line for reason in explanation.break_reasons]


def _announce(x: torch.Tensor) -> torch.Tensor:
    print("between layers")                  # a graph break, one call below forward
    return x


class _Breaks(nn.Module):
    """(N, 4) -> (N, 4) through 3 linear layers, with graph breaks between them: `breaks` names them in
    order, "helper" (a print inside a function that forward calls) and "explicit"
    (`torch._dynamo.graph_break()` in forward)."""

    LINES = {"helper": 'print("between layers")', "explicit": "torch._dynamo.graph_break()"}

    def __init__(self, *breaks: str):
        super().__init__()
        self.first, self.second, self.third = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.breaks = breaks + ("",) * (2 - len(breaks))

    def _break(self, kind: str, x: torch.Tensor) -> torch.Tensor:
        if kind == "helper":                  # a Python attribute, not a tensor: no break by itself
            return _announce(x)
        if kind == "explicit":
            torch._dynamo.graph_break()
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._break(self.breaks[0], self.first(x))
        x = self._break(self.breaks[1], self.second(x))
        return self.third(x)


# the models the check tries: the order of the last one is not alphabetical, and two of them have a
# number of breaks other than the 2 the task mentions
_BREAK_CASES = (("helper", "explicit"), (), ("explicit",), ("explicit", "helper"))


def check_count_graph_breaks(fn: Callable) -> Verdict:
    """Exercise: `fn(model, x)` returns `(count, lines)`: how many graph breaks `torch.compile` meets in
    `model(x)`, and for each the source line Dynamo could not trace (the innermost frame), in order;
    tried on models with 2, 0, 1 and 2 (in the other order) breaks, at two batch sizes."""
    observed = None
    for index, breaks in enumerate(_BREAK_CASES):
        torch._dynamo.reset()
        try:
            with redirect_stdout(StringIO()):
                answer = fn(_Breaks(*breaks).eval(), torch.randn(3 + 2 * index, 4))
        except Exception as error:
            observed = _raised(error)
            break
        finally:
            torch._dynamo.reset()
        if answer is None:
            break                           # `...`: not attempted
        if not (isinstance(answer, tuple) and len(answer) == 2):
            observed = f"it returned {answer!r}, not a (count, lines) pair"
            break
        count, lines = answer
        expected = [_Breaks.LINES[kind] for kind in breaks]
        plural = "s" * (len(breaks) != 1)
        if count != len(breaks):
            observed = f"for a model with {len(breaks)} graph break{plural} it returned the count {count!r}"
            break
        try:
            named = [str(line).split("#")[0].strip() for line in lines]     # the code, without its comment
        except TypeError:
            observed = f"for a model with {len(breaks)} graph break{plural} it returned lines={lines!r}, not a list"
            break
        if len(named) != len(expected):
            observed = f"for a model with {len(breaks)} graph break{plural} it named {len(named)} line(s): {named}"
            break
        wrong = [line for line, want in zip(named, expected) if line != want]
        if wrong:
            observed = (f"for a model with {len(breaks)} graph break{plural} it named the lines {named}; "
                        f"`{wrong[0]}` is not the line Dynamo failed to trace at that break")
            break
    else:
        return report_check("count_graph_breaks", True, None, [])
    return report_check("count_graph_breaks", False, observed,
                        ["the explanation counts graphs and graph breaks separately: which one was asked for?",
                         "a break reason's user_stack is a list of frames, outermost first: which frame holds the "
                         "line that could not be traced?"])
