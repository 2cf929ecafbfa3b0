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
# # Chapter 4 — Checkpoints that survive crashes and resume exactly
#
# **You will be able to:** save what can be loaded safely (`state_dict`, not the pickled model); write a
# checkpoint that resumes training **bit for bit**; load a GPU checkpoint on a laptop; load weights whose
# keys or shapes don't match without hiding problems; and save so that a crash never costs you the last
# good checkpoint.
#
# **Hardware and time.** *Run All* takes about 30 seconds on a 2-core CPU, most of it in section 6, which
# writes and kills checkpoints of 128 MB. On a CUDA GPU the training runs on the GPU and section 4 saves a
# real CUDA checkpoint.

# %%
import io
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils import (CheckpointError, evaluate, expect_error, get_device, hardware_summary,
                          load_checkpoint, load_matching_state_dict, mlp, save_checkpoint, saved_as_if_on,
                          seed_everything, train_step)
from course_utils.interrupted_save import big_model, kill_while_saving

# %load_ext course_utils
device = get_device()
seed_everything(0)
artifacts = Path("artifacts/ch4")
artifacts.mkdir(parents=True, exist_ok=True)
print("device:", device)
print(hardware_summary())


# %% [markdown]
# ## 1. `torch.save(model)` versus `torch.save(model.state_dict())`
#
# `torch.save(model)` pickles the **object**: a reference to its class by module path plus its attributes.
# Since PyTorch 2.6, `torch.load` defaults to `weights_only=True`, which only unpickles tensors and plain
# containers — so the whole-model file is refused:

# %%
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp([4, 16, 16])
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x))

net = Net()
torch.save(net, artifacts / "whole_model.pt")
torch.save(net.state_dict(), artifacts / "state_dict.pt")
with expect_error(Exception, match="Weights only load failed"):
    torch.load(artifacts / "whole_model.pt")


# %% [markdown]
# Even with `weights_only=False`, the file only loads while the exact class still exists under the same
# name. Rename or move it (a refactor, another notebook, another project) and it is lost:

# %%
class NetV2(Net):                 # the class after a refactor
    pass
del Net
with expect_error(AttributeError, match="Can't get attribute 'Net'"):
    torch.load(artifacts / "whole_model.pt", weights_only=False)

restored = NetV2()
restored.load_state_dict(torch.load(artifacts / "state_dict.pt", weights_only=True))   # names and shapes: all it needs
assert all(torch.equal(a, b) for a, b in zip(restored.parameters(), net.parameters()))
print("the state_dict loads into the renamed class")


# %% [markdown]
# **Why `weights_only=False` on someone else's file is a security hole:** unpickling can call any function.
# This harmless object runs `print` the moment it is loaded; a malicious one could run anything.

# %%
class RunsOnLoad:
    def __reduce__(self):
        return (print, ("!!! this code ran inside torch.load !!!",))

torch.save({"weights": torch.ones(2), "surprise": RunsOnLoad()}, artifacts / "untrusted.pt")
with expect_error(Exception, match="Weights only load failed"):
    torch.load(artifacts / "untrusted.pt", weights_only=True)      # refused: nothing ran
torch.load(artifacts / "untrusted.pt", weights_only=False);        # the code runs

# %% [markdown]
# ## 2. Resuming with the model alone is not resuming
#
# A run with dropout, Adam, a learning-rate schedule and a shuffled `DataLoader`. We train it straight
# through, then again with an interruption after 2 of 4 epochs where only the model's weights were saved.

# %%
generator = torch.Generator().manual_seed(0)
features = torch.randn(256, 8, generator=generator)
targets = (features[:, :4].sum(dim=1, keepdim=True) - features[:, 4:].prod(dim=1, keepdim=True))
train_loader = DataLoader(TensorDataset(features[:192], targets[:192]), batch_size=32, shuffle=True)
val_loader = DataLoader(TensorDataset(features[192:], targets[192:]), batch_size=64)

def new_run(seed=0):
    seed_everything(seed)
    model = mlp([8, 64, 64, 1], dropout=0.1).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    return model, optimizer, scheduler

def train_epochs(model, optimizer, scheduler, epochs):
    """Train, step the schedule and validate once per epoch; returns the validation losses."""
    val_losses = []
    for _ in range(epochs):
        for batch in train_loader:            # shuffling draws from torch's global RNG
            train_step(model, batch, nn.MSELoss(), optimizer)
        scheduler.step()
        val_losses.append(evaluate(model, val_loader, nn.MSELoss()))   # also draws: every DataLoader iterator takes a seed
    return val_losses

def weights(model):
    return [p.detach().clone() for p in model.parameters()]

model, optimizer, scheduler = new_run()
straight_vals = train_epochs(model, optimizer, scheduler, 4)
straight = weights(model)
print("uninterrupted: validation loss per epoch", [round(v, 4) for v in straight_vals])

# %%
model, optimizer, scheduler = new_run()
train_epochs(model, optimizer, scheduler, 2)
torch.save(model.state_dict(), artifacts / "weights_only.pt")          # the incomplete checkpoint

model, optimizer, scheduler = new_run(seed=1)                          # "the next morning"
model.load_state_dict(torch.load(artifacts / "weights_only.pt", weights_only=True))
resumed_vals = train_epochs(model, optimizer, scheduler, 2)             # Adam's moments and the lr restart
print("resumed from weights only: validation loss for epochs 3-4", [round(v, 4) for v in resumed_vals])
print("learning rate after resuming:", scheduler.get_last_lr(), "(the uninterrupted run was at", [3e-3 * 0.7**4], ")")
assert not all(torch.equal(a, b) for a, b in zip(straight, weights(model)))

# %% [markdown]
# ## 3. The full checkpoint resumes bit for bit
#
# `save_checkpoint` stores model, optimizer (Adam's moments and step counts), scheduler, your meta data
# (epoch, global step, best score) and the state of every random number generator — Python, NumPy, torch
# on the CPU and on every GPU — which decides the next dropout masks and the next shuffle. We interrupt
# after epoch 2, build **fresh objects with a different seed**, and load.

# %%
model, optimizer, scheduler = new_run()
val_at_interruption = train_epochs(model, optimizer, scheduler, 2)[-1]
save_checkpoint(artifacts / "full.pt", model=model, optimizer=optimizer, scheduler=scheduler,
                epoch=2, global_step=2 * len(train_loader), best_val=val_at_interruption)
del model, optimizer, scheduler

model, optimizer, scheduler = new_run(seed=12345)                     # nothing carried over in memory
meta = load_checkpoint(artifacts / "full.pt", model=model, optimizer=optimizer, scheduler=scheduler)
print("meta:", meta)
rng_after_loading = torch.get_rng_state()
val_after_loading = evaluate(model, val_loader, nn.MSELoss())
torch.set_rng_state(rng_after_loading)             # this check must not shift the random stream
print(f"validation before the interruption {val_at_interruption:.6f}, after loading {val_after_loading:.6f}")
assert val_after_loading == meta["best_val"]       # check a resume by re-running validation first

resumed_vals = train_epochs(model, optimizer, scheduler, 4 - meta["epoch"])
print("validation loss for epochs 3-4:", [round(v, 4) for v in resumed_vals], "| uninterrupted:",
      [round(v, 4) for v in straight_vals[2:]])
resumed = weights(model)
if device.type == "cpu":
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))  # bit for bit
else:   # GPU kernels may pick different algorithms from run to run; the lesson is the same
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(straight, resumed))
print("final weights identical to the uninterrupted run:",
      all(torch.equal(a, b) for a, b in zip(straight, resumed)))

# %% [markdown]
# We interrupted at an epoch boundary: resuming *inside* an epoch would also need the position in the
# shuffled order (the `DataLoader` has no `state_dict`), so checkpoint at epoch ends or store the order.
#
# ## 4. `map_location`: a GPU checkpoint on a CPU-only machine
#
# Tensors are saved with their device. On a GPU machine we save a real CUDA checkpoint; elsewhere
# `saved_as_if_on("cuda:0")` writes a file whose tensors are tagged `cuda:0` exactly as a GPU machine
# would, so the CPU machine meets the real error.

# %%
model, optimizer, scheduler = new_run()
if device.type == "cuda":
    save_checkpoint(artifacts / "from_gpu.pt", model=model, epoch=0)
    print("saved a real CUDA checkpoint; loading it onto the CPU:")
    cpu_model = mlp([8, 64, 64, 1], dropout=0.1)
    load_checkpoint(artifacts / "from_gpu.pt", model=cpu_model, map_location="cpu")
    assert cpu_model[0].weight.device.type == "cpu"
else:
    with saved_as_if_on("cuda:0"):
        save_checkpoint(artifacts / "from_gpu.pt", model=model, epoch=0)
    with expect_error(RuntimeError, match="map_location=torch.device\\('cpu'\\)"):
        torch.load(artifacts / "from_gpu.pt", weights_only=True)        # no map_location: the real error
    cpu_model = mlp([8, 64, 64, 1], dropout=0.1)
    load_checkpoint(artifacts / "from_gpu.pt", model=cpu_model)         # map_location defaults to the model's device
    assert torch.equal(cpu_model[0].weight, model[0].weight.cpu())
print("loaded onto", cpu_model[0].weight.device)


# %% [markdown]
# ## 5. Keys and shapes that don't match
#
# Two everyday cases: a state dict saved from `nn.DataParallel` / DDP (every key starts with `module.`),
# and a pretrained model whose classifier head has another number of classes.

# %%
class Classifier(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.backbone = mlp([8, 32, 32])
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(torch.relu(self.backbone(x)))

seed_everything(0)
pretrained = Classifier(classes=10)
wrapped_state = nn.DataParallel(pretrained).state_dict()     # what a multi-GPU script saves
print("saved keys:", list(wrapped_state)[:3], "...")

new_model = Classifier(classes=5)                            # our task has 5 classes
with expect_error(RuntimeError, match="(?s)Missing key\\(s\\) in state_dict.*Unexpected key\\(s\\)"):
    new_model.load_state_dict(wrapped_state)

plain_state = {key.removeprefix("module."): value for key, value in wrapped_state.items()}
with expect_error(RuntimeError, match="size mismatch for head.weight"):
    new_model.load_state_dict(plain_state)

# %% [markdown]
# `strict=False` looks like the way out. It is not: it does not skip shape mismatches, and with the
# `module.` prefix it **silently loads nothing** — it reports the problem in a return value nobody reads.

# %%
before = [p.detach().clone() for p in new_model.parameters()]
result = new_model.load_state_dict({k: v for k, v in wrapped_state.items() if "head" not in k}, strict=False)
print(f"strict=False: no error, {len(result.missing_keys)} missing and {len(result.unexpected_keys)} unexpected keys")
assert all(torch.equal(a, b) for a, b in zip(before, new_model.parameters()))   # nothing was loaded

# %%
report = load_matching_state_dict(new_model, wrapped_state)
print(report)
assert torch.equal(new_model.backbone[0].weight, pretrained.backbone[0].weight)   # backbone transferred
assert torch.equal(new_model.head.weight, before[-2])                              # head kept its fresh init
assert [key for key, _, _ in report.shape_mismatch] == ["head.weight", "head.bias"]

# %% [markdown]
# ## 6. Crash safety
#
# A process can die at any instant: out-of-memory killer, pre-empted cloud machine, Ctrl-C at the wrong
# moment. We start a real subprocess that writes a 128 MB checkpoint over and over and `SIGKILL` it in the
# middle of a write. First a plain `torch.save` over the previous file:

# %%
plain = artifacts / "plain.pt"
torch.save(big_model(128, 1.0).state_dict(), plain)
print("exit code of the killed writer:", kill_while_saving(plain, atomic=False, megabytes=128))
print(f"{plain.name} is now {os.path.getsize(plain):,} bytes")
with expect_error(CheckpointError, match="truncated or corrupt"):
    load_checkpoint(plain, model=big_model(128, 0.0))

# %% [markdown]
# The previous checkpoint is gone and the new one is half written. `save_checkpoint` writes to a
# temporary file in the same folder, `fsync`s it, and only then renames it over the target — a rename is
# atomic, so the target is always either the complete old file or the complete new one. Five kills at
# different moments:

# %%
atomic = artifacts / "atomic.pt"
save_checkpoint(atomic, model=big_model(128, 1.0), version=1)
for delay in (0.0, 0.05, 0.1, 0.3, 1.0):
    code = kill_while_saving(atomic, atomic=True, megabytes=128, delay_s=delay)
    survivor = big_model(128, 0.0)
    meta = load_checkpoint(atomic, model=survivor)
    expected_value = {1: 1.0, 2: 2.0}[meta["version"]]
    assert code == -9 and torch.all(survivor.weight == expected_value)
    print(f"killed after {delay:.2f} s -> checkpoint loads: version {meta['version']}, complete")
leftovers = sorted(p.name for p in artifacts.glob(".atomic.pt.*.partial"))
print(f"temporary files left by killed writers (never mistaken for the checkpoint): {len(leftovers)}")
for p in artifacts.glob(".*.partial"):
    p.unlink()

# %% [markdown]
# ## What to remember
# - Save `state_dict()`s, load with `weights_only=True`; never `weights_only=False` on a file you did not make.
# - A resumable checkpoint holds model, optimizer, scheduler (and `GradScaler`), epoch/step/best score, and RNG states.
# - After loading, re-run validation and compare with the logged value before training on.
# - `map_location` (or `load_checkpoint`, which defaults to the model's device) loads GPU checkpoints anywhere.
# - `strict=False` hides problems; `load_matching_state_dict` reports what loaded, what didn't and why.
# - Write to a temporary file, `fsync`, rename: `save_checkpoint` does it.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `UnpicklingError: Weights only load failed` | a pickled whole model or custom object: save `state_dict()` | 1 |
# | `AttributeError: Can't get attribute 'Net'` | a whole-model file after the class moved | 1 |
# | loss jumps after resuming | optimizer/scheduler state not restored | 2 |
# | `Attempting to deserialize object on a CUDA device` | GPU checkpoint on a CPU machine: `map_location` | 4 |
# | `Missing key(s) ... Unexpected key(s) ... module.` | DataParallel/DDP prefix: `load_matching_state_dict` | 5 |
# | `size mismatch for head.weight` | a different head: load the rest with `load_matching_state_dict` | 5 |
# | `PytorchStreamReader failed` / `EOFError` on load | a write was interrupted: use `save_checkpoint` | 6 |
