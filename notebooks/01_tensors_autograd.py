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
# # Chapter 1 — Tensors and autograd
#
# **You will be able to:** pick the device and say whether autograd tracks a tensor; read what
# `backward()` fills in (and what it leaves empty); write a full training loop with no `nn.Module` (the
# manual `y = 2x + 0.3` regression); recognise a forgotten `grad.zero_()` from its loss curve and the
# other update mistakes from their errors; call `backward()` on a non-scalar (and say what it computes)
# and twice through one graph (and say when `retain_graph=True` is right); find a shape bug that hides in
# one branch of `forward` or in a silent broadcast; and say why a learning rate above a limit makes plain
# gradient descent diverge.
#
# **You write the PyTorch; `course_utils` holds the hardened versions of what you write.** Each section
# shows the plain code first and reproduces the pitfall with it; a helper appears only afterwards, as the
# same code with input checks and edge cases handled (here: `get_device`, `expect_error`, `fit_line`, the
# plots and the widget).
#
# **Hardware and time.** Every number below was produced by the machine that ran this notebook (the
# first code cell prints it). On a CUDA GPU the same cells run unchanged with `device = cuda`, and
# section 3 shows the `.to("cuda")` form of its pitfall for real.
#
# **Run All:** 5.5 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).
#
# Each pitfall is **reproduced → seen → diagnosed → fixed → asserted**: the broken code really runs,
# and the `assert` lines are what CI checks on every PyTorch upgrade. `%load_ext course_utils` (first
# code cell of every chapter) adds an explanation and a pointer to the right chapter under any error
# this course knows, when one escapes in your own experiments.

# %% [markdown]
# The first cell imports what the chapter uses and fixes the random seed: `seed_everything(0)` is
# `random.seed(0); numpy.random.seed(0); torch.manual_seed(0)` in one call (`torch.manual_seed` also seeds
# every GPU), so the random numbers below are the same on every run.

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from course_utils import (RegressionExplorer, check_fit_linear_by_hand, check_line_parameters, check_per_loss_gradients,
                          check_sgd_update, check_slopes_of_cube, check_two_branch_forward, exercise, expect_error,
                          expect_warning, fit_line, get_device, hardware_summary, plot_line_fit, plot_losses, progress,
                          seed_everything)

# %load_ext course_utils
seed_everything(0)
print(hardware_summary())

# %% [markdown]
# ## 1. Pick the device once; a tensor carries it, and whether autograd tracks it
#
# In your own scripts, one line at the top picks the device:

# %%
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# on a Mac: "mps" if torch.backends.mps.is_available() else "cpu"
print("the one-liner picks:", device)
one_liner_device = device

# %% [markdown]
# The course uses `get_device()`, the same line hardened: it also takes Apple's MPS where MPS really works
# (it can report itself available and still fail on first use), `get_device(prefer="cpu")` forces the CPU,
# and on the course's GPU test runner it raises instead of silently falling back to the CPU.

# %%
device = get_device()
print("get_device() picks:", device)
assert device == one_liner_device or device.type == "mps"     # the same choice, unless it found a working MPS

# %% [markdown]
# Make it a habit: data goes over with `torch.as_tensor(data).to(device)`; parameters are created **on**
# the device. Tensors made **from data** do not require gradients; parameters you want to learn do.

# %%
data = [[1.0, 2.0], [3.0, 4.0]]
t = torch.as_tensor(data).to(device)
w = torch.randn(2, device=device, requires_grad=True)     # created on the device, as a leaf
h = w * 2                                                   # the result of an op on w

for name, tensor in [("t (data)", t), ("w (parameter)", w), ("h = w * 2", h)]:
    print(f"{name:14} device={tensor.device}  requires_grad={tensor.requires_grad!s:5}  "
          f"is_leaf={tensor.is_leaf!s:5}  grad_fn={type(tensor.grad_fn).__name__ if tensor.grad_fn else None}")

assert not t.requires_grad and t.is_leaf
assert w.requires_grad and w.is_leaf
assert h.requires_grad and not h.is_leaf and h.grad_fn is not None

# %% [markdown]
# ## 2. What `backward()` fills in
#
# `backward()` stores gradients in `.grad` of **leaves** that require grad — the tensors you created, not
# the results of operations on them:

# %%
a = torch.tensor([1.0, -2.0, 3.0], device=device, requires_grad=True)   # leaf
hidden = a * 3                                                            # non-leaf
(hidden ** 2).sum().backward()
print("a.grad =", a.grad)                                   # d/da (3a)^2 = 18a
torch.testing.assert_close(a.grad, 18 * a.detach())

# %% [markdown]
# An intermediate (non-leaf) tensor keeps no `.grad`. Reading it gives `None` and a long `UserWarning`.
# `warnings.catch_warnings(record=True)` collects it instead of printing it, so we can print its first
# sentence and check it:

# %%
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")          # record it even if it was shown before
    hidden_grad = hidden.grad
print("hidden.grad =", hidden_grad)
print("UserWarning:", str(seen[0].message).split(". ")[0])
assert hidden_grad is None and "not a leaf Tensor" in str(seen[0].message)

# %% [markdown]
# When you do want an intermediate's gradient (while debugging), ask with `retain_grad()` **before**
# `backward()`. One detail first: `backward()` **adds** into `.grad` (section 5 shows what that does to a
# training loop), so `a.grad` is emptied before this second pass, or it would read 36a instead of 18a.

# %%
a.grad = None                                                # start afresh: backward() adds into .grad
hidden = a * 3
hidden.retain_grad()
(hidden ** 2).sum().backward()
print("hidden.grad with retain_grad() =", hidden.grad)     # 2 * hidden
torch.testing.assert_close(hidden.grad, 2 * hidden.detach())
torch.testing.assert_close(a.grad, 18 * a.detach())         # this pass alone

# %% [markdown]
# A tensor created **without** `requires_grad=True` (data, a constant) is a leaf too, but autograd does not
# track it: after `backward()` its `.grad` is `None`, and this time **no warning** tells you so.

# %%
scale = torch.tensor([2.0, 2.0, 2.0], device=device)       # data: requires_grad is False
a.grad = None
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    (scale * a).sum().backward()
    scale_grad = scale.grad
print("a.grad =", a.grad, "| scale.grad =", scale_grad, "| warnings:", len(seen))
assert scale_grad is None and not seen and a.grad is not None

# %% [markdown]
# And `backward()` only works on something autograd recorded. A loss computed under `torch.no_grad()` (or
# from tensors that don't require grad) has no `grad_fn`. To see an error and carry on, you would write a
# `try`/`except`:

# %%
with torch.no_grad():
    frozen_loss = (a * 3).pow(2).sum()
print("requires_grad:", frozen_loss.requires_grad, "| grad_fn:", frozen_loss.grad_fn)
try:
    frozen_loss.backward()
except RuntimeError as error:
    print("RuntimeError:", error)

# %% [markdown]
# The pitfall cells of this course use `expect_error(RuntimeError, match=...)`: that `try`/`except`,
# hardened. It prints the error the same way, and **fails the cell** if no error happened or if the
# message does not match, so CI notices the day a PyTorch release changes the behaviour. Its twin
# `expect_warning` does the same for a warning (section 3 uses it).

# %%
with expect_error(RuntimeError, match="does not require grad and does not have a grad_fn"):
    frozen_loss.backward()
assert (a * 3).pow(2).sum().grad_fn is not None          # outside no_grad the graph is recorded

# %% [markdown]
# To print or plot a tensor with NumPy, `.numpy()` hands NumPy the tensor's memory. A tensor in autograd's
# graph (a prediction, a parameter) is refused, because NumPy could not carry its gradient; and NumPy reads
# only CPU memory, so a GPU tensor is refused first, with a `TypeError` ("can't convert cuda:0 device type
# tensor to numpy"). `.detach()` gives the same values without the graph, `.cpu()` copies them to the host:

# %%
prediction = a * 3                                    # in the graph: requires_grad=True
with expect_error((RuntimeError, TypeError), match=r"Can't call numpy\(\) on Tensor that requires grad|"
                                                   r"can't convert cuda:0 device type tensor to numpy"):
    prediction.numpy()
values = prediction.detach().cpu().numpy()            # the fix, for printing and plotting
print("prediction.detach().cpu().numpy() =", values, values.dtype)
torch.testing.assert_close(torch.from_numpy(values), (3 * a.detach()).cpu())

# %% [markdown]
# ### `backward()` on a non-scalar: which combination of the outputs?
#
# `backward()` with no argument needs **one number**. A loss per sample (a forgotten `.mean()`, or
# `nn.MSELoss(reduction="none")`) is a vector, and autograd refuses it:

# %%
target = torch.tensor([0.0, 1.0, 2.0], device=device)
a.grad = None
per_sample = (3 * a - target) ** 2                  # (3,): one loss per sample, not reduced
print("per_sample =", per_sample)
with expect_error(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
    per_sample.backward()
assert a.grad is None                               # nothing was filled in

# %% [markdown]
# Why: the derivative of 3 outputs with respect to 3 inputs is a 3 × 3 matrix, the Jacobian
# `J[i, j] = ∂per_sample[i] / ∂a[j]`, and `backward()` never builds it. It computes a **vector-Jacobian
# product** `vᵀJ`, a gradient for one weighted sum of the outputs, with one weight `v[i]` per output. For a
# scalar output `v = 1` goes without saying; for a vector you choose `v`, in one of two ways:
#
# - reduce first: `.mean()` is `v = 1/N` everywhere and `.sum()` is `v = 1`, so `.sum()` gives an N times
#   larger gradient (section 7 shows what a learning rate N times too large does);
# - or pass `v` yourself: `per_sample.backward(gradient=v)`.
#
# The cell checks both against `torch.autograd.grad(..., grad_outputs=v)` (the same product, returned instead
# of stored in `.grad`), against `v @ J` with the full Jacobian from `torch.autograd.functional.jacobian`,
# and against the gradient of the mean worked out by hand, `2 (3a − target)`.

# %%
def per_sample_loss(t):
    return (3 * t - target) ** 2                    # (3,) -> (3,)

grads = {}
for name, backward in [("mean().backward()", lambda out: out.mean().backward()),
                       ("sum().backward()", lambda out: out.sum().backward()),
                       ("backward(gradient=1/3)", lambda out: out.backward(gradient=torch.full_like(out, 1 / 3)))]:
    a.grad = None
    backward(per_sample_loss(a))                    # a fresh forward for each
    grads[name] = a.grad.clone()
    print(f"{name:23} a.grad = {grads[name]}")

v = torch.full((3,), 1 / 3, device=device)
(returned,) = torch.autograd.grad(per_sample_loss(a), a, grad_outputs=v)
J = torch.autograd.functional.jacobian(per_sample_loss, a.detach())    # (3, 3): diagonal here
print("Jacobian J =\n", J)
torch.testing.assert_close(J, torch.diag(J.diagonal()))            # diagonal: loss i depends on a[i] only
for other in (grads["backward(gradient=1/3)"], returned, v @ J):
    torch.testing.assert_close(other, grads["mean().backward()"])
torch.testing.assert_close(grads["mean().backward()"], 2 * (3 * a.detach() - target))   # by hand
torch.testing.assert_close(grads["sum().backward()"], 3 * grads["mean().backward()"])   # N = 3 times larger

# %% [markdown]
# That Jacobian is diagonal: each loss depends on its own `a[i]` only, so `.sum()` (`v = 1`) hands every
# element its own derivative. `f(x).sum().backward()` is therefore a common way to get `f′` at many points
# in one pass. It works for such **element-wise** `f` only: when the outputs mix the inputs (a matrix
# product, `cumsum`, `softmax`), `v = 1` returns the sum of each column of J instead.

# %%
M = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0]], device=device)   # out = M @ p: (2,) from (3,); J = M
p = torch.tensor([0.5, -1.0, 2.0], device=device, requires_grad=True)
(M @ p).sum().backward()
print("(M @ p).sum().backward():       p.grad =", p.grad, "(the column sums of M)")
torch.testing.assert_close(p.grad, M.sum(dim=0))                     # by hand: 1ᵀ M
p.grad = None
v = torch.tensor([1.0, -2.0], device=device)
(M @ p).backward(gradient=v)
print("(M @ p).backward(gradient=v):   p.grad =", p.grad, "(vᵀ M, v = [1, -2])")
torch.testing.assert_close(p.grad, v @ M)

# %% [markdown]
# ## 3. Pitfall: converting a tensor after `requires_grad=True`
#
# Any operation on a tensor returns a **new** tensor (except the in-place ones with a trailing `_`, such as
# `mul_`, section 5), and so does `.to()` whenever the conversion does
# something (another device, another dtype). That new tensor is the result of an operation, so it is not
# a leaf: `backward()` fills the original, which you no longer hold. Below, a conversion to `float16` (a
# real conversion on every device) and a scaling by 0.01, each written after `requires_grad=True`:

# %%
converted = torch.randn(2, device=device, requires_grad=True).to(torch.float16)   # broken: converted after
scaled = torch.randn(2, device=device, requires_grad=True) * 0.01                 # broken: scaled after
for name, param in [("converted", converted), ("scaled", scaled)]:
    (param ** 2).sum().backward()
    print(f"{name:9}  is_leaf={param.is_leaf}  grad_fn={type(param.grad_fn).__name__}")
with expect_warning(UserWarning, match="not a leaf Tensor"):     # section 2's warning, its key line printed
    converted_grad = converted.grad
print("converted.grad =", converted_grad)
assert converted_grad is None and not converted.is_leaf and not scaled.is_leaf

# %% [markdown]
# The form you will meet most is `.to(device)`: on a GPU, moving a CPU tensor copies it into a new,
# non-leaf tensor. On a CPU-only machine `.to("cpu")` has nothing to do and returns the tensor itself, still
# a leaf, which is why this bug hides on a laptop and appears the first time the code runs on a GPU.

# %%
moved = torch.randn(2, requires_grad=True).to(device)           # created on the CPU, then moved
print(f"device {device.type}: .to(device) returned", "the same tensor" if moved.is_leaf else "a new tensor",
      f"| is_leaf={moved.is_leaf} | grad_fn={type(moved.grad_fn).__name__ if moved.grad_fn else None}")
if device.type == "cpu":
    assert moved.is_leaf                                        # nothing moved: the bug is invisible here
else:
    assert not moved.is_leaf and type(moved.grad_fn).__name__ == "ToCopyBackward0"

# %% [markdown]
# The same holds for an `nn.Parameter` you convert yourself: the result is a plain tensor, not a leaf.

# %%
own = nn.Parameter(torch.randn(2)).to(torch.float16)
print(type(own).__name__, "| is_leaf:", own.is_leaf)
assert not isinstance(own, nn.Parameter) and not own.is_leaf

# %% [markdown]
# The fix, two ways: create the tensor with the dtype and device it must have; or, when its values need
# computing (a scaling, a conversion), compute them first and call `.requires_grad_()` **last**. Either
# way the parameter is a leaf and `backward()` fills its `.grad`.

# %%
created = torch.randn(2, dtype=torch.float16, device=device, requires_grad=True)
computed = (torch.randn(2, device=device) * 0.01).to(torch.float16).requires_grad_()
for name, param in [("created as float16", created), ("computed, then requires_grad_()", computed)]:
    (param ** 2).sum().backward()
    print(f"{name:32} is_leaf={param.is_leaf}  grad={param.grad}")
    torch.testing.assert_close(param.grad, 2 * param.detach())

# %% [markdown]
# **`model.to(device)` is fine.** On an `nn.Module`, `.to()` converts each parameter's data *in place*:
# the module keeps the same `Parameter` objects, still leaves, so `model.parameters()` still yields what
# `backward()` fills. The rule is about tensors you convert yourself, not modules.

# %%
model = nn.Linear(3, 1)
weight_before = model.weight
model.to(device=device, dtype=torch.float16)        # a real conversion on every machine: float32 -> float16
model(torch.randn(4, 3, device=device, dtype=torch.float16)).sum().backward()
print("same Parameter object:", model.weight is weight_before, "| is_leaf:", model.weight.is_leaf,
      "| dtype:", model.weight.dtype, "| weight.grad:", model.weight.grad)
assert model.weight is weight_before and model.weight.is_leaf
assert model.weight.dtype == torch.float16 and model.weight.grad is not None

# %% [markdown]
# ## 4. The manual regression: `y = 2x + 0.3`, no `nn.Module`
#
# Two leaf tensors `w` and `b`, a mean-squared-error loss, `backward()` to fill `.grad`, then the update
# **inside `torch.no_grad()`** (the update itself must not be recorded in the graph) and `grad.zero_()`.

# %%
x = torch.linspace(-1, 1, 200, device=device).reshape(-1, 1)   # (200, 1)
noise = torch.randn(x.shape, device=device)
y = 2 * x + 0.3 + noise * 0.02                                  # (200, 1)

w_start = torch.randn(1, device=device)                          # kept, so section 5 starts from it too
w = w_start.clone().requires_grad_()
b = torch.zeros(1, device=device, requires_grad=True)
lr = 0.1
losses = []
for step in range(1000):
    loss = ((w * x + b - y) ** 2).mean()    # forward: builds the graph
    loss.backward()                          # fills w.grad and b.grad
    with torch.no_grad():                    # the update is not part of the model
        w -= lr * w.grad
        b -= lr * b.grad
        w.grad.zero_()                       # trailing underscore: in place
        b.grad.zero_()
    losses.append(loss.item())               # .item(): a float, not a tensor holding the graph

learned_w, learned_b = w.item(), b.item()
assert abs(learned_w - 2) < 0.02 and abs(learned_b - 0.3) < 0.02   # holds for any seed (noise std 0.02)

# %%
# NBVAL_CHECK_OUTPUT
print(f"learned w = {w.item():.1f}, b = {b.item():.1f}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))     # plain matplotlib: the data, the line, the loss
left.scatter(x.cpu().flatten(), y.cpu().flatten(), s=4, label="data")
left.plot(x.cpu().flatten(), (learned_w * x + learned_b).cpu().flatten(), color="C1", label="learned line")
left.legend()
right.plot(losses)
right.set(yscale="log", xlabel="step", ylabel="loss");

# %% [markdown]
# From here on `plot_line_fit` and `plot_losses` draw the same two plots in one line each (labels, log scale).

# %% [markdown]
# ## 5. Pitfall: forgetting `grad.zero_()`, and other update mistakes
#
# `backward()` **adds** into `.grad`; it never overwrites, and it adds **in place**: a name you bound to
# `v.grad` earlier sees the sum too (keep a copy with `.clone()`). First, see it on one tensor:

# %%
v = torch.tensor([1.0, 2.0], device=device, requires_grad=True)
(v ** 2).sum().backward()
first = v.grad.clone()                      # a copy of this gradient
bound = v.grad                              # another name for the tensor .grad holds
(v ** 2).sum().backward()                   # same computation, no zero_() in between
print("after one backward:", first, "| after two:", v.grad, "| the name bound after the first:", bound)
torch.testing.assert_close(v.grad, 2 * first)
assert bound is v.grad                      # the second pass added into that same tensor, in place

# %% [markdown]
# In a loop this means every step applies the sum of **all past gradients**: the update behaves like a
# momentum with no friction, overshoots, and the loss swings up and down instead of falling. Here is the
# loop of section 4 with the two `grad.zero_()` lines removed, from the same starting `w` and `b`,
# nothing else changed:

# %%
def rises(history):
    """How many steps raised the loss by more than float rounding."""
    return sum(later > earlier * (1 + 1e-5) for earlier, later in zip(history, history[1:]))

w = w_start.clone().requires_grad_()                # the same start as section 4
b = torch.zeros(1, device=device, requires_grad=True)
forgot_losses = []
for step in range(1000):
    loss = ((w * x + b - y) ** 2).mean()
    loss.backward()                          # adds this step's gradient to all the previous ones
    with torch.no_grad():
        w -= lr * w.grad
        b -= lr * b.grad                     # (w.grad.zero_() and b.grad.zero_() removed)
    forgot_losses.append(loss.item())

late = sum(forgot_losses[-100:]) / 100
print(f"with zero_():    loss rose on {rises(losses)} of 999 steps; final loss {losses[-1]:.5f}")
print(f"without zero_(): loss rose on {rises(forgot_losses)} of 999 steps; mean of the last 100 losses {late:.5f} "
      f"({late / losses[-1]:.0f}x the correct loop's final loss)")
fig, (whole, start) = plt.subplots(1, 2, figsize=(10, 3.2))
plot_losses({"with grad.zero_()": losses, "without": forgot_losses}, ax=whole, title="1000 steps")
plot_losses({"with grad.zero_()": losses[:60], "without": forgot_losses[:60]}, ax=start,
            title="the first 60 steps: up, down, up")
whole.set_ylim(top=20)                    # room above the band for the legend
whole.legend(loc="upper right")
assert rises(losses) == 0
assert rises(forgot_losses) > 400 and late > 50 * losses[-1]      # it oscillates for good: about half the steps rise

# %% [markdown]
# `course_utils.fit_line(x, y, lr=, steps=, zero_grad=)` is this loop, hardened: it checks the shapes of
# `x` and `y` (section 6 shows what a wrong shape does, silently) and the hyperparameters with a readable
# error, starts from a seeded `w`, records `w` and `b` at every step, and stops as soon as the loss becomes
# inf or nan. The widget in section 7 calls it; `zero_grad=False` removes the same two lines.

# %%
good = fit_line(x, y, lr=0.1, steps=1000)
forgot = fit_line(x, y, lr=0.1, steps=1000, zero_grad=False)
print("zero_grad=True: ", good)
print("zero_grad=False:", forgot)
assert abs(good.w - learned_w) < 1e-4 and abs(good.b - learned_b) < 1e-4   # another start, same answer
assert rises(forgot.losses) > 400 and sum(forgot.losses[-100:]) / 100 > 50 * good.losses[-1]

# %% [markdown]
# Two more ways to get the update wrong, each with PyTorch's real complaint. First, updating **in place
# outside `no_grad()`**: autograd refuses to modify a leaf it is tracking.

# %%
w = torch.randn(1, device=device, requires_grad=True)
((w * x - y) ** 2).mean().backward()
with expect_error(RuntimeError, match="leaf Variable that requires grad is being used in an in-place operation"):
    w -= 0.1 * w.grad

# %% [markdown]
# Second, **rebinding** with `w = w - lr * w.grad`: the new `w` is computed from the old one, so it is not a
# leaf. At the next step `backward()` fills the old leaf, which you no longer hold; reading `w.grad` gives
# section 2's warning and `None`, and the update then fails on `None`.

# %%
w = torch.randn(1, device=device, requires_grad=True)
((w * x - y) ** 2).mean().backward()
w = w - 0.1 * w.grad                         # step 0: rebinds w to a new tensor
print("after step 0: w.is_leaf =", w.is_leaf)
((w * x - y) ** 2).mean().backward()         # step 1
with expect_warning(UserWarning, match="not a leaf Tensor"):
    w_grad = w.grad
print("w.grad =", w_grad)
with expect_error(TypeError, match="NoneType"):
    w = w - 0.1 * w_grad

# %% [markdown]
# **The trailing underscore.** `zero_()`, `mul_()`, `relu_()` change a tensor **in place**. That saves memory,
# but autograd may have saved the old value for the backward pass; it notices, and refuses:

# %%
z = torch.ones(3, device=device, requires_grad=True)
out = z.sigmoid()                 # sigmoid saves its output: backward needs it
out.mul_(2)                       # in place: overwrites the saved output
with expect_error(RuntimeError, match="modified by an inplace operation"):
    out.sum().backward()

out = z.sigmoid() * 2             # the fix: out of place, a new tensor
out.sum().backward()
sig = torch.sigmoid(torch.ones(3, device=device))
torch.testing.assert_close(z.grad, 2 * sig * (1 - sig))
print("out of place: z.grad =", z.grad)

# %% [markdown]
# A **view** shares its base's memory (`x[0]`, `x.view(...)`, `x.split(...)`), so changing it in place
# changes the base too. Autograd can follow that for one view, but not for the several views that `split`,
# `chunk` or `unbind` return at once, and refuses the in-place op right away. The out-of-place form
# builds a new tensor:

# %%
z = torch.ones(4, device=device, requires_grad=True)
first, second = z.split(2)                            # two views of one tensor
with expect_error(RuntimeError, match="is a view and is being modified inplace"):
    first.mul_(2)
doubled = torch.cat([first * 2, second])              # the fix: a new tensor
doubled.sum().backward()
print("out of place: z.grad =", z.grad)
torch.testing.assert_close(z.grad, torch.tensor([2.0, 2.0, 1.0, 1.0], device=device))

# %% [markdown]
# ## 6. The dynamic graph: ordinary Python decides the computation
#
# The graph is recorded **while** the code runs, so a Python `if` can change it from one call to the
# next, and you can print shapes anywhere before `backward()`. The habit that saves hours: write the
# expected shapes at the top of `forward` and in comments after each line.
#
# This `forward` is meant to compute `h @ W2` for a batch with a positive mean and `relu(h) @ W2` for any
# other batch (its docstring says so). The second branch has a shape bug. The first input takes the
# healthy branch, so the bug stays hidden until an input with a negative mean arrives.

# %%
W1 = torch.randn(4, 8, device=device, requires_grad=True)
W2 = torch.randn(8, 2, device=device, requires_grad=True)

def forward_buggy(x):
    """x: (N, 4) -> (N, 2): h @ W2 if x has a positive mean, else relu(h) @ W2, with h = x @ W1."""
    h = x @ W1                       # (N, 8)
    print("  x mean", round(x.mean().item(), 2), "-> h:", tuple(h.shape))
    if x.mean() > 0:
        return h @ W2                # (N, 8) @ (8, 2) -> (N, 2)
    return torch.relu(h).T @ W2      # BUG: (8, N) @ (8, 2)

torch.manual_seed(1)
positive, negative = torch.rand(5, 4, device=device), -torch.rand(5, 4, device=device)
print("positive batch:"); out = forward_buggy(positive)
print("  out:", tuple(out.shape))
print("negative batch:")
with expect_error(RuntimeError, match="cannot be multiplied"):
    forward_buggy(negative)

# %% [markdown]
# Worse, with exactly **8** rows the transposed `(8, 8)` matrix multiplies without complaint: the buggy
# branch returns the right shape and wrong values. The fix is the docstring's computation, `relu(h) @ W2`.
# Each call records its own graph: the operation feeding the last matrix multiply (read from
# `out.grad_fn.next_functions`) is a ReLU on one branch only.

# %%
def forward_fixed(x):
    """x: (N, 4) -> (N, 2): h @ W2 if x has a positive mean, else relu(h) @ W2, with h = x @ W1."""
    h = x @ W1                       # (N, 8)
    if x.mean() > 0:
        return h @ W2                # (N, 8) @ (8, 2) -> (N, 2)
    return torch.relu(h) @ W2        # (N, 8) @ (8, 2) -> (N, 2)

inputs_of_last_op = {}
for name, batch in [("positive", positive), ("negative", negative)]:
    out = forward_fixed(batch)
    out.sum().backward()
    inputs_of_last_op[name] = [type(fn).__name__ for fn, _ in out.grad_fn.next_functions]
    print(f"{name}: {tuple(batch.shape)} -> {tuple(out.shape)} | {type(out.grad_fn).__name__} computed from",
          inputs_of_last_op[name])
    assert out.shape == (5, 2)
assert "ReluBackward0" in inputs_of_last_op["negative"] and "ReluBackward0" not in inputs_of_last_op["positive"]

eight = -torch.rand(8, 4, device=device)
print("8 rows, negative mean, buggy forward:")
silent = forward_buggy(eight)
print("  out:", tuple(silent.shape), "| largest difference from the fixed forward:",
      round((silent - forward_fixed(eight)).abs().max().item(), 2))
assert silent.shape == (8, 2) and not torch.allclose(silent, forward_fixed(eight))

# %% [markdown]
# The `if` works because `x.mean()` holds one number. A condition on a whole tensor (one value per row) has
# no single truth value, and Python's `if` refuses it. Decide what you meant: **one decision for the batch**
# (reduce with `.all()`, `.any()`, or `.item()` for one element), or **one decision per row**, which is
# `torch.where(condition, a, b)`. A batch of 5 rows with a positive mean and 5 with a negative one:

# %%
mixed = torch.cat([positive, negative])        # (10, 4)
with expect_error(RuntimeError, match="Boolean value of Tensor with more than one value is ambiguous"):
    if mixed.mean(dim=1) > 0:                  # (10,) booleans: one per row
        pass
print("one decision for the batch: any row positive?", bool((mixed.mean(dim=1) > 0).any()))
h = mixed @ W1                                 # (10, 8)
flag = mixed.mean(dim=1, keepdim=True) > 0     # (10, 1): one flag per row, spread over h's 8 columns
per_row = torch.where(flag, h, torch.relu(h)) @ W2                       # (10, 2)
one_by_one = torch.cat([forward_fixed(row[None]) for row in mixed])     # the fixed forward, row by row
print("rows that took the h branch:", flag.squeeze(1).tolist())
assert torch.allclose(per_row, one_by_one) and not torch.allclose(per_row, torch.relu(h) @ W2)

# %% [markdown]
# Two details. Without `keepdim=True` the flag has shape `(10,)` and broadcasting lines it up with the
# *columns* of `h`, not its rows: an error here, and a silent per-column choice for a batch of exactly 8 rows
# (the next section is about such pairings). And `torch.where` computes **both** branches, so a NaN or inf in
# the branch not chosen still reaches the gradient: `torch.where(a > 0, torch.log(a), 0)` at `a = 0` gives a
# NaN gradient; clamp the input of the unsafe branch:

# %%
a = torch.tensor([0.0, 2.0], requires_grad=True)
torch.where(a > 0, torch.log(a), 0.0).sum().backward()                       # log(0) is computed, then unused
b = torch.tensor([0.0, 2.0], requires_grad=True)
torch.where(b > 0, torch.log(b.clamp_min(1e-12)), 0.0).sum().backward()    # the unsafe input clamped
print("gradient, log(a) unclamped:", a.grad.tolist(), "| clamped:", b.grad.tolist())
assert a.grad[0].isnan() and b.grad.isfinite().all()

# %% [markdown]
# ### Broadcasting: shapes that pair up wrongly
#
# Element-wise operations line shapes up **from the right**, and a missing dimension or a dimension of size 1
# is stretched to match. Convenient, and the source of two symptoms: an error when the sizes that meet
# differ, and — worse — no error at all when they happen to fit.
#
# The silent one first: section 4's loop, with `x` as a flat `(200,)` vector (a column read from a file
# often comes out that way) and `y` still `(200, 1)`. `w * x + b - y` is then `(200,) - (200, 1)`, which
# broadcasts to `(200, 200)`: every x paired with every y.

# %%
x_flat = x.flatten()                                             # (200,)
print("prediction", tuple((2 * x_flat).shape), "- target", tuple(y.shape), "->", tuple((2 * x_flat - y).shape))
w = torch.randn(1, device=device, requires_grad=True)
b = torch.zeros(1, device=device, requires_grad=True)
for step in range(200):                          # enough steps to settle here
    loss = ((w * x_flat + b - y) ** 2).mean()    # (200, 200): no error
    loss.backward()
    with torch.no_grad():
        w -= lr * w.grad
        b -= lr * b.grad
        w.grad.zero_()
        b.grad.zero_()
print(f"no error; learned w = {w.item():.2f}, b = {b.item():.2f} (the (200, 1) loop learned w = {learned_w:.2f})")
assert abs(w.item()) < 0.1 < abs(learned_w)   # every x against every y: the best line is flat

# %% [markdown]
# `fit_line` refuses that input with a readable error instead (the shape check of the hardened loop):

# %%
with expect_error(ValueError, match=r"shape \(N, 1\)"):
    fit_line(x_flat, y)

# %% [markdown]
# The error, and its silent twin. A reduction over a dimension drops it: `h.mean(dim=1)` of a `(5, 8)` matrix
# is `(5,)`, and `(5, 8) - (5,)` lines the 8 columns up with the 5 row means. `keepdim=True` keeps the
# dimension as size 1, a column `(5, 1)` that pairs with the rows. With 8 rows instead of 5 the wrong
# version runs and subtracts row *j*'s mean from column *j*.

# %%
h = torch.randn(5, 8, device=device)                            # 5 rows of 8 features
with expect_error(RuntimeError, match=r"The size of tensor a \(8\) must match the size of tensor b \(5\)"):
    h - h.mean(dim=1)                                           # (5, 8) - (5,)
centred = h - h.mean(dim=1, keepdim=True)                       # (5, 8) - (5, 1): each row minus its own mean
print(f"largest row mean after centring: {centred.mean(dim=1).abs().max().item():.1e}")
torch.testing.assert_close(centred.mean(dim=1), torch.zeros(5, device=device), atol=1e-6, rtol=0)

square = torch.randn(8, 8, device=device)                      # 8 rows: the wrong line runs
wrong, right = square - square.mean(dim=1), square - square.mean(dim=1, keepdim=True)
print("8 rows without keepdim: no error, largest difference", round((wrong - right).abs().max().item(), 2))
assert not torch.allclose(wrong, right)

# %% [markdown]
# ### Dtypes that pair up wrongly
#
# Parameters are `float32`. NumPy's default is `float64` ("Double"), and `torch.from_numpy` keeps it. Class
# labels for `cross_entropy` are `int64` ("Long") indices. Most operations promote a mixed pair without a
# word (`float32 + float64` gives `float64`), so the error shows up later, in a loss or a layer:

# %%
targets_from_numpy = torch.from_numpy(np.array([[1.0], [0.0], [1.0], [1.0]]))   # 0/1 labels: float64
probabilities = torch.sigmoid(torch.randn(4, 1, device=device))                  # float32 predictions
print("probabilities:", probabilities.dtype, "| targets:", targets_from_numpy.dtype)
with expect_error(RuntimeError, match="Double"):
    nn.functional.binary_cross_entropy(probabilities, targets_from_numpy.to(device))

logits = torch.randn(4, 3, device=device)                       # 4 samples, 3 classes
labels_as_floats = torch.tensor([0.0, 2.0, 1.0, 2.0], device=device)
with expect_error(RuntimeError, match="Long"):
    nn.functional.cross_entropy(logits, labels_as_floats)

# %% [markdown]
# The fix is to convert once, where the data enters: `.float()` for features and targets of a regression
# or a binary loss, `.long()` for class labels. Printing `x.dtype` next to `x.shape` finds the culprit.

# %%
bce = nn.functional.binary_cross_entropy(probabilities, targets_from_numpy.float().to(device))
ce = nn.functional.cross_entropy(logits, labels_as_floats.long())
print(f"with .float() and .long(): binary cross-entropy {bce.item():.3f}, cross-entropy {ce.item():.3f}")
assert bce.dtype == ce.dtype == torch.float32 and torch.isfinite(bce) and torch.isfinite(ce)

# %% [markdown]
# ### One forward, one backward: calling `backward()` twice
#
# The graph is recorded while the forward runs, and `backward()` frees the tensors it saved for the backward
# pass (the inputs of a multiplication, the output of a `sigmoid`) as soon as it has used them: a large
# model cannot keep that memory. A second backward through the same graph finds them gone. Where you meet
# it: part of the forward computed once, before the loop. Here section 4's prediction is moved out of the
# loop "to save time":

# %%
w = torch.randn(1, device=device, requires_grad=True)
b = torch.zeros(1, device=device, requires_grad=True)
pred = w * x + b                                   # BUG: the forward runs once, before the loop
steps_done = 0
with expect_error(RuntimeError, match="Trying to backward through the graph a second time"):
    for step in range(100):
        loss = ((pred - y) ** 2).mean()            # a new loss node on top of pred's old graph
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
        steps_done += 1
print("steps completed before the error:", steps_done)
assert steps_done == 1

# %% [markdown]
# The nodes of the graph are still there (`pred.grad_fn`); what the first `backward()` freed are the
# tensors they saved. A node shows them as `_saved_*` attributes (private names, for looking only; PyTorch's
# tutorial "Hooks for autograd saved tensors" reads them this way): the multiplication `w * x` saved `x`, which it needs for `w`'s
# gradient, and reading it now raises the same error.

# %%
mul = pred.grad_fn.next_functions[0][0]          # pred = (w * x) + b: the node of w * x
print("pred.grad_fn:", type(pred.grad_fn).__name__, "<-", type(mul).__name__)
with expect_error(RuntimeError, match="access saved tensors after they have already been freed"):
    mul._saved_other

# %% [markdown]
# No error does not mean a second backward was right: a graph whose operations saved nothing (an addition,
# a sum) runs backward twice without complaint, and adds its gradient twice.

# %%
u = torch.ones(2, device=device, requires_grad=True)
total = (u + 1).sum()                  # neither + nor sum() saves a tensor for backward
total.backward()
total.backward()                       # no error...
print("u.grad after two backward() calls:", u.grad)
assert torch.equal(u.grad, torch.full((2,), 2.0, device=device))   # ...and the gradient counted twice

# %% [markdown]
# The message suggests `retain_graph=True`. That silences the error, and the loop then learns nothing:
# `pred` was computed once, from the first `w` and `b`, so every step sees the same prediction, the same
# loss and the same gradient, and `w` and `b` walk off in a straight line.

# %%
w = torch.randn(1, device=device, requires_grad=True)
b = torch.zeros(1, device=device, requires_grad=True)
pred = w * x + b                                   # still once, before the loop
retained_losses = []
for step in range(50):
    loss = ((pred - y) ** 2).mean()
    loss.backward(retain_graph=True)               # the error is gone...
    with torch.no_grad():
        w -= lr * w.grad
        b -= lr * b.grad
        w.grad.zero_()
        b.grad.zero_()
    retained_losses.append(loss.item())
print(f"retain_graph=True: loss {retained_losses[0]:.4f} at step 0 and {retained_losses[-1]:.4f} at step 49; "
      f"w = {w.item():.2f}, b = {b.item():.2f} (section 4: w = {learned_w:.2f}, b = {learned_b:.2f})")
true_loss = ((w * x + b - y) ** 2).mean().item()           # the loss of the w and b the loop ended with
print(f"the loss of those final w and b, from a fresh forward: {true_loss:.4f}")
assert abs(b.item() - learned_b) > 1                        # b walked away from the answer...
assert true_loss > 10 * retained_losses[-1]                 # ...while the stale loss hid it

# %% [markdown]
# The fix is section 4's loop: the forward **inside** the loop. Each step records a fresh graph from the
# current `w` and `b`, and its `backward()` may free it, because no later step needs it.

# %%
w = torch.randn(1, device=device, requires_grad=True)
b = torch.zeros(1, device=device, requires_grad=True)
fresh_losses = []
for step in range(50):
    loss = ((w * x + b - y) ** 2).mean()           # the forward, every step: a new graph
    loss.backward()                                # uses it once and frees it
    with torch.no_grad():
        w -= lr * w.grad
        b -= lr * b.grad
        w.grad.zero_()
        b.grad.zero_()
    fresh_losses.append(loss.item())
print(f"forward in the loop: loss {fresh_losses[0]:.4f} at step 0 and {fresh_losses[-1]:.4f} at step 49")
assert rises(fresh_losses) == 0 and fresh_losses[-1] < fresh_losses[0] / 10

# %% [markdown]
# **When `retain_graph=True` is right:** a second backward through the *same* forward, with nothing changed
# in between. Typically two losses computed from one forward (a fit and a penalty on the outputs) whose
# `backward()` calls sit in different places of the code: the first keeps the graph, the last frees it, and
# the two gradients add up in `.grad` (section 5) to the gradient of the sum, which one
# `(fit + penalty).backward()` gives in a single pass. **When to recompute the forward instead:** whenever
# the parameters changed between the two backward calls, as in every training step; a retained graph still
# holds the old values.

# %%
w = torch.randn(1, device=device, requires_grad=True)
b = torch.zeros(1, device=device, requires_grad=True)
pred = w * x + b                                    # one forward...
fit, penalty = ((pred - y) ** 2).mean(), 0.1 * (pred ** 2).mean()
fit.backward(retain_graph=True)                     # ...the first backward keeps its saved tensors
print("after the first backward, w * x still holds x:", tuple(pred.grad_fn.next_functions[0][0]._saved_other.shape))
penalty.backward()                                  # the last backward frees them
summed = torch.autograd.grad(((w * x + b - y) ** 2).mean() + 0.1 * ((w * x + b) ** 2).mean(), (w, b))
print(f"w.grad = {w.grad.item():.4f}, b.grad = {b.grad.item():.4f} | the gradient of fit + penalty, from a "
      f"fresh forward: {summed[0].item():.4f}, {summed[1].item():.4f}")
torch.testing.assert_close((w.grad, b.grad), summed)
with expect_error(RuntimeError, match="backward through the graph a second time"):
    fit.backward()                                  # a third pass: the shared part, w * x + b, is freed now

# %% [markdown]
# ### A value carried from one step into the next: `.detach()` it
#
# The same error comes from a value that each step computes *and hands on* to the next step's loss: a
# recurrent network's hidden state, or any value the next loss is computed from. (A value kept only for
# logging, such as a running total of the loss, raises nothing: it silently keeps a growing chain of graph
# nodes alive, chapter 3 §3, which is why you log `loss.item()`.) Here a state `h` reads a signal one value
# per step,
# `h = tanh(w * h + x_t)`, and each step fits `h` to the next value. Step 1's graph starts from step 0's
# `h`, so step 1's `backward()` walks back into step 0's graph, which step 0's `backward()` freed:

# %%
stream = torch.randn(8, generator=torch.Generator().manual_seed(1)).to(device)   # a signal, one value per step
w = torch.full((1,), 0.5, device=device, requires_grad=True)
h = torch.zeros(1, device=device)
with expect_error(RuntimeError, match="Trying to backward through the graph a second time"):
    for t in range(len(stream) - 1):
        h = torch.tanh(w * h + stream[t])           # BUG: h brings step t-1's graph into step t
        loss = ((h - stream[t + 1]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad.zero_()
print("steps completed before the error:", t)
assert t == 1

# %% [markdown]
# `retain_graph=True`, as the message suggests, keeps every earlier step's graph, so each `backward()` runs
# back through all the steps so far, and those graphs saved `w` as it was then. The update has changed `w` in
# place since, and the next error says so. It comes one step later than the first error: step 0's `w * h`
# saved no `w`, because its `h` was zeros that need no gradient; step 1's saved `w` at version 1, and step 2's
# `backward()` finds it at version 2:

# %%
w = torch.full((1,), 0.5, device=device, requires_grad=True)
h = torch.zeros(1, device=device)
with expect_error(RuntimeError, match="modified by an inplace operation"):
    for t in range(len(stream) - 1):
        h = torch.tanh(w * h + stream[t])
        loss = ((h - stream[t + 1]) ** 2).mean()
        loss.backward(retain_graph=True)
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad.zero_()
print("retain_graph=True: steps completed before the error:", t)
assert t == 2

# %% [markdown]
# The fix keeps the *value* and drops the *history*: `h.detach()` at the start of each step is the same
# numbers with no `grad_fn` behind them, so the step's `backward()` stops there (truncated backpropagation
# through time; a recurrent model reading a long sequence in chunks does this once per chunk). The state
# still carries what the signal did: a loop that starts every step from zeros instead ends elsewhere, and its
# `w`, which acts only through the carried state, gets a gradient of exactly 0 every step, so it never moves.

# %%
def train_carrying(start_of_step):
    """The loop above, each step starting from start_of_step(h); returns the last h, w and the steps run."""
    w = torch.full((1,), 0.5, device=device, requires_grad=True)
    h = torch.zeros(1, device=device)
    steps = 0
    for t in range(len(stream) - 1):
        h = start_of_step(h)
        h = torch.tanh(w * h + stream[t])
        loss = ((h - stream[t + 1]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad.zero_()
        steps += 1
    return h, w, steps


h, w, steps = train_carrying(lambda h: h.detach())  # the value goes on; its graph stays behind
h_reset, w_reset, _ = train_carrying(torch.zeros_like)   # no error either, but nothing carried
print(f"detached: {steps} of {len(stream) - 1} steps ran; h = {h.item():.4f}, w = {w.item():.4f}; "
      f"h.detach() = {h.detach().item():.4f} with grad_fn {h.detach().grad_fn}")
print(f"reset to zeros every step: h = {h_reset.item():.4f}, w = {w_reset.item():.4f}")
assert steps == len(stream) - 1 and torch.equal(h.detach(), h) and h.detach().grad_fn is None
assert not torch.allclose(h, h_reset) and w_reset.item() == 0.5            # reset: w never moved

# %% [markdown]
# ## 7. Explore: learning rate and steps
#
# How large can the learning rate be? This loss is a quadratic bowl in `(w, b)`. Along `b` its curvature is
# 2, along `w` it is `2·mean(x²) ≈ 0.67` (and, `x` being centred, the two do not interact). One step of
# gradient descent multiplies `b`'s distance from its optimum by `1 − 2·lr`:
#
# - `lr < 0.5`: the factor is between 0 and 1, `b` creeps up to its optimum from one side;
# - `0.5 < lr < 1`: the factor is negative, `b` jumps **to the other side** on every step, closer each time;
#   the line see-saws around the data, yet the loss, which only sees the distance, **falls on every step**;
# - `lr = 1`: the factor is −1, `b` bounces between two values for good and the loss stalls;
# - `lr > 1`: the distance grows on every step, and so does the loss, without bound (just above 1 it
#   falls for the first steps, while `w` still settles; further above, it rises from the start and
#   overflows to `inf`).
#
# Measured with `fit_line` (200 steps each; "b crossed": on how many of the first 9 steps `b` jumped to the
# other side of the optimum that section 4 found):

# %%
curvature_w = 2 * (x ** 2).mean().item()
print(f"curvature along w: 2·mean(x²) = {curvature_w:.2f}; along b: 2")
print(f"{'lr':>5} | loss rose on | b crossed | final loss")
fits, crossed = {}, {}
for lr_try in (0.3, 0.9, 1.0, 1.01, 1.5):
    fits[lr_try] = fit = fit_line(x, y, lr=lr_try, steps=200)
    above = [b_t > learned_b for _, b_t in fit.path[:10]]
    crossed[lr_try] = sum(before != after for before, after in zip(above, above[1:]))
    print(f"{lr_try:5} | {rises(fit.losses):>5} of {len(fit.losses) - 1:>3} | {crossed[lr_try]:>4} of 9 | "
          f"{fit.losses[-1]:.3g}" + ("  (diverged: fit_line stopped)" if fit.diverged else ""))

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
plot_losses({f"lr = {lr_try}": fits[lr_try].losses for lr_try in (0.3, 0.9, 1.0, 1.01)}, ax=left)
for lr_try in (0.3, 0.9, 1.0):
    right.plot([b_t for _, b_t in fits[lr_try].path[:20]], marker=".", label=f"lr = {lr_try}")
right.axhline(learned_b, color="gray", linestyle=":", label="optimum")
right.set(xlabel="step", ylabel="b", title="b during the first 20 steps", ylim=(-0.05, 0.8))
right.legend(loc="upper center", ncol=4, fontsize="small");

assert all(rises(fits[lr_try].losses) == 0 for lr_try in (0.3, 0.9, 1.0))   # up to lr = 1 the loss never rises
assert crossed[0.3] == 0 and crossed[0.9] == 9 and crossed[1.0] == 9       # past 0.5, b overshoots every step
assert fits[1.0].losses[-1] > 100 * fits[0.9].losses[-1]                     # at exactly 1, b never settles
assert rises(fits[1.01].losses) > 190 and fits[1.01].losses[-1] > 100   # just past 1: grows, after the first steps
assert fits[1.5].diverged                                                    # further past 1: overflows to inf

# %% [markdown]
# Now try it yourself: drag the sliders (the plot redraws when you let go) across `lr = 0.5` and `lr = 1`
# and watch the fitted line and the loss.

# %%
RegressionExplorer(x.cpu(), y.cpu(), lr=0.1, steps=200)


# %% [markdown]
# ## 8. Exercises
#
# Each exercise is a function in a cell, followed by its check. Fix the code (or write it, where the body
# is `...`) and run the cell again. The check runs your function on its own inputs (other sizes, dtypes and
# learning rates than the chapter's, on `get_device()`) and says what it **observed**; each further failed
# attempt adds one hint. `progress(chapter=1)` at the end of the notebook shows what you have solved.
#
# **Exercise 1 (write it).** Return the derivative of `x ** 3` at every point of `xs`, a tensor of any shape
# and floating dtype, as a tensor of the same shape, dtype and device. Compute it **by autograd**, with
# **one** backward pass for all the points (the check notices a formula worked out by hand, and counts the
# passes).

# %%
@exercise
def slopes_of_cube(xs: torch.Tensor) -> torch.Tensor:
    ...  # your code here


check_slopes_of_cube(slopes_of_cube)


# %% [markdown]
# **Exercise 2 (write it).** Write the update step of section 4 as a function: for each leaf tensor in
# `params` (any number of them, of any shapes), subtract `lr * grad` **in place** without recording it in the
# graph, then zero its gradient.

# %%
@exercise
def sgd_update(params: list[torch.Tensor], lr: float) -> None:
    ...  # your code here


check_sgd_update(sgd_update)


# %% [markdown]
# **Exercise 3 (find the bugs; there are 2).** Section 4's loop, for inputs with several features:
# `y ≈ x @ w + b`. The check fits its own data, once with 1 feature and once with 3, each with its own
# learning rate and number of steps, and compares every step with plain gradient descent from zero.

# %%
@exercise
def fit_linear_by_hand(x: torch.Tensor, y: torch.Tensor, lr: float,
                       steps: int) -> tuple[list[float], float, list[float]]:
    """Fit y ≈ x @ w + b by gradient descent from w = 0, b = 0. x: (N, k), y: (N, 1).
    Returns w as a list of k floats, b as a float, and the loss of every step as floats."""
    w = torch.zeros(x.shape[1], 1, device=x.device, requires_grad=True)    # (k, 1)
    b = torch.zeros(1, device=x.device, requires_grad=True)
    losses = []
    for step in range(steps):
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        w -= lr * w.grad
        b -= lr * b.grad
        losses.append(loss.item())
    return w.flatten().tolist(), b.item(), losses


check_fit_linear_by_hand(fit_linear_by_hand)


# %% [markdown]
# **Exercise 4 (find the bugs; there are 2).** The parameters of a linear model, made by hand. Both come
# out with the right shape, dtype and device, and yet `backward()` leaves `weight.grad` and `bias.grad` at
# `None`. The check asks for parameters of two sizes and two dtypes on its device, runs a backward pass
# through `x @ weight + bias` and looks at what it filled in.

# %%
@exercise
def line_parameters(n_features: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """weight: (n_features, 1), small random values (std 0.01); bias: (1,), zeros. Both of `dtype`, on
    `device`, both learnable."""
    weight = torch.randn(n_features, 1, dtype=dtype, device=device, requires_grad=True) * 0.01
    bias = torch.zeros(1, requires_grad=True).to(device, dtype)
    return weight, bias


check_line_parameters(line_parameters)


# %% [markdown]
# **Exercise 5 (find the bug; there is 1).** A `forward` with two branches, like section 6's. It runs on
# the batch you would try first. The check runs both branches, with several batch sizes.

# %%
@exercise
def two_branch_forward(x: torch.Tensor, W1: torch.Tensor, W2: torch.Tensor) -> torch.Tensor:
    """x: (N, 4), W1: (4, 8), W2: (8, 2) -> (N, 2).

    A batch with a positive mean returns h @ W2. Any other batch is normalised first: each row of h is
    divided by that row's largest absolute value.
    """
    h = x @ W1                               # (N, 8)
    if x.mean() > 0:
        return h @ W2                        # (N, 2)
    scale = h.abs().amax(dim=1)              # the largest |value| of each row
    return (h / scale) @ W2                  # (N, 2)


check_two_branch_forward(two_branch_forward)


# %% [markdown]
# **Exercise 6 (find the bugs; there are 2).** A model whose one forward pass feeds two losses, a fit and a
# penalty. To see which of the two pulls the weights harder, this function should return the gradient of
# each loss **separately**, from that one forward pass. It stops with an error, and fixing the error alone
# is not enough. The check uses its own shapes, and once calls it with an earlier gradient still in
# `w.grad`, as a training loop would leave it.

# %%
@exercise
def per_loss_gradients(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w: (k, m), a leaf that requires grad (its .grad may hold an earlier gradient); x: (N, k); y: (N, m).

    One forward pass, h = tanh(x @ w), feeds two losses: fit = mean((h - y)**2) and penalty = mean(h**2).
    Returns (gradient of fit, gradient of penalty) with respect to w, each (k, m).
    """
    h = torch.tanh(x @ w)                    # the forward pass: once
    fit = ((h - y) ** 2).mean()
    penalty = (h ** 2).mean()
    fit.backward()
    grad_fit = w.grad
    penalty.backward()
    grad_penalty = w.grad
    return grad_fit, grad_penalty


check_per_loss_gradients(per_loss_gradients)

# %% [markdown]
# ## What to remember
# - Pick the device once (`torch.device("cuda" if torch.cuda.is_available() else "cpu")`, or
#   `get_device()`); create parameters **on** the device and dtype with `requires_grad=True`. Any
#   operation after that (`.to()`, `* 0.01`) returns a non-leaf: compute the values first, then
#   `.requires_grad_()`. On a CPU-only machine `.to("cpu")` hides the bug. `model.to(device)` on an
#   `nn.Module` is fine: it converts in place.
# - Only leaves that require grad get `.grad`; `retain_grad()` for intermediates while debugging.
# - `backward()` needs a scalar. For a vector of losses, reduce it (`.mean()`: `.sum()` makes the gradient N
#   times larger) or pass the weights yourself, `backward(gradient=v)`: autograd computes the
#   vector-Jacobian product `vᵀJ`, never J itself. `f(x).sum().backward()` gives each point's own
#   derivative only when `f` is element-wise.
# - One forward, one backward: `backward()` frees the tensors the graph saved. Compute the forward inside
#   the loop, every step. `retain_graph=True` is for a second backward through the *same, unchanged*
#   forward (two losses of one forward); in a training loop it only hides a stale forward. A value carried
#   into the next step (a hidden state) is `.detach()`-ed at the step's start.
# - Update under `torch.no_grad()`, in place (`-=`), then `grad.zero_()`: `backward()` accumulates, in
#   place, into the one tensor `.grad` holds; `.clone()` a gradient you want to keep.
# - Log `loss.item()`, not `loss`.
# - Past a learning-rate limit (here `lr = 1`, set by the loss's largest curvature) plain gradient descent
#   diverges; between half the limit and the limit the parameters overshoot back and forth while the loss
#   still falls.
# - The graph is rebuilt every call: print shapes, write them in comments, test every branch. Broadcasting
#   lines shapes up from the right: keep `(N, 1)` columns as `(N, 1)`, reduce with `keepdim=True`, and test
#   with a batch size that differs from every other dimension, so a broadcast cannot hide.
# - Convert dtypes where the data enters: `.float()` for NumPy's float64, `.long()` for class labels.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `UserWarning: The .grad attribute of a Tensor that is not a leaf Tensor is being accessed` | you converted (or scaled) a parameter after `requires_grad=True`, rebound it with `w = w - ...`, or read an intermediate's grad | 2, 3, 5 |
# | `.grad` is `None` after `backward()`, no warning | the tensor was created without `requires_grad=True` | 2 |
# | gradients arrive on the CPU but are `None` on a GPU | `.to(device)` after `requires_grad=True` | 3 |
# | the loss rises and falls from step to step and stays far above where it should end | `grad.zero_()` missing | 5 |
# | the loss grows on every step, then becomes `inf` / `nan` | learning rate past the limit | 7 |
# | the loss falls, but a parameter jumps from one side of its final value to the other on every step | learning rate just below the limit | 7 |
# | `RuntimeError: a leaf Variable that requires grad is being used in an in-place operation` | update outside `torch.no_grad()` | 5 |
# | `TypeError: unsupported operand type(s) ... 'NoneType'` in the update | `w = w - ...` rebound `w` to a non-leaf | 5 |
# | `RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation` | an in-place op overwrote a value autograd saved | 5 |
# | `RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn` | loss computed under `no_grad` or from tensors without `requires_grad` | 2 |
# | `RuntimeError: grad can be implicitly created only for scalar outputs` | `backward()` on a loss per sample (no `.mean()`) or any other non-scalar | 2 (non-scalar) |
# | `.sum().backward()` gives gradients that are not each element's own derivative | the outputs mix the inputs (a matrix product, `cumsum`, `softmax`): `v = 1` sums J's columns | 2 (non-scalar) |
# | `RuntimeError: Trying to backward through the graph a second time` | part of the forward computed once, before the loop; a value carried from the last step (a hidden state) without `.detach()`; or two losses of one forward, each `backward()`-ed | 6 (backward twice, a carried value) |
# | `retain_graph=True` silenced that error, and now the loss never changes | the prediction is computed once, from the first parameters: a stale forward | 6 (backward twice) |
# | a gradient you stored earlier changed after another `backward()` | `g = w.grad` names the tensor that `backward()` adds into, in place | 5 |
# | `RuntimeError: mat1 and mat2 shapes cannot be multiplied` on some batches only | a branch of `forward` with the wrong shapes | 6 |
# | `RuntimeError: The size of tensor a (8) must match the size of tensor b (5)` | a broadcast that pairs the wrong dimensions (a reduction without `keepdim=True`) | 6 (broadcasting) |
# | no error, but a flat fit or wrong values when the batch size equals another dimension | a silent broadcast (`(N,)` against `(N, 1)`, or 8 rows against 8 features) | 6 (broadcasting) |
# | `RuntimeError: Found dtype Double but expected Float`, or `expected target dtype to be Long` | float64 data from NumPy, or class labels stored as floats | 6 (dtypes) |
# | `RuntimeError: Can't call numpy() on Tensor that requires grad` | a tensor in the graph handed to NumPy: `.detach().cpu().numpy()` | 2 |
# | `TypeError: can't convert cuda:0 device type tensor to numpy` | a GPU tensor handed to NumPy: `.cpu()` first | 2 |
# | `RuntimeError: Output 0 of Split (or Unbind) is a view and is being modified inplace` | an in-place op on one of several views (`split`, `chunk`, `unbind`) | 5 |
# | `RuntimeError: Boolean value of Tensor with more than one value is ambiguous` | an `if`, `while`, `and` or `or` on a tensor of several values: `.any()`/`.all()` for one decision, `torch.where` for one per element | 6 |
# | `ValueError: only one element tensors can be converted to Python scalars` | `.item()`, `int()` or `float()` of a tensor with several values | 6 |

# %%
print(progress(chapter=1))
