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
# other update mistakes from their errors; and use the dynamic graph to find a shape bug that hides in one
# branch.
#
# **You write the PyTorch; `course_utils` holds the hardened versions of what you write.** Each section
# shows the plain code first and reproduces the pitfall with it; a helper appears only afterwards, as the
# same code with input checks and edge cases handled (here: `get_device`, `fit_line`, the plots and the
# widget).
#
# **Hardware and time.** Every number below was produced by the machine that ran this notebook (the
# first code cell prints it). Measured on a 2-core CPU machine: *Run All* took 6 s of cell time when the
# machine was idle and up to 15 s while other processes kept its cores busy; `time ./course outputs`,
# which also starts the kernel and saves the notebook, took 16 to 32 s. On a CUDA GPU the same cells run
# unchanged with `device = cuda`.
#
# Each pitfall is **reproduced → seen → diagnosed → fixed → asserted**: the broken code really runs,
# and the `assert` lines are what CI checks on every PyTorch upgrade. `%load_ext course_utils` (first
# code cell of every chapter) adds an explanation and a pointer to the right chapter under any error
# this course knows, when one escapes in your own experiments.

# %%
import warnings

import matplotlib.pyplot as plt
import torch
from torch import nn

from course_utils import (RegressionExplorer, check_fit_line_by_hand, check_grad_of_cube, check_line_parameters,
                          check_sgd_update, check_two_branch_forward, exercise, expect_error, fit_line,
                          get_device, hardware_summary, plot_line_fit, plot_losses, progress, seed_everything)

# %load_ext course_utils
seed_everything(0)
print(hardware_summary())

# %% [markdown]
# ## 1. Pick the device once; a tensor carries it, and whether autograd tracks it
#
# In your own scripts, one line at the top picks the device:

# %%
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print("the one-liner picks:", device)

# %% [markdown]
# The course uses `get_device()`, the same line hardened: it also takes Apple's MPS where MPS really works
# (it can report itself available and still fail on first use), `get_device(prefer="cpu")` forces the CPU,
# and on the course's GPU test runner it raises instead of silently falling back to the CPU.

# %%
device = get_device()
print("get_device() picks:", device)
assert (device.type == "cuda") == torch.cuda.is_available()     # CUDA whenever there is one

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
# An intermediate (non-leaf) tensor keeps no `.grad`. Reading it gives `None` and a long `UserWarning`;
# here it is caught, and its key line printed:

# %%
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")          # record it even if it was shown before
    hidden_grad = hidden.grad
print("hidden.grad =", hidden_grad)
print("UserWarning:", str(seen[0].message).split(". ")[0])
assert hidden_grad is None and "not a leaf Tensor" in str(seen[0].message)

# %% [markdown]
# When you do want an intermediate's gradient (while debugging), ask with `retain_grad()` **before**
# `backward()`:

# %%
hidden = a * 3
hidden.retain_grad()
(hidden ** 2).sum().backward()
print("hidden.grad with retain_grad() =", hidden.grad)     # 2 * hidden
torch.testing.assert_close(hidden.grad, 2 * hidden.detach())

# %% [markdown]
# And `backward()` only works on something autograd recorded. A loss computed under `torch.no_grad()` (or
# from tensors that don't require grad) has no `grad_fn`:

# %%
with torch.no_grad():
    frozen_loss = (a * 3).pow(2).sum()
print("requires_grad:", frozen_loss.requires_grad, "| grad_fn:", frozen_loss.grad_fn)
with expect_error(RuntimeError, match="does not require grad and does not have a grad_fn"):
    frozen_loss.backward()
assert (a * 3).pow(2).sum().grad_fn is not None          # outside no_grad the graph is recorded

# %% [markdown]
# ## 3. Pitfall: converting a tensor after `requires_grad=True`
#
# `.to()` returns a **new** tensor whenever the conversion does something (another device, another dtype).
# That new tensor is the result of an operation, so it is not a leaf: `backward()` fills the original,
# which you no longer hold. The conversion here is to `float16`, a real conversion on every device (on a
# GPU, `.to("cuda")` of a CPU tensor does the same).

# %%
param = torch.randn(2, requires_grad=True).to(torch.float16)   # the broken way
(param ** 2).sum().backward()
print("is_leaf:", param.is_leaf, "| grad_fn:", type(param.grad_fn).__name__)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    param_grad = param.grad                                     # the same warning as in section 2
print("param.grad =", param_grad)
assert param_grad is None and not param.is_leaf and "not a leaf Tensor" in str(seen[0].message)

# %% [markdown]
# The same holds for an `nn.Parameter` you convert yourself: the result is a plain tensor, not a leaf.

# %%
own = nn.Parameter(torch.randn(2)).to(torch.float16)
print(type(own).__name__, "| is_leaf:", own.is_leaf)
assert not isinstance(own, nn.Parameter) and not own.is_leaf

# %% [markdown]
# The fix: create the tensor with the dtype and device it must have, then it is a leaf (or convert first
# and call `.requires_grad_()` last).

# %%
param = torch.randn(2, dtype=torch.float16, device=device, requires_grad=True)
(param ** 2).sum().backward()
torch.testing.assert_close(param.grad, 2 * param.detach())
print("fixed: param.grad =", param.grad)

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

w = torch.randn(1, device=device, requires_grad=True)
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
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
plot_line_fit(x, y, learned_w, learned_b, ax=left)
plot_losses({"lr = 0.1": losses}, ax=right);

# %% [markdown]
# ## 5. Pitfall: forgetting `grad.zero_()`, and other update mistakes
#
# `backward()` **adds** into `.grad`; it never overwrites. First, see it on one tensor:

# %%
v = torch.tensor([1.0, 2.0], requires_grad=True)
(v ** 2).sum().backward()
first = v.grad.clone()
(v ** 2).sum().backward()                   # same computation, no zero_() in between
print("after one backward:", first, "| after two:", v.grad)
torch.testing.assert_close(v.grad, 2 * first)

# %% [markdown]
# In a loop this means every step applies the sum of **all past gradients**: the update behaves like a
# momentum with no friction, overshoots, and the loss swings up and down instead of falling. Here is the
# loop of section 4 with the two `grad.zero_()` lines removed, nothing else changed:

# %%
def rises(history):
    """How many steps raised the loss by more than float rounding."""
    return sum(later > earlier * (1 + 1e-5) for earlier, later in zip(history, history[1:]))

w = torch.randn(1, device=device, requires_grad=True)
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
plot_losses({"with grad.zero_()": losses, "without": forgot_losses}, title="forgetting grad.zero_()")
assert rises(losses) == 0
assert rises(forgot_losses) > 400 and late > 50 * losses[-1]      # it oscillates for good: about half the steps rise

# %% [markdown]
# `course_utils.fit_line(x, y, lr=, steps=, zero_grad=)` is this loop, hardened: it checks the shapes of
# `x` and `y` and the hyperparameters with a readable error, starts from a seeded `w`, and stops as soon as
# the loss becomes inf or nan. The widget in section 7 calls it; `zero_grad=False` removes the same two
# lines.

# %%
good = fit_line(x, y, lr=0.1, steps=1000)
forgot = fit_line(x, y, lr=0.1, steps=1000, zero_grad=False)
print("zero_grad=True: ", good)
print("zero_grad=False:", forgot)
assert abs(good.w - learned_w) < 1e-4 and abs(good.b - learned_b) < 1e-4   # another start, same answer
assert sum(forgot.losses[-100:]) / 100 > 50 * good.losses[-1]
with expect_error(ValueError, match=r"shape \(N, 1\)"):
    fit_line(x.flatten(), y)                         # a (200,) x: the plain loop would broadcast silently

# %% [markdown]
# Two more ways to get the update wrong, each with PyTorch's real complaint:
#
# - updating **in place outside `no_grad()`**: autograd refuses to modify a leaf it is tracking;
# - **rebinding** with `w = w - lr * w.grad`: the new `w` is not a leaf, so next step `w.grad` is `None`.

# %%
w = torch.randn(1, requires_grad=True)
((w * x.cpu() - y.cpu()) ** 2).mean().backward()
with expect_error(RuntimeError, match="leaf Variable that requires grad is being used in an in-place operation"):
    w -= 0.1 * w.grad

# %%
w = torch.randn(1, requires_grad=True)
with warnings.catch_warnings(record=True), expect_error(TypeError, match="NoneType"):   # records section 2's warning
    for step in range(2):
        print(f"step {step}: w.is_leaf = {w.is_leaf}")
        ((w * x.cpu() - y.cpu()) ** 2).mean().backward()
        w = w - 0.1 * w.grad        # rebinds w to a new, non-leaf tensor: at step 1 w.grad is None

# %% [markdown]
# **The trailing underscore.** `zero_()`, `mul_()`, `relu_()` change a tensor **in place**. That saves memory,
# but autograd may have saved the old value for the backward pass; it notices, and refuses:

# %%
z = torch.ones(3, requires_grad=True)
out = z.sigmoid()                 # sigmoid saves its output: backward needs it
out.mul_(2)                       # in place: overwrites the saved output
with expect_error(RuntimeError, match="modified by an inplace operation"):
    out.sum().backward()

out = z.sigmoid() * 2             # the fix: out of place, a new tensor
out.sum().backward()
sig = torch.sigmoid(torch.ones(3))
torch.testing.assert_close(z.grad, 2 * sig * (1 - sig))
print("out of place: z.grad =", z.grad)

# %% [markdown]
# ## 6. The dynamic graph: ordinary Python decides the computation
#
# The graph is recorded **while** the code runs, so a Python `if` can change it from one call to the
# next, and you can print shapes anywhere before `backward()`. The habit that saves hours: write the
# expected shapes at the top of `forward` and in comments after each line.
#
# This `forward` has a shape bug on one branch only. The first input takes the healthy branch, so the
# bug stays hidden until an input with a negative mean arrives.

# %%
W1 = torch.randn(4, 8, requires_grad=True)
W2 = torch.randn(8, 2, requires_grad=True)

def forward_buggy(x):
    """x: (N, 4) -> (N, 2)"""
    h = x @ W1                       # (N, 8)
    print("  x mean", round(x.mean().item(), 2), "-> h:", tuple(h.shape))
    if x.mean() > 0:
        return h @ W2                # (N, 8) @ (8, 2) -> (N, 2)
    return h.T @ W2                  # BUG: (8, N) @ (8, 2)

torch.manual_seed(1)
positive, negative = torch.rand(5, 4), -torch.rand(5, 4)
print("positive batch:"); out = forward_buggy(positive)
print("  out:", tuple(out.shape), "grad_fn:", type(out.grad_fn).__name__)
print("negative batch:")
with expect_error(RuntimeError, match="cannot be multiplied"):
    forward_buggy(negative)


# %%
def forward_fixed(x):
    """x: (N, 4) -> (N, 2)"""
    h = x @ W1                       # (N, 8)
    if x.mean() > 0:
        return h @ W2                # (N, 2)
    return torch.relu(h) @ W2        # (N, 2): the other branch does different work, same shapes

for batch in (positive, negative):
    out = forward_fixed(batch)
    out.sum().backward()             # each call built its own graph
    print(tuple(batch.shape), "->", tuple(out.shape), "| last op:", type(out.grad_fn).__name__)
    assert out.shape == (5, 2)

# %% [markdown]
# ## 7. Explore: learning rate and steps
#
# Drag the sliders (the plot redraws when you let go). Small rates converge slowly; around
# `lr ≈ 1` the loss starts to bounce, and past it the updates overshoot by more each step and the loss
# explodes. For this loss the curvature along `b` is 2, so plain gradient descent diverges for `lr > 2 / 2 = 1`.

# %%
RegressionExplorer(x.cpu(), y.cpu(), lr=0.1, steps=200)

# %%
too_large = fit_line(x, y, lr=1.5, steps=1000)
print(too_large)
assert too_large.diverged
assert not fit_line(x, y, lr=0.9, steps=1000).diverged


# %% [markdown]
# ## 8. Exercises
#
# Each exercise is a function in a cell, followed by its check. Fix the code (or write it, where the body
# is `...`) and run the cell again. The check runs your function on its own small data and says what it
# **observed**; each further failed attempt adds one hint. `progress()` at the end of the notebook shows what
# you have solved, across chapters.
#
# **Exercise 1 (write it).** Return the derivative of `x ** 3` at `x`, computed **by autograd** (not by
# hand), as a Python float.

# %%
@exercise
def grad_of_cube(x: float) -> float:
    ...  # your code here


check_grad_of_cube(grad_of_cube)


# %% [markdown]
# **Exercise 2 (write it).** Write the update step of section 4 as a function: for each leaf tensor in
# `params`, subtract `lr * grad` **in place** without recording it in the graph, then zero its gradient.

# %%
@exercise
def sgd_update(params: list[torch.Tensor], lr: float) -> None:
    ...  # your code here


check_sgd_update(sgd_update)


# %% [markdown]
# **Exercise 3 (find the bugs; there are 2).** Section 4's loop as a function. The check fits its own
# data (100 noisy points of `y = 2x + 0.3`) with `lr = 0.1` for 300 steps and compares the result with the
# least-squares line.

# %%
@exercise
def fit_line_by_hand(x: torch.Tensor, y: torch.Tensor, lr: float, steps: int) -> tuple[float, float, list[float]]:
    """Fit y ≈ w * x + b from w = b = 0. x, y: (N, 1). Returns w, b and the loss of every step."""
    w = torch.zeros(1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    losses = []
    for step in range(steps):
        loss = ((w * x + b - y) ** 2).mean()
        loss.backward()
        w -= lr * w.grad
        b -= lr * b.grad
        losses.append(loss.item())
    return w.item(), b.item(), losses


check_fit_line_by_hand(fit_line_by_hand)


# %% [markdown]
# **Exercise 4 (find the bugs; there are 2).** The parameters of a linear model, made by hand. Both come
# out with the right shape and dtype, and yet `backward()` leaves `weight.grad` and `bias.grad` at `None`.
# The check asks for `float64` parameters, runs a backward pass through `x @ weight + bias` and looks at
# what it filled in.

# %%
@exercise
def line_parameters(n_features: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """weight: (n_features, 1), small random values (std 0.01); bias: (1,), zeros. Both of `dtype`, both learnable."""
    weight = torch.randn(n_features, 1, dtype=dtype, requires_grad=True) * 0.01
    bias = torch.zeros(1, requires_grad=True).to(dtype)
    return weight, bias


check_line_parameters(line_parameters)


# %% [markdown]
# **Exercise 5 (find the bug; there is 1).** A `forward` with two branches, like section 6's. It runs on
# the batch you would try first. The check runs both branches, with 5 rows and with 8.

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
# ## What to remember
# - Pick the device once (`torch.device("cuda" if torch.cuda.is_available() else "cpu")`, or
#   `get_device()`); create parameters **on** the device and dtype with `requires_grad=True`. Any
#   operation after that (`.to()`, arithmetic) returns a non-leaf: convert first, then
#   `.requires_grad_()`. `model.to(device)` on an `nn.Module` is fine: it converts in place.
# - Only leaves get `.grad`; `retain_grad()` for intermediates while debugging.
# - Update under `torch.no_grad()`, in place (`-=`), then `grad.zero_()`: `backward()` accumulates.
# - Log `loss.item()`, not `loss`.
# - The graph is rebuilt every call: print shapes, write them in comments, test every branch (and a batch
#   size that differs from every other dimension, so a broadcast cannot hide).
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `UserWarning: The .grad attribute of a Tensor that is not a leaf Tensor is being accessed` | you converted (or scaled) a parameter after `requires_grad=True`, or you read an intermediate's grad | 2, 3 |
# | `.grad` is `None` after `backward()`, no warning | the tensor was created without `requires_grad=True` | 2 |
# | the loss swings up and down and never settles | `grad.zero_()` missing, or the learning rate is too large | 5, 7 |
# | `RuntimeError: a leaf Variable that requires grad is being used in an in-place operation` | update outside `torch.no_grad()` | 5 |
# | `TypeError: unsupported operand type(s) ... 'NoneType'` in the update | `w = w - ...` rebound `w` to a non-leaf | 5 |
# | `RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation` | an in-place op overwrote a value autograd saved | 5 |
# | `RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn` | loss computed under `no_grad` or from tensors without `requires_grad` | 2 |
# | `RuntimeError: mat1 and mat2 shapes cannot be multiplied` on some batches only | a branch of `forward` with the wrong shapes | 6 |
# | `RuntimeError: The size of tensor a (8) must match the size of tensor b (5)` on some batches only | a broadcast that pairs the wrong dimensions | 6, exercise 5 |

# %%
print(progress())
