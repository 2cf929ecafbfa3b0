"""Chapter 6: measuring inference honestly — precision, torch.compile, ONNX verified with ONNX Runtime."""
from __future__ import annotations

import logging
import os
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


# --- timing --------------------------------------------------------------------------------

@dataclass
class BenchmarkRow:
    name: str
    first_call_s: float   # the first call alone: includes compilation for compiled functions
    median_s: float       # steady state, after that first call
    iqr_s: float
    speedup: float        # median of the first row / this median


@dataclass
class BenchmarkTable(ReadableResult):
    """Steady-state latency (median and IQR) per variant, its first-call time, and the hardware."""

    rows: list[BenchmarkRow]
    hardware: str
    num_threads: int

    def __getitem__(self, name: str) -> BenchmarkRow:
        return next(row for row in self.rows if row.name == name)

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
        measured.append((name, first, m.median, m.iqr))
    base = measured[0][2]
    rows = [BenchmarkRow(name, first, median, iqr, base / median) for name, first, median, iqr in measured]
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
    `torch.export.Dim`); without it the file accepts only the example's batch size. The weights
    are embedded in the one `.onnx` file (`external_data=False`) so it cannot be separated from
    them; above 2 GB (protobuf's limit) they would have to go to a `.onnx.data` side file.
    """
    import onnx

    _checks.module(model)
    path = _checks.writable_file(path, "path")
    if isinstance(example_inputs, torch.Tensor):
        raise TypeError("example_inputs must be a tuple of tensors, e.g. (x,)")
    if dynamic_batch and any(x.shape[0] == 1 for x in example_inputs):
        raise ValueError("use an example batch of 2 or more with dynamic_batch=True: "
                         "torch.export specialises a dimension of size 1")
    dynamic_shapes = tuple({0: torch.export.Dim("batch")} for _ in example_inputs) if dynamic_batch else None
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        with _quiet_exporter():
            torch.onnx.export(model, tuple(example_inputs), str(path), input_names=list(input_names),
                              output_names=list(output_names), dynamic_shapes=dynamic_shapes,
                              external_data=False, verbose=False)
    finally:
        model.train(was_training)
    onnx.checker.check_model(str(path))
    return path


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
    """ONNX Runtime against PyTorch, per input and output. `passed` only if every row passed."""

    passed: bool
    max_abs_error: float
    mean_abs_error: float
    rows: list[VerificationRow] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{'PASSED' if self.passed else 'FAILED'}: max |onnx - torch| = {self.max_abs_error:.2e}, "
                 f"mean = {self.mean_abs_error:.2e}"]
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
                message = str(error).replace("\n", " ")
                named = ", ".join(str(list(shape)) for shape in shapes)
                rows.append(VerificationRow(shapes, "all outputs", float("inf"), float("inf"), False,
                                            f"ONNX Runtime rejected input shape {named}: {message[:160]}"))
                continue
            for name, want, have in zip(output_names, expected, got):
                want = want.detach().cpu().numpy()
                if want.shape != have.shape:
                    rows.append(VerificationRow(shapes, name, float("inf"), float("inf"), False,
                                                f"shape {list(have.shape)} from ONNX, {list(want.shape)} from torch"))
                    continue
                diff = np.abs(want.astype(np.float64) - have.astype(np.float64))
                rows.append(VerificationRow(shapes, name, float(diff.max(initial=0.0)), float(diff.mean()) if diff.size else 0.0,
                                            bool(np.allclose(have, want, rtol=rtol, atol=atol))))
    finally:
        model.train(was_training)
    return OnnxVerification(all(r.passed for r in rows), max(r.max_abs_error for r in rows),
                            float(np.mean([r.mean_abs_error for r in rows])), rows)
