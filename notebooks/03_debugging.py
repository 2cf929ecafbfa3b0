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
# # Chapter 3 — When training blows up: OOM, NaN and device mismatch
#
# **You will be able to:** estimate a training step's memory before you run it and check the estimate
# against a measurement; find the largest batch that fits; tell a real OOM from memory you are holding by
# accident; track a NaN to its source in the order **data → model → numerics**; and name every tensor on
# the wrong device.
#
# **Hardware and time.** Numbers come from the machine running the notebook (printed below). *Run All*
# takes about 30 seconds on a 2-core CPU. On a CUDA GPU the OOM sections run for real (a capped GPU, a
# real `torch.OutOfMemoryError`, a memory snapshot); on CPU each has a labelled CPU counterpart.

# %%
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import (DeviceMismatchError, SmallConvNet, check_devices, check_memory_estimate,
                          cuda_memory_cap, estimate_training_memory, expect_error, expect_warning,
                          find_max_batch_size,
                          find_nonfinite, get_device, hardware_summary, locate_nonfinite,
                          measure_peak_memory, mlp, plot_losses, seed_everything, to_device, train_step)

# %load_ext course_utils
device = get_device()
seed_everything(0)
artifacts = Path("artifacts")
artifacts.mkdir(exist_ok=True)
print("device:", device)
print(hardware_summary())

# %% [markdown]
# # Part 1 — Out of memory
#
# ## 1. Estimate first
#
# One input batch of 32 RGB images at 224×224 in float32:

# %%
batch_bytes = 32 * 3 * 224 * 224 * 4
print(f"{batch_bytes:,} bytes = {batch_bytes / 1e6:.1f} MB = {batch_bytes / 2**20:.1f} MiB")
assert batch_bytes == torch.empty(32, 3, 224, 224, device="meta").nbytes

# %% [markdown]
# The batch is the small part. Training also holds the parameters, their gradients, the optimizer's state
# (Adam keeps two more copies of every parameter) and every activation autograd saves for the backward
# pass. `estimate_training_memory` counts the first three from the parameters and **measures** the
# activations by running one forward pass on the `meta` device: shapes only, nothing allocated — so we
# can ask about a batch of 256 at 224×224 on any laptop.

# %%
model = SmallConvNet().to(device)
for n in (32, 256):
    estimate = estimate_training_memory(model, torch.empty(n, 3, 224, 224, device="meta"), optimizer="adam")
    print(f"batch {n}, 3x224x224, Adam:\n{estimate}\n")
small = estimate_training_memory(model, torch.empty(32, 3, 224, 224, device="meta")).activations
large = estimate_training_memory(model, torch.empty(256, 3, 224, 224, device="meta")).activations
assert abs(large / small - 8) < 0.01          # activations scale with the batch; parameters do not

# %% [markdown]
# An estimate is only worth what it predicts. `check_memory_estimate` runs a real first training step at
# each batch size and measures its peak with `measure_peak_memory` (on CUDA: the allocator's peak
# statistics; on CPU: every tensor storage PyTorch allocates, tracked from creation to release). Both sides
# leave out the parameters, which exist before the step.

# %%
# on a GPU, larger batches: there cuDNN's workspace would dominate the peak of a tiny batch
sizes = [8, 32, 64] if device.type == "cpu" else [64, 256, 512]
check = check_memory_estimate(model, (3, 64, 64), sizes, optimizer="adam")
print(hardware_summary())
print(check)
print(f"worst relative error: {check.worst_relative_error:.0%}")
assert all(0.8 <= ratio <= 1.5 for ratio in check.ratios)


# %% [markdown]
# The tolerance (measured within 0.8–1.5× of the estimate) is stated, not tuned away: the estimate counts
# what the step **holds**, the measured peak also includes **working memory** — the gradient of each
# activation while backward runs through it (about +30 % for this conv net), and the optimizer's
# temporaries inside `step()`. Plan with a margin.

# %% [markdown]
# ## 2. A real OOM, and the largest batch that fits
#
# On a GPU we cap the process at a slice of the card with `torch.cuda.set_per_process_memory_fraction`
# (through `cuda_memory_cap`, which lifts the cap afterwards), so the OOM is real but harmless. On CPU,
# running out of RAM would freeze the machine or get the process killed, so the CPU counterpart searches
# against a stated memory **budget** using the measured peak.

# %%
def make_step(batch_size):
    """One training step of a fresh SmallConvNet-sized problem at this batch size (3x64x64 images)."""
    model.zero_grad(set_to_none=True)
    images = torch.randn(batch_size, 3, 64, 64, device=device)
    labels = torch.randint(0, 10, (batch_size,), device=device)
    F.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)

if device.type == "cuda":
    print("CUDA path:", torch.cuda.get_device_name())
    with cuda_memory_cap(2 * 2**30 / torch.cuda.get_device_properties(0).total_memory) as cap:
        print(f"capped at {cap / 2**30:.1f} GiB")
        with expect_error(torch.OutOfMemoryError, match="out of memory"):
            make_step(20_000)                                    # about 6 GiB of activations
        print("\n".join(torch.cuda.memory_summary(abbreviated=True).splitlines()[:14]))
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        make_step(256)
        torch.cuda.memory._dump_snapshot(str(artifacts / "ch3_memory_snapshot.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
        print("snapshot written: drag artifacts/ch3_memory_snapshot.pickle onto https://pytorch.org/memory_viz")
        largest = find_max_batch_size(make_step, start=64, limit=20_000)
    print(f"largest batch that fits in the cap, with a 10 % safety margin: {largest}")
    assert 64 <= largest < 20_000
else:
    budget = 64 * 2**20
    print(f"CPU counterpart: the largest batch whose measured step peak stays within {budget / 2**20:.0f} MiB")
    largest = find_max_batch_size(make_step, start=8, limit=4096, budget_bytes=budget)
    peak = measure_peak_memory(make_step, largest).peak_bytes
    print(f"largest batch, with a 10 % safety margin: {largest} (its measured peak: {peak / 2**20:.1f} MiB)")
    assert peak <= budget
    assert measure_peak_memory(make_step, 2 * largest).peak_bytes > budget


# %% [markdown]
# The 10 % margin is deliberate: a size that fit once can fail later (memory fragmentation, longer
# sequences, a second process on the GPU).
#
# ## 3. "Fake OOM": memory you are holding by accident
#
# Appending `loss` (a tensor) to a list keeps **each step's whole graph** alive; `loss.item()` keeps a float.

# %%
def run(steps, keep):
    history = []
    for _ in range(steps):
        loss = F.cross_entropy(model(torch.randn(16, 3, 64, 64, device=device)),
                               torch.randint(0, 10, (16,), device=device))
        history.append(loss if keep == "tensor" else loss.item())
    return history

peaks = {(keep, steps): measure_peak_memory(run, steps, keep).peak_bytes
         for keep in ("tensor", "float") for steps in (4, 8)}
for keep in ("tensor", "float"):
    growth = (peaks[(keep, 8)] - peaks[(keep, 4)]) / 4
    print(f"history of {keep:6}: peak {peaks[(keep, 4)] / 2**20:6.1f} MiB after 4 steps, "
          f"{peaks[(keep, 8)] / 2**20:6.1f} MiB after 8 -> {growth / 2**20:5.2f} MiB more per step")
assert peaks[("tensor", 8)] > 1.7 * peaks[("tensor", 4)]     # grows with every step
assert peaks[("float", 8)] < 1.1 * peaks[("float", 4)]       # flat

# %% [markdown]
# `torch.cuda.empty_cache()` is often tried here. It only returns **unused cached** blocks to the driver;
# memory that a Python reference still holds cannot be freed by anything but dropping the reference.

# %%
if device.type == "cuda":
    history = run(8, "tensor")
    held = torch.cuda.memory_allocated()
    torch.cuda.empty_cache()
    after_empty_cache = torch.cuda.memory_allocated()
    del history
    after_del = torch.cuda.memory_allocated()
    print(f"allocated: {held / 2**20:.1f} MiB, after empty_cache {after_empty_cache / 2**20:.1f} MiB, "
          f"after del {after_del / 2**20:.1f} MiB")
    assert after_empty_cache == held and after_del < held
else:
    print("CPU: PyTorch's CPU allocator has no cache to empty (freed tensors go straight back to malloc);\n"
          "the lesson is the same: only dropping the reference frees it. Measured:")
    report = measure_peak_memory(lambda: len(run(8, "tensor")))   # the list dies inside: all freed
    print(f"peak while the list lived: {report.peak_bytes / 2**20:.1f} MiB")
    assert report.peak_bytes > 1.7 * peaks[("tensor", 4)]

# %% [markdown]
# # Part 2 — NaN and Inf, in the order data → model → numerics
#
# ## 4. Data
#
# Two classic sources: a **missing value** read as NaN, and **normalising** by a standard deviation of 0
# (a sensor stuck at one value while the training statistics were collected): 0/0 = NaN, x/0 = Inf.

# %%
seed_everything(0)
train_features = torch.randn(1000, 4)
train_features[:, 3] = 5.0                  # the sensor was stuck at 5.0 in the training data
mean, std = train_features.mean(dim=0), train_features.std(dim=0)
print("training std per column:", std)

raw = torch.randn(64, 4)
raw[:, 3] = 5.0
raw[17, 3] = 7.0                            # ... and moved once in this batch
raw[10, 1] = float("nan")                   # a missing value
batch = {"features": (raw - mean) / std, "targets": torch.randn(64, 1)}

regressor = mlp([4, 16, 1])
loss = F.mse_loss(regressor(batch["features"]), batch["targets"])
print("loss:", loss.item())
assert torch.isnan(loss)

# %%
problems = find_nonfinite(batch)
for problem in problems:
    print(problem)
bad_per_column = (~torch.isfinite(batch["features"])).sum(dim=0)
print("non-finite values per column:", bad_per_column.tolist())
assert [p.path for p in problems] == ["batch['features']"]
assert (problems[0].nan, problems[0].posinf) == (64, 1)
assert bad_per_column.tolist() == [0, 1, 0, 64]
assert torch.isnan(batch["features"][10, 1]) and torch.isposinf(batch["features"][17, 3])

# %% [markdown]
# Fix the data, not the symptom: fill the missing value (here with the training mean) and give a
# zero-variance column a scale of 1, as scikit-learn's `StandardScaler` does.

# %%
safe_std = torch.where(std > 0, std, torch.ones_like(std))
filled = torch.where(torch.isnan(raw), mean.expand_as(raw), raw)
batch = {"features": (filled - mean) / safe_std, "targets": batch["targets"]}
loss = F.mse_loss(regressor(batch["features"]), batch["targets"])
print("loss after the fix:", loss.item())
assert find_nonfinite(batch) == [] and torch.isfinite(loss)


# %% [markdown]
# ## 5. Model: `log(softmax(x))` by hand
#
# `softmax` of large logits underflows to exactly 0 for the losing classes, and `log(0) = -inf`.
# `F.log_softmax` / `F.cross_entropy` compute the same thing stably (the log-sum-exp trick).

# %%
class LogOfSoftmax(nn.Module):
    def forward(self, logits):
        return torch.log(torch.softmax(logits, dim=-1))      # unstable

class Classifier(nn.Module):
    def __init__(self, log_probs):
        super().__init__()
        self.body = mlp([4, 32, 3])
        self.log_probs = log_probs

    def forward(self, x):
        return self.log_probs(self.body(x) * 1000)          # large logits (e.g. a temperature bug)

seed_everything(0)
x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
unstable = Classifier(LogOfSoftmax())
loss = F.nll_loss(unstable(x), y)
print("manual log(softmax):", loss.item())
assert not torch.isfinite(loss)

location = locate_nonfinite(unstable, x)
print(location)
assert location.module_name == "log_probs" and location.phase == "forward" and location.inputs_were_finite

# %%
stable = Classifier(nn.LogSoftmax(dim=-1))
stable.load_state_dict(unstable.state_dict())
loss = F.nll_loss(stable(x), y)
same_as_cross_entropy = F.cross_entropy(stable.body(x) * 1000, y)
print("nn.LogSoftmax:", loss.item(), "| F.cross_entropy on the logits:", same_as_cross_entropy.item())
assert torch.isfinite(loss) and locate_nonfinite(stable, x) is None
torch.testing.assert_close(loss, same_as_cross_entropy)


# %% [markdown]
# ## 6. Numerics
#
# **Learning rate.** The same model and data with Adam at `lr=0.1` and `lr=1e-3`:

# %%
def train_regressor(lr, steps=300):
    seed_everything(0)
    net = mlp([10, 64, 64, 1])
    X = torch.randn(256, 10)
    Y = X.sum(dim=1, keepdim=True).sin()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    return [train_step(net, (X, Y), nn.MSELoss(), opt) for _ in range(steps)]

curves = {f"Adam lr={lr}": train_regressor(lr) for lr in (0.1, 1e-3)}
plot_losses(curves, title="same model, two learning rates")
spikes = {name: sum(b > 1.5 * a for a, b in zip(c, c[1:])) for name, c in curves.items()}
print("loss spikes (a step that raises the loss by >50 %):", spikes)
print("final losses:", {name: round(c[-1], 5) for name, c in curves.items()})
assert spikes["Adam lr=0.1"] > spikes["Adam lr=0.001"]
assert curves["Adam lr=0.001"][-1] < curves["Adam lr=0.1"][-1]


# %% [markdown]
# **Exploding gradients.** A 20-layer ReLU network initialised with too large weights: the gradient norm is
# in the trillions, and one SGD step sends the weights to Inf and the loss to NaN. `clip_grad_norm_` caps
# the step size so training stays finite — a seat belt; the cure is a sane initialisation.

# %%
def deep_net(weight_std=None):
    seed_everything(0)
    layers = []
    for _ in range(20):
        linear = nn.Linear(32, 32)
        if weight_std is not None:
            nn.init.normal_(linear.weight, std=weight_std)       # too large for 20 layers
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 1))

X, Y = torch.randn(64, 32), torch.randn(64, 1)
def train_deep(net, max_norm=None, steps=20):
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    return [train_step(net, (X, Y), nn.MSELoss(), opt, max_norm=max_norm) for _ in range(steps)]

exploding = train_deep(deep_net(weight_std=0.5))
clipped = train_deep(deep_net(weight_std=0.5), max_norm=1.0)
default_init = train_deep(deep_net())
print(f"no clipping: losses {exploding[:3]} ...")
print(f"clipped:     {clipped[0]:.3g} -> {clipped[-1]:.3g}")
print(f"default init, no clipping: {default_init[0]:.3g} -> {default_init[-1]:.3g}")
assert not all(map(torch.isfinite, map(torch.tensor, exploding)))
assert all(map(torch.isfinite, map(torch.tensor, clipped))) and clipped[-1] < clipped[0]
assert default_init[-1] < 10


# %% [markdown]
# **Saturated sigmoids.** With a bad initialisation the pre-activations are huge, every sigmoid outputs
# almost exactly 0 or 1, its slope is ~0, and the first layer receives almost no gradient: training
# stalls without any NaN.

# %%
def sigmoid_net(first_layer_std=None):
    seed_everything(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.Sigmoid(), nn.Linear(64, 64), nn.Sigmoid(), nn.Linear(64, 1))
    if first_layer_std is not None:
        nn.init.normal_(net[0].weight, std=first_layer_std)     # pre-activations of size ~50
    F.mse_loss(net(X), Y).backward()
    pre_activation = net[0](X).detach()
    mean_slope = (torch.sigmoid(pre_activation) * (1 - torch.sigmoid(pre_activation))).mean().item()
    return mean_slope, net[0].weight.grad.norm().item()

bad_slope, bad_grad = sigmoid_net(first_layer_std=10.0)
good_slope, good_grad = sigmoid_net()                          # PyTorch's default initialisation
print(f"std=10 init:  mean sigmoid slope {bad_slope:.4f}, first-layer grad norm {bad_grad:.2e}")
print(f"default init: mean sigmoid slope {good_slope:.4f}, first-layer grad norm {good_grad:.2e}  (max slope is 0.25)")
assert bad_slope < 0.1 * good_slope and bad_grad < 0.3 * good_grad

# %% [markdown]
# **Which backward op made the NaN?** `torch.autograd.detect_anomaly()` checks every backward function's
# output and raises at the first NaN, naming the operation (and printing the forward line that created it).
# It is slow: switch it on only while hunting.

# %%
x = torch.zeros(3, requires_grad=True)
with expect_warning(UserWarning, match="Error detected in SqrtBackward0") as forward_trace:
    with torch.autograd.detect_anomaly(), expect_error(RuntimeError, match="Function 'SqrtBackward0' returned nan values"):
        y = torch.sqrt(x) * 0          # d sqrt(x)/dx at 0 is inf; inf * 0 = nan
        y.sum().backward()
culprit = [line.strip() for line in str(forward_trace.value).splitlines() if "torch.sqrt(x)" in line]
print("the forward line that created it:", culprit[0])
assert culprit

# %% [markdown]
# # Part 3 — Device mismatch
#
# ## 7. Model on one device, batch on another
#
# On a GPU: model on `cuda`, batch left on the CPU. On CPU we put the model on the `meta` device, which
# raises the same kind of error for real.

# %%
model = mlp([4, 8, 2])
other = torch.device("cuda") if device.type == "cuda" else torch.device("meta")
model.to(other)
images, labels = torch.randn(5, 4), torch.randint(0, 2, (5,))
print(f"model on {other}, batch on cpu:")
with expect_error(RuntimeError, match="device"):
    model(images)

# %% [markdown]
# Check the three suspects at once — parameters, inputs, targets:

# %%
with expect_error(DeviceMismatchError, match=r"input inputs\[0\]: cpu"):
    check_devices(model, images, labels)
images, labels = to_device((images, labels), other)
check_devices(model, images, labels)            # silent: all on one device
out = model(images)
assert out.device.type == other.type
print("after to_device: all tensors on", other)


# %% [markdown]
# ## 8. A plain tensor attribute versus `register_buffer`
#
# A constant the model needs (a mask, a normalisation mean) must be a **buffer**: buffers move with
# `.to(device)` and are saved in `state_dict()`. A plain attribute does neither.

# %%
class Normalise(nn.Module):
    def __init__(self):
        super().__init__()
        self.mean_plain = torch.tensor([0.5, 0.5])                  # the bug
        self.register_buffer("mean_buffer", torch.tensor([0.5, 0.5]))   # the fix

module = Normalise().to(other)
print("plain attribute on", module.mean_plain.device, "| buffer on", module.mean_buffer.device)
print("state_dict keys:", list(module.state_dict()))
assert module.mean_plain.device.type == "cpu" and module.mean_buffer.device.type == other.type
assert list(module.state_dict()) == ["mean_buffer"]

# %% [markdown]
# ## What to remember
# - Estimate before you run (`estimate_training_memory`), measure to check (`measure_peak_memory`), keep a margin.
# - `find_max_batch_size` catches the OOM outside the `except` block, frees memory, and backs off 10 %.
# - Log `loss.item()`; evaluate under `inference_mode`; `empty_cache()` never frees what you still reference.
# - NaN: check the **data** (`find_nonfinite`), then the **model** (`locate_nonfinite`), then the **numerics**
#   (learning rate, clipping, initialisation, `detect_anomaly`).
# - Devices: `check_devices(model, inputs, targets)`; constants are buffers.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `torch.OutOfMemoryError: CUDA out of memory` on the first step | batch too large: estimate, then `find_max_batch_size` | 1, 2 |
# | OOM after many steps, memory growing every step | a tensor (loss, output) kept in a list | 3 |
# | loss is `nan` from the first step | NaN/Inf in the data: `find_nonfinite(batch)` | 4 |
# | loss is `inf`/`nan` with large logits | `log(softmax(x))` by hand: use `F.cross_entropy` | 5 |
# | loss spikes, then `nan` | learning rate too high, or exploding gradients: lower lr, `clip_grad_norm_` | 6 |
# | loss flat, no NaN | saturated activations from a bad initialisation | 6 |
# | `RuntimeError: Function 'XBackward0' returned nan values` | `detect_anomaly` found the backward op | 6 |
# | `Expected all tensors to be on the same device` | model, input or target on another device: `check_devices` | 7 |
# | a constant stays on the CPU / is missing from the checkpoint | plain tensor attribute: `register_buffer` | 8 |
