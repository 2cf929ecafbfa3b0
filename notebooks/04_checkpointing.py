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
# **You will be able to:** save what can be loaded safely (`state_dict`, not the pickled model); write the
# checkpoint dict and the resume by hand so that training continues **bit for bit** — also from the middle
# of an epoch; see why a resume with the weights alone silently becomes another run; prove a resume exact
# with `check_resume`; load a checkpoint written on GPUs this machine lacks (a laptop, or rank 3 of a DDP
# job); load weights whose keys or shapes don't match without hiding problems; and save so that a
# `SIGKILL` never costs you the last good checkpoint.
#
# **You write the PyTorch; `course_utils` holds the hardened versions.** Every section first shows the
# short code a practitioner writes (`torch.save({...})`, `torch.load(path, map_location=...,
# weights_only=True)`, the key filter, the temp-file-and-rename recipe), reproduces the failure with it,
# and only then uses the helper that hardens it (`save_checkpoint`, `load_checkpoint`,
# `load_matching_state_dict`, `check_resume`).
#
# **Hardware and time.** Most of the time goes to fresh Python processes: the runs of `check_resume` in
# section 6 and the writers killed in section 9. On a CUDA GPU the training runs on the GPU and section 7
# saves a real CUDA checkpoint.
#
# **Run All:** 17 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).

# %%
import copy
import itertools
import os
import pickle
import re
import tempfile
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from course_utils import (CheckpointError, check_checkpoint_dict, check_epoch_batches_from, check_load_matching,
                          check_resume, check_resume_training, evaluate, exercise, expect_error, explain, get_device,
                          hardware_summary, load_checkpoint, load_matching_state_dict, mlp, progress,
                          save_checkpoint, saved_as_if_on, seed_everything, train_step)
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
refused = ""
try:
    torch.load(artifacts / "whole_model.pt")
except pickle.UnpicklingError as error:                 # a long message; its key lines:
    refused = str(error)
print("UnpicklingError:", refused.split(".")[0], "|", re.search(r"Unsupported global: GLOBAL \S+", refused)[0])
assert "Weights only load failed" in refused and "GLOBAL __main__.Net" in refused


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
# The same mix-up the other way round: `torch.load` of a state_dict file returns the **dict**, not a model.
# Code written for a whole-model file then calls a model's method on a dict:

# %%
loaded = torch.load(artifacts / "state_dict.pt", weights_only=True)
with expect_error(AttributeError, match="'collections.OrderedDict' object has no attribute 'eval'"):
    loaded.eval()
print("torch.load returned", type(loaded).__name__, "with keys", list(loaded)[:2], "...")
model = NetV2()                                      # the fix: build the model, then load the dict into it
model.load_state_dict(loaded)
model.eval()
x = torch.randn(3, 4)
assert torch.equal(model(x), net.eval()(x))          # the weights arrived

# %% [markdown]
# A full checkpoint (section 2 writes one) is a plain `dict` of several state dicts, and fails the same way,
# as `'dict' object has no attribute 'eval'`. Print its keys, then load the part that is the model's:

# %%
torch.save({"model": net.state_dict(), "epoch": 3}, artifacts / "small_checkpoint.pt")
checkpoint = torch.load(artifacts / "small_checkpoint.pt", weights_only=True)
with expect_error(AttributeError, match="'dict' object has no attribute 'eval'"):
    checkpoint.eval()
print("keys:", list(checkpoint))
model = NetV2()
model.load_state_dict(checkpoint["model"])
assert torch.equal(model.eval()(x), net(x))

# %% [markdown]
# `torch.save(model)` must also pickle everything the model *holds*, not only its tensors. A lambda (or a local
# function, an open file, a lock) kept as an attribute cannot be pickled, so the whole-model save fails where the
# state_dict, tensors only, saves as always:

# %%
class ScaledTanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.activation = lambda t: 2 * torch.tanh(t)       # a lambda kept as an attribute

    def forward(self, x):
        return self.activation(self.linear(x))

scaled = ScaledTanh()
save_error = None
try:
    torch.save(scaled, artifacts / "scaled_whole.pt")
# a local lambda: AttributeError (PicklingError from Python 3.14); a module-level one: PicklingError;
# an open file or a lock: TypeError
except (AttributeError, pickle.PicklingError, TypeError) as error:
    save_error = error
last_frames = "".join(traceback.format_exception(save_error, limit=-2))     # its last frames: inside torch.save
print(last_frames.replace(str(Path(torch.__file__).parent.parent), "..."))  # (site-packages shortened)
assert save_error is not None and "pickle" in str(save_error)

# which attribute? pickle what each module holds, the way torch.save would (submodules one by one)
unpicklable = []
for module_name, module in scaled.named_modules():
    for name, value in vars(module).items():
        if name == "_modules":                              # the submodules: named_modules visits them
            continue
        try:
            pickle.dumps(value)
        except (AttributeError, pickle.PicklingError, TypeError):
            unpicklable.append(f"{module_name}.{name}".lstrip("."))
print("attributes pickle cannot write:", unpicklable)
assert unpicklable == ["activation"]

torch.save(scaled.state_dict(), artifacts / "scaled_state_dict.pt")   # the fix: tensors only
copy_of_scaled = ScaledTanh()                                          # the lambda comes back from the code
copy_of_scaled.load_state_dict(torch.load(artifacts / "scaled_state_dict.pt", weights_only=True))
assert torch.equal(copy_of_scaled(x), scaled(x))
print("the state_dict saved and loaded back: the same outputs")
print("explain():", explain(save_error).id)                # the same diagnosis, from the traceback's torch.save
assert explain(save_error).id == "model-not-picklable"

# %% [markdown]
# The other fix is in the model: a module-level `def` or a layer (`nn.Tanh()`) instead of the lambda pickles by
# name. And a failed `torch.save` still leaves a file behind (`scaled_whole.pt` above), which a later
# `torch.load` refuses; section 9 writes checkpoints so that a failed save leaves the previous file intact:

# %%
print("left behind:", (artifacts / "scaled_whole.pt").stat().st_size, "bytes")
with expect_error(RuntimeError, match="PytorchStreamReader failed"):
    torch.load(artifacts / "scaled_whole.pt", weights_only=True)

# %% [markdown]
# **Why `weights_only=False` on someone else's file is a security hole:** unpickling can call any function.
# This harmless object runs `print` the moment it is loaded; a malicious one could run anything.

# %%
class RunsOnLoad:
    def __reduce__(self):
        return (print, ("!!! this code ran inside torch.load !!!",))

torch.save({"weights": torch.ones(2), "surprise": RunsOnLoad()}, artifacts / "untrusted.pt")
refused = ""
try:
    torch.load(artifacts / "untrusted.pt", weights_only=True)      # refused: nothing ran
except pickle.UnpicklingError as error:
    refused = str(error)
print("UnpicklingError:", refused.split(".")[0], "|", re.search(r"Unsupported global: GLOBAL \S+", refused)[0])
assert "GLOBAL print" in refused
torch.load(artifacts / "untrusted.pt", weights_only=False);        # the code runs

# %% [markdown]
# ## 2. The checkpoint, by hand
#
# A run with dropout, Adam, a learning-rate schedule and a shuffled `DataLoader`: four epochs. After
# epoch 2 it saves a checkpoint and keeps going, so the same run is also the *uninterrupted* reference.
# What must the checkpoint hold so that training can continue as if nothing had happened? Everything that
# decides the next step: the weights, the optimizer's state (Adam keeps two running averages per weight
# and a step count), the scheduler's position, the epoch, and the random state that draws the next dropout
# masks and the next shuffle (here torch's generator; on a GPU also CUDA's).

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
    """Train, step the schedule and validate once per epoch; returns (loss per step, validation loss per epoch)."""
    step_losses, val_losses = [], []
    for _ in range(epochs):
        for batch in train_loader:            # shuffling draws from torch's global RNG
            step_losses.append(train_step(model, batch, nn.MSELoss(), optimizer))
        scheduler.step()
        val_losses.append(evaluate(model, val_loader, nn.MSELoss()))   # also draws: every DataLoader iterator takes a seed
    return step_losses, val_losses

def weights(model):
    return [p.detach().clone() for p in model.parameters()]

# %%
model, optimizer, scheduler = new_run()
first_steps, first_vals = train_epochs(model, optimizer, scheduler, 2)
lr_epoch_3 = optimizer.param_groups[0]["lr"]    # what the schedule gives the next epoch
torch.save({
    "model": model.state_dict(),
    "optimizer": optimizer.state_dict(),        # Adam's moments and step counts
    "scheduler": scheduler.state_dict(),        # where the learning-rate schedule is
    "epoch": 2,                                 # the next epoch to run
    "rng": {"torch": torch.get_rng_state(),     # the next dropout masks and shuffles
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
}, artifacts / "by_hand.pt")
torch.save({"model": model.state_dict(), "epoch": 2,   # the common mistake, for section 3
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}},
           artifacts / "model_only.pt")

last_steps, last_vals = train_epochs(model, optimizer, scheduler, 2)    # the run goes on: the reference
straight, straight_steps, straight_vals = weights(model), first_steps + last_steps, first_vals + last_vals
print("uninterrupted: validation loss per epoch", [round(v, 4) for v in straight_vals])

# %% [markdown]
# The optimizer's state is not small: Adam keeps `exp_avg` and `exp_avg_sq` per parameter, each of its
# shape — so its moments are exactly twice the weights, by construction. What it costs on disk is what to
# check: the full checkpoint minus the model-only one (same weights, same RNG state) is the optimizer's
# and the scheduler's share of the file.

# %%
def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)

weight_bytes = tensor_bytes(model.parameters())
moment_bytes = tensor_bytes(state[name] for state in optimizer.state.values() for name in ("exp_avg", "exp_avg_sq"))
print(f"weights {weight_bytes / 1024:.1f} KiB, Adam's moments {moment_bytes / 1024:.1f} KiB "
      f"({moment_bytes / weight_bytes:.1f}x the weights)")
model_only_bytes, full_bytes = os.path.getsize(artifacts / "model_only.pt"), os.path.getsize(artifacts / "by_hand.pt")
print(f"files: model only {model_only_bytes / 1024:.1f} KiB, full checkpoint {full_bytes / 1024:.1f} KiB: "
      f"the optimizer and scheduler add {(full_bytes - model_only_bytes) / weight_bytes:.2f}x the weights")
assert moment_bytes == 2 * weight_bytes                     # Adam keeps two moments per weight: exactly 2x
overhead = full_bytes - model_only_bytes - moment_bytes
print(f"the rest of the difference ({overhead / 1024:.1f} KiB): the optimizer's step counts and hyperparameters, "
      "the scheduler, the archive's headers")
assert 0 < overhead < 0.5 * weight_bytes

# %% [markdown]
# The resume, by hand: build **fresh objects with another seed** (nothing carried over in memory), load
# with `map_location` (the device you train on now) and `weights_only=True` (only tensors and plain
# containers are unpickled), and restore each part.

# %%
model, optimizer, scheduler = new_run(seed=12345)                     # "the next morning"
checkpoint = torch.load(artifacts / "by_hand.pt", map_location=device, weights_only=True)
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
scheduler.load_state_dict(checkpoint["scheduler"])
torch.set_rng_state(checkpoint["rng"]["torch"].cpu())  # map_location moved this byte tensor too; it must be on the CPU
if torch.cuda.is_available():
    torch.cuda.set_rng_state_all([state.cpu() for state in checkpoint["rng"]["cuda"]])

resumed_steps, resumed_vals = train_epochs(model, optimizer, scheduler, 4 - checkpoint["epoch"])
print("validation loss for epochs 3-4:", [round(v, 4) for v in resumed_vals], "| uninterrupted:",
      [round(v, 4) for v in straight_vals[2:]])
resumed = weights(model)
if device.type == "cpu":
    assert resumed_vals == straight_vals[2:] and all(torch.equal(a, b) for a, b in zip(straight, resumed))
else:   # GPU kernels may pick different algorithms from run to run; the lesson is the same
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(straight, resumed))
print("final weights identical to the uninterrupted run:", all(torch.equal(a, b) for a, b in zip(straight, resumed)))

# %% [markdown]
# ## 3. Resuming with the model alone is not resuming
#
# The most common checkpoint holds the weights and the epoch, not the optimizer and the scheduler. Nothing
# fails: training continues, the loss is plausible — it is just another run than the one you configured.
# To see that effect alone, this resume restores the weights **and** the random state (same batches, same
# dropout masks as the uninterrupted run); only the optimizer and the scheduler start afresh.

# %%
model, optimizer, scheduler = new_run(seed=12345)
checkpoint = torch.load(artifacts / "model_only.pt", map_location=device, weights_only=True)
model.load_state_dict(checkpoint["model"])
torch.set_rng_state(checkpoint["rng"]["torch"].cpu())
if torch.cuda.is_available():
    torch.cuda.set_rng_state_all([state.cpu() for state in checkpoint["rng"]["cuda"]])
print(f"learning rate now {optimizer.param_groups[0]['lr']:.2e}; the uninterrupted run used "
      f"{lr_epoch_3:.2e} in epoch 3. Adam's moments are kept for {len(optimizer.state)} tensors (none)")
assert optimizer.param_groups[0]["lr"] == 3e-3 != lr_epoch_3 and not optimizer.state

lost_steps, lost_vals = train_epochs(model, optimizer, scheduler, 2)
steps_per_epoch = len(train_loader)
print("training loss, first steps of epoch 3:")
print("  uninterrupted        ", [round(v, 4) for v in straight_steps[2 * steps_per_epoch:][:4]])
print("  resumed, model only  ", [round(v, 4) for v in lost_steps[:4]])
print("validation loss, epochs 3-4: uninterrupted", [round(v, 4) for v in straight_vals[2:]],
      "| resumed, model only", [round(v, 4) for v in lost_vals])
same_first = (lost_steps[0] == straight_steps[2 * steps_per_epoch] if device.type == "cpu"
              else abs(lost_steps[0] - straight_steps[2 * steps_per_epoch]) <= 1e-5)
assert same_first                                                  # same weights, batch and dropout mask...
assert lost_steps[1] != straight_steps[2 * steps_per_epoch + 1]    # ...then the first optimizer step differs
assert not any(torch.allclose(a, b) for a, b in zip(straight, weights(model)))
assert lost_vals[-1] < straight_vals[-1]                           # and here it even looks better

# %% [markdown]
# The first loss after resuming matches the log to the last bit (the weights, the batch and the dropout
# mask are the same); from the second step on, the run leaves the uninterrupted one: the learning rate
# restarted at 3e-3 (the optimizer, which carries the current learning rate, was not restored either) and
# Adam took its first step with empty moments. Here the validation loss even comes out *lower* — this small run's schedule decays
# quickly, and restarting it gave it more learning rate — which is exactly why the mistake goes unnoticed:
# the numbers look fine, but they no longer belong to the run you configured, compared and logged. Whether
# the restart makes the loss go down or jump up depends on the run; that the curve leaves the log does not.

# %% [markdown]
# ## 4. `save_checkpoint`: the same checkpoint, hardened
#
# `torch.save(obj, path)` first truncates `path`, then writes: a crash in between (section 9) leaves
# neither the old checkpoint nor the new one. The recipe that never loses the last good file is four
# lines of standard library around the same `torch.save`:

# %%
def save_atomically(obj, path):
    """torch.save `obj` so that `path` always holds either its previous content or all of `obj`."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")  # same folder, same disk
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())            # the bytes are on the disk, not only in the OS cache
        os.replace(temp, path)                 # atomic: readers see the old file or the new one, never half
    except BaseException:
        os.unlink(temp)                        # a failed save leaves no half-written file behind
        raise

save_atomically({"model": model.state_dict(), "epoch": 4}, artifacts / "atomic_by_hand.pt")


class FailsHalfway:
    """An object whose pickling raises: a save that dies after torch.save has started writing."""
    def __reduce__(self):
        raise OSError("disk full (simulated)")


with expect_error(OSError, match="disk full"):
    save_atomically({"model": model.state_dict(), "epoch": 5, "extra": FailsHalfway()},
                    artifacts / "atomic_by_hand.pt")
kept = torch.load(artifacts / "atomic_by_hand.pt", weights_only=True)
left_behind = [p.name for p in artifacts.glob(".atomic_by_hand.pt.*")]
print("after the failed save: epoch", kept["epoch"], "| left behind:", left_behind)
assert kept["epoch"] == 4 and not left_behind          # the last good file, and no half-written one

# %% [markdown]
# `save_checkpoint` is that function hardened: the same dict as section 2 (model, optimizer, scheduler,
# `GradScaler`, your meta data such as epoch and best score) plus the state of **every** generator —
# Python's `random`, NumPy, torch on the CPU and on each GPU — written with the temp-file + `fsync` +
# `os.replace` recipe (its source, `save_checkpoint??`, also `fsync`s the folder, so that the rename itself
# survives a power cut), meta data checked to be plain JSON-like values so the file always loads with
# `weights_only=True` (below), the permissions `torch.save` would give (what the umask allows; `mkstemp`
# alone gives 0600), and the temporary files of killed writers removed. `load_checkpoint` is the resume of
# section 2: `weights_only=True`, `map_location` defaulting to the model's device, a clear `CheckpointError`
# for a truncated file or a missing part.

# %%
model, optimizer, scheduler = new_run()
_, vals = train_epochs(model, optimizer, scheduler, 2)
save_checkpoint(artifacts / "full.pt", model=model, optimizer=optimizer, scheduler=scheduler,
                epoch=2, global_step=2 * len(train_loader), val_loss=vals[-1])
mode = {name: oct(os.stat(artifacts / name).st_mode & 0o777) for name in ("full.pt", "state_dict.pt")}
print("permissions: save_checkpoint", mode["full.pt"], "| torch.save", mode["state_dict.pt"])
assert mode["full.pt"] == mode["state_dict.pt"]
del model, optimizer, scheduler

# %% [markdown]
# A pitfall that `torch.save` lets through: a score computed with NumPy (`np.mean`, a scikit-learn metric)
# is a `numpy.float64`. It prints like a float and even is one for `isinstance` (it subclasses `float`), so
# the save succeeds — and the `weights_only=True` load refuses the whole file, the day you resume:

# %%
mean_val = np.mean(vals)                                              # numpy.float64, not float
print(f"{mean_val} is a {type(mean_val).__module__}.{type(mean_val).__name__}; "
      f"isinstance(mean_val, float): {isinstance(mean_val, float)}")
torch.save({"epoch": 2, "val_loss": mean_val}, artifacts / "numpy_meta.pt")   # no error here...
with expect_error(pickle.UnpicklingError, match="Unsupported global: GLOBAL numpy"):
    torch.load(artifacts / "numpy_meta.pt", weights_only=True)        # ...but here, next week
before = (artifacts / "full.pt").read_bytes()
with expect_error(TypeError, match="meta 'val_loss' is a numpy.float64"):
    save_checkpoint(artifacts / "full.pt", model=new_run()[0], epoch=2, val_loss=mean_val)   # refused now, named
assert (artifacts / "full.pt").read_bytes() == before                 # and the last good file is untouched
torch.save({"epoch": 2, "val_loss": float(mean_val)}, artifacts / "numpy_meta.pt")           # the fix: float(x)
print(torch.load(artifacts / "numpy_meta.pt", weights_only=True))

# %% [markdown]
# The error message also offers `torch.serialization.add_safe_globals([...])`: it lets `weights_only=True`
# rebuild the types you list. That is fine for plain types of your own that you trust; it is no fix for a
# file from elsewhere, and for a NumPy number `float(x)` at save time is simpler for every future reader.

# %% [markdown]
# The resume with `load_checkpoint`. Before training on, re-run validation and compare with the value
# logged at save time: bit for bit on the CPU, a cheap proof that the right weights came back (and it must
# not shift the random stream).

# %%
model, optimizer, scheduler = new_run(seed=12345)                     # nothing carried over in memory
meta = load_checkpoint(artifacts / "full.pt", model=model, optimizer=optimizer, scheduler=scheduler)
print("meta:", meta)
rng_after_loading = torch.get_rng_state()
val_after_loading = evaluate(model, val_loader, nn.MSELoss())
torch.set_rng_state(rng_after_loading)             # this check must not shift the random stream
print(f"validation before the interruption {meta['val_loss']:.6f}, after loading {val_after_loading:.6f}")
# bit for bit on the CPU; on a GPU the same weights and data agree to rounding (cuBLAS may pick another
# reduction order unless deterministic algorithms are on)
assert (val_after_loading == meta["val_loss"] if device.type == "cpu"
        else abs(val_after_loading - meta["val_loss"]) <= 1e-6 * abs(meta["val_loss"]))

_, vals = train_epochs(model, optimizer, scheduler, 4 - meta["epoch"])
if device.type == "cpu":
    assert vals == straight_vals[2:] and all(torch.equal(a, b) for a, b in zip(straight, weights(model)))
else:
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(straight, weights(model)))
print("validation loss for epochs 3-4:", [round(v, 4) for v in vals], "— the uninterrupted run's")

# %% [markdown]
# ## 5. Resuming in the middle of an epoch
#
# Long epochs get checkpointed every N steps, so a job is usually killed *inside* an epoch. A shuffled
# `DataLoader` has no `state_dict`: the order of an epoch is drawn from the loader's generator when the
# epoch's iterator is created. To watch the order, each sample here is its own index; the run is killed
# after 2 of the 6 batches of epoch 1.

# %%
order_data = TensorDataset(torch.arange(24))          # sample i is the number i: the batches show the order

def make_loader(seed):
    shuffle = torch.Generator().manual_seed(seed)     # the loader's own generator: the data order, nothing else
    return DataLoader(order_data, batch_size=4, shuffle=True, generator=shuffle), shuffle

loader, shuffle = make_loader(seed=0)
uninterrupted = [[batch.tolist() for (batch,) in loader] for _ in range(3)]
print("epoch 1, uninterrupted:", uninterrupted[1])
trained_before_kill = uninterrupted[1][:2]            # the job died after these two batches of epoch 1

# %% [markdown]
# The usual resume restarts the interrupted epoch from its first batch, with the loader seeded as at the
# start of the run — so "epoch 1" replays epoch 0's order:

# %%
loader, shuffle = make_loader(seed=0)                 # "the next morning"
restarted = [batch.tolist() for (batch,) in loader]   # for epoch in range(checkpoint["epoch"], ...): all of it
seen = [i for batch in trained_before_kill + restarted for i in batch]
twice = sorted({i for i in seen if seen.count(i) == 2})
print("epoch 1 after the restart:", restarted)
print(f"samples trained on twice in epoch 1: {len(twice)} of 24; the order is epoch 0's: {restarted == uninterrupted[0]}")
assert restarted == uninterrupted[0] != uninterrupted[1]   # epoch 0 again, not epoch 1

# %% [markdown]
# The fix: at the start of every epoch keep the generator's state, and save it with the number of batches
# done in that epoch. To resume, put the state back (the same shuffle is drawn) and skip the batches
# already trained on. `itertools.islice` still loads the skipped batches; with an expensive dataset, build
# the epoch's index order from the same generator and hand the rest to a sampler instead.

# %%
loader, shuffle = make_loader(seed=0)
list(loader)                                          # epoch 0, as in the interrupted job
checkpoint = {"epoch": 1, "batches_done": 2, "epoch_start": shuffle.get_state()}   # saved with the model etc.

loader, shuffle = make_loader(seed=123)               # fresh objects, another seed
shuffle.set_state(checkpoint["epoch_start"])
rest_of_epoch = [batch.tolist() for (batch,) in itertools.islice(loader, checkpoint["batches_done"], None)]
next_epoch = [batch.tolist() for (batch,) in loader]
print("epoch 1 after the resume:", trained_before_kill + rest_of_epoch)
assert trained_before_kill + rest_of_epoch == uninterrupted[1] and next_epoch == uninterrupted[2]
print("epochs 1 and 2 match the uninterrupted run batch for batch")

# %% [markdown]
# **`torchdata`'s `StatefulDataLoader`** does this bookkeeping for you: a drop-in `DataLoader` with
# `state_dict()` / `load_state_dict()` on the loader itself (the sampler's state and the batches already
# yielded, with worker processes too), saved in the checkpoint beside the model:
#
# ```python
# from torchdata.stateful_dataloader import StatefulDataLoader
# loader = StatefulDataLoader(dataset, batch_size=4, shuffle=True)
# checkpoint["loader"] = loader.state_dict()        # mid-epoch: where the iterator stands
# ...
# loader.load_state_dict(checkpoint["loader"])      # the next iter(loader) continues from there
# ```
#
# It is a separate package (`pip install torchdata`), which this course does not install, so it is not
# run here; the generator-state recipe above is what it does for a map-style dataset, in plain PyTorch.

# %% [markdown]
# ## 6. Prove a resume exact: `check_resume`
#
# A resume bug is silent: nothing raises, the loss looks plausible. The only proof is a comparison with an
# uninterrupted run, step by step. By hand, with the runs of sections 2 and 3: the loss of every training
# step after the resume against the loss the uninterrupted run logged at that step.

# %%
def first_difference(logged, resumed, rtol):
    """Index of the first step whose losses differ by more than `rtol` (relative), or None."""
    return next((step for step, (a, b) in enumerate(zip(logged, resumed)) if abs(a - b) > rtol * abs(a)), None)

rtol = 0.0 if device.type == "cpu" else 1e-5        # a GPU may reduce in another order: agree to rounding
logged_after_save = straight_steps[2 * steps_per_epoch:]
full_resume, model_only_resume = (first_difference(logged_after_save, run, rtol) for run in (resumed_steps, lost_steps))
for name, step in (("full checkpoint (section 2)", full_resume), ("model only (section 3)", model_only_resume)):
    print(f"{name:28} first loss that leaves the log:",
          f"none in {len(logged_after_save)} steps" if step is None else f"step {step} after the resume (counting from 0)")
assert len(resumed_steps) == len(logged_after_save) and full_resume is None and model_only_resume == 1

# %% [markdown]
# `check_resume` is that comparison, made trustworthy. It runs the job in **fresh processes** (a resume in
# the same process inherits the RNG, the objects, the cached state that a restarted job would not have),
# records at every step not only the loss but the batch, the learning rate and the scheduler's position,
# the random streams, the parameters and the optimizer state, and names the first difference with its
# step and the part that differs. Here is a whole job, as you would write
# it: a `DataLoader` that shuffles with its own generator and loads with 2 worker processes, dropout,
# Adam, `StepLR`, a checkpoint every `stop_at` steps (here: once, mid-epoch) holding everything from
# sections 2 and 5. Three switches plant the three classic resume bugs. The job runs on the CPU.

# %%
# %%writefile artifacts/ch4/resume_job.py
"""A training job that checkpoints in the middle of an epoch and resumes from there (for check_resume)."""
import itertools
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build():
    random.seed(0)                                 # every generator the job and its libraries use
    np.random.seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    shuffle = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 6), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=shuffle, num_workers=2)
    return model, optimizer, scheduler, loader, shuffle


def run(probe):
    bug = probe.options                            # check_resume turns a planted bug on
    model, optimizer, scheduler, loader, shuffle = build()
    step, epoch_start = 0, shuffle.get_state()
    if probe.resuming:
        checkpoint = torch.load(probe.checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if not bug.get("forget_scheduler"):
            scheduler.load_state_dict(checkpoint["scheduler"])
        if not bug.get("forget_rng"):
            torch.set_rng_state(checkpoint["rng"])
        step, epoch_start = checkpoint["step"], checkpoint["epoch_start"]
    while step < probe.steps:
        shuffle.set_state(epoch_start)                          # this epoch's order
        skip = 0 if bug.get("restart_epoch") else step % len(loader)
        for x, y in itertools.islice(loader, skip, None):       # from the next batch on
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            probe.step(step, batch=(x, y), loss=loss, model=model, optimizer=optimizer, scheduler=scheduler)
            step += 1
            if step == probe.stop_at:                           # save, then "get killed"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),
                            "step": step, "epoch_start": epoch_start}, probe.checkpoint)
                return
            if step == probe.steps:
                break
        epoch_start = shuffle.get_state()
    probe.finish(model=model, optimizer=optimizer, scheduler=scheduler)

# %% [markdown]
# `check_resume` runs the job three times — uninterrupted for 10 steps; stopped after 6 steps, steps 0–5
# (the middle of the second epoch of 4 batches); resumed from that checkpoint — and compares the runs step by step.
# Each run is a fork of a Python process that has only imported torch (started on the first call),
# so a run costs no import time; `resume_options` turns a bug on in the resumed run only, so the two
# reference runs are made once.

# %%
job = "artifacts/ch4/resume_job.py:run"
expected = {"forget_scheduler": "the scheduler state was not restored",
            "forget_rng": "random streams (torch) differ",
            "restart_epoch": "the epoch restarted"}
for bug, symptom in expected.items():
    report = check_resume(job, steps=10, stop_at=6, resume_options={bug: True})
    print(f"{bug}: {report}")
    assert not report and report.step == 6 and symptom in str(report)

# %% [markdown]
# Each bug is caught at the first step after the resume, and named. Read the scheduler's line closely:
# the learning rate is **right** just after the resume (the same on both sides), because
# `optimizer.load_state_dict` brings back the last learning rate. What is lost is the scheduler's counter
# (`last_epoch`), so the next decay lands at the wrong step: a curve that looks fine and leaves the log
# later. (In section 3 the optimizer was lost too, so there the learning rate itself restarted at 3e-3.)
#
# With all three switches off:

# %%
report = check_resume(job, steps=10, stop_at=6)
print(report)
assert report

# %% [markdown]
# ## 7. `map_location`: a GPU checkpoint on a CPU-only machine
#
# Tensors are saved with their device. On a GPU machine we save a real CUDA checkpoint; elsewhere
# `saved_as_if_on("cuda:0")` writes a file whose tensors are tagged `cuda:0` exactly as a GPU machine
# would, so the CPU machine meets the real error. `torch.load(path, map_location="cpu", weights_only=True)`
# is the fix you write; `load_checkpoint` defaults `map_location` to the model's device.

# %%
model, optimizer, scheduler = new_run()
if device.type == "cuda":
    save_checkpoint(artifacts / "from_gpu.pt", model=model, epoch=0)
    print("saved a real CUDA checkpoint; loading it onto the CPU (the error without map_location only "
          "happens on a machine without CUDA: run this cell on a laptop to see it)")
else:
    with saved_as_if_on("cuda:0"):
        save_checkpoint(artifacts / "from_gpu.pt", model=model, epoch=0)
    with expect_error(RuntimeError, match="map_location=torch.device\\('cpu'\\)"):
        torch.load(artifacts / "from_gpu.pt", weights_only=True)        # no map_location: the real error

saved_on = set()                          # where the file says each tensor lives: map_location sees it
torch.load(artifacts / "from_gpu.pt", weights_only=True,
           map_location=lambda storage, location: saved_on.add(location) or storage)
state = torch.load(artifacts / "from_gpu.pt", map_location="cpu", weights_only=True)["model"]
print("tensors saved on", saved_on, "| by hand, map_location='cpu':", {tensor.device for tensor in state.values()})
assert saved_on == {"cuda:0"}             # the file really is a GPU checkpoint
cpu_model = mlp([8, 64, 64, 1], dropout=0.1)
load_checkpoint(artifacts / "from_gpu.pt", model=cpu_model)             # map_location: the model's device
assert torch.equal(cpu_model[0].weight, model[0].weight.cpu())
print("load_checkpoint loaded it onto", cpu_model[0].weight.device)

# %% [markdown]
# ### A checkpoint from a bigger machine
#
# The file of a multi-GPU job meets both problems at once. Rank 3 of a 4-GPU DDP job saved the wrapped
# model (`torch.save(ddp_model.state_dict(), path)`, a common slip: the state of `ddp_model.module` is what
# you want): every key starts with `module.`, and every tensor is tagged `cuda:3` — a GPU this machine
# lacks. The DDP wrapper below is a real one (a one-process `gloo` group on the CPU), and `saved_as_if_on`
# tags its tensors as rank 3's GPU would.

# %%
missing_gpu = f"cuda:{max(3, torch.cuda.device_count())}"                  # an index this machine does not have
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)   # a one-process "job"
try:
    ddp_model = DistributedDataParallel(mlp([8, 64, 64, 1], dropout=0.1))
    with saved_as_if_on(missing_gpu):
        torch.save(ddp_model.state_dict(), artifacts / "rank3.pt")      # what rank 3 wrote
finally:
    dist.destroy_process_group()

with expect_error(RuntimeError, match="Attempting to deserialize object on (a )?CUDA device"):
    torch.load(artifacts / "rank3.pt", weights_only=True)               # the error names what this machine lacks
state = torch.load(artifacts / "rank3.pt", map_location=device, weights_only=True)   # fix 1: map to our device
print("keys as saved:", list(state)[:2], "...")
single = mlp([8, 64, 64, 1], dropout=0.1).to(device)
with expect_error(RuntimeError, match="(?s)Missing key\\(s\\).*Unexpected key\\(s\\).*module\\.0\\.weight"):
    single.load_state_dict(state)
consume_prefix_in_state_dict_if_present(state, "module.")               # fix 2: PyTorch's own prefix strip
single.load_state_dict(state)
assert all(torch.equal(a.cpu(), b) for a, b in zip(single.parameters(), ddp_model.module.parameters()))
print(f"loaded on {device} the weights saved on {missing_gpu} by a DDP-wrapped model: identical")

unwrapped = single.state_dict()                                         # a file saved without the wrapper
cut = {key[len("module."):]: value for key, value in unwrapped.items()}  # the prefix cut from every key
print("key[7:] on that file:", list(unwrapped)[:2], "->", list(cut)[:2])
report = single.load_state_dict(cut, strict=False)                     # strict=False hides it: nothing loads
print(f"strict=False on the cut keys: {len(report.missing_keys)} of {len(unwrapped)} keys missing")
assert sorted(report.missing_keys) == sorted(unwrapped)
consume_prefix_in_state_dict_if_present(unwrapped, "module.")           # strips only where present
assert list(unwrapped) == list(single.state_dict())

# %% [markdown]
# `map_location` takes a device (`device`, `"cpu"`), a dict (`{"cuda:3": "cuda:0"}`) or a function. The
# prefix strip must be conditional: `consume_prefix_in_state_dict_if_present` strips `module.` from the
# keys that have it and leaves a file saved without the wrapper alone, where `key[7:]` on every key left
# no name the model knows (the last lines of the cell).
# Better still, save what the wrapper wraps: `torch.save(ddp_model.module.state_dict(), path)` on rank 0.


# %% [markdown]
# ## 8. Keys and shapes that don't match
#
# Two everyday cases: a state dict saved from `nn.DataParallel` / DDP (every key starts with `module.`;
# `torch.compile` adds `_orig_mod.`), and a pretrained model whose classifier head has another number of
# classes.

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
# what a multi-GPU script saves; with exactly one GPU, DataParallel moves the model it wraps to cuda:0,
# so wrap a copy and keep `pretrained` on the CPU for the comparisons below
wrapped_state = nn.DataParallel(copy.deepcopy(pretrained)).state_dict()
print("saved keys:", list(wrapped_state)[:3], "...")

new_model = Classifier(classes=5)                            # our task has 5 classes
with expect_error(RuntimeError, match="(?s)Missing key\\(s\\) in state_dict.*Unexpected key\\(s\\)"):
    new_model.load_state_dict(wrapped_state)

plain_state = {key.removeprefix("module."): value for key, value in wrapped_state.items()}
assert not torch.equal(new_model.backbone[0].weight, pretrained.backbone[0].weight)
with expect_error(RuntimeError, match="size mismatch for head.weight"):
    new_model.load_state_dict(plain_state)
print("after that error, the backbone is the pretrained one:",
      torch.equal(new_model.backbone[0].weight, pretrained.backbone[0].weight))
assert torch.equal(new_model.backbone[0].weight, pretrained.backbone[0].weight)

# %% [markdown]
# A trap: "it raised, so nothing changed" is wrong. `load_state_dict` copies every entry that fits and
# raises at the end: after the size-mismatch error the backbone is already the pretrained one, the head
# still random. Catch that error and train on, and you train a half-loaded model without knowing it.
#
# `strict=False` looks like the way out. It is not: it does **not** skip a shape mismatch, and with the
# `module.` prefix it **silently loads nothing** (no name matches) — it reports the problem in a return
# value nobody reads.

# %%
with expect_error(RuntimeError, match="size mismatch for head.weight"):
    Classifier(classes=5).load_state_dict(plain_state, strict=False)

new_model = Classifier(classes=5)
before = [p.detach().clone() for p in new_model.parameters()]
result = new_model.load_state_dict(wrapped_state, strict=False)
print(f"strict=False: no error, {len(result.missing_keys)} missing and {len(result.unexpected_keys)} unexpected keys")
assert len(result.missing_keys) == len(result.unexpected_keys) == 6
assert all(torch.equal(a, b) for a, b in zip(before, new_model.parameters()))   # nothing was loaded

# %% [markdown]
# What you write instead: strip the prefixes, keep what matches the model **by name and shape**, load that
# with `strict=False`, and look at what was left out.

# %%
new_model = Classifier(classes=5)                     # fresh: nothing loaded by the cells above
before = [p.detach().clone() for p in new_model.parameters()]
own = new_model.state_dict()
matched = {}
for key, value in wrapped_state.items():
    key = key.removeprefix("module.").removeprefix("_orig_mod.")
    if key in own and value.shape == own[key].shape:
        matched[key] = value
result = new_model.load_state_dict(matched, strict=False)
print("loaded:", sorted(matched))
print("kept their own values:", result.missing_keys)
assert all(torch.equal(new_model.state_dict()[key], value) for key, value in matched.items())   # backbone transferred
assert result.missing_keys == ["head.weight", "head.bias"] and torch.equal(new_model.head.weight, before[-2])

# %% [markdown]
# `load_matching_state_dict` is that loop hardened: it strips a prefix only when **every** key has it
# (with PyTorch's own `consume_prefix_in_state_dict_if_present`), reports what loaded, what did not fit
# and why, and raises when nothing matches instead of loading nothing silently.

# %%
new_model = Classifier(classes=5)
before = [p.detach().clone() for p in new_model.parameters()]
report = load_matching_state_dict(new_model, wrapped_state)
print(report)
assert torch.equal(new_model.backbone[0].weight, pretrained.backbone[0].weight)   # backbone transferred
assert torch.equal(new_model.head.weight, before[-2])                              # head kept its fresh init
assert [key for key, _, _ in report.shape_mismatch] == ["head.weight", "head.bias"]

# %% [markdown]
# The optimizer's state dict matches its parameters **by position**, group by group (even when the optimizer
# was built from `named_parameters()`, whose names it then stores, loading still goes by position). So
# `load_state_dict` checks only how many parameters each group has, never their shapes. Adam's state after one
# step of the 10-class model, loaded where the model gained a layer (8 parameters instead of 6):

# %%
def adam_after_one_step(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return optimizer

seed_everything(0)
source = Classifier(classes=10)
saved_optimizer = adam_after_one_step(source).state_dict()           # holds exp_avg, exp_avg_sq, step
grown = nn.Sequential(Classifier(classes=10), nn.Linear(10, 10))
with expect_error(ValueError, match="loaded state dict contains a parameter group that doesn't match the size "
                                    "of optimizer's group"):
    torch.optim.Adam(grown.parameters()).load_state_dict(saved_optimizer)
print("saved for", len(saved_optimizer["param_groups"][0]["params"]), "parameters; the model now has",
      len(list(grown.parameters())))

# %% [markdown]
# Worse, a change that keeps the count passes the check. The 5-class model has 6 parameters too: its
# optimizer loads the 10-class state without a word, and fails at the first `step()`, with a message that
# does not mention the optimizer:

# %%
five = Classifier(classes=5)
optimizer = torch.optim.Adam(five.parameters(), lr=1e-3)
optimizer.load_state_dict(saved_optimizer)                            # no error: 6 parameters, 6 saved
five(torch.randn(4, 8)).sum().backward()
with expect_error(RuntimeError, match=r"The size of tensor a \(10\) must match the size of tensor b \(5\)"):
    optimizer.step()

# %% [markdown]
# An optimizer state resumes only the model it was saved with, built the same way; after changing the model,
# load the weights that still fit (as above) and start a fresh optimizer. Both, checked:

# %%
same = torch.optim.Adam(Classifier(classes=10).parameters(), lr=1e-3)
same.load_state_dict(saved_optimizer)
first, restored = next(iter(saved_optimizer["state"].values())), same.state[same.param_groups[0]["params"][0]]
assert torch.equal(restored["exp_avg"], first["exp_avg"])            # Adam's moments, restored exactly
fresh = torch.optim.Adam(five.parameters(), lr=1e-3)                  # the changed model: a new optimizer
five.zero_grad()
five(torch.randn(4, 8)).sum().backward()
fresh.step()
print("the same model's optimizer resumes its moments; the changed model steps with a fresh one")

# %% [markdown]
# ## 9. Crash safety under a real `SIGKILL`
#
# A process can die at any instant: out-of-memory killer, pre-empted cloud machine, Ctrl-C at the wrong
# moment. We start a real subprocess that overwrites a 16 MB checkpoint with a plain `torch.save(state,
# path)`. So that the kill lands at a **known point** on any machine, however busy, the writer stops by
# itself after exactly 1 MiB of the new file has been written, says so, and waits; then it gets `SIGKILL`:

# %%
plain = artifacts / "plain.pt"
torch.save(big_model(16, 1.0).state_dict(), plain)                     # the last good checkpoint
complete = os.path.getsize(plain)
killed = kill_while_saving(plain, atomic=False, megabytes=16, kill_at="mid-write", after_bytes=2**20)
print(killed)
print(f"{plain.name} is now {os.path.getsize(plain):,} bytes; the complete one had {complete:,}")
assert killed.returncode == -9 and os.path.getsize(plain) == killed.bytes_written < complete   # old file gone
with expect_error(RuntimeError, match="PytorchStreamReader failed reading zip archive"):
    torch.load(plain, weights_only=True)
with expect_error(CheckpointError, match="truncated or corrupt"):
    load_checkpoint(plain, model=big_model(16, 0.0))

# %% [markdown]
# The previous checkpoint is gone and the new one is cut short: a zip archive without its central
# directory, the message above. `save_checkpoint` uses the recipe of section 4 (temporary file in the same
# folder, `fsync`, `os.replace`), so the target is always either the complete old file or the complete
# new one. The same writer now saves version 2 (weights 2.0) over version 1 (weights 1.0) with
# `save_checkpoint`, and is killed at the same point — 1 MiB into its write — and, in a second run, right
# after a save has completed.

# %%
atomic = artifacts / "atomic.pt"
save_checkpoint(atomic, model=big_model(16, 1.0), version=1)
for kill_at, expected_version in (("mid-write", 1), ("after-save", 2)):
    killed = kill_while_saving(atomic, atomic=True, megabytes=16, kill_at=kill_at, after_bytes=2**20)
    left_behind = {p.name: p.stat().st_size for p in artifacts.glob(".atomic.pt.*.partial")}   # the temporary file
    survivor = big_model(16, 0.0)
    meta = load_checkpoint(atomic, model=survivor)     # loads the survivor, removes dead writers' leftovers
    print(f"{killed}\n  -> {atomic.name} loads complete: version {meta['version']}, weights "
          f"{survivor.weight.unique().tolist()}; temporary files left by the writer: {list(left_behind.values())} bytes")
    assert killed.returncode == -9 and meta["version"] == expected_version
    assert torch.all(survivor.weight == float(expected_version))
    assert list(left_behind.values()) == ([2**20] if kill_at == "mid-write" else [])   # the cut write is there...
    assert not list(artifacts.glob(".atomic.pt.*.partial"))                          # ...until the load removes it

# %% [markdown]
# A killed writer cannot clean up after itself (no `finally` runs under `SIGKILL`), so its temporary file,
# the size of a checkpoint, stays behind. Its name carries the writer's host and PID
# (`.atomic.pt.HOST.PID.RANDOM.partial`), so the next `save_checkpoint` or `load_checkpoint` removes the
# files of writers on this host that no longer exist — never one that a live process is still writing
# (`remove_stale_partials` does it, and says which).
#
# A file can also be complete and still not be a checkpoint: a download link that returned an HTML error
# page, or a Git LFS pointer (a text file of about 130 bytes) from a repository cloned without
# `git lfs pull`. `torch.load` fails on the first byte, `<` or `v`:

# %%
import pickle
import zipfile

html_page, lfs_pointer = artifacts / "downloaded.pt", artifacts / "cloned.pt"
html_page.write_bytes(b"<!DOCTYPE html><html><head><title>404 Not Found</title></head></html>\n")
lfs_pointer.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 16777216\n")
for path, first_byte in ((html_page, "<"), (lfs_pointer, "v")):
    with expect_error(pickle.UnpicklingError, match=f"Unsupported operand {ord(first_byte)}"):
        torch.load(path, weights_only=True)                 # today's default
    with expect_error(pickle.UnpicklingError, match=f"invalid load key, '{first_byte}'"):
        torch.load(path, weights_only=False)                # what older PyTorch, and weights_only=False, say

# %% [markdown]
# The first message's advice, to retry with `weights_only=False`, cannot help here: the second call shows
# what that gives. Since PyTorch 1.6 `torch.save` writes a zip archive, so `zipfile.is_zipfile` tells a
# checkpoint from an HTML page, a pointer or a cut-off write (whose first bytes, `PK`, look like a good
# file's: only its end is missing). The first bytes tell the page and the pointer apart; the fix is to
# download again (`git lfs pull` for a pointer). A file written by PyTorch before 1.6, or with
# `_use_new_zipfile_serialization=False`, is not a zip either, and still loads.

# %%
for path in (html_page, lfs_pointer, plain, atomic):
    print(f"{path.name:15} {path.stat().st_size:>11,} bytes  zip: {zipfile.is_zipfile(path)!s:5}  "
          f"starts with {path.read_bytes()[:24]!r}")
assert not any(zipfile.is_zipfile(p) for p in (html_page, lfs_pointer, plain)) and zipfile.is_zipfile(atomic)

# %% [markdown]
# ## 10. Exercises
#
# Three exercises are **real code with planted bugs** (the text says how many); the last one you write.
# Fix or write the code in the cell and run it: the check runs your function on its own small, seeded data
# and prints a verdict that says what it *observed* (for example "the schedule is at epoch 0"). Each
# further failed attempt adds one hint, mildest first; none of them is the solution. `progress()` at the
# end of the notebook shows what you have solved.
#
# **Exercise 1 — a resume (there are 2 bugs).** `resume_training` restores a checkpoint written as in
# section 2 (`"model"`, `"optimizer"`, `"scheduler"`, `"epoch"`, `"rng": {"torch", "cuda"}`) into freshly
# built objects, so that training continues exactly as the uninterrupted run would, and returns the
# epoch to continue from. The check resumes two runs with it: one like section 2's (Adam, `StepLR`,
# dropout) and one the chapter did not show (SGD with momentum, `ReduceLROnPlateau`, BatchNorm).

# %%
@exercise
def resume_training(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]


check_resume_training(resume_training)

# %% [markdown]
# **Exercise 2 — the checkpoint dict (there are 2 bugs).** `checkpoint_dict` returns the dict that
# section 2 saves, for the end of epoch `epoch`: it must load with `weights_only=True` and restore the run
# exactly. The check restores your dict strictly into fresh objects, for a run like the chapter's and for
# one with BatchNorm, SGD with momentum and `ReduceLROnPlateau`, saved at another epoch.

# %%
@exercise
def checkpoint_dict(model, optimizer, scheduler, epoch):
    return {
        "model": model,
        "scheduler": scheduler.state_dict(),
        "epoch": epoch,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
    }


check_checkpoint_dict(checkpoint_dict)

# %% [markdown]
# **Exercise 3 — loading what matches (there are 2 bugs).** `load_matching` loads every entry of
# `state_dict` whose name (after removing a `module.` or `_orig_mod.` prefix) and shape match the model,
# leaves the model's other values as they are, and returns the sorted list of loaded keys. The check
# loads a 10-class classifier saved from `DataParallel` into a 5-class one, then a model the chapter did
# not show (BatchNorm, a block wrapped in a module whose attribute is named `module`, a head named `fc`),
# saved once without any prefix and once by `torch.compile`.

# %%
@exercise
def load_matching(model, state_dict):
    own = model.state_dict()
    matched = {}
    for key, value in state_dict.items():
        for prefix in ("module.", "_orig_mod."):
            key = key.removeprefix(prefix)
        if key in own:
            matched[key] = value
    model.load_state_dict(matched)
    return sorted(matched)


check_load_matching(load_matching)

# %% [markdown]
# **Exercise 4 — the rest of an interrupted epoch (write it).** `loader` shuffles with `generator`; the
# job was killed after `skip` batches of an epoch, and the checkpoint holds `epoch_start_state`, the
# generator's state when that epoch began. Return the batches of that epoch that were not trained on yet,
# in the order the uninterrupted run gave them, as a list of what the loader yields (for the check's
# `TensorDataset` of sample numbers, each batch is a one-element list holding a tensor of sample numbers).
# The check runs it on section 5's case and on other dataset sizes, batch sizes, epochs and points of
# interruption.

# %%
@exercise
def epoch_batches_from(loader, generator, epoch_start_state, skip):
    ...  # your code here


check_epoch_batches_from(epoch_batches_from)

# %% [markdown]
# ## What to remember
# - Save `state_dict()`s, load with `weights_only=True`; never `weights_only=False` on a file you did not make.
# - A resumable checkpoint holds model, optimizer, scheduler (and `GradScaler`), epoch/step/best score, the
#   RNG states, and mid-epoch the data position (the loader generator's state at the epoch's start and the
#   batches done — or `torchdata`'s `StatefulDataLoader.state_dict()`). Adam's state alone is twice the weights.
# - Meta data in a checkpoint must be plain Python: `float(np.mean(...))`, `loss.item()`. A `numpy.float64`
#   saves fine and makes the `weights_only=True` load refuse the whole file; `save_checkpoint` refuses it at
#   save time, naming the key.
# - A resume with the weights alone raises nothing: the run silently becomes another one.
# - After loading, re-run validation and compare with the logged value; prove a resume with `check_resume`
#   (fresh processes, step by step) before trusting a week-long job to it.
# - Tensors are saved with their device: `torch.load(path, map_location=..., weights_only=True)` (or
#   `load_checkpoint`, which defaults to the model's device) loads a file from `cuda:3` on a laptop or a
#   one-GPU machine.
# - A DDP/DataParallel wrapper's state dict has `module.` keys: save `ddp_model.module.state_dict()`, and
#   strip a prefix only where it is (`consume_prefix_in_state_dict_if_present`), never from every key.
# - `strict=False` neither skips shape mismatches nor complains about a prefix; filter by name and shape
#   (`load_matching_state_dict`) and read what was left out.
# - Write to a temporary file in the same folder, `fsync`, `os.replace`: a writer killed in the middle then
#   leaves the old file whole. `save_checkpoint` does it.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | `UnpicklingError: Weights only load failed ... GLOBAL __main__.Net` | a pickled whole model or custom object: save `state_dict()` | 1 |
# | `AttributeError: Can't get attribute 'Net'` | a whole-model file after the class moved | 1 |
# | `torch.save(model)`: `AttributeError: Can't pickle local object 'ScaledTanh.__init__.<locals>.<lambda>'` | the model holds a lambda (or a file, a lock): save `state_dict()` | 1 |
# | `AttributeError: 'collections.OrderedDict' object has no attribute 'eval'` (or `'dict' object ...`) | `torch.load` returned a state dict (or a checkpoint dict): build the model and `load_state_dict` | 1 |
# | `UnpicklingError: ... Unsupported global: GLOBAL numpy._core.multiarray.scalar` | a NumPy number (`np.mean`, a metric) saved in the checkpoint: store `float(x)` | 4 |
# | `TypeError: checkpoint meta 'val_loss' is a numpy.float64` | `save_checkpoint` refusing that number before writing: pass `float(x)` | 4 |
# | after resuming, the loss leaves the logged curve (a jump, or an unexplained drop) from the second step | optimizer/scheduler state not restored | 3 |
# | after resuming, samples repeat or the order differs from the log | the epoch restarted: save the loader generator's state and the batches done | 5 |
# | `check_resume`: `resume is NOT exact at step N` | the message names the part not restored (scheduler, RNG, data order, optimizer) | 6 |
# | `Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False` | GPU checkpoint on a CPU machine: `map_location` | 7 |
# | `Attempting to deserialize object on CUDA device 3 but torch.cuda.device_count() is 1` (on a GPU machine; a CPU-only one says CUDA is not available) | a file from a bigger machine: `map_location=device` (or `{"cuda:3": "cuda:0"}`) | 7 |
# | `Missing key(s) ... Unexpected key(s) ... module.` | DataParallel/DDP prefix: `consume_prefix_in_state_dict_if_present`, `load_matching_state_dict` | 7, 8 |
# | after stripping `module.`, nothing loads from another file (or `strict=False` loads nothing) | the prefix was cut from keys that did not have it: strip only where present | 7 |
# | `Missing key(s) in state_dict: "bn.running_mean" ...` | buffers (BatchNorm statistics) left out of the checkpoint | 2 |
# | `size mismatch for head.weight` (also with `strict=False`) | a different head: load the rest by name and shape | 8 |
# | `PytorchStreamReader failed reading zip archive: failed finding central directory` | a write was interrupted: save with the temp-file recipe (`save_checkpoint`) | 9 |
# | `UnpicklingError: invalid load key, '<'` (or `Unsupported operand 60`; `'v'` / `118`) | the file is an HTML page (a failed download) or a Git LFS pointer: `zipfile.is_zipfile(path)` is False | 9 |
# | files `.NAME.HOST.PID.xxxx.partial` beside a checkpoint | a killed writer's temporary file: the next `save_checkpoint`/`load_checkpoint` removes it | 9 |
# | `ValueError: loaded state dict contains a parameter group that doesn't match the size of optimizer's group` | the model gained or lost parameters since the optimizer state was saved: a fresh optimizer | 8 |
# | `The size of tensor a (10) must match the size of tensor b (5)` at the first `optimizer.step()` after a resume | an optimizer state of a model with the same parameter count but other shapes, loaded without a check | 8 |

# %%
print(progress(chapter=4))
