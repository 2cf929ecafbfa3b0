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
# say what each costs in memory and accuracy; compare speeds honestly (variants timed interleaved, called
# faster only when their spreads do not overlap); see what `torch.compile` compiled and recompiled — by
# asking Dynamo, not a stopwatch — and find the graph breaks that stop it; export to ONNX with a dynamic
# batch axis (`torch.onnx.export(..., dynamic_shapes=...)`), weigh it against a static one, run the file
# with `onnxruntime.InferenceSession`, and catch the export that **silently** keeps one branch of an `if`
# on the batch size, or unrolls a loop over the batch.
#
# **You write the PyTorch; `course_utils` holds the hardened versions.** Each section first shows the
# few lines a practitioner writes, reproduces the pitfall with them, and only then uses the helper
# (`benchmark`, `try_compile`, `watch_compiles`, `export_onnx`, `verify_onnx`) on the same case.
#
# **Hardware and time.** Every number is measured on the machine running the notebook and printed with
# its hardware; the very first `torch.compile` on a machine adds about 20 s while it builds its C++
# headers. On a GPU the same cells time the GPU. Speed-ups this hardware does not give are reported as such,
# and a comparison a busy machine cannot decide is printed as "no significant difference", never failed.
#
# **Run All:** 34 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).

# %%
import copy
import io
import logging
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.utils.benchmark
from torch import nn
from torch._dynamo.testing import CompileCounter   # a backend that counts the graphs Dynamo hands it
from torch.export import Dim

from course_utils import (benchmark, capture_process_output, check_clipped_forward, check_count_graph_breaks,
                          check_export_for_any_batch, check_onnx_matches_torch, choose_autocast, compare_speed,
                          count_compilations, doctor, exercise, expect_error, export_onnx, get_device,
                          hardware_summary, idle_cores, onnx_session, progress, seed_everything, try_compile,
                          verify_onnx, watch_compiles)

# %load_ext course_utils
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
# A float16 model runs only as far as each of its operations has a float16 kernel on the device. The
# decompositions of `torch.linalg` have none, on the CPU or on CUDA (here the Cholesky factor of a
# covariance, as a Mahalanobis-distance score needs). The fix is to run that one step in float32 and convert
# its result:

# %%
covariance = torch.eye(4, device=device) + 0.1                 # symmetric positive definite
with expect_error((RuntimeError, NotImplementedError), match="not implemented for 'Half'|Low precision dtypes"):
    torch.linalg.cholesky(covariance.half())
factor = torch.linalg.cholesky(covariance).half()              # float32 for this step, then float16
print("cholesky in float32, then .half():", factor.dtype)
torch.testing.assert_close(factor.float() @ factor.float().T, covariance, atol=2e-3, rtol=0)

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
# For **training**, `.half()` has a second trap. float16 gradients underflow to zero, so float16 training
# multiplies the loss by a large factor before `backward()` (`torch.amp.GradScaler`) and divides the
# gradients by it before the step. The scaler refuses to unscale float16 gradients, which is what a
# `.half()` model's parameters get; the error comes at `scaler.step`, after the backward pass has run:

# %%
scaler = torch.amp.GradScaler(device.type)
labels = reference.argmax(-1).clone()                         # clone: a normal tensor, usable by autograd
train_half = copy.deepcopy(model).half().train()
optimizer = torch.optim.SGD(train_half.parameters(), lr=0.01)
scaler.scale(nn.functional.cross_entropy(train_half(batch.half()).float(), labels)).backward()
with expect_error(ValueError, match="Attempting to unscale FP16 gradients"):
    scaler.step(optimizer)

# %% [markdown]
# The fix is `autocast`, as above, with float16: the weights stay float32, so their gradients are float32
# and the scaler can unscale them. `scaler.update()` after each step adjusts the factor (smaller after a
# step with Inf/NaN gradients, which it skips; larger after a run of good ones):

# %%
scaler = torch.amp.GradScaler(device.type)                     # a fresh scaler
train_fp32 = copy.deepcopy(model).train()
optimizer = torch.optim.SGD(train_fp32.parameters(), lr=0.01)
before = train_fp32.net[0].weight.detach().clone()
with torch.autocast(device_type=device.type, dtype=torch.float16):
    loss = nn.functional.cross_entropy(train_fp32(batch), labels)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
print(f"float32 weights, float16 autocast: loss {loss.item():.3f} ({loss.dtype}), one step taken; "
      f"gradients {train_fp32.net[0].weight.grad.dtype}")
assert train_fp32.net[0].weight.dtype == train_fp32.net[0].weight.grad.dtype == torch.float32
assert not torch.equal(before, train_fp32.net[0].weight)

# %% [markdown]
# bfloat16 is the autocast type on CPUs and on GPUs from compute capability 8.0 (Ampere); older GPUs emulate
# it slowly and run float16 natively. `choose_autocast` is that choice, hardened (it checks the capability,
# not `torch.cuda.is_bf16_supported()`, which can answer True for emulated bf16):

# %%
choice = choose_autocast(device)
print(f"choose_autocast({device.type!r}) -> {str(choice.dtype).removeprefix('torch.')}")


# %% [markdown]
# Speed. Two variants timed one after the other on a shared machine measure the machine as much as the
# variants: a browser tab that wakes up during the second one makes it "slower". So time them
# **interleaved**: the same warm-up for each, then rounds in which every variant runs one block, with
# `torch.utils.benchmark.Timer` (give it this process's thread count: its default is **one** thread, which
# understates a CPU). The plain PyTorch:

# %%
def eager(x):
    with torch.inference_mode():
        return model(x)

def autocast(x):
    with torch.inference_mode(), choice.autocast():
        return model(x)

def half(x):
    with torch.inference_mode():
        return half_model(x.half())

precisions = {"float32": eager, f"autocast {str(choice.dtype)[6:]}": autocast, "float16 model": half}
timers = {name: torch.utils.benchmark.Timer("f(x)", globals={"f": f, "x": batch}, num_threads=torch.get_num_threads())
          for name, f in precisions.items()}
for f in precisions.values():
    f(batch)                                          # the same warm-up for every variant
runs = {name: [] for name in precisions}
for _ in range(7):                                    # round-robin blocks: A B C, A B C, ...
    for name, timer in timers.items():
        runs[name].append(timer.timeit(10).mean)      # seconds per call in this block
for name, times in runs.items():
    q1, median, q3 = statistics.quantiles(times, n=4)   # the spread: first to third quartile of the blocks
    print(f"{name:<16} median {median * 1e3:7.3f} ms per call, spread {q1 * 1e3:.3f} to {q3 * 1e3:.3f} ms")
base_q1, _, base_q3 = statistics.quantiles(runs["float32"], n=4)
for name in list(runs)[1:]:
    q1, _, q3 = statistics.quantiles(runs[name], n=4)
    decided = "faster" if q3 < base_q1 else "slower" if q1 > base_q3 else "not decided (the spreads overlap)"
    print(f"{name} against float32: {decided}")

# %% [markdown]
# Which one is faster? Only a difference larger than the spread between blocks says so: the last lines
# above call a variant faster only when its whole spread lies below float32's. `benchmark` is that loop,
# hardened: it rotates the order in each round (so no variant always runs right after another),
# sizes the blocks, times each variant's first call apart (compilation shows up there), synchronises a
# GPU, and calls a variant **faster only when the spreads (first to third quartile of the blocks) do not
# overlap** — otherwise "no significant difference", which on a busy laptop is the honest answer; the
# ratio printed beside it is the ratio of the medians, not a speed-up. (It is `course_utils.compare_speed`
# for functions of the same inputs.)

# %%
print(f"{idle_cores():.1f} of {torch.get_num_threads()} cores idle before timing (a busy machine widens the spreads)")
precision_speed = benchmark(precisions, batch)
print(precision_speed)
cpuinfo = Path("/proc/cpuinfo")                       # Linux: the CPU's instruction-set flags
flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
native = sorted(flags & {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"})
print(f"low-precision units on this CPU: {', '.join(native) or ('none' if flags else 'unknown (no /proc/cpuinfo)')}"
      + (f"; GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
print("Half precision can be faster only where the hardware multiplies in it natively (tensor cores on GPUs; "
      "AVX-512 BF16/FP16 or AMX on CPUs), and even there only when the multiplications dominate: for a small "
      "model at batch 32 the casts and the per-call overhead can eat the gain. The verdicts above are what this "
      "machine did at batch 32.")

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
# model — saying why — where this machine cannot compile. Its first call compiles nothing new here: Dynamo
# reuses the graph the cell above compiled for this model, grad mode and shape (`watch_compiles`, shown
# below, counts what compiled):

# %%
with watch_compiles() as first_call:
    compiled = try_compile(model, batch)
print(compiled, f"— graphs compiled: {first_call.graphs}")
if compiled.compiled:
    assert first_call.graphs == 0
else:
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
# guard and compiles again (a **recompile**); by default that second compile makes the batch dimension
# dynamic, so later sizes reuse it. A stopwatch is a poor witness of that (on a busy core every call is
# slow); ask Dynamo what it compiled. Its counters count the graphs, and `torch._logging.set_logs(recompiles=True)`
# — what `TORCH_LOGS="recompiles"` turns on — logs each recompile with the guard that failed (printed under
# the cell):

# %%
from torch._dynamo.utils import counters

torch._logging.set_logs(recompiles=True)          # log every recompile, with the failed guard
before = counters["stats"]["unique_graphs"]
x48 = torch.randn(48, 256, device=device)
compiled_call(x48)                                # a new batch size: the guard on batch 32 fails
compiled_call(x48)                                # the same size again: the new graph is reused
torch._logging.set_logs()                         # back to the defaults
new_graphs = counters["stats"]["unique_graphs"] - before
print(f"graphs compiled by two calls at batch 48: {new_graphs}")
assert new_graphs == (1 if compiled.compiled else 0)   # one recompile, paid once (none for the eager fallback)

# %% [markdown]
# `watch_compiles` is that cell, hardened: it collects the log instead of printing it, restores torch's
# logging settings, and returns the count with the failed guards. Batch 1 compiles again (PyTorch
# specialises a size of 1: the dynamic graph assumes a size of at least 2); batch 256 reuses the dynamic
# graph:

# %%
with watch_compiles() as at_1:
    compiled_call(torch.randn(1, 256, device=device))
with watch_compiles() as at_256:
    compiled_call(torch.randn(256, 256, device=device))
print(f"batch 1: {at_1}\nbatch 256: {at_256}")
if compiled.compiled:
    assert at_1.graphs == 1 and any("size mismatch at index 0" in reason for reason in at_1.reasons)
    assert at_256.graphs == 0
else:
    print("(eager fallback: nothing compiles, so nothing recompiles)")

# %% [markdown]
# The steady state, at the same three batch sizes, eager and compiled timed interleaved under the same
# `inference_mode`. Watched too: a timing that compiled something would not be like for like.

# %%
print(f"{idle_cores():.1f} of {torch.get_num_threads()} cores idle before timing")
speeds = {}
with watch_compiles() as while_timing:
    for n in (1, 32, 256):
        speeds[n] = benchmark({"eager": eager, "compiled": compiled_call}, torch.randn(n, 256, device=device))
for n, comparison in speeds.items():
    print(f"batch {n}:\n{comparison}\n")
print("compiled while timing:", while_timing)
assert while_timing.graphs == 0            # every timed call ran a graph compiled before: like for like

# %% [markdown]
# How to read it: compilation (and each recompilation) is paid once per new graph, so compile pays off only
# for long-running jobs. Where compile helps (GPUs, larger CPUs) it usually helps most at small batches —
# fused kernels, less Python overhead — while at large batches the matrix multiplies dominate and both paths
# call the same BLAS. A small MLP on a 2-core CPU often shows "no significant difference": the verdicts
# above say what **this** machine did, and only a "faster" there is a speed-up.
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
# **The grad mode is a guard too.** A model compiled under `no_grad` (a warm-up, say) and then called with
# gradients enabled (a timing loop that forgot the context) fails that guard and compiles a **second graph,
# built for autograd** — and the timing then measures that graph, not the one you meant. Reproduced with the
# counting backend (the guards are Dynamo's, whatever the backend):

# %%
torch._dynamo.reset()
counter = CompileCounter()
counted = torch.compile(model, backend=counter)
with torch.no_grad():
    counted(batch)                         # compiled here, under no_grad
with watch_compiles() as grad_enabled:
    counted(batch)                         # the same model and input, gradients enabled
print(f"graphs after one call under no_grad and one with grad enabled: {counter.frame_count}")
print(grad_enabled)
assert counter.frame_count == 2 and any("grad_mode" in reason for reason in grad_enabled.reasons)

# %% [markdown]
# The fix: call it under the grad mode it was compiled under, as `eager` and `compiled_call` above both
# do (`inference_mode`). No new graph:

# %%
with torch.no_grad(), watch_compiles() as same_mode:
    counted(batch)
print(same_mode)
assert same_mode.graphs == 0 and counter.frame_count == 2
torch._dynamo.reset()

# %% [markdown]
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
    print(f"graph break at line {reason.user_stack[-1].lineno} of this cell: {reason.user_stack[-1].line}")
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
logging.getLogger("torch.onnx").setLevel(logging.ERROR)   # the exporter's "torchvision is not installed" notes
cpu_model = Classifier().eval()
cpu_model.load_state_dict(model.state_dict())
Path("artifacts/ch6").mkdir(parents=True, exist_ok=True)
torch.onnx.export(cpu_model, (torch.randn(2, 256),), "artifacts/ch6/static.onnx", dynamo=True, verbose=False,
                  input_names=["input"], output_names=["output"],
                  external_data=False)   # one file; the default (True) writes the weights to a separate .onnx.data
options = ort.SessionOptions()
options.intra_op_num_threads = torch.get_num_threads()       # as many threads as PyTorch, for a fair comparison
options.add_session_config_entry("session.intra_op.allow_spinning", "0")   # threads that do not spin: section 5
session = ort.InferenceSession("artifacts/ch6/static.onnx", options, providers=["CPUExecutionProvider"])
print("input shape in the file:", session.get_inputs()[0].shape)
with expect_error(Exception, match="Got invalid dimensions for input"):
    session.run(None, {"input": torch.randn(4, 256).numpy()})

# %% [markdown]
# `dynamic_shapes` names the dimensions that vary, one dict per `forward` argument, with `torch.export.Dim`.
# It is preferred to the old exporter's `dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}` (keyed by
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
# ### An operator the exporter cannot translate
#
# Every operator in the model needs an ONNX translation. The older TorchScript-based exporter
# (`dynamo=False`, which many tutorials still show) lacks some, for example the FFT behind a spectrum
# feature:

# %%
class SpectrumFeatures(nn.Module):
    """(N, 256) signal -> (N, 129) magnitude spectrum."""
    def forward(self, x):
        return torch.fft.rfft(x).abs()

spectrum = SpectrumFeatures().eval()
with warnings.catch_warnings(), capture_process_output("stdout") as exporter_log:   # its C++ graph dump
    warnings.simplefilter("ignore", DeprecationWarning)      # the old exporter announces its retirement
    with expect_error(torch.onnx.errors.UnsupportedOperatorError, match="Exporting the operator 'aten::fft_rfft'"):
        torch.onnx.export(spectrum, (torch.randn(2, 256),), "artifacts/ch6/spectrum_old.onnx", dynamo=False,
                          opset_version=17)
print(f"(the old exporter also dumped its graph, {len(exporter_log.text.splitlines())} lines, on the process's stdout)")

# %% [markdown]
# A higher `opset_version` does not help (opset 20 fails the same way): this exporter has no translation of
# the FFT at any opset. The `torch.export`-based exporter (`dynamo=True`, the default since PyTorch 2.9,
# opset 18 and later) translates it; check the file against PyTorch as for any export:

# %%
spectrum_path = export_onnx(spectrum, (torch.randn(1, 256),), "artifacts/ch6/spectrum.onnx")
spectrum_check = verify_onnx(spectrum, spectrum_path, [(torch.randn(n, 256),) for n in (1, 8)])
print(spectrum_check)
assert spectrum_check.passed

# %% [markdown]
# ### Does a static batch axis pay?
#
# A static batch axis is not only a mistake: it is also a choice. With every shape known, ONNX Runtime can
# fold the shape arithmetic into constants and plan its memory once; with a symbolic batch it works those out
# at run time. What that buys depends on the model, so measure it: the dynamic file against a file exported
# for exactly the batch size served, run by ONNX Runtime at that size, interleaved:

# %%
dynamic_session = onnx_session(dynamic_path)
ort_speed = {}
for n in (1, 32):
    fixed_session = onnx_session(export_onnx(cpu_model, (torch.randn(n, 256),), f"artifacts/ch6/static_{n}.onnx",
                                             dynamic_batch=False))
    x = torch.randn(n, 256).numpy()
    ort_speed[n] = compare_speed({"dynamic batch axis": lambda: dynamic_session.run(None, {"input": x}),
                                  f"static batch {n}": lambda: fixed_session.run(None, {"input": x})})
    print(f"ONNX Runtime at batch {n}:\n{ort_speed[n]}\n")
for n, comparison in ort_speed.items():
    outcome = comparison.outcome(f"static batch {n}")
    print(f"batch {n}: " + {"faster": "the static file wins here",
                            "slower": "the static file is slower here"}.get(outcome, "no measurable difference here"))
with expect_error(Exception, match="Got invalid dimensions for input"):     # what the static file gives up
    fixed_session.run(None, {"input": torch.randn(33, 256).numpy()})

# %% [markdown]
# Read the verdicts above, not a rule: a static axis wins where the measurement says so — typically models
# with shape arithmetic to fold (reshapes, flattens, attention) served at one fixed batch size, small batches
# where per-call overhead matters. It costs flexibility: the file refuses every other batch size (the error
# above), so the server must always send, or pad to, that size — and it is one file per size. For this MLP,
# where there is little shape arithmetic to fold, keep the dynamic axis unless the verdict says "faster".

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
# **On the shape — the silent one.** A branch on `x.shape[0]` is worse. Here large batches should get
# probabilities. Ask `torch.export.export` — the tracer under `torch.onnx.export(..., dynamo=True)` — for a
# dynamic batch first. It **refuses**, and says why: the `if` made it assume the batch is at most 10,
# which contradicts "any batch size", and it suggests the bounded `Dim` as a fix:

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
any_batch = ({0: Dim("batch")},)
with expect_error(torch._dynamo.exc.UserError, match=r"Constraints violated \(batch\)") as refusal:
    torch.export.export(batch_aware, (torch.randn(2, 256),), dynamic_shapes=any_batch)
assert "batch = Dim('batch', max=10)" in refusal.value.msg       # the fix it suggests

# %% [markdown]
# `torch.onnx.export` catches exactly that error, **applies the suggested fix** and exports again — without
# an error (torch 2.13's `torch/onnx/_internal/exporter/_capture_strategies.py` calls
# `torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes`). The same step, by hand:

# %%
refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(refusal.value.msg, any_batch)
batch_dim = refined[0][0]
print(f"the dynamic_shapes torch.onnx.export retries with: {batch_dim}, from {batch_dim.min} to {batch_dim.max}")
assert batch_dim.max == 10

# %% [markdown]
# So the branch taken for the example (2: logits) is baked in, the bound lives only in the exporter's
# records, and the file still has a dynamic batch axis, which ONNX Runtime does not bound:

# %%
program = torch.onnx.export(batch_aware, (torch.randn(2, 256),), "artifacts/ch6/batch_aware.onnx", dynamo=True,
                            verbose=False, input_names=["input"], output_names=["output"], external_data=False,
                            dynamic_shapes=any_batch)
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
# The retry does leave a trace: the bound it applied. `torch.onnx.export` returns an `ONNXProgram`; its
# `exported_program.range_constraints` maps each symbol to its range, unbounded for a model that holds at
# every batch size:

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
# time. (Each branch must return a new tensor, hence `t.clone()` rather than `t` for "nothing to do".)
# Verified across the same range:

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
# ### A Python loop at export time
#
# The exporter runs `forward` once, on the example, so a Python loop runs then too. Whether it is
# **unrolled** (each iteration written into the graph) or **refused** depends on what decides the number of
# iterations. **A tensor's value:** `torch.export` cannot know it for every input, so it refuses (the
# graph it may print on stderr is what it had traced when it stopped: `max`, then `item`, the Python
# number it cannot know):

# %%
class AddMaxTimes(nn.Module):
    """Adds 1 to every value as many times as the input's largest value (rounded down): (N, 8) -> (N, 8)."""
    def forward(self, x):
        for _ in range(int(x.max())):        # the number of iterations is a tensor VALUE
            x = x + 1
        return x

example = torch.full((2, 8), 3.0)
with expect_error(Exception, match="Could not guard on data-dependent expression"):
    torch.export.export(AddMaxTimes(), (example,))
# torch.onnx.export fails too: it retries with torch.export's other strategies (non-strict, then strict),
# and each one meets the same data-dependent loop
with expect_error(RuntimeError, match="torch.onnx.export failed"):
    export_onnx(AddMaxTimes(), (example,), "artifacts/ch6/add_max_times.onnx", dynamic_batch=False)

# %% [markdown]
# **The batch size:** `for row in x` runs `x.shape[0]` times. With a dynamic batch `torch.export` refuses
# again — the loop fixed the batch at the example's 3 — and suggests `batch = 3`; `torch.onnx.export`
# applies that suggestion, as above, and writes a file **unrolled for batch 3**, without an error:

# %%
class PerRow(nn.Module):
    """The classifier applied one row at a time: (N, 256) -> (N, 10)."""
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return torch.stack([self.body(row) for row in x])     # a Python loop over the batch

per_row = PerRow(cpu_model).eval()
with expect_error(torch._dynamo.exc.UserError, match="specialized it to be a constant") as unrolled:
    torch.export.export(per_row, (torch.randn(3, 256),), dynamic_shapes=any_batch)
assert "batch = 3" in unrolled.value.msg                               # the fix it suggests
torch.onnx.export(per_row, (torch.randn(3, 256),), "artifacts/ch6/per_row.onnx", dynamo=True, verbose=False,
                  input_names=["input"], output_names=["output"], external_data=False, dynamic_shapes=any_batch)
per_row_file = onnx.load("artifacts/ch6/per_row.onnx")
matmuls = sum(node.op_type in ("Gemm", "MatMul") for node in per_row_file.graph.node)
print(f"exported without an error; input shape in the file: {onnx_session('artifacts/ch6/per_row.onnx').get_inputs()[0].shape}, "
      f"{matmuls} matrix multiplies (3 layers x 3 rows)")
assert onnx_session("artifacts/ch6/per_row.onnx").get_inputs()[0].shape == [3, 256] and matmuls == 9

# %% [markdown]
# `export_onnx` checks the file's batch axis and refuses it. The fix is the batched operation the loop
# re-implemented: `self.body(x)` on the whole batch (for per-row logic that has no batched form,
# `torch.vmap`), and a loop whose count is a tensor value becomes tensor arithmetic or moves to the caller.

# %%
with expect_error(ValueError, match=r"fixes the batch size \(input: \[3, 256\]\)"):
    export_onnx(per_row, (torch.randn(3, 256),), "artifacts/ch6/per_row.onnx")
x5 = torch.randn(5, 256)
with torch.inference_mode():
    torch.testing.assert_close(per_row(x5), cpu_model(x5))   # the loop computed what one batched call does

# %% [markdown]
# ## 5. The final table
#
# Every way to run the same classifier, on this machine, at batch 1 and 32, each checked to give the eager
# answers first, then all timed **interleaved** in one measurement per batch size. ONNX Runtime runs on the
# CPU with as many threads as PyTorch; its time includes converting the input to NumPy and back. On a GPU
# that row also copies GPU -> CPU and runs on the CPU, so it is shown for reference and left out of the
# verdicts. (`torch._dynamo.reset()` in section 2 dropped the compiled graphs, so the compiled variant
# compiles again in its warm-up — the first-call column — before any block is timed.)
#
# One more like-for-like condition, and a pitfall of its own: after each run ONNX Runtime's threads keep
# **spinning** on their cores for a while, waiting for the next run (its default,
# `session.intra_op.allow_spinning = "1"`). In a server that only runs ONNX that saves a wake-up; in a
# process that does anything else between two runs, on a machine with few cores, the spinning threads take
# the cores from it. Eager PyTorch timed alone, and interleaved with a spinning ONNX Runtime session:

# %%
spinning_options = ort.SessionOptions()
spinning_options.intra_op_num_threads = torch.get_num_threads()          # spinning left at its default
spinning = ort.InferenceSession(str(dynamic_path), spinning_options, providers=["CPUExecutionProvider"])
x32 = torch.randn(32, 256, device=device)
eager_alone = benchmark({"eager": eager, "eager (again)": eager}, x32, block_s=0.03)
beside_ort = compare_speed({"eager": lambda: eager(x32),
                            "ONNX Runtime, spinning": lambda: spinning.run(None, {"input": x32.cpu().numpy()})},
                           block_s=0.03)
slowdown = beside_ort["eager"].median_s / eager_alone["eager"].median_s
print(f"eager at batch 32: {eager_alone['eager'].median_s * 1e3:.3f} ms alone, {beside_ort['eager'].median_s * 1e3:.3f} ms "
      f"between runs of a spinning ONNX Runtime session ({slowdown:.2f}x the time) on {torch.get_num_threads()} threads")
print("the sessions below (onnx_session) turn spinning off, so the variants do not slow each other down")
del spinning

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
final = {n: benchmark(variants, torch.randn(n, 256, device=device), block_s=0.03) for n in (1, 32)}
print(hardware_summary(), f"; {idle:.1f} of {torch.get_num_threads()} cores idle before timing", sep="")
print(f"{'variant':<28}{'batch 1: median (Q1-Q3), ms':>30}{'batch 32: median (Q1-Q3), ms':>32}")
for name in variants:
    cells = [f"{final[n][name].median_s * 1e3:.3f} ({final[n][name].q1_s * 1e3:.3f}-{final[n][name].q3_s * 1e3:.3f})"
             for n in (1, 32)]
    print(f"{name:<28}{cells[0]:>30}{cells[1]:>32}")
for n, comparison in final.items():
    print(f"\nagainst eager at batch {n}:")
    for name in list(variants)[1:]:
        print(f"  {name:<28}{comparison.verdict(name)}")

import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
for ax, n in zip(axes, (1, 32)):
    rows = [final[n][name] for name in variants]
    ax.barh(list(variants), [r.median_s * 1e3 for r in rows],
            xerr=[[(r.median_s - r.q1_s) * 1e3 for r in rows], [(r.q3_s - r.median_s) * 1e3 for r in rows]])
    ax.invert_yaxis()
    ax.set(xlabel="ms per call (median, bars: Q1-Q3)", title=f"batch {n}")
fig.tight_layout()

# %%
for n, comparison in final.items():   # a headline only from a variant whose spread lies below eager's
    comparable = [name for name in list(variants)[1:] if not (device.type == "cuda" and name.startswith("ONNX"))]
    faster = [name for name in comparable if comparison.outcome(name) == "faster"]
    if faster:
        print(f"batch {n}: measurably faster than eager here: "
              + "; ".join(f"{name}, {comparison.verdict(name)}" for name in faster)
              + (" (not ranked against each other)" if len(faster) > 1 else ""))
    else:
        print(f"batch {n}: no variant was measurably faster than eager here (every spread overlaps eager's, "
              "or lies above it)")
print("Where each can pay, when it does: half precision with fast low-precision units; compile where Python "
      "and kernel-launch overhead matter (small batches, GPUs); ONNX Runtime for small models on CPU and for "
      "serving without Python. The verdicts above are this machine's: re-run the table where you deploy.")

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
# copies **only that file** to another folder, as a deployment would, and runs it at seven batch sizes
# between 1 and 333 (not the ones in this cell).

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
# **every** batch size from 1 to 64 (a batch size ONNX Runtime refuses counts as a mismatch: return `False`,
# do not raise). The check asks it about five files of its own: two correct ones, one
# with a shape branch baked in (section 4), one that is wrong only at some batch sizes between 1 and 64, and
# one whose outputs are slightly off everywhere.

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
# accept it. The check tries three layers and inputs of its own: outliers of both signs, a single large
# negative one, and none.

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
# `forward` calls — in order. The check tries models with 0, 1 and 2 breaks, in both orders, one kind of
# break inside a helper function.

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
# - Compare speeds **interleaved** (round-robin blocks in one measurement, the same warm-up and grad mode),
#   and call one faster only when the spreads do not overlap; otherwise it is "no significant difference",
#   whatever the medians say. Numbers timed in separate cells compare the machine's moods, not the variants.
# - `torch.compile` compiles on the first call and again at each shape, dtype or **grad mode** its guards
#   reject. See it by what compiled — `torch._dynamo.utils.counters`, `TORCH_LOGS="recompiles"` /
#   `torch._logging.set_logs(recompiles=True)` (which names the failed guard), `watch_compiles` — not by a
#   stopwatch. Use `dynamic=True` / `mark_dynamic` when shapes vary; call it under the grad mode it was
#   compiled for. Find graph breaks with `torch._dynamo.explain`; `fullgraph=True` makes them errors.
# - ONNX: `torch.onnx.export(..., dynamo=True, dynamic_shapes=({0: Dim("batch")},), external_data=False)`,
#   then run the file with `onnxruntime.InferenceSession` across the whole range of batch sizes you serve.
#   A static batch axis is a trade-off, not a default: measure it against the dynamic one; it can win at
#   one fixed batch size and refuses every other.
# - `torch.onnx.export` runs `torch.export` and, when that refuses a dynamic batch, **applies its suggested
#   fix and retries without an error**: an `if` on `x.shape[0]` becomes a bounded batch with one branch
#   baked in, a loop over the rows a file fixed at the example's size. Ask `torch.export.export` first — it
#   says why — and verify across batch sizes. An `if` or a loop count on tensor *values* is refused by both.
#   Move the branch to the caller or write it with `torch.cond`; replace the loop with batched operations.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Where this chapter shows it |
# |---|---|---|
# | `RuntimeError: mat1 and mat2 must have the same dtype` | `.half()` model with float32 input: half the input, or use autocast | 1, first cell |
# | `NotImplementedError: "cholesky_cpu" not implemented for 'Half'` (`cholesky_cuda` on a GPU) | an operation without a float16 kernel on this device: run that step in float32 | 1, the Cholesky cell |
# | `ValueError: Attempting to unscale FP16 gradients.` | `GradScaler` with a `.half()` model: float32 weights under float16 autocast | 1, the GradScaler cells |
# | autocast or float16 slower than float32 | no fast low-precision units on this device | 1, `benchmark` of the precisions |
# | one variant "faster" in one cell, slower in the next | timed in separate cells on a shared machine: time them interleaved | 1, the round-robin cell and `benchmark` |
# | `no significant difference (…, the spreads overlap)` | the difference is smaller than the machine's noise: no speed-up shown | 1, 2 and 5, every comparison |
# | the first call takes seconds, later calls are fast | compilation: measure it apart | 2, first `torch.compile` cell |
# | `Recompiling function … size mismatch at index 0. expected 32, actual 48` | a new batch size failed a shape guard: `dynamic=True` / `mark_dynamic` | 2, the recompile cell and `watch_compiles` |
# | `GLOBAL_STATE changed: grad_mode` in the recompile log; compiled no faster than eager | compiled under one grad mode, called under another | 2, "The grad mode is a guard too" |
# | `torch._dynamo.exc.Unsupported` with `fullgraph=True`, or a compiled model barely faster | a graph break: `torch._dynamo.explain` | 2, "Graph breaks" |
# | `InvalidCxxCompiler` / `C++ compile error` from `torch.compile` | no working compiler: `doctor()`, eager fallback | 2, `try_compile` |
# | `INVALID_ARGUMENT : Got invalid dimensions for input` in ONNX Runtime | exported without a dynamic batch axis (or on purpose, static) | 3, first cell and "Does a static batch axis pay?" |
# | `Exporting the operator 'aten::…' to ONNX opset version 17 is not supported` | the old exporter (`dynamo=False`) has no translation: export with `dynamo=True` | 3, "An operator the exporter cannot translate" |
# | `External data path does not exist` in ONNX Runtime | the weights were written to a separate `.onnx.data` file (the default) that did not travel with the `.onnx` | 3 |
# | `Could not guard on data-dependent expression` at export | an `if` or a loop count on tensor values in `forward` | 4, `SignGated` and `AddMaxTimes` |
# | `Constraints violated (batch)! … Suggested fixes: batch = Dim('batch', max=10)` from `torch.export` | an `if` on `x.shape[0]`; `torch.onnx.export` applies that fix silently | 4, `BatchAware` |
# | ONNX outputs right for small batches, wrong for large ones | an `if` on `x.shape[0]` baked in at export: verify across batch sizes, `torch.cond` | 4, `BatchAware` and its fixes |
# | `specialized it to be a constant (3)`, or a file whose batch axis is fixed although you passed `dynamic_shapes` | a Python loop over the batch (`for row in x`), unrolled for the example | 4, "A Python loop at export time" |
# | PyTorch (or anything else in the process) slower between ONNX Runtime runs, on a machine with few cores | ONNX Runtime's threads spin after each run: `session.intra_op.allow_spinning` "0" | 5 |

# %%
print(progress(chapter=6))
