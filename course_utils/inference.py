"""Chapter 6: measuring inference honestly — precision, torch.compile, ONNX verified with ONNX Runtime."""
from __future__ import annotations

import copy
import functools
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_utils import _checks
from course_utils._display import ReadableResult
from course_utils.environment import cpp_compiler
from course_utils.timing import SpeedComparison, compare_speed


# --- timing --------------------------------------------------------------------------------

def benchmark(fns: dict[str, Callable], *inputs: Any, blocks: int = 7, block_s: float = 0.05,
              warmup_calls: int = 2) -> SpeedComparison:
    """`compare_speed` for functions that take the same inputs: each `fn(*inputs)` is timed in
    `blocks` interleaved round-robin blocks (the order rotates), after the same warm-up, at this
    process's thread count and with CUDA synchronised. The first call of
    each function is timed on its own (`first_call_s`: compilation shows up there). The result's
    `verdict(name)` calls a variant faster than the first one only when their spreads (quartile 1 to 3
    of the blocks) do not overlap; otherwise "no significant difference"."""
    if not isinstance(fns, dict):
        raise TypeError(f"fns must be a dict of name -> callable, e.g. {{'eager': model}}, got a {type(fns).__name__}")
    if not fns:
        raise ValueError("fns is empty: pass {'name': callable, ...}")
    return compare_speed({name: functools.partial(fn, *inputs) for name, fn in fns.items()},
                         blocks=blocks, block_s=block_s, warmup_calls=warmup_calls)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


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


@dataclass
class CompileWatch(ReadableResult):
    """What Dynamo compiled while a `watch_compiles()` block ran: how many new graphs, and for each
    recompilation the guard failures that caused it (the `TORCH_LOGS="recompiles"` log)."""

    graphs: int = 0                                    # new graphs compiled inside the block
    recompiles: list[str] = field(default_factory=list)  # one log message per recompilation

    @property
    def reasons(self) -> list[str]:
        """The guard-failure lines, e.g. "0/0: tensor 'x' size mismatch at index 0. expected 32, actual 48"."""
        return [line.strip()[2:].split("  # ")[0] for message in self.recompiles for line in message.splitlines()
                if line.strip().startswith("- ")]             # without the source comment Dynamo appends

    def __str__(self) -> str:
        lines = [f"{self.graphs} graph(s) compiled, {len(self.recompiles)} of them recompilation(s) "
                 f"(a failed guard on a graph already compiled)"]
        lines += [f"  recompiled because {reason}" for reason in self.reasons]
        return "\n".join(lines)


class _ListHandler(logging.Handler):
    def __init__(self, messages: list[str]):
        super().__init__(logging.DEBUG)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def watch_compiles() -> Iterator[CompileWatch]:
    """Count the graphs Dynamo compiles inside the block (`torch._dynamo.utils.counters["stats"]
    ["unique_graphs"]`) and collect its recompile log (`torch._logging.set_logs(recompiles=True)`,
    what `TORCH_LOGS="recompiles"` turns on) into the returned `CompileWatch`, filled in when the
    block ends. The messages are collected, not printed; torch's logging settings are restored."""
    from torch._dynamo.utils import counters
    from torch._logging import _internal as torch_logging

    saved = {key: copy.copy(value) for key, value in vars(torch_logging.log_state).items()}
    names = torch_logging.log_registry.get_log_qnames()
    levels = {name: logging.getLogger(name).level for name in names}   # _init_logs resets them: put them back
    watch = CompileWatch()
    messages: list[str] = []
    handler = _ListHandler(messages)
    before = counters["stats"]["unique_graphs"]
    torch._logging.set_logs(recompiles=True)
    logger = logging.getLogger("torch._dynamo.guards.__recompiles")   # the artifact logger set_logs enables
    logger.addHandler(handler)
    logger.propagate = False                                          # collected here, not also on stderr
    try:
        yield watch
    finally:
        logger.removeHandler(handler)
        vars(torch_logging.log_state).update(saved)
        torch_logging._init_logs()                                    # what set_logs does after changing the state
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        watch.graphs = counters["stats"]["unique_graphs"] - before
        watch.recompiles = messages


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
    fixed = _static_batch_inputs(path)
    if dynamic_batch and fixed:
        path.unlink()
        raise ValueError(f"the exported file fixes the batch size ({fixed}) although it was asked to keep it "
                         "dynamic: forward uses the batch size as a Python number (a loop over the rows of x, "
                         "int(x.shape[0]) ...), so torch.export specialised it and torch.onnx.export applied "
                         "that as its fix; write forward with batched tensor operations (file not written)")
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

    When `torch.export` cannot honour a `Dim` (a Python branch on the shape), it raises a "Constraints
    violated" UserError with a suggested fix (`Dim('batch', max=10)`); `torch.onnx.export` catches it,
    applies the fix with `torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes` and
    exports again without an error (torch/onnx/_internal/exporter/_capture_strategies.py, torch 2.13).
    The branch taken is then baked in, and the only trace of it is the bounded range left in
    `range_constraints` (ONNX Runtime does not enforce it)."""
    ranges = [f"from {r.lower} to {r.upper}" for r in exported.range_constraints.values()
              if not math.isinf(float(r.upper))]
    return ", ".join(ranges)


def _static_batch_inputs(path: Path) -> str:
    """The file's inputs whose dimension 0 is a fixed number instead of a symbol, e.g. "input: [3, 8]", or ""."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    fixed = []
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].dim_param:
            fixed.append(f"{value.name}: {[d.dim_value if not d.dim_param else d.dim_param for d in dims]}")
    return ", ".join(fixed)


def onnx_session(path: str | Path, *, threads: int | None = None):
    """An ONNX Runtime CPU session using as many threads as torch does, whose threads do not spin.

    By default ONNX Runtime's intra-op threads keep spinning on their cores for a while after each run,
    waiting for the next one ("session.intra_op.allow_spinning", default "1", in ONNX Runtime's
    "Thread management" documentation); on a machine with few cores they then slow down whatever the
    process does next — PyTorch included, which makes interleaved timings unfair. Turned off here.
    """
    import onnxruntime as ort

    path = _checks.existing_file(path, "path", "ONNX file (export one with export_onnx)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
