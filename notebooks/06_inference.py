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
# **You will be able to:** run a model in reduced precision without dtype errors and know what it costs in
# accuracy; measure `torch.compile` honestly (compile time apart from steady-state speed) and stop it from
# recompiling; export to ONNX with a dynamic batch axis and **verify** the file against PyTorch with ONNX
# Runtime before trusting it.
#
# **Hardware and time.** Every number is measured on the machine running the notebook and printed with
# it. *Run All* takes about a minute and a half on a 2-core CPU, `torch.compile`'s first compilation
# included (about 20 s the very first time on a machine, while it builds its C++ headers; a few seconds
# afterwards). On a GPU the same cells measure the GPU. Speed-ups that this hardware does not give are
# reported as such.

# %%
import torch
import torch.nn.functional as F
from torch import nn

from course_utils import (benchmark, choose_autocast, count_compilations, doctor, expect_error,
                          export_onnx, get_device, hardware_summary, onnx_session, seed_everything,
                          try_compile, verify_onnx)

# %load_ext course_utils
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
# ## 1. Half precision
#
# `model.half()` converts the **weights** to float16. Inputs stay float32, and the first matrix multiply
# refuses to mix them:

# %%
import copy
half_model = copy.deepcopy(model).half()
with expect_error(RuntimeError, match="same dtype|expected .* dtype"):
    with torch.inference_mode():
        half_model(batch)

# %% [markdown]
# The fix is **autocast**: weights stay float32, and inside the context each operation runs in the
# reduced type where that is safe (matrix multiplies) and in float32 where it is not (reductions,
# softmax). `choose_autocast` picks the type this device really runs natively:

# %%
choice = choose_autocast(device)
print(choice)
with torch.inference_mode(), choice.autocast():
    low = model(batch)
error = (low.float() - reference).abs().max().item()
print(f"max |autocast - float32| on the logits: {error:.4f} (logits span {reference.abs().max().item():.2f})")
assert low.dtype == choice.dtype
assert error < 0.05 * reference.abs().max().item()          # close, but not identical: it is lower precision


# %% [markdown]
# Speed and memory, measured here:

# %%
def eager(x):
    with torch.inference_mode():
        return model(x)

def autocast(x):
    with torch.inference_mode(), choice.autocast():
        return model(x)

precision_table = benchmark({"float32": eager, f"autocast {str(choice.dtype)[6:]}": autocast}, batch)
print(precision_table)
fp32_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
half_bytes = sum(p.numel() * p.element_size() for p in half_model.parameters())
print(f"weights: {fp32_bytes / 2**20:.2f} MiB in float32, {half_bytes / 2**20:.2f} MiB after .half()")
assert half_bytes * 2 == fp32_bytes
speedup = precision_table.rows[1].speedup
why_not = ("typical of CPUs without bf16 matrix instructions, where the conversions cost more than they save"
           if device.type == "cpu" else "at this size the conversions and kernel launches cost more than they save")
print(f"autocast is {speedup:.2f}x the float32 speed on this machine" +
      ("" if speedup > 1 else f" -- no speed-up here ({why_not})"))

# %% [markdown]
# On CPUs without bfloat16 matrix instructions (AVX-512 BF16 / AMX) autocast is often **slower**; on
# GPUs with tensor cores it is usually much faster. Measure on the machine you deploy to.
#
# ## 2. `torch.compile`, measured honestly
#
# Compilation happens on the **first call** and can take seconds; only then is the steady state faster
# (or not). `try_compile` compiles, times the first call, and falls back to eager — saying why — if this
# machine cannot compile (no C++ compiler on CPU, for instance):

# %%
compiled = try_compile(model, batch)       # first call under inference_mode, like `eager` above
print(compiled)
if not compiled.compiled:
    print(doctor())           # names the missing piece

def compiled_call(x):         # timed under the same grad mode as `eager`: a different grad mode
    with torch.inference_mode():                 # would make Dynamo compile a second graph
        return compiled(x)

# %%
tables = {}
for n in (1, 32, 256):
    x = torch.randn(n, 256, device=device)
    tables[n] = benchmark({"eager": eager, "compiled": compiled_call}, x, min_run_time=0.3)
    print(f"batch {n}:\n{tables[n]}\n")
with torch.inference_mode():
    torch.testing.assert_close(compiled(batch), reference, rtol=1e-4, atol=1e-4)   # same answers
for n, table in tables.items():
    verdict = "faster" if table["compiled"].speedup > 1.05 else "no faster" if table["compiled"].speedup > 0.95 else "slower"
    print(f"batch {n:3}: compiled is {table['compiled'].speedup:.2f}x eager ({verdict} here)")

# %% [markdown]
# The first call (the `first call` column, compilation included) is orders of magnitude slower than a
# steady-state call: compile pays off only for long-running jobs. Where it helps (GPUs, larger CPUs), it
# usually helps most at small batches — fused kernels, less Python overhead — while at large batches the
# matrix multiplies dominate and both paths call the same BLAS. The verdict lines above say what **this**
# machine does; a small MLP on a 2-core CPU often gains nothing.
#
# **Recompilation.** Compiled code is specialised to the shapes it saw. With `dynamic=False`, every new
# batch size compiles again (counted here with Dynamo's counting backend, which compiles nothing itself):

# %%
sizes = [torch.randn(n, 256, device=device) for n in (2, 3, 4, 8, 16)]
static = count_compilations(model, sizes, dynamic=False)
dynamic = count_compilations(model, sizes, dynamic=True)
default = count_compilations(model, sizes)
print(f"5 batch sizes: {static} compilations with dynamic=False, {dynamic} with dynamic=True, "
      f"{default} with the default (compiles a dynamic graph after the first recompilation)")
assert static == 5 and dynamic == 1 and default <= 2

# %% [markdown]
# The fix is `dynamic=True`, or marking the dimension that varies before the first call:
# `torch._dynamo.mark_dynamic(x, 0)`. On a GPU, `mode="reduce-overhead"` also captures the kernels in a
# CUDA graph, which removes launch overhead for small batches:

# %%
if device.type == "cuda":
    graphed = try_compile(model, batch, mode="reduce-overhead")
    print(graphed)

    def graphed_call(x):
        with torch.inference_mode():
            return graphed(x)
    print(benchmark({"eager": eager, "reduce-overhead": graphed_call}, torch.randn(1, 256, device=device)))
else:
    print("CPU: mode='reduce-overhead' uses CUDA graphs, which exist only on CUDA devices; nothing to measure here.")

# %% [markdown]
# ## 3. ONNX with a dynamic batch axis
#
# Exported without a dynamic axis, the file accepts **only** the example's batch size. ONNX Runtime
# rejects anything else:

# %%
cpu_model = Classifier().eval()
cpu_model.load_state_dict(model.state_dict())
static_path = export_onnx(cpu_model, (torch.randn(2, 256),), "artifacts/ch6/static.onnx", dynamic_batch=False)
session = onnx_session(static_path)
print("input shape in the file:", session.get_inputs()[0].shape)
with expect_error(Exception, match="Got invalid dimensions for input"):
    session.run(None, {"input": torch.randn(4, 256).numpy()})

# %%
dynamic_path = export_onnx(cpu_model, (torch.randn(2, 256),), "artifacts/ch6/dynamic.onnx")
print("input shape in the file:", onnx_session(dynamic_path).get_inputs()[0].shape)
checks = [(torch.randn(n, 256),) for n in (1, 4, 32)]
print(verify_onnx(cpu_model, static_path, checks))
verified = verify_onnx(cpu_model, dynamic_path, checks)
print(verified)
assert verified.passed and verified.max_abs_error < 1e-4
assert not verify_onnx(cpu_model, static_path, checks).passed


# %% [markdown]
# ## 4. Python control flow that depends on the data
#
# `torch.onnx.export` traces the model with `torch.export`, which cannot turn `if x.sum() > 0:` into a
# graph: the condition depends on the **values** of the input, unknown at export time.

# %%
class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Classifier()

    def forward(self, x):
        logits = self.body(x)
        if x.sum() > 0:                      # data-dependent Python branch
            return logits
        return -logits

gated = Gated().eval()
with expect_error(Exception, match="data-dependent|Could not guard|torch.export"):
    export_onnx(gated, (torch.randn(2, 256),), "artifacts/ch6/gated.onnx")

# %% [markdown]
# Fix: export the part without the branch, and make the decision in the caller (or, when the branch must
# live inside the graph, express it with `torch.cond`). Then verify the exported part again:

# %%
body_path = export_onnx(gated.body, (torch.randn(2, 256),), "artifacts/ch6/gated_body.onnx")
assert verify_onnx(gated.body, body_path, checks).passed
body_session = onnx_session(body_path)

def gated_with_onnx(x):
    logits = torch.from_numpy(body_session.run(None, {"input": x.numpy()})[0])
    return logits if x.sum() > 0 else -logits            # the branch, in the caller

for x in (torch.rand(4, 256), -torch.rand(4, 256)):
    with torch.inference_mode():
        torch.testing.assert_close(gated_with_onnx(x), gated(x), rtol=1e-3, atol=1e-4)
print("the caller-side branch gives the same outputs as the original model on both branches")

# %% [markdown]
# ## 5. The final table
#
# All four ways to run the same classifier, on this machine, at batch 1 and 32. ONNX Runtime runs on the
# CPU with as many threads as PyTorch; its time includes converting the input to NumPy and back.

# %%
onnx_run = onnx_session(dynamic_path)

variants = {
    "eager": eager,
    "autocast": autocast,
    "compiled" + ("" if compiled.compiled else " (eager fallback)"): compiled_call,
    "ONNX Runtime (CPU)": lambda x: torch.from_numpy(onnx_run.run(None, {"input": x.cpu().numpy()})[0]),
}
final = {n: benchmark(variants, torch.randn(n, 256, device=device), min_run_time=0.3) for n in (1, 32)}
print(hardware_summary())
print(f"{'variant':<28}{'batch 1 (ms)':>14}{'batch 32 (ms)':>15}")
for name in variants:
    print(f"{name:<28}{final[1][name].median_s * 1e3:>14.3f}{final[32][name].median_s * 1e3:>15.3f}")

import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
final[1].plot(axes[0], title="batch 1")
final[32].plot(axes[1], title="batch 32")
fig.tight_layout()
assert all(row.median_s > 0 for table in final.values() for row in table.rows)

# %% [markdown]
# ## What to remember
# - Never `.half()` a model and feed it float32; use `torch.autocast` with the dtype the device runs natively.
# - Check accuracy against float32 and measure speed: reduced precision is not faster everywhere.
# - `torch.compile`: report compile time apart from steady state; use `dynamic=True` or `mark_dynamic`
#   when shapes vary; fall back to eager when compilation is impossible.
# - ONNX: export with a dynamic batch axis and verify several batch sizes with ONNX Runtime before shipping.
# - Data-dependent `if` in `forward` does not export: move it to the caller or use `torch.cond`.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `RuntimeError: mat1 and mat2 must have the same dtype` | `.half()` model with float32 input: use autocast | 1 |
# | autocast slower than float32 | no fast low-precision units on this device | 1 |
# | the first call takes seconds, later calls are fast | compilation: measure it apart | 2 |
# | every new batch size is slow once | recompilation: `dynamic=True` / `mark_dynamic` | 2 |
# | `InvalidCapturedGraph` / `C++ compile error` from `torch.compile` | no working compiler: `doctor()`, eager fallback | 2 |
# | `INVALID_ARGUMENT : Got invalid dimensions for input` in ONNX Runtime | exported without a dynamic batch axis | 3 |
# | `TorchExportError` mentioning data-dependent expressions | Python `if` on tensor values in `forward` | 4 |
