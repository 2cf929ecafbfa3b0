# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 6 — Faster inference: half precision, `torch.compile`, ONNX
#
# **You will be able to:** run a model in half precision (`.half()` with half inputs, or `autocast`) and
# say what each costs in memory and accuracy; time `torch.compile` like for like (same grad mode, compile
# and recompile time apart) and find the graph breaks that stop it; export to ONNX with a dynamic batch
# axis (`torch.onnx.export(..., dynamic_shapes=...)`), run the file with `onnxruntime.InferenceSession`,
# and catch the export that **silently** keeps one branch of an `if` on the batch size.
#
# **You write the PyTorch; `course_utils` holds the hardened versions.** Each section first shows the
# few lines a practitioner writes, reproduces the pitfall with them, and only then uses the helper
# (`benchmark`, `try_compile`, `export_onnx`, `verify_onnx`) on the same case.
#
# **Hardware and time.** Every number is measured on the machine running the notebook and printed with
# its hardware; the very first `torch.compile` on a machine adds about 20 s while it builds its C++
# headers. On a GPU the same cells time the GPU. Speed-ups this hardware does not give are reported as such.
#
# **Run All:** 40 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).

# %%
import copy
import io
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.utils.benchmark
from torch import nn
from torch._dynamo.testing import CompileCounter   # a backend that counts the graphs Dynamo hands it
from torch.export import Dim

from course_utils import (benchmark, check_clipped_forward, check_count_graph_breaks, check_export_for_any_batch,
                          check_onnx_matches_torch, choose_autocast, count_compilations, doctor, exercise,
                          expect_error, export_onnx, get_device, hardware_summary, idle_cores, onnx_session,
                          progress, seed_everything, try_compile, verify_onnx)

# %load_ext course_utils
logging.getLogger("torch.onnx").setLevel(logging.ERROR)   # the exporter's "torchvision is not installed" notes
warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")   # from torch's own pytree code
device = get_device()
seed_everything(0)
print("device:", device)
print(hardware_summary())

class Classifier(nn.Module):
    """(N, 256) float features -> (N, 10) logits."""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)

model = Classifier().to(device).eval()
batch = torch.randn(32, 256, device=device)
with torch.inference_mode():
    reference = model(batch)

# %% [markdown]
# ## 1. Half precision: `.half()` or `autocast`
#
# `model.half()` converts the **weights** to float16. Inputs stay float32, and the first matrix multiply
# refuses to mix them:

# %%
half_model = copy.deepcopy(model).half()
with expect_error(RuntimeError, match="same dtype|expected .* dtype"):
    with torch.inference_mode():
        half_model(batch)

# %% [markdown]
# There are two fixes, and they are different choices.
#
# **Half the inputs too.** A float16 model fed float16 inputs is a normal way to serve a model, and the
# only one of the two that **halves the memory of the weights**. Its outputs are float16:

# %%
def saved_bytes(m):
    """Bytes of `m`'s state_dict as torch.save writes it: what a checkpoint or a server loads."""
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    return buffer.getbuffer().nbytes

with torch.inference_mode():
    half_logits = half_model(batch.half())
half_error = (half_logits.float() - reference).abs().max().item()
span = reference.abs().max().item()
print(f"float16 model: max |half - float32| = {half_error:.5f} on logits up to {span:.2f}")
print(f"saved weights: {saved_bytes(model) / 2**20:.2f} MiB in float32, "
      f"{saved_bytes(half_model) / 2**20:.2f} MiB after .half()")
assert half_logits.dtype == torch.float16 and 0 < half_error < 0.01 * span   # rounded, not wrong
assert 0.45 < saved_bytes(half_model) / saved_bytes(model) < 0.55            # every weight went to 2 bytes

# %% [markdown]
# **`autocast`.** The weights stay float32; inside the context each operation runs in the reduced type
# where that is safe (matrix multiplies, on a copy of the weights made for the call) and in float32 where
# it is not. Which operations count as unsafe depends on the device: losses such as `cross_entropy`
# everywhere; on CUDA also softmax and sums, which CPU autocast leaves in bfloat16. Written out, with
# bfloat16 (float32's range, fewer digits):

# %%
with torch.inference_mode(), torch.autocast(device_type=device.type, dtype=torch.bfloat16):
    low = model(batch)
    probabilities = low.softmax(-1)
    loss = nn.functional.cross_entropy(low, reference.argmax(-1))
error = (low.float() - reference).abs().max().item()
print(f"autocast on {device.type}: logits {low.dtype}, softmax {probabilities.dtype}, cross_entropy {loss.dtype}; "
      f"max |autocast - float32| = {error:.4f} on logits up to {span:.2f}")
print(f"weight dtypes after running under autocast: {sorted({str(p.dtype) for p in model.parameters()})}; "
      f"after .half(): {sorted({str(p.dtype) for p in half_model.parameters()})}")
assert low.dtype == torch.bfloat16 and loss.dtype == torch.float32
assert probabilities.dtype == (torch.float32 if device.type == "cuda" else torch.bfloat16)
assert 0 < error < 0.05 * span                                     # close, not identical: lower precision
assert {p.dtype for p in model.parameters()} == {torch.float32}    # autocast converted no weight in place
assert {p.dtype for p in half_model.parameters()} == {torch.float16}

# %% [markdown]
# bfloat16 is the autocast type on CPUs and on GPUs from compute capability 8.0 (Ampere); older GPUs emulate
# it slowly and run float16 natively. `choose_autocast` is that choice, hardened (it checks the capability,
# not `torch.cuda.is_bf16_supported()`, which can answer True for emulated bf16):

# %%
choice = choose_autocast(device)
print(f"choose_autocast({device.type!r}) -> {str(choice.dtype).removeprefix('torch.')}")


# %% [markdown]
# Speed. `torch.utils.benchmark.Timer` runs a statement in blocks until `min_run_time` has passed and
# reports the median and the IQR (the spread of the middle half) per call. Give it this process's thread
# count: its default is **one** thread, which understates a CPU.

# %%
def eager(x):
    with torch.inference_mode():
        return model(x)

eager(batch)                                  # warm-up
timer = torch.utils.benchmark.Timer("eager(batch)", globals={"eager": eager, "batch": batch},
                                    num_threads=torch.get_num_threads())
measurement = timer.blocked_autorange(min_run_time=0.3)
print(f"float32, batch 32: median {measurement.median * 1e3:.3f} ms, IQR {measurement.iqr * 1e3:.3f} ms "
      f"({len(measurement.times)} blocks)")

# %% [markdown]
# `benchmark` is that Timer for several variants at once, hardened: it times each one's first call apart
# (compilation shows up there), synchronises the GPU, and its `verdict` ranks two rows only when the
# timings allow it — a gap smaller than the IQR is "no significant difference", and when the IQR exceeds
# the median (a busy machine) it says "too noisy to tell" rather than rank:

# %%

def autocast(x):
    with torch.inference_mode(), choice.autocast():
        return model(x)

def half(x):
    with torch.inference_mode():
        return half_model(x.half())

print(f"{idle_cores():.1f} of {torch.get_num_threads()} cores idle before timing (a busy machine widens the IQR)")
precision_table = benchmark({"float32": eager, f"autocast {str(choice.dtype)[6:]}": autocast,
                             "float16 model": half}, batch)
print(precision_table)
for row in precision_table.rows[1:]:
    print(f"{row.name} against float32: {precision_table.verdict(row.name)}")
print("Half precision is faster only where the hardware multiplies in it natively (tensor cores on GPUs; "
      "AVX-512 BF16 or AMX on CPUs); the verdicts above are what this machine does at batch 32.")

# %% [markdown]
# ## 2. `torch.compile`, measured like for like
#
# `torch.compile(model)` returns at once: it compiles on the **first call**, and Dynamo guards on what it
# saw then — shapes, dtypes and the **grad mode**. So the compiled model must be timed under the same
# `inference_mode` as the eager one (`eager` above); otherwise every timed call would run a second graph,
# compiled for autograd, and the comparison would be unfair. The plain PyTorch:

# %%
compiled_model = torch.compile(model)        # returns at once: nothing is compiled yet
start = time.perf_counter()
try:
    with torch.inference_mode():             # the grad mode it will be called under
        compiled_model(batch)                # the first call compiles
    print(f"first call (compilation included): {time.perf_counter() - start:.1f} s")
except Exception as error:                   # e.g. no C++ compiler on this CPU
    print("torch.compile failed here:", str(error).splitlines()[0][:160])

# %% [markdown]
# `try_compile` is that cell, hardened: it checks for a C++ compiler first and falls back to the eager
# model — saying why — where this machine cannot compile. (Its first call is quick here: Dynamo reuses
# the graph the cell above compiled for this model, grad mode and shape.)

# %%
compiled = try_compile(model, batch)
print(compiled)
if not compiled.compiled:
    print(doctor())           # names the missing piece

def compiled_call(x):         # the same grad mode as `eager`
    with torch.inference_mode():
        return compiled(x)

with torch.inference_mode():
    torch.testing.assert_close(compiled_call(batch), reference, rtol=1e-4, atol=1e-4)   # same answers
if not compiled.compiled:
    print("(compile fell back to eager here, so that check compared eager with itself)")

# %% [markdown]
# The graph compiled for batch 32 guards on that shape. The **first call at a new batch size** fails the
# guard and compiles again (a recompile); by default that second compile makes the batch dimension
# dynamic, so later sizes reuse it. Timed by hand:

# %%
def timed_call(x):
    """Seconds for one call of the compiled model, synchronised on a GPU."""
    start = time.perf_counter()
    compiled_call(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start

x48 = torch.randn(48, 256, device=device)
first = timed_call(x48)
later = min(timed_call(x48) for _ in range(10))        # the fastest of 10: robust on a busy machine
print(f"batch 48: first call {first * 1e3:.1f} ms (a recompile), later calls {later * 1e3:.2f} ms")
if compiled.compiled:
    assert first > 10 * later                          # the recompile is paid once
else:
    print("(eager fallback: no recompile to see here)")

# %% [markdown]
# The steady state, at three batch sizes. The `first call` column shows the same effect: batch 1 is always
# compiled on its own (PyTorch specialises a size of 1), batch 256 reuses the dynamic graph.

# %%
print(f"{idle_cores():.1f} of {torch.get_num_threads()} cores idle before timing")
tables = {}
for n in (1, 32, 256):
    x = torch.randn(n, 256, device=device)
    tables[n] = benchmark({"eager": eager, "compiled": compiled_call}, x, min_run_time=0.3)
    print(f"batch {n}:\n{tables[n]}\n")
for n, table in tables.items():
    print(f"batch {n:3}: compiled against eager: {table.verdict('compiled')}")
if compiled.compiled:                     # batch 1 met no graph that covers it: it compiled again
    assert tables[1]["compiled"].first_call_s > 10 * tables[1]["compiled"].median_s
else:
    print("(eager fallback: both rows run the same eager model)")

# %% [markdown]
# How to read it: the `first call` column is compilation (or recompilation), paid once per new graph, so
# compile pays off only for long-running jobs. Where compile helps (GPUs, larger CPUs) it usually helps
# most at small batches — fused kernels, less Python overhead — while at large batches the matrix
# multiplies dominate and both paths call the same BLAS. A small MLP on a 2-core CPU often shows "no
# significant difference", and a busy one "too noisy to tell": the verdicts above say what **this** machine
# does.
#
# **Counting compilations.** Dynamo's `CompileCounter` backend counts the graphs Dynamo hands it and
# compiles nothing itself, so counting is cheap (`torch._dynamo.reset()` clears the compiled graphs first):

# %%
def graphs_for(sizes, mark=False):
    """Graphs compiled for one call at each batch size; `mark`: mark dim 0 dynamic before each call."""
    torch._dynamo.reset()
    counter = CompileCounter()
    counted = torch.compile(model, backend=counter)
    for n in sizes:
        x = torch.randn(n, 256, device=device)
        if mark:
            torch._dynamo.mark_dynamic(x, 0)
        with torch.inference_mode():
            counted(x)
    torch._dynamo.reset()
    return counter.frame_count

counts = [graphs_for([32]), graphs_for([32, 48]), graphs_for([32, 48, 64, 100])]
marked = graphs_for([32, 48, 64, 100], mark=True)
print(f"graphs after batch 32: {counts[0]} | after 32, 48: {counts[1]} | after 32, 48, 64, 100: {counts[2]}")
print(f"with torch._dynamo.mark_dynamic(x, 0) before each call, 32, 48, 64, 100: {marked}")
assert counts == [1, 2, 2] and marked == 1     # one recompile, then a dynamic graph; marked: one graph

# %% [markdown]
# `count_compilations` is `graphs_for`, hardened, with the compile options as arguments. With
# `dynamic=False` every new batch size compiles again:

# %%
sizes = [torch.randn(n, 256, device=device) for n in (2, 3, 4)]
static = count_compilations(model, sizes, dynamic=False)
dynamic = count_compilations(model, sizes, dynamic=True)
default = count_compilations(model, sizes)
print(f"3 batch sizes: {static} compilations with dynamic=False, {dynamic} with dynamic=True, "
      f"{default} with the default (a dynamic graph after the first recompilation)")
assert static == 3 and dynamic == 1 and default == 2

# %% [markdown]
# The fix is `dynamic=True`, or `torch._dynamo.mark_dynamic(x, 0)` on the dimension that varies before the
# first call (one graph above).
#
# **Graph breaks.** Dynamo turns `forward` into graphs. Python it cannot put in a graph — an `if` on a
# tensor's *values*, a `print`, a call into an unknown C extension — ends the graph there: the rest runs
# in a new graph, with plain Python in between (a **graph break**). Nothing fails, so nothing tells you.
# Here a NaN guard someone left in `forward`; `torch._dynamo.explain` runs the model once and reports
# what Dynamo did, without compiling anything:

# %%
class Guarded(nn.Module):
    """Classifier with a NaN guard between its layers: (N, 256) -> (N, 10)."""
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        h = self.body.net[:4](x)
        if not torch.isfinite(h).all():          # an `if` on tensor values: a graph break
            raise ValueError("non-finite activations")
        return self.body.net[4:](h)

guarded = Guarded(model).eval()
explanation = torch._dynamo.explain(guarded)(batch)
print(f"{explanation.graph_count} graphs, {explanation.graph_break_count} graph break(s)")
for reason in explanation.break_reasons:
    print(f"graph break at line {reason.user_stack[-1].lineno} of forward: {reason.user_stack[-1].line}")
assert explanation.graph_break_count == 1
with torch.inference_mode():             # compiled anyway (no fullgraph), it runs and answers the same
    torch.testing.assert_close(torch.compile(guarded, backend="eager")(batch), reference)
torch._dynamo.reset()

# %% [markdown]
# `fullgraph=True` turns a graph break into an error, so it cannot creep back in unnoticed. (The same
# information as a log: `TORCH_LOGS="graph_breaks,recompiles" python serve.py`.)

# %%
try:
    torch.compile(guarded, fullgraph=True)(batch)
    raise AssertionError("fullgraph=True accepted a graph break")
except torch._dynamo.exc.Unsupported as error:
    print("torch.compile(fullgraph=True) refused it:", str(error).splitlines()[0])
torch._dynamo.reset()

# %% [markdown]
# The fix: keep `forward` one graph and check in the caller (or write the guard with tensor operations such
# as `torch.nan_to_num` / `torch.where`). Removed, the model is one graph again:

# %%
explanation = torch._dynamo.explain(model)(batch)
print(f"{explanation.graph_count} graph, {explanation.graph_break_count} graph breaks")
assert explanation.graph_count == 1 and explanation.graph_break_count == 0

# %% [markdown]
# On a GPU, `mode="reduce-overhead"` also captures the kernels in a CUDA graph, which removes launch overhead
# for small batches (timed under `inference_mode`, like everything here):

# %%
if device.type == "cuda":
    x1 = torch.randn(1, 256, device=device)
    graphed = try_compile(model, x1, mode="reduce-overhead")   # compiled at batch 1, the size timed
    print(graphed)

    def graphed_call(x):
        with torch.inference_mode():
            return graphed(x).clone()    # a CUDA-graph output is overwritten by the next replay: copy it
    torch.testing.assert_close(graphed_call(x1), eager(x1), rtol=1e-4, atol=1e-4)
    graph_table = benchmark({"eager": eager, "reduce-overhead": graphed_call}, x1)
    print(graph_table)   # its first call records the CUDA graph (warm-up), hence the larger first-call time
    print(f"reduce-overhead against eager at batch 1: {graph_table.verdict('reduce-overhead')}")
else:
    print("CPU run: mode='reduce-overhead' uses CUDA graphs, which exist only on CUDA devices; "
          "this cell times it on a GPU.")

# %% [markdown]
# ## 3. ONNX with a dynamic batch axis
#
# `torch.onnx.export(..., dynamo=True)` traces the model with `torch.export`. Without `dynamic_shapes` the
# file accepts **only** the example's batch size, and ONNX Runtime rejects anything else:

# %%
cpu_model = Classifier().eval()
cpu_model.load_state_dict(model.state_dict())
Path("artifacts/ch6").mkdir(parents=True, exist_ok=True)
torch.onnx.export(cpu_model, (torch.randn(2, 256),), "artifacts/ch6/static.onnx", dynamo=True, verbose=False,
                  input_names=["input"], output_names=["output"], external_data=False)
session = ort.InferenceSession("artifacts/ch6/static.onnx", providers=["CPUExecutionProvider"])
print("input shape in the file:", session.get_inputs()[0].shape)
with expect_error(Exception, match="Got invalid dimensions for input"):
    session.run(None, {"input": torch.randn(4, 256).numpy()})

# %% [markdown]
# `dynamic_shapes` names the dimensions that vary, one dict per `forward` argument, with `torch.export.Dim`.
# It replaces the old exporter's `dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}` (keyed by
# input *and* output names); here the output's batch axis follows from the graph. An example batch of 1
# works too. Then run the file with ONNX Runtime, as a server would, and compare with PyTorch:

# %%
torch.onnx.export(cpu_model, (torch.randn(1, 256),), "artifacts/ch6/dynamic.onnx", dynamo=True, verbose=False,
                  input_names=["input"], output_names=["output"], external_data=False,
                  dynamic_shapes=({0: Dim("batch")},))
session = ort.InferenceSession("artifacts/ch6/dynamic.onnx", providers=["CPUExecutionProvider"])
print("input shape in the file:", session.get_inputs()[0].shape)
for n in (4, 64):
    x = torch.randn(n, 256)
    got = session.run(None, {"input": x.numpy()})[0]
    with torch.inference_mode():
        want = cpu_model(x).numpy()
    print(f"batch {n}: max |onnx - torch| = {np.abs(got - want).max():.2e}")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)

# %% [markdown]
# A `Dim` on the wrong axis is a quiet mistake: `{1: Dim("batch")}` names the features axis, which the
# weights fix at 256, so the exporter specialises it **without an error** — and the batch axis, never
# named, is fixed at the example's size:

# %%
torch.onnx.export(cpu_model, (torch.randn(4, 256),), "artifacts/ch6/wrong_axis.onnx", dynamo=True, verbose=False,
                  input_names=["input"], output_names=["output"], external_data=False,
                  dynamic_shapes=({1: Dim("batch")},))
wrong_axis = ort.InferenceSession("artifacts/ch6/wrong_axis.onnx", providers=["CPUExecutionProvider"])
print("exported without an error; input shape in the file:", wrong_axis.get_inputs()[0].shape)
assert wrong_axis.get_inputs()[0].shape == [4, 256]

# %% [markdown]
# The same, hardened: `export_onnx` also validates the file with `onnx.checker`, puts the model in `eval()`
# and back, and keeps the weights inside the one file; `verify_onnx` runs ONNX Runtime against PyTorch on
# every input you give it and turns a rejected shape into a failed row instead of a crash:

# %%
static_path = "artifacts/ch6/static.onnx"                          # exported above, batch 2 only
dynamic_path = export_onnx(cpu_model, (torch.randn(1, 256),), "artifacts/ch6/dynamic.onnx")
checks = [(torch.randn(n, 256),) for n in (1, 4, 32)]
print(verify_onnx(cpu_model, static_path, checks))
verified = verify_onnx(cpu_model, dynamic_path, checks)
print(verified)
assert verified.passed and verified.max_abs_error < 1e-4
assert not verify_onnx(cpu_model, static_path, checks).passed

# %% [markdown]
# ## 4. Python control flow in `forward`
#
# **On the values.** `torch.export` cannot turn `if x.sum() > 0:` into a graph: the condition depends on
# the input's values, unknown at export time. The export fails (`export_onnx` keeps the key line of the
# exporter's 30-line report):

# %%
class SignGated(nn.Module):
    """Logits, or their negation when the input sums to a negative number: (N, 256) -> (N, 10)."""
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        logits = self.body(x)
        if x.sum() > 0:                      # a branch on the input's values
            return logits
        return -logits

with expect_error(RuntimeError, match="Could not guard on data-dependent expression"):
    export_onnx(SignGated(cpu_model).eval(), (torch.randn(2, 256),), "artifacts/ch6/sign_gated.onnx")

# %% [markdown]
# In that message `u0` is an *unbacked symbol*: the exporter's name for a value known only at run time
# (here the truth of `x.sum() > 0`). The graph needs it now, so the export stops.

# %% [markdown]
# **On the shape — the silent one.** A branch on `x.shape[0]` is worse. The batch is a symbol, but the
# `if` needs a bool: the exporter evaluates `x.shape[0] > 10` on the example (2: False), keeps that branch,
# and records the condition as an assumption that **bounds** the symbol (batch from 0 to 10) — **without an
# error**. The file still has a dynamic batch axis, and ONNX Runtime does not enforce the bound. Here large
# batches should get probabilities:

# %%
class BatchAware(nn.Module):
    """Logits for up to 10 samples, probabilities for larger batches: (N, 256) -> (N, 10)."""
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        logits = self.body(x)
        if x.shape[0] > 10:                  # a branch on the batch size
            return logits.softmax(-1)
        return logits

batch_aware = BatchAware(cpu_model).eval()
program = torch.onnx.export(batch_aware, (torch.randn(2, 256),), "artifacts/ch6/batch_aware.onnx", dynamo=True,
                            verbose=False, input_names=["input"], output_names=["output"], external_data=False,
                            dynamic_shapes=({0: Dim("batch")},))
print("exported without an error; input shape in the file:",
      onnx_session("artifacts/ch6/batch_aware.onnx").get_inputs()[0].shape)

# %% [markdown]
# Verified at the example's size and one more, the file looks right. Verified across the range of batch
# sizes it will serve, it is wrong from batch 11 on:

# %%
few = verify_onnx(batch_aware, "artifacts/ch6/batch_aware.onnx", [(torch.randn(n, 256),) for n in (2, 8)])
print(few)
sweep = [(torch.randn(n, 256),) for n in (1, 2, 5, 10, 11, 16, 64, 256)]
full = verify_onnx(batch_aware, "artifacts/ch6/batch_aware.onnx", sweep)
print(full)
assert few.passed and not full.passed
assert [row.input_shapes[0][0] for row in full.rows if not row.passed] == [11, 16, 64, 256]

# %% [markdown]
# The exporter does leave a trace: the range it assumed for the batch. `torch.onnx.export` returns an
# `ONNXProgram`; its `exported_program.range_constraints` maps each symbol to its range, unbounded for a
# model that holds at every batch size:

# %%
bounds = {str(symbol): (r.lower, r.upper) for symbol, r in program.exported_program.range_constraints.items()}
print("batch_aware.onnx was exported for:", bounds)
assert list(bounds.values()) == [(0, 10)]

# %% [markdown]
# `export_onnx` reads those ranges and **refuses** a file whose batch is bounded:

# %%
with expect_error(ValueError, match="only valid for batch sizes from 0 to 10"):
    export_onnx(batch_aware, (torch.randn(2, 256),), "artifacts/ch6/batch_aware.onnx")

# %% [markdown]
# Two fixes. **Move the branch to the caller**: export the body (that is `dynamic.onnx` from section 3)
# and decide on the batch size in the serving code:

# %%
body_session = onnx_session(dynamic_path)

def serve(x):
    logits = torch.from_numpy(body_session.run(None, {"input": x.numpy()})[0])
    return logits.softmax(-1) if x.shape[0] > 10 else logits      # the branch, in Python, at run time

with torch.inference_mode():
    for (x,) in sweep:
        torch.testing.assert_close(serve(x), batch_aware(x), rtol=1e-3, atol=1e-4)
print(f"body exported, branch in the caller: matches BatchAware at batch sizes {[x.shape[0] for (x,) in sweep]}")

# %% [markdown]
# Or **keep the branch in the graph** with `torch.cond`, which exports **both** branches and picks one at run
# time. Verified across the same range:

# %%
class BatchAwareCond(BatchAware):
    def forward(self, x):
        logits = self.body(x)
        return torch.cond(x.shape[0] > 10, lambda t: t.softmax(-1), lambda t: t.clone(), (logits,))

cond_path = export_onnx(BatchAwareCond(cpu_model).eval(), (torch.randn(2, 256),), "artifacts/ch6/batch_aware_cond.onnx")
fixed = verify_onnx(batch_aware, cond_path, sweep)          # against the original model's answers
print(fixed)
assert fixed.passed

# %% [markdown]
# ## 5. The final table
#
# Every way to run the same classifier, on this machine, at batch 1 and 32, each checked to give the eager
# answers first. ONNX Runtime runs on the CPU with as many threads as PyTorch; its time includes
# converting the input to NumPy and back. On a GPU that row also copies GPU -> CPU and runs on the CPU, so it
# is shown for reference and left out of the "fastest" verdict.

# %%
onnx_run = onnx_session(dynamic_path)
variants = {
    "eager": eager,
    f"autocast {str(choice.dtype)[6:]}": autocast,
    "float16 model": half,
    "compiled" + ("" if compiled.compiled else " (eager fallback)"): compiled_call,
    "ONNX Runtime (CPU)" + (", from GPU" if device.type == "cuda" else ""):
        lambda x: torch.from_numpy(onnx_run.run(None, {"input": x.cpu().numpy()})[0]),
}
for name, fn in variants.items():           # like for like: the same answers, within each one's precision
    tolerance = 1e-4 if name.startswith(("eager", "compiled", "ONNX")) else 0.05 * span
    assert (fn(batch).float().cpu() - reference.cpu()).abs().max().item() < tolerance, name
idle = idle_cores()
final = {n: benchmark(variants, torch.randn(n, 256, device=device), min_run_time=0.3) for n in (1, 32)}
print(hardware_summary(), f"; {idle:.1f} of {torch.get_num_threads()} cores idle before timing", sep="")
print(f"{'variant':<28}{'batch 1 (ms)':>14}{'batch 32 (ms)':>15}")
for name in variants:
    print(f"{name:<28}{final[1][name].median_s * 1e3:>14.3f}{final[32][name].median_s * 1e3:>15.3f}")
for n, table in final.items():
    print(f"\nagainst eager at batch {n}:")
    for row in table.rows[1:]:
        print(f"  {row.name:<28}{table.verdict(row.name)}")

import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
final[1].plot(axes[0], title="batch 1")
final[32].plot(axes[1], title="batch 32")
fig.tight_layout()

# %%
quiet = device.type == "cuda" or idle >= 1   # on a shared CPU every number above is partly the other programs
for n, table in final.items():   # a headline only from rows whose verdict ranks them ("...x faster")
    if not quiet:
        print(f"batch {n}: no headline: only {idle:.1f} idle core(s) while timing")
        continue
    comparable = [row for row in table.rows[1:] if not (device.type == "cuda" and row.name.startswith("ONNX"))]
    faster = [row for row in comparable if table.verdict(row.name).endswith("faster")]
    noisy = [row.name for row in comparable if table.verdict(row.name).startswith("too noisy")]
    if faster:
        best = max(faster, key=lambda row: row.speedup)
        print(f"batch {n}: fastest here is {best.name}, {table.verdict(best.name)} than eager")
    else:
        print(f"batch {n}: no variant was measurably faster than eager here"
              + (f" ({', '.join(noisy)}: too noisy to tell)" if noisy else ""))
if not quiet:
    print("Other programs shared the CPU while timing, so the differences above say as much about them as about "
          "the variants. Re-run on an idle machine before deciding.")
print("Half precision pays where the hardware has fast low-precision units; compile pays where Python and "
      "kernel-launch overhead matter (small batches, GPUs); ONNX Runtime pays for small models on CPU and "
      "for serving without Python. Re-run this table on the machine you deploy to.")

# %% [markdown]
# ## 6. Exercises
#
# All four exercises are **real code with planted bugs** (the text says how many). Fix the code in the
# cell and run it: the check runs your function on its own small, seeded model and prints a verdict that says what it *observed* (for example "ONNX Runtime rejected a
# batch of 5"). Each further failed attempt adds one hint, mildest first; none of them is the solution.
# `progress(chapter=6)` at the end of the notebook shows what you have solved.
#
# **Exercise 1 — an export that only works here (there are 2 bugs).** `export_for_any_batch` should write
# `model` (`(N, 8) -> (N, 3)`) to one ONNX file at `path` that ONNX Runtime runs at any batch size. The check
# copies **only that file** to another folder, as a deployment would, and runs it at batch 1, 5 and 64.

# %%
@exercise
def export_for_any_batch(model, path):
    example = torch.randn(4, 8)
    torch.onnx.export(model, (example,), path, dynamo=True, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({1: Dim("batch")},))


check_export_for_any_batch(export_for_any_batch)

# %% [markdown]
# **Exercise 2 — a verification that misses the bug (there are 2 bugs).** `onnx_matches_torch` should
# return `True` only if the ONNX file at `path` gives `model`'s outputs (`(N, 8) -> (N, 3)`, within 1e-4) at
# **every** batch size from 1 to 64. The check asks it about a correct file, a file with a shape branch
# baked in (section 4) and a file whose outputs are slightly off.

# %%
@exercise
def onnx_matches_torch(model, path):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (2, 8):
        x = torch.randn(n, 8)
        got = session.run(None, {"input": x.numpy()})[0]
        with torch.no_grad():
            want = model(x)
        if not np.allclose(got, want.numpy(), rtol=0, atol=1e-1):
            return False
    return True


check_onnx_matches_torch(onnx_matches_torch)

# %% [markdown]
# **Exercise 3 — clipping that breaks the graph (there are 2 bugs).** `clipped_forward` returns
# `layer(x)` clipped to ±3 standard deviations of all its values, `(N, D) -> (N, D)`. Its outputs are
# right, but it must also compile as **one graph**: `torch.compile(clipped_forward, fullgraph=True)` has to
# accept it.

# %%
@exercise
def clipped_forward(layer, x):
    h = layer(x)
    limit = 3 * h.std()
    if (h.abs() > limit).any():              # clip only when something is out of range
        print("clipping outliers")
        h = h.clamp(-limit, limit)
    return h


check_clipped_forward(clipped_forward)

# %% [markdown]
# **Exercise 4 — where does the graph break? (there are 2 bugs).** `count_graph_breaks(model, x)` returns
# `(count, lines)`: how many graph breaks `torch.compile` meets when it runs `model(x)` (0 when `forward` is
# one graph), and for each break the source line Dynamo could not trace — which may sit in a function that
# `forward` calls — in order. The check tries a model with two breaks, one of them inside a helper function.

# %%
@exercise
def count_graph_breaks(model, x):
    explanation = torch._dynamo.explain(model)(x)
    lines = [reason.user_stack[0].line for reason in explanation.break_reasons]
    return explanation.graph_count, lines


check_count_graph_breaks(count_graph_breaks)

# %% [markdown]
# ## What to remember
# - `.half()` converts the weights only: feed it `x.half()`. It halves weight memory; `autocast` keeps
#   float32 weights and picks the precision per operation. Check accuracy against float32 either way.
# - Time like for like: the same grad mode (`inference_mode`) for eager and compiled, warm-up and first
#   call apart, median and IQR; a difference inside the IQR is no difference, and an IQR larger than the
#   median means the machine was too busy to rank anything.
# - `torch.compile` compiles on the first call and again at each shape its guards reject; use
#   `dynamic=True` / `mark_dynamic` when shapes vary. Find graph breaks with `torch._dynamo.explain`;
#   `fullgraph=True` makes them errors.
# - ONNX: `torch.onnx.export(..., dynamo=True, dynamic_shapes=({0: Dim("batch")},), external_data=False)`,
#   then run the file with `onnxruntime.InferenceSession` across the whole range of batch sizes you serve.
# - An `if` on tensor values fails at export; an `if` on the batch size exports **silently** with one
#   branch. Move the branch to the caller or write it with `torch.cond`.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `RuntimeError: mat1 and mat2 must have the same dtype` | `.half()` model with float32 input: half the input, or use autocast | 1 |
# | autocast or float16 slower than float32 | no fast low-precision units on this device | 1 |
# | the first call takes seconds, later calls are fast | compilation: measure it apart | 2 |
# | the first call at each new batch size is slow | a recompile (`TORCH_LOGS="recompiles"`): `dynamic=True` / `mark_dynamic` | 2 |
# | compiled no faster than eager, `GLOBAL_STATE changed: grad_mode` in the logs | compiled and timed under different grad modes | 2 |
# | `torch._dynamo.exc.Unsupported` with `fullgraph=True`, or a compiled model barely faster | a graph break: `torch._dynamo.explain` | 2 |
# | `InvalidCxxCompiler` / `C++ compile error` from `torch.compile` | no working compiler: `doctor()`, eager fallback | 2 |
# | `INVALID_ARGUMENT : Got invalid dimensions for input` in ONNX Runtime | exported without a dynamic batch axis | 3 |
# | `External data path does not exist` in ONNX Runtime | the weights went to a `.onnx.data` file left behind: `external_data=False` | 3 |
# | `Could not guard on data-dependent expression` at export | Python `if` on tensor values in `forward` | 4 |
# | ONNX outputs right for small batches, wrong for large ones | an `if` on `x.shape[0]` baked in at export: verify across batch sizes, `torch.cond` | 4 |

# %%
print(progress(chapter=6))
