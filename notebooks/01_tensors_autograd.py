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
# **You will be able to:** say where a tensor lives and whether autograd tracks it; write a full
# training loop with no `nn.Module` (the manual `y = 2x + 0.3` regression); recognise the forgotten
# `grad.zero_()` from its loss curve; read what `backward()` fills in; and use the dynamic graph to find a
# shape bug that hides in one branch.
#
# **Hardware and time.** Every number below was produced by the machine that ran this notebook (the
# first code cell prints it). *Run All* takes about 10 seconds on a 2-core CPU laptop; on a CUDA GPU
# the same cells run unchanged with `device = cuda`.
#
# Each pitfall is **reproduced → seen → diagnosed → fixed → asserted**: the broken code really runs,
# and the `assert` lines are what CI checks on every PyTorch upgrade. `%load_ext course_utils` (first
# code cell of every chapter) adds an explanation and a pointer to the right chapter under any error
# this course knows, when one escapes in your own experiments.

# %%
import torch

from course_utils import (RegressionExplorer, check_grad_of_cube, check_sgd_update, exercise,
                          expect_error, expect_warning, fit_line, get_device, hardware_summary,
                          plot_line_fit, plot_losses, seed_everything)

# %load_ext course_utils
device = get_device()          # CUDA if there is one, else MPS where it works, else CPU
seed_everything(0)
print("device:", device)
print(hardware_summary())

# %% [markdown]
# ## 1. A tensor carries its device and whether autograd tracks it
#
# Make it a habit: one `device = ...` at the top, and `torch.as_tensor(data).to(device)` for data.
# Tensors made **from data** do not require gradients; parameters you want to learn do.

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
# **Pitfall: converting a parameter after `requires_grad=True`.** `torch.randn(2, requires_grad=True).to(...)`
# returns a *new* tensor whenever the conversion does anything (another device, another dtype). The leaf that
# collects gradients is the original, which you no longer hold. Here the conversion is to `float64`, which
# shows the same thing on every machine (on a GPU, `.to("cuda")` does it too).

# %%
param = torch.randn(2, requires_grad=True).to(torch.float64)   # the broken way
(param ** 2).sum().backward()
print("is_leaf:", param.is_leaf, "| grad_fn:", param.grad_fn)
with expect_warning(UserWarning, match="is not a leaf Tensor"):
    print("param.grad =", param.grad)                           # None: the gradient went elsewhere
    assert param.grad is None

param = torch.randn(2, dtype=torch.float64, device=device, requires_grad=True)   # the fix
(param ** 2).sum().backward()
torch.testing.assert_close(param.grad, 2 * param.detach())
print("fixed: param.grad =", param.grad)

# %% [markdown]
# ## 2. The manual regression: `y = 2x + 0.3`, no `nn.Module`
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

assert abs(w.item() - 2) < 0.02 and abs(b.item() - 0.3) < 0.02   # holds for any seed (noise std 0.02)

# %%
# NBVAL_CHECK_OUTPUT
print(f"learned w = {w.item():.1f}, b = {b.item():.1f}")

# %% [markdown]
# The same loop lives in `course_utils.fit_line`, which the rest of the chapter uses. It starts from a
# different random `w`, yet lands on the same least-squares answer:

# %%
fit = fit_line(x, y, lr=0.1, steps=1000)
print(fit)
assert abs(fit.w - w.item()) < 1e-4 and abs(fit.b - b.item()) < 1e-4

import matplotlib.pyplot as plt
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
plot_line_fit(x, y, w.item(), b.item(), ax=left)
plot_losses({"lr = 0.1": losses}, ax=right);

# %% [markdown]
# ## 3. Pitfall: forgetting `grad.zero_()`
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
# momentum with no friction, overshoots, and the loss oscillates instead of falling smoothly.

# %%
good = fit_line(x, y, lr=0.1, steps=200)
forgot = fit_line(x, y, lr=0.1, steps=200, zero_grad=False)
plot_losses({"with grad.zero_()": good.losses, "without": forgot.losses},
            title="forgetting grad.zero_()")
rises = sum(later > earlier for earlier, later in zip(forgot.losses, forgot.losses[1:]))
print(f"with zero_(): final loss {good.losses[-1]:.5f}, loss never rises")
print(f"without:      final loss {forgot.losses[-1]:.5f}, loss rose on {rises} of 199 steps")
assert all(later <= earlier + 1e-9 for earlier, later in zip(good.losses, good.losses[1:]))
assert rises > 10 and forgot.losses[-1] > 10 * good.losses[-1]

# %% [markdown]
# Two more ways to get the update wrong, each with PyTorch's real complaint:
#
# - updating **in place outside `no_grad()`** — autograd refuses to modify a leaf it is tracking;
# - **rebinding** with `w = w - lr * w.grad` — the new `w` is not a leaf, so next step `w.grad` is `None`.

# %%
w = torch.randn(1, requires_grad=True)
((w * x.cpu() - y.cpu()) ** 2).mean().backward()
with expect_error(RuntimeError, match="leaf Variable that requires grad is being used in an in-place operation"):
    w -= 0.1 * w.grad

# %%
w = torch.randn(1, requires_grad=True)
with expect_error(TypeError, match="NoneType"):
    for step in range(2):
        ((w * x.cpu() - y.cpu()) ** 2).mean().backward()
        w = w - 0.1 * w.grad        # step 2: w is no longer a leaf, w.grad is None

# %% [markdown]
# **The trailing underscore.** `zero_()`, `mul_()`, `relu_()` change a tensor **in place**. That saves memory,
# but autograd may have saved the old value for the backward pass — it notices, and refuses:

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
# ## 4. What `backward()` fills in
#
# Only **leaves** that require grad get a `.grad`. Intermediate (non-leaf) tensors don't keep theirs,
# unless you ask with `retain_grad()` before `backward()` — handy for debugging.

# %%
a = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)   # leaf
hidden = a * 3                                            # non-leaf
out = (hidden ** 2).sum()
out.backward()
print("a.grad =", a.grad)                                 # d/da (3a)^2 = 18a
torch.testing.assert_close(a.grad, 18 * a.detach())
with expect_warning(UserWarning, match="is not a leaf Tensor"):
    assert hidden.grad is None

hidden = a * 3
hidden.retain_grad()                                      # ask for it before backward()
(hidden ** 2).sum().backward()
print("hidden.grad with retain_grad() =", hidden.grad)    # 2 * hidden
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
# ## 5. The dynamic graph: ordinary Python decides the computation
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
# ## 6. Explore: learning rate and steps
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
# ## 7. Exercises
#
# Replace the `...` in each function with your code, run the cell, and read the check's verdict.
#
# **Exercise 1.** Return the derivative of `x ** 3` at `x`, computed **by autograd** (not by hand), as a Python float.

# %%
@exercise
def grad_of_cube(x: float) -> float:
    ...  # your code here


check_grad_of_cube(grad_of_cube)


# %% [markdown]
# **Exercise 2.** Write the update step of section 2 as a function: for each leaf tensor in `params`,
# subtract `lr * grad` **in place** without recording it in the graph, then zero its gradient.

# %%
@exercise
def sgd_update(params: list[torch.Tensor], lr: float) -> None:
    ...  # your code here


check_sgd_update(sgd_update)

# %% [markdown]
# ## What to remember
# - One `device = get_device()` at the top; create parameters **on** the device with `requires_grad=True`
#   (or call `.requires_grad_()` after moving), never `.to()` after `requires_grad=True`.
# - Only leaves get `.grad`; `retain_grad()` for intermediates while debugging.
# - Update under `torch.no_grad()`, in place (`-=`), then `grad.zero_()` — `backward()` accumulates.
# - Log `loss.item()`, not `loss`.
# - The graph is rebuilt every call: print shapes, write them in comments, test every branch.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `UserWarning: The .grad attribute of a Tensor that is not a leaf Tensor is being accessed` | you converted a parameter after `requires_grad=True`, or you read an intermediate's grad | 1, 4 |
# | the loss bounces and never settles | `grad.zero_()` missing, or the learning rate is too large | 3, 6 |
# | `RuntimeError: a leaf Variable that requires grad is being used in an in-place operation` | update outside `torch.no_grad()` | 3 |
# | `TypeError: unsupported operand type(s) ... 'NoneType'` in the update | `w = w - ...` rebound `w` to a non-leaf | 3 |
# | `RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation` | an in-place op overwrote a value autograd saved | 3 |
# | `RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn` | loss computed under `no_grad` or from tensors without `requires_grad` | 4 |
# | `RuntimeError: mat1 and mat2 shapes cannot be multiplied` on some batches only | a branch of `forward` with the wrong shapes | 5 |
