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
# # Chapter 2 — The DataLoader, `nn.Module` pitfalls and the training loop
#
# **You will be able to:** pick `num_workers`, `pin_memory` and `drop_last` from measurements instead
# of folklore; spot layers the optimizer never sees; write the steps of a training step in the one
# correct order; accumulate gradients correctly; and evaluate without keeping the graph alive.
#
# **Hardware and time.** All numbers are measured on the machine running the notebook (printed below).
# *Run All* takes about 30 seconds on a 2-core CPU laptop; on a CUDA GPU the same cells run, and the
# pinned-memory section measures real host-to-device copies.

# %%
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from course_utils import (SmallConvNet, SyntheticImages, benchmark_loader, capture_process_stderr,
                          compare_pinned_copy, evaluate, expect_error, expect_warning,
                          find_unregistered_modules, fit, get_device, hardware_summary, mlp,
                          plot_losses, saved_activation_bytes, seed_everything, snapshot,
                          train_accumulated, train_step, unchanged)

# %load_ext course_utils
device = get_device()
seed_everything(0)
print("device:", device)
print(hardware_summary())

# %% [markdown]
# ## 1. `num_workers`: let other processes prepare the next batches
#
# `SyntheticImages` does real CPU work per sample (render, blur, random crop and flip, normalise), like
# decoding and augmenting a JPEG. With `num_workers=0` the training process does all of it; with `N`
# workers, `N` **processes** each prepare whole batches in parallel.

# %%
dataset = SyntheticImages(n=768)
image, label = dataset[0]
print("one sample:", tuple(image.shape), image.dtype, "label", label.item())

cores = os.cpu_count() or 1
settings = [0, 2] + ([4] if cores >= 4 else [])
stats = {n: benchmark_loader(DataLoader(dataset, batch_size=32, num_workers=n), label=f"num_workers={n}")
         for n in settings}
print(hardware_summary())
for s in stats.values():
    print(s)

# %% [markdown]
# On a machine with more than one core, workers help as long as there are idle cores for them. Beyond the
# number of cores they only compete with each other and with the training process, and **each worker is
# a separate process with its own copy of the dataset object** (and of anything it holds in memory), so
# memory grows with every worker. The first batch also arrives later: workers must start first.

# %%
speedup = stats[2].samples_per_s / stats[0].samples_per_s
print(f"{cores} logical cores: num_workers=2 gives {speedup:.2f}x the throughput of num_workers=0")
if cores > 1:
    assert speedup > 1.2, "with idle cores, two workers should clearly beat the main process alone"
else:
    print("one core only: workers cannot run in parallel here, so no speed-up is expected")
assert stats[2].first_batch_s > stats[0].first_batch_s    # worker start-up is not free


# %% [markdown]
# **Pitfall: a `Dataset` defined in the notebook, with `spawn` workers.** On macOS and Windows, workers are
# started with `spawn`: a fresh Python that **imports** the dataset's class by its module path. A class
# defined in a notebook lives in `__main__` of the kernel, which the worker cannot import. We force `spawn`
# here so the failure happens on Linux too.

# %%
class NotebookDataset(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor(index)

with capture_process_stderr() as worker_stderr, expect_error(RuntimeError, match="exited unexpectedly"):
    for batch in DataLoader(NotebookDataset(), batch_size=4, num_workers=1, multiprocessing_context="spawn"):
        pass
print("the worker's own error:", worker_stderr.last_line)
assert "Can't get attribute 'NotebookDataset'" in worker_stderr.last_line

# %% [markdown]
# The fix: put the dataset in an importable module (the course keeps its datasets in `course_utils.data`).
# In a **script**, also guard the training code with `if __name__ == "__main__":` — each spawned worker
# imports your script, and without the guard it would start training (and more workers) itself.

# %%
loader = DataLoader(SyntheticImages(n=8), batch_size=4, num_workers=1, multiprocessing_context="spawn")
batches = [images for images, labels in loader]
assert len(batches) == 2 and batches[0].shape == (4, 3, 32, 32)
print("spawned worker delivered", len(batches), "batches")

# %% [markdown]
# ## 2. `pin_memory=True`
#
# A copy from ordinary (pageable) host memory to a GPU goes through a pinned staging buffer. With
# `pin_memory=True` the DataLoader puts batches in page-locked memory directly, which makes the copy faster
# and lets `tensor.to(device, non_blocking=True)` overlap it with computation. It only matters when there
# is an accelerator to copy to.

# %%
if device.type == "cuda":
    times = compare_pinned_copy(64 * 2**20, device)       # a 64 MiB batch
    print(hardware_summary())
    for name, ms in times.items():
        print(f"{name:22} {ms:7.3f} ms per 64 MiB copy")
    assert times["pinned"] < times["pageable"]
else:
    print("CPU only: there is no device to copy to, so there is nothing to pin for. PyTorch says so:")
    with expect_warning(UserWarning, match="pin_memory"):
        next(iter(DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2, pin_memory=True)))

# %% [markdown]
# ## 3. `drop_last` and BatchNorm
#
# BatchNorm in training mode normalises with the statistics of the current batch. A batch of **one**
# sample has no spread to measure. 33 samples with `batch_size=32` leave a last batch of exactly 1:

# %%
features = torch.randn(33, 8)
targets = features.sum(dim=1, keepdim=True)
data_of_33 = TensorDataset(features, targets)

def make_bn_model():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

model = make_bn_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(data_of_33, batch_size=32, drop_last=False)      # the last batch holds 1 sample
with expect_error(ValueError, match="Expected more than 1 value per channel when training"):
    for batch in loader:
        train_step(model, batch, nn.MSELoss(), optimizer)

# %% [markdown]
# Fix: `drop_last=True` for **training** (one sample less this epoch; with shuffling a different one each
# epoch), `drop_last=False` for **validation**, where every sample must count and the model is in `eval()`
# mode (running statistics, any batch size works).

# %%
train_loader = DataLoader(data_of_33, batch_size=32, shuffle=True, drop_last=True)
val_loader = DataLoader(data_of_33, batch_size=32, drop_last=False)
for batch in train_loader:
    train_step(model, batch, nn.MSELoss(), optimizer)
val_counted = sum(len(x) for x, _ in val_loader)
print(f"validation loss {evaluate(model, val_loader, nn.MSELoss()):.3f} over {val_counted} samples")
assert val_counted == len(data_of_33) == 33


# %% [markdown]
# ## 4. Layers in a plain Python list
#
# `nn.Module` finds sub-modules through attribute assignment. A plain `list` hides them: they are not in
# `parameters()` (so the optimizer never updates them), not in `state_dict()` (so they are not saved), and
# `.to(device)` does not move them.

# %%
class BadModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(10, 10) for _ in range(3)]   # a plain list: invisible to PyTorch
        self.head = nn.Linear(10, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)

model = BadModel()
print("tensors in parameters():", [name for name, _ in model.named_parameters()])
batch = (torch.randn(64, 10), torch.randn(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
before = snapshot(model)
for _ in range(20):
    train_step(model, batch, nn.MSELoss(), optimizer)
print("find_unregistered_modules:", find_unregistered_modules(model))
assert find_unregistered_modules(model) == ["layers.0", "layers.1", "layers.2"]
assert unchanged(model, before, names=find_unregistered_modules(model))   # 20 steps, not one change
assert not unchanged(model, before, names=["head"])                        # only the head learned


# %%
class FixedModel(BadModel):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(10, 10) for _ in range(3))   # registered

model = FixedModel()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
before = snapshot(model)
for _ in range(20):
    train_step(model, batch, nn.MSELoss(), optimizer)
assert find_unregistered_modules(model) == []
assert not unchanged(model, before, names=["layers.0", "layers.1", "layers.2"])
print("parameters():", len(list(model.parameters())), "tensors; every layer trained")


# %% [markdown]
# The static scan cannot see a layer **created inside `forward`** (new random weights on every call, never
# trained). Give `find_unregistered_modules` an example input and it also watches one forward pass:

# %%
class BuildsHeadInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(10, 10)

    def forward(self, x):
        head = nn.Linear(10, 1)          # a fresh, untrained layer on every call
        return head(self.body(x))

suspect = BuildsHeadInForward()
print("static scan:", find_unregistered_modules(suspect))
print("with a forward pass:", find_unregistered_modules(suspect, torch.randn(2, 10)))
assert find_unregistered_modules(suspect, torch.randn(2, 10)) == ["<forward>:Linear"]


# %% [markdown]
# ## 5. A bloated `forward`
#
# A `forward` that grows a branch per experiment, with in-place edits in between, is hard to read and
# easy to break. Put the stable stack in `nn.Sequential` and the part that varies in small methods.

# %%
class Bloated(nn.Module):
    def __init__(self, residual=True, pool="mean"):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.norm = nn.LayerNorm(32)
        self.residual, self.pool = residual, pool

    def forward(self, x):                      # x: (N, T, 8) -> (N, 4)
        h = self.fc1(x)
        h = torch.relu(h)
        h = self.norm(h)
        if self.residual:
            r = self.fc2(h)
            r.relu_()                          # in-place edit
            h = h + r
        else:
            h = self.fc2(h)
            h.relu_()
        if self.pool == "mean":
            h = h.mean(dim=1)
        elif self.pool == "max":
            h = h.max(dim=1).values
        else:
            h = h[:, 0]
        return self.fc3(h)


class Refactored(nn.Module):
    def __init__(self, residual=True, pool="mean"):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.LayerNorm(32))   # the stable part
        self.fc2, self.fc3 = nn.Linear(32, 32), nn.Linear(32, 4)
        self.residual, self.pool = residual, pool

    def block(self, h):                        # (N, T, 32) -> (N, T, 32)
        r = torch.relu(self.fc2(h))
        return h + r if self.residual else r

    def pool_time(self, h):                    # (N, T, 32) -> (N, 32)
        return {"mean": lambda: h.mean(dim=1), "max": lambda: h.max(dim=1).values,
                "first": lambda: h[:, 0]}[self.pool]()

    def forward(self, x):                      # x: (N, T, 8) -> (N, 4)
        return self.fc3(self.pool_time(self.block(self.stem(x))))


# %%
x = torch.randn(5, 7, 8)
for residual in (True, False):
    for pool in ("mean", "max", "first"):
        old, new = Bloated(residual, pool), Refactored(residual, pool)
        new.stem[0].load_state_dict(old.fc1.state_dict())
        new.stem[2].load_state_dict(old.norm.state_dict())
        new.fc2.load_state_dict(old.fc2.state_dict())
        new.fc3.load_state_dict(old.fc3.state_dict())
        torch.testing.assert_close(new(x), old(x), rtol=0, atol=0)
print("identical outputs on all 6 configurations")

# %% [markdown]
# ## 6. The order of a training step
#
# `zero_grad` → forward → `backward` → `clip_grad_norm_` → `step`. `train_step` does exactly this. Two
# orders that look plausible and silently do nothing:

# %%
model = mlp([10, 16, 1])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 10), torch.randn(64, 1) * 100

before = snapshot(model)
loss = nn.functional.mse_loss(model(x), y)
loss.backward()
optimizer.zero_grad()            # WRONG PLACE: wipes the gradients just computed
optimizer.step()
print("zero_grad between backward and step -> parameters unchanged:", unchanged(model, before))
assert unchanged(model, before)


# %%
def one_step(clip_where):
    seed_everything(0)
    model = mlp([10, 16, 1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if clip_where == "before step (train_step)":
        train_step(model, (x, y), nn.MSELoss(), optimizer, max_norm=1.0)
        return model
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    if clip_where == "after step":
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # WRONG: the update already happened
    return model

results = {where: snapshot(one_step(where)) for where in ("none", "after step", "before step (train_step)")}
same_as_unclipped = all(torch.equal(results["none"][k], results["after step"][k]) for k in results["none"])
print("clipping after step changes nothing:", same_as_unclipped)
assert same_as_unclipped
assert not all(torch.equal(results["none"][k], results["before step (train_step)"][k]) for k in results["none"])


# %% [markdown]
# ## 7. Gradient accumulation
#
# When a batch of 32 does not fit, run 4 micro-batches of 8 and step once. `backward()` **adds** gradients,
# and each micro-batch loss is already a mean over 8 samples, so the sum of 4 of them is 4× too large
# unless each loss is divided by 4.

# %%
def grads_of(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])

seed_everything(0)
x, y = torch.randn(32, 10), torch.randn(32, 1)
model = mlp([10, 16, 1])
nn.functional.mse_loss(model(x), y).backward()
big_batch = grads_of(model)

model.zero_grad()
for xb, yb in zip(x.split(8), y.split(8)):
    nn.functional.mse_loss(model(xb), yb).backward()          # WRONG: not divided by 4
wrong = grads_of(model)
print(f"without dividing: gradient {wrong.norm() / big_batch.norm():.2f}x the big batch's")
torch.testing.assert_close(wrong, 4 * big_batch, rtol=1e-4, atol=1e-6)

# %%
model.zero_grad()
captured = {}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer.register_step_pre_hook(lambda opt, args, kwargs: captured.update(grad=grads_of(model).clone()))
train_accumulated(model, list(zip(x.split(8), y.split(8))), nn.MSELoss(), optimizer)
torch.testing.assert_close(captured["grad"], big_batch, rtol=1e-4, atol=1e-6)
print("train_accumulated: same gradients as one batch of 32, one step, then zero_grad")

# %% [markdown]
# ## 8. Evaluation without `no_grad`
#
# A forward pass with gradients enabled records the graph and **keeps every activation it saved for
# backward alive** as long as the output is referenced. In evaluation nobody calls `backward()`.

# %%
seed_everything(0)
model = SmallConvNet().to(device).eval()
images = torch.randn(64, 3, 32, 32, device=device)
params = list(model.parameters())

kept_with_grad, out = saved_activation_bytes(model, images, exclude=params)
print(f"grad enabled:   output requires_grad={out.requires_grad}, graph keeps {kept_with_grad / 2**20:.2f} MiB alive")
with torch.inference_mode():
    kept_inference, out = saved_activation_bytes(model, images, exclude=params)
print(f"inference_mode: output requires_grad={out.requires_grad}, graph keeps {kept_inference / 2**20:.2f} MiB alive")
assert kept_with_grad > 1_000_000 and kept_inference == 0 and not out.requires_grad

# %% [markdown]
# `evaluate` runs under `torch.inference_mode()` and `model.eval()`, then puts the model back in the mode
# it was in.

# %% [markdown]
# ## 9. Putting it together: `fit`
#
# `fit` runs `train_step` over a loader with a progress bar, steps the scheduler per epoch, evaluates after
# each epoch, and returns the loss history. Later chapters reuse it.

# %%
seed_everything(0)
train_data, val_data = SyntheticImages(n=512, work=4, seed=1), SyntheticImages(n=256, work=4, seed=2)
train_loader = DataLoader(train_data, batch_size=32, shuffle=True, drop_last=True)
val_loader = DataLoader(val_data, batch_size=64)
model = SmallConvNet().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
loss_fn = nn.CrossEntropyLoss()
untrained = evaluate(model, val_loader, loss_fn)
history = fit(model, train_loader, loss_fn, optimizer, epochs=3, val_loader=val_loader)
print(f"validation loss: {untrained:.3f} untrained -> {history.val_losses[-1]:.3f} after 3 epochs")
plot_losses({"train (per step)": history.train_losses}, title="fit on SyntheticImages")
assert history.val_losses[-1] < 0.8 * untrained

# %% [markdown]
# ## What to remember
# - Measure `num_workers` (`benchmark_loader`); no more workers than idle cores; each is a process with its own memory.
# - Datasets live in importable modules; scripts need `if __name__ == "__main__":`.
# - `pin_memory=True` + `non_blocking=True` only matter with an accelerator.
# - `drop_last=True` for training with BatchNorm, `False` for validation.
# - Sub-modules go in `nn.ModuleList` / `nn.ModuleDict` / `nn.Sequential`; `find_unregistered_modules` checks.
# - `zero_grad` → forward → `backward` → clip → `step`; accumulate with the loss divided by the number of micro-batches.
# - Evaluate under `torch.inference_mode()` and `model.eval()`.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | GPU idle, training slow, one CPU core at 100 % | data loading in the main process: raise `num_workers` | 1 |
# | `RuntimeError: DataLoader worker (pid(s) ...) exited unexpectedly` | a dataset defined in a notebook/`__main__` with `spawn` workers, or a worker crash: read the worker's own error | 1 |
# | `ValueError: Expected more than 1 value per channel when training` | a last batch of one with BatchNorm: `drop_last=True` | 3 |
# | some weights never change; `state_dict` misses layers | layers in a plain list or dict, or built in `forward` | 4 |
# | the loss does not move at all | `zero_grad()` between `backward()` and `step()` | 6 |
# | training with accumulation diverges at the old learning rate | loss not divided by the number of micro-batches | 7 |
# | memory grows during evaluation | evaluation without `no_grad` / `inference_mode` | 8 |
