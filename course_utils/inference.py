"""Chapter 6: measuring inference honestly — precision, torch.compile, ONNX verified with ONNX Runtime."""
from __future__ import annotations

import copy
import logging
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils import benchmark as torch_benchmark

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.environment import cpp_compiler, hardware_summary
from course_utils.exercises import Verdict, reference_solution, report_check


# --- timing --------------------------------------------------------------------------------

@dataclass
class BenchmarkRow:
    name: str
    first_call_s: float   # the first call alone: includes compilation for compiled functions
    median_s: float       # steady state, after that first call
    iqr_s: float
    speedup: float        # median of the first row / this median
    blocks: int | None = None   # timed blocks behind median and IQR (None: not known)


MIN_BLOCKS = 5   # fewer timed blocks than this and an IQR means nothing


@dataclass
class BenchmarkTable(ReadableResult):
    """Steady-state latency (median and IQR) per variant, its first-call time, and the hardware."""

    rows: list[BenchmarkRow]
    hardware: str
    num_threads: int

    def __getitem__(self, name: str) -> BenchmarkRow:
        return next(row for row in self.rows if row.name == name)

    def verdict(self, name: str, baseline: str | None = None) -> str:
        """`name` against `baseline` (default: the first row) in words: "1.40x faster", "0.70x the speed
        (slower)", or "no significant difference" when the medians differ by less than the larger IQR and
        both timings are stable (IQR at most half the median). "too noisy to tell" instead of a ranking when
        a row's IQR exceeds its median, when a gap within the IQR comes from a spread-out timing, or when a row
        has fewer than MIN_BLOCKS timed blocks (its IQR is then meaningless, often 0)."""
        row, base = self[name], self[baseline] if baseline else self.rows[0]
        ratio = base.median_s / row.median_s
        within_iqr = abs(row.median_s - base.median_s) <= max(row.iqr_s, base.iqr_s)
        few = [r.name for r in (base, row) if r.blocks is not None and r.blocks < MIN_BLOCKS]
        if few:
            return (f"too noisy to tell ({ratio:.2f}x, but {' and '.join(few)} ran fewer than {MIN_BLOCKS} timed "
                    "blocks, too few for an IQR); rerun on an idle machine")
        noisy = [r.name for r in (base, row) if r.iqr_s > r.median_s]
        spread = [r.name for r in (base, row) if r.iqr_s > r.median_s / 2]
        if noisy or (within_iqr and spread):
            what = (f"the IQR of {' and '.join(noisy)} is larger than its median" if noisy else
                    f"the gap is within the IQR and the IQR of {' and '.join(spread)} is over half its median")
            return f"too noisy to tell ({ratio:.2f}x, but {what}); rerun on an idle machine"
        if within_iqr:
            return f"no significant difference ({ratio:.2f}x, within the IQR)"
        return f"{ratio:.2f}x faster" if ratio > 1 else f"{ratio:.2f}x the speed (slower)"

    def __str__(self) -> str:
        width = max(len(r.name) for r in self.rows)
        lines = [f"{self.hardware}; timed with torch.utils.benchmark, {self.num_threads} thread(s)",
                 f"{'variant':<{width}}  {'median':>10}  {'IQR':>9}  {'speed-up':>8}  {'first call':>10}"]
        lines += [f"{r.name:<{width}}  {r.median_s * 1e3:8.3f} ms  {r.iqr_s * 1e3:6.3f} ms  {r.speedup:7.2f}x"
                  f"  {r.first_call_s * 1e3:7.1f} ms" for r in self.rows]
        return "\n".join(lines)

    def plot(self, ax=None, *, title: str = "steady-state latency"):
        """Horizontal bars of the median latency with IQR error bars (milliseconds)."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(6, 0.5 * len(self.rows) + 1.2))[1]
        names = [r.name for r in self.rows]
        ax.barh(names, [r.median_s * 1e3 for r in self.rows], xerr=[r.iqr_s * 1e3 for r in self.rows])
        ax.invert_yaxis()
        ax.set(xlabel="milliseconds per call (median, IQR bars)", title=title)
        return ax


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def benchmark(fns: dict[str, Callable], *inputs: Any, min_run_time: float = 0.5) -> BenchmarkTable:
    """Time each `fn(*inputs)` with `torch.utils.benchmark` and return a table.

    The first call of each function is timed on its own (`first_call_s`: compile time shows up
    there) and serves as warm-up; then `Timer.blocked_autorange` measures the steady state
    (median and IQR over many runs, CUDA synchronised) with `num_threads` set to what this
    process uses — the Timer's own default is one thread, which would understate CPU speed.
    Speed-ups are relative to the first entry.
    """
    if not isinstance(fns, dict):
        raise TypeError(f"fns must be a dict of name -> callable, e.g. {{'eager': model}}, got a {type(fns).__name__}")
    if not fns:
        raise ValueError("fns is empty: pass {'name': callable, ...}")
    threads = torch.get_num_threads()
    measured = []
    for name, fn in fns.items():
        _synchronize()
        start = time.perf_counter()
        fn(*inputs)
        _synchronize()
        first = time.perf_counter() - start
        timer = torch_benchmark.Timer("fn(*inputs)", globals={"fn": fn, "inputs": inputs},
                                      num_threads=threads, label=name)
        m = timer.blocked_autorange(min_run_time=min_run_time)
        measured.append((name, first, m.median, m.iqr, len(m.times)))
    base = measured[0][2]
    rows = [BenchmarkRow(name, first, median, iqr, base / median, blocks)
            for name, first, median, iqr, blocks in measured]
    return BenchmarkTable(rows, hardware_summary(), threads)


# --- precision -----------------------------------------------------------------------------

@dataclass
class PrecisionChoice(ReadableResult):
    """The autocast dtype this device really runs natively, and whether training needs a GradScaler."""

    device_type: str
    dtype: torch.dtype
    use_grad_scaler: bool
    reason: str

    def autocast(self) -> torch.autocast:
        """`torch.autocast(device_type, dtype)` for this choice."""
        return torch.autocast(self.device_type, dtype=self.dtype)

    def __str__(self) -> str:
        scaler = "with a torch.amp.GradScaler for training" if self.use_grad_scaler else "no GradScaler needed"
        return f"autocast on {self.device_type} with {str(self.dtype).removeprefix('torch.')}, {scaler}: {self.reason}"


def choose_autocast(device: torch.device | str) -> PrecisionChoice:
    """bfloat16 on CPU and on GPUs with native bf16 (compute capability 8.0+, Ampere and newer);
    float16 with a GradScaler on older GPUs and on MPS. The capability is checked directly because
    `torch.cuda.is_bf16_supported()` can answer True for bf16 that is only emulated (slowly)."""
    device = _checks.device(device)
    if device.type == "cpu":
        return PrecisionChoice("cpu", torch.bfloat16, False, "the CPU autocast dtype; float16 autocast on CPU is limited")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return PrecisionChoice("cuda", torch.bfloat16, False,
                                   f"compute capability {major}.{minor} has native bf16 (float32's range, no scaler)")
        return PrecisionChoice("cuda", torch.float16, True,
                               f"compute capability {major}.{minor}: no native bf16; float16 needs loss scaling")
    if device.type == "mps":
        return PrecisionChoice("mps", torch.float16, True, "MPS autocast uses float16")
    raise ValueError(f"no autocast choice for device {device}")


# --- torch.compile -------------------------------------------------------------------------

@dataclass
class CompiledModel(ReadableResult):
    """What `try_compile` produced: a callable (compiled, or the eager model as fallback) and why."""

    fn: Callable
    compiled: bool
    compile_s: float
    reason: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __str__(self) -> str:
        if self.compiled:
            return f"compiled in {self.compile_s:.1f} s (first call, including code generation)"
        return f"running eager: {self.reason}"


def try_compile(model: nn.Module, *example_inputs: Any, **compile_kwargs: Any) -> CompiledModel:
    """`torch.compile(model, **compile_kwargs)` and run it once on `example_inputs` under
    `torch.inference_mode()` (compilation is lazy: errors surface on the first call). Call the
    result under inference_mode too: Dynamo guards on the grad mode, and another one compiles a
    second graph. If there is no C++ compiler for a CPU model, or compilation fails, fall back to
    the eager model and say why, instead of crashing (except on the GPU runner)."""
    _checks.module(model)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if on_cpu and cpp_compiler() is None and os.environ.get("COURSE_REQUIRE_CUDA") != "1":
        return CompiledModel(model, False, 0.0, "no C++ compiler found, which torch.compile needs on CPU "
                                                "(python -m course_utils doctor; install g++ or clang++)")
    compiled = torch.compile(model, **compile_kwargs)
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            compiled(*example_inputs)
        _synchronize()
    except Exception as error:  # any backend failure: the lesson goes on in eager mode ...
        if os.environ.get("COURSE_REQUIRE_CUDA") == "1":   # ... except on the GPU runner, where it must work
            raise RuntimeError("COURSE_REQUIRE_CUDA=1: torch.compile failed, and the GPU run must not fall back "
                               "to eager; run `python -m course_utils doctor`") from error
        return CompiledModel(model, False, 0.0, f"compilation failed ({type(error).__name__}: {str(error)[:200]})")
    return CompiledModel(compiled, True, time.perf_counter() - start, "")


def count_compilations(model: nn.Module, inputs: Sequence[torch.Tensor], **compile_kwargs: Any) -> int:
    """How many graphs `torch.compile(model, **compile_kwargs)` compiles when called on each input in
    turn. Counted with Dynamo's CompileCounter backend, which compiles nothing itself: recompilation
    is decided by Dynamo's guards, whatever the backend, so this is cheap and exact."""
    from torch._dynamo.testing import CompileCounter  # Dynamo's own counting backend

    _checks.module(model)
    if isinstance(inputs, torch.Tensor) or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise TypeError("inputs must be a list of tensors, one call each (e.g. [torch.randn(n, 256) for n in sizes])")
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, **compile_kwargs)
    with torch.no_grad():
        for x in inputs:
            compiled(x)
    torch._dynamo.reset()
    return counter.frame_count


# --- ONNX ----------------------------------------------------------------------------------

@contextmanager
def _quiet_exporter():
    """The exporter prints progress, dumps graphs when `torch.export` fails, logs optional-op
    warnings (torchvision ops) and a FutureWarning from its own pytree code. None of it helps a
    learner: the exception, if any, still propagates with its full message."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with redirect_stdout(StringIO()), redirect_stderr(StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_onnx(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], path: str | Path, *,
                dynamic_batch: bool = True, input_names: Sequence[str] = ("input",),
                output_names: Sequence[str] = ("output",)) -> Path:
    """Export with today's exporter (`torch.onnx.export`, which goes through `torch.export`), in
    `eval()` mode, and validate the file with `onnx.checker`.

    `dynamic_batch` marks dimension 0 of every input as dynamic (`dynamic_shapes` with a
    `torch.export.Dim`; a batch-1 example works too); without it the file accepts only the example's
    batch size. If the exported graph holds only for a bounded range of batch sizes (forward branches
    on `x.shape[0]`, which the exporter bakes in silently), the file is deleted and ValueError raised.
    The weights are embedded in the one `.onnx` file (`external_data=False`) so it cannot be separated
    from them; above 2 GB (protobuf's limit) they would have to go to a `.onnx.data` side file.
    """
    import onnx

    _checks.module(model)
    path = _checks.writable_file(path, "path")
    if isinstance(example_inputs, torch.Tensor):
        raise TypeError("example_inputs must be a tuple of tensors, e.g. (x,)")
    dynamic_shapes = tuple({0: torch.export.Dim("batch")} for _ in example_inputs) if dynamic_batch else None
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        with _quiet_exporter():
            program = torch.onnx.export(model, tuple(example_inputs), str(path), input_names=list(input_names),
                                        output_names=list(output_names), dynamic_shapes=dynamic_shapes,
                                        external_data=False, verbose=False)
    except Exception as error:   # a 30-line report with colour codes: keep its key line, chain the rest
        raise RuntimeError(f"torch.onnx.export failed: {_key_line(str(error))}") from error
    finally:
        model.train(was_training)
    bounded = _bounded_dynamic_dims(program.exported_program)
    if dynamic_batch and bounded:
        path.unlink()
        raise ValueError(f"the exported graph is only valid for batch sizes {bounded}: forward branches on the "
                         "batch size (Python `if` on x.shape), and the exporter kept one branch; move the "
                         "branch to the caller or write it with torch.cond (file not written)")
    onnx.checker.check_model(str(path))
    return path


def _key_line(report: str) -> str:
    """The line under the exporter's "## Exception summary" (else its first line), without ANSI codes."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", report).splitlines()]
    if "## Exception summary" in lines:
        following = lines[lines.index("## Exception summary") + 1:]
        return next((line for line in following if line), lines[0])
    return next((line for line in lines if line), "")


def _bounded_dynamic_dims(exported: torch.export.ExportedProgram) -> str:
    """The range of each dynamic dimension with a finite upper bound, e.g. "from 0 to 10", or "".

    When `torch.export` cannot honour a `Dim` (a Python branch on the shape), `torch.onnx.export` falls
    back to a non-strict trace without an error; the branch taken is then baked in, and the only trace
    of it is the bounded range left in `range_constraints`."""
    ranges = [f"from {r.lower} to {r.upper}" for r in exported.range_constraints.values()
              if not math.isinf(float(r.upper))]
    return ", ".join(ranges)


def onnx_session(path: str | Path, *, threads: int | None = None):
    """An ONNX Runtime CPU session using as many threads as torch does (for fair comparisons)."""
    import onnxruntime as ort

    path = _checks.existing_file(path, "path", "ONNX file (export one with export_onnx)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass
class VerificationRow:
    input_shapes: list[tuple[int, ...]]
    output: str
    max_abs_error: float
    mean_abs_error: float
    passed: bool
    error: str = ""


@dataclass
class OnnxVerification(ReadableResult):
    """ONNX Runtime against PyTorch, per input and output. `passed` only if every row passed; the error
    statistics cover the rows that produced outputs (NaN for rows ONNX Runtime rejected)."""

    passed: bool
    max_abs_error: float
    mean_abs_error: float
    rows: list[VerificationRow] = field(default_factory=list)

    def __str__(self) -> str:
        rejected = sum(1 for r in self.rows if math.isnan(r.max_abs_error))
        summary = (f"max |onnx - torch| = {self.max_abs_error:.2e}, mean = {self.mean_abs_error:.2e}"
                   if rejected < len(self.rows) else "no input produced outputs to compare")
        if rejected:
            summary += f"; {rejected} of {len(self.rows)} input(s) rejected"
        lines = [f"{'PASSED' if self.passed else 'FAILED'}: {summary}"]
        for row in self.rows:
            shapes = ", ".join(str(list(s)) for s in row.input_shapes)
            detail = row.error or f"max {row.max_abs_error:.2e}, mean {row.mean_abs_error:.2e}"
            lines.append(f"  input {shapes} -> {row.output}: {'ok  ' if row.passed else 'FAIL'} {detail}")
        return "\n".join(lines)


def verify_onnx(model: nn.Module, path: str | Path, inputs_list: Sequence[tuple[torch.Tensor, ...]], *,
                rtol: float = 1e-3, atol: float = 1e-4) -> OnnxVerification:
    """Run ONNX Runtime and PyTorch (eval mode, no grad) on each input tuple and compare every output
    with `np.allclose(rtol, atol)`. An ONNX Runtime error (e.g. a batch size the file does not
    accept) becomes a failed row naming the input shapes, not a crash.

    Written against ONNX Runtime directly rather than `torch.onnx.verification`, whose helpers take
    an in-memory ONNXProgram: this checks the file you will actually ship.
    """
    if not inputs_list:
        raise ValueError("inputs_list is empty: pass [(x1,), (x2,), ...]")
    session = onnx_session(path)
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]
    rows: list[VerificationRow] = []
    was_training = model.training
    model.eval()
    try:
        for inputs in inputs_list:
            inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
            shapes = [tuple(x.shape) for x in inputs]
            with torch.no_grad():
                expected = model(*inputs)
            expected = expected if isinstance(expected, (tuple, list)) else (expected,)
            try:
                got = session.run(None, {n: x.detach().cpu().numpy() for n, x in zip(input_names, inputs)})
            except Exception as error:  # onnxruntime raises its own pybind error types
                named = ", ".join(str(list(shape)) for shape in shapes)
                rows.append(VerificationRow(shapes, "all outputs", math.nan, math.nan, False,
                                            f"ONNX Runtime rejected input shape {named}: {_ort_key_line(error)}"))
                continue
            for name, want, have in zip(output_names, expected, got):
                want = want.detach().cpu().numpy()
                if want.shape != have.shape:
                    rows.append(VerificationRow(shapes, name, math.nan, math.nan, False,
                                                f"shape {list(have.shape)} from ONNX, {list(want.shape)} from torch"))
                    continue
                diff = np.abs(want.astype(np.float64) - have.astype(np.float64))
                rows.append(VerificationRow(shapes, name, float(diff.max(initial=0.0)), float(diff.mean()) if diff.size else 0.0,
                                            bool(np.allclose(have, want, rtol=rtol, atol=atol))))
    finally:
        model.train(was_training)
    compared = [r for r in rows if not math.isnan(r.max_abs_error)]   # rows that produced outputs
    return OnnxVerification(all(r.passed for r in rows), max((r.max_abs_error for r in compared), default=math.nan),
                            float(np.mean([r.mean_abs_error for r in compared])) if compared else math.nan, rows)


def _ort_key_line(error: Exception) -> str:
    """ONNX Runtime's message on one line, without its "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :" prefix
    and its "Please fix either the inputs/outputs or the model." advice."""
    message = " ".join(str(error).split())
    message = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)
    return message.replace(" Please fix either the inputs/outputs or the model.", "")


# --- exercises -----------------------------------------------------------------------------

def _raised(error: Exception, limit: int = 160) -> str:
    """The first line of an exception, in the learner's terms."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"your function raised {type(error).__name__}: {first[:limit]}"


def _seeded_classifier(seed: int) -> nn.Module:
    """(N, 8) -> (N, 3), seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


@reference_solution("export_for_any_batch", chapter=6)
def _export_for_any_batch(model: nn.Module, path: str) -> None:
    torch.onnx.export(model, (torch.randn(4, 8),), path, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True, external_data=False)


def check_export_for_any_batch(fn: Callable) -> Verdict:
    """Exercise: `fn(model, path)` writes an ONNX file of `model` ((N, 8) -> (N, 3)) that, copied alone to
    another folder (as to a server), ONNX Runtime runs at batch 1, 5 and 64 with the model's outputs."""
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
                    observed = _first_batch_mismatch(session, model, batch_sizes=(1, 5, 64), features=8)
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
    1e-4) at every batch size from 1 to 64. Asked about a correct file, a file that is wrong above
    batch 10 (a shape branch baked in at export) and a file whose outputs are off by 0.01."""
    model = _seeded_classifier(seed=7).eval()
    branched = _SoftmaxForLargeBatches(model).eval()
    shifted = copy.deepcopy(model)
    with torch.no_grad():
        shifted[-1].bias += 0.01
    dynamic = ({0: torch.export.Dim("batch")},)
    cases = [(model, model, True, "a correct file"),
             (branched, branched, False, "a file whose outputs differ from its model's at some batch sizes"),
             (model, shifted, False, "a file whose outputs are all 0.01 off its model's")]
    observed = None
    with tempfile.TemporaryDirectory() as folder:
        for index, (truth, exported, expected, what) in enumerate(cases):
            path = str(Path(folder) / f"case{index}.onnx")
            with _quiet_exporter():
                torch.onnx.export(exported, (torch.randn(2, 8),), path, input_names=["input"],
                                  output_names=["output"], dynamic_shapes=dynamic, dynamo=True, external_data=False)
            try:
                answer = fn(truth, path)
            except Exception as error:
                observed = _raised(error)
                break
            if answer is None:
                break                       # `...`: not attempted
            if bool(answer) != expected:
                observed = f"asked about {what}, it answered {answer!r}"
                break
        else:
            return report_check("onnx_matches_torch", True, None, [])
    return report_check("onnx_matches_torch", False, observed,
                        ["which batch sizes does your function actually try? The task says every one from 1 to 64.",
                         "how far apart may two numbers be and still count as equal under your tolerance?"])


@reference_solution("clipped_forward", chapter=6)
def _clipped_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = layer(x)
    limit = 3 * h.std()
    return torch.clamp(h, -limit, limit)


def check_clipped_forward(fn: Callable) -> Verdict:
    """Exercise: `fn(layer, x)` returns `layer(x)` clipped to +-3 standard deviations of all its values,
    (N, D) -> (N, D), and compiles as one graph: `torch.compile(fn, fullgraph=True)` accepts it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(8)
        layer, x = nn.Linear(6, 6), torch.randn(32, 6)
    x[0] *= 40                                         # one outlier row, so the clipping matters
    want = _clipped_forward(layer, x).detach()
    passed, observed = False, None
    try:
        got = fn(layer, x)
    except Exception as error:
        got, observed = None, _raised(error)
    if got is not None:
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            observed = (f"it returned {type(got).__name__} {tuple(getattr(got, 'shape', ()))}, "
                        f"expected a tensor {tuple(want.shape)}")
        elif not torch.allclose(got.detach(), want, rtol=1e-4, atol=1e-5):
            gap = (got.detach() - want).abs().max().item()
            observed = f"its outputs differ from clipping at 3 standard deviations by up to {gap:.3f}"
        else:
            torch._dynamo.reset()
            try:
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


@reference_solution("count_graph_breaks", chapter=6)
def _count_graph_breaks(model: nn.Module, x: torch.Tensor) -> tuple[int, list[str]]:
    explanation = torch._dynamo.explain(model)(x)
    return explanation.graph_break_count, [reason.user_stack[-1].line for reason in explanation.break_reasons]


def _announce(x: torch.Tensor) -> torch.Tensor:
    print("between layers")                  # a graph break, one call below forward
    return x


class _Breaks(nn.Module):
    """(N, 4) -> (N, 4) through 3 linear layers, with `breaks` (0 to 2) graph breaks between them: the
    first inside a helper that forward calls, the second explicit."""

    BREAK_LINES = ('print("between layers")', "torch._dynamo.graph_break()")

    def __init__(self, breaks: int):
        super().__init__()
        self.first, self.second, self.third, self.breaks = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), breaks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        if self.breaks >= 1:                  # a Python attribute, not a tensor: no break by itself
            x = _announce(x)
        x = self.second(x)
        if self.breaks >= 2:
            torch._dynamo.graph_break()
        return self.third(x)


def check_count_graph_breaks(fn: Callable) -> Verdict:
    """Exercise: `fn(model, x)` returns `(count, lines)`: how many graph breaks `torch.compile` meets in
    `model(x)`, and for each the source line Dynamo could not trace (the innermost frame), in order;
    tried on models with 2 and 0 breaks."""
    observed = None
    for breaks in (2, 0):
        torch._dynamo.reset()
        try:
            with redirect_stdout(StringIO()):
                answer = fn(_Breaks(breaks).eval(), torch.randn(3, 4))
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
        if count != breaks:
            observed = f"for a model with {breaks} graph break{'s' * (breaks != 1)} it returned the count {count!r}"
            break
        named = [str(line).split("#")[0].strip() for line in lines]      # the code, without its comment
        expected = list(_Breaks.BREAK_LINES[:breaks])
        if len(named) != len(expected):
            observed = f"for a model with {breaks} graph breaks it named {len(named)} line(s): {named}"
            break
        wrong = [line for line, want in zip(named, expected) if line != want]
        if wrong:
            observed = (f"for a model with {breaks} graph breaks it named the lines {named}; `{wrong[0]}` is "
                        "not a line Dynamo failed to trace")
            break
    else:
        return report_check("count_graph_breaks", True, None, [])
    return report_check("count_graph_breaks", False, observed,
                        ["the explanation counts graphs and graph breaks separately: which one was asked for?",
                         "a break reason's user_stack is a list of frames, outermost first: which frame holds the "
                         "line that could not be traced?"])
