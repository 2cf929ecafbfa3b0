# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
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
# # Chapter 7 — The broken project
#
# **You will be able to:** take over someone else's training project that "runs but does not work", start
# from the symptom, walk the triage order (data, then model, then the training step, then what happens
# around training: resuming, several processes, export), find each bug with the PyTorch you learned in
# chapters 1–6, fix it in the files, and prove the fix with a check.
#
# Every chapter so far showed one pitfall in a cell built for it. Real bugs arrive together, silently, in
# code you did not write. The project in `broken_project/` is about 200 lines a practitioner would
# write — a data module, a small CNN, a training script with checkpoints, resume and `torchrun` support,
# an ONNX export — with **eleven bugs planted from chapters 1–6**. Ten of them raise no error: the project
# trains, just wrongly. Two tools help: `diagnose`, which watches the unchanged training script and names
# what its gradients, modes and inputs show, and `explain`, which reads an error message. They do not name
# every bug: some need your own reasoning, and the text says where.
#
# **How to work.** Open the files in JupyterLab's file browser (`broken_project/`), edit, save, and run the
# stage's check cell again. `bp.reset(folder)` gives you the broken project back at any time. Each check
# runs the project's own scripts in fresh processes, as you would from a terminal, and says what it observed.
# Section 7 then has you write four of `diagnose`'s probes yourself, in plain PyTorch.
#
# **Run All:** 63 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).

# %%
import functools
import importlib.util
import json
import math
import subprocess
import sys

import torch
from torch import nn

from course_utils import broken_project as bp
from course_utils import (check_accuracy_restoring_modes, check_leaks_gradients, check_outputs_are_probabilities,
                          check_parameters_left_out, exercise, explain, hardware_summary, progress)
from course_utils.exercises import solutions_in_place

print(hardware_summary())
folder = bp.project_folder("broken_project")     # created broken the first time; your edited copy afterwards
SHIPPED = bp.as_shipped(folder)                  # every planted bug still in place?
for name in bp.FILES:
    print(f"broken_project/{name:10s} {len((folder / name).read_text().splitlines()):4d} lines")
print("the files are as shipped (every bug planted)" if SHIPPED else "the files have been edited (or fixed)")

# %% [markdown]
# The cells below **assert** the symptoms they show while the files are as shipped (`SHIPPED`); once you
# edit the files, they show what your version does instead.
#
# ## 1. The symptom
#
# The colleague who wrote it says: "`train.py` runs, but the loss is `nan` and the accuracy stays at
# 25 %" — chance, for four classes. Run it as they did (a terminal's `python train.py --epochs 3`):

# %%
def run(*args: str) -> subprocess.CompletedProcess:
    """One of the project's scripts, run from its folder, its output shown."""
    done = subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=300)
    print((done.stdout + done.stderr)[-2500:])
    return done


first = run("train.py", "--epochs", "3", "--log-file", "symptom_log.jsonl")
(folder / "symptom_log.jsonl").unlink(missing_ok=True)
epochs = [json.loads(line) for line in first.stdout.splitlines() if line.startswith("{")]
if SHIPPED:
    assert first.returncode == 0 and all(math.isnan(e["loss"]) for e in epochs)
    assert epochs[-1]["val_accuracy"] <= 0.3

# %% [markdown]
# No exception, no warning: nothing to paste into `explain`. This is where the **triage order** starts:
# the data first (is what goes in sane?), then the model (does it compute what you think, and is every
# layer trained?), then the training step (chapter 2's order), then numerics.
#
# ## 2. Stage 1: does it train?
#
# ### 2.1 The data, with plain PyTorch
#
# Import the project's `data.py` as its own code would (a fresh import each time, since you will edit it)
# and look at one batch: its values and its labels.

# %%
def load(module: str):
    """A fresh import of broken_project/<module>.py (it changes as you fix it)."""
    spec = importlib.util.spec_from_file_location(f"broken_project_{module}", folder / f"{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.path.insert(0, str(folder))              # its own `from model import ...` lines
    try:
        spec.loader.exec_module(loaded)
    finally:
        sys.path.remove(str(folder))
        for name in set(sys.modules) - before:   # forget the project's files: the next load reads your edits
            if str(folder.resolve()) in str(getattr(sys.modules[name], "__file__", "")):
                del sys.modules[name]
    return loaded


data = load("data")
train_loader, val_loader, sampler = data.loaders(batch_size=64)
images, labels = next(iter(train_loader))
bad = ~torch.isfinite(images)
print("batch", tuple(images.shape), "| non-finite values:", int(bad.sum()),
      "| in image rows", sorted(set(bad.nonzero()[:, 2].tolist())))
print("labels of the first batch:", labels[:16].tolist(), "...")
print("classes per batch, first 5 batches:", [len(y.unique()) for _, y in list(train_loader)[:5]])
if SHIPPED:
    assert bad.any() and set(bad.nonzero()[:, 2].tolist()) == {0}
    assert all(len(y.unique()) == 1 for _, y in list(train_loader)[:5])

# %% [markdown]
# Two questions, each raised by one line of plain PyTorch (chapter 3 §4: the data first):
# - **Where do the NaN come from?** They all sit in one image row. Read `normalise` and the line that computes
#   its `mean` and `std` in `data.py`: what does it divide by for a row that is the same in every image
#   (`draw` says what the scanner does to row 0)? Print that value.
# - **Why one class per batch?** Look at how `make_shapes` orders the labels, then at what decides the order
#   of the batches. With a `sampler=`, the order comes from the sampler's own arguments, not from the
#   `DataLoader`'s (which refuses `shuffle=True` beside a sampler); chapter 5 §3 builds this sampler.
#
# ### 2.2 The model, with plain PyTorch
#
# Count what the optimizer will see, and look at what the model outputs.

# %%
model = load("model").ShapesNet()
registered = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
print(model)
print("Conv2d layers in model.named_modules():", registered)
print("parameters model.parameters() hands the optimizer:", sum(p.numel() for p in model.parameters()))
with torch.no_grad():
    out = model.eval()(torch.randn(4, 1, 16, 16))
print("each output row sums to:", [round(v, 4) for v in out.sum(1).tolist()])
if SHIPPED:
    assert registered == [] and torch.allclose(out.sum(1), torch.ones(4))

# %% [markdown]
# Two more questions:
# - **Where are the convolutions?** `__init__` builds two blocks, yet `print(model)` and `named_modules()` do not
#   list them, and the optimizer gets `model.parameters()`. Chapter 2 §4 shows what a module must be held in to
#   be registered.
# - **Why do the rows sum to 1?** Look at the last line of `forward`, then at the loss `train.py` uses: what does
#   `nn.CrossEntropyLoss` do to its input first (chapter 3 §5, `log(softmax(x))`)?
#
# ### 2.3 The whole run, watched: `diagnose`
#
# The training step's bugs do not show in a batch or a model printout; they show in what happens step after
# step. `diagnose` runs the unchanged `train.py` in a child process with PyTorch's global module and optimizer
# hooks installed first, and names what the gradients, the modes and the loss inputs show. `check_training`
# runs it on six epochs and also asks for 95 % validation accuracy.

# %%
stage1 = bp.check_training(folder)
stage1

# %%
stage1_rules = set(stage1.diagnosis.rules())
if SHIPPED:
    assert not stage1.passed
    assert {"nonfinite-input", "unshuffled-data", "param-not-in-optimizer", "double-softmax",
            "grad-not-cleared", "eval-mode-training"} <= stage1_rules, stage1_rules
if solutions_in_place():
    assert stage1.passed and not stage1_rules

# %% [markdown]
# Each finding names its chapter. Read the one you do not recognise in that chapter, then find the line:
#
# | `diagnose` says | What it saw | Chapter |
# |---|---|---|
# | `nonfinite-input` | NaN in a batch before the model | 3 §4 |
# | `unshuffled-data` | almost every batch holds one class | 5 §3 (the sampler's arguments) |
# | `param-not-in-optimizer` | the blocks got gradients but never changed | 2 §4 |
# | `double-softmax` | `cross_entropy` fed rows that sum to 1, from a softmax | 3 §5 |
# | `grad-not-cleared` | each backward added onto the gradient of the previous update | 1 §5 |
# | `eval-mode-training` | the model trained in eval mode after the first validation | 2 §8 |
# | `sampler-without-set-epoch` | the sampler shuffled the same way every epoch | 5 §3 |
#
# Two of them you can see without the tool, with the script's own functions: does `evaluate` leave the model as
# it found it, and what happens to a parameter's `.grad` when `backward()` runs twice without clearing?
#
# %%
train_module = load("train")
probe = load("model").ShapesNet()
print("training mode before evaluate():", probe.training)
train_module.evaluate(probe, val_loader)
print("training mode after evaluate(): ", probe.training)
x = torch.randn(8, 1, 16, 16)
grads = []
for _ in range(2):                              # two backward passes, nothing cleared in between
    nn.functional.cross_entropy(probe.train()(x), torch.zeros(8, dtype=torch.long)).backward()
    grads.append(probe.head.weight.grad.clone())
print("head gradient norm after 1 and 2 backward passes:", [round(g.norm().item(), 4) for g in grads])
# (the training loop in train.py decides whether the second pass starts from zero)

# %% [markdown]
# **Exercise 1 — stage 1 (there are 7 bugs, in `data.py`, `model.py` and `train.py`).** Fix them in the
# files and run the check cell above again until it says PASSED. Fix one at a time and re-run: a bug can
# hide behind another — the last row of the table appears only once the sampler shuffles at all.
#
# ## 3. Stage 2: does `--resume` continue exactly?
#
# A resumable checkpoint holds everything the next step depends on (chapter 4): the model, the optimizer's
# state, where training was, and the random number generators. Look at what the script writes, with plain
# `torch.load`:

# %%
run("train.py", "--epochs", "1", "--checkpoint", "peek.pt", "--log-file", "peek.jsonl")
checkpoint = torch.load(folder / "peek.pt", map_location="cpu", weights_only=True)
print({key: type(value).__name__ for key, value in checkpoint.items()})
for name in ("peek.pt", "peek.jsonl"):
    (folder / name).unlink(missing_ok=True)

# %% [markdown]
# The file holds all four. Whether `--resume` *uses* them is another question: `check_resume` trains four
# epochs in one run, then two epochs and `--resume` to four, compares the logs and the final weights, and
# watches the resumed run with `diagnose`.

# %%
stage2 = bp.check_resume(folder)
stage2

# %%
if SHIPPED:
    assert not stage2.passed and "resume-without-optimizer-state" in stage2.diagnosis.rules()
    assert "[0, 1, 1, 2, 3]" in stage2.observations[0]
if solutions_in_place():
    assert stage2.passed

# %% [markdown]
# `diagnose` names one bug: the optimizer's state is in the file but never loaded, so SGD's momentum starts
# from zero again. The other needs your reasoning — it leaves no trace in gradients or modes, only in the
# **log**: look at the epochs the resumed run logged, and at the line of `train.py` that decides where it
# starts.
#
# **Exercise 2 — stage 2 (there are 2 bugs, in `train.py`).** Fix them and run the check again.
#
# ## 4. Stage 3: two processes
#
# The script is written for `torchrun` (chapter 5). `check_distributed` launches it on two processes
# (`gloo`, on this machine) for two epochs and reads the log it writes.

# %%
stage3 = bp.check_distributed(folder)
stage3

# %%
if SHIPPED:   # every epoch is logged twice, whether or not a rank then died in its save (see below)
    assert not stage3.passed and "epochs in the log: [0, 0" in str(stage3)
    crashed = stage3.observations[0] != "torchrun exited with 0"
    assert not crashed or "FileNotFoundError" in stage3.observations[1]
if solutions_in_place():
    assert stage3.passed

# %% [markdown]
# Read the log the two processes wrote, line by line, with plain Python:

# %%
for line in (folder / "train_log.jsonl").read_text().splitlines():
    print(line[:100])
print("this run:", "a rank died in its save, and the job with it" if stage3.observations[0] != "torchrun exited with 0"
      else "both ranks finished, every epoch logged twice")

# %% [markdown]
# No tool names this one, and what it shows depends on timing. Each epoch ends the same way in both
# processes: each appends its record to the log (so every epoch is there twice), then each writes
# `checkpoint.pt.tmp` and renames it to `checkpoint.pt`. When the two renames come close together, the
# second finds no `.tmp` file left and that rank dies with `FileNotFoundError`; otherwise both finish with
# a doubled log. The last line above says which of the two this run got; run the check again and you may
# get the other. Which lines of `train.py` run on every rank, and which should run on one (chapter 5)?
#
# **Exercise 3 — stage 3 (1 bug, in `train.py`).** Fix it and run the check again.
#
# ## 5. Stage 4: the export
#
# `export.py` writes `shapes.onnx` for a service that sends batches of any size. `check_export` trains two
# epochs, runs `export.py`, and compares ONNX Runtime with PyTorch on a batch of 1 and a batch of 8.

# %%
stage4 = bp.check_export(folder)
stage4

# %%
if SHIPPED:
    assert not stage4.passed
if solutions_in_place():
    assert stage4.passed

# %% [markdown]
# While the blocks are still in a plain list, `export.py` fails before any ONNX file exists ("Constant ... is
# mutated in the forward method. Pls register it as buffer": their BatchNorm buffers are not the model's
# buffers; its `explain` line points at chapter 6 §4, but the cause is §2.2's list). Once stage 1 passes, the
# file is written and ONNX Runtime rejects the batch sizes: paste the message the check shows into
# `explain()`, and ask the file itself which input shape it accepts, with plain `onnxruntime`:

# %%
import onnxruntime

if (folder / "shapes.onnx").exists():
    session = onnxruntime.InferenceSession(str(folder / "shapes.onnx"))
    print("the ONNX file's input:", session.get_inputs()[0].name, session.get_inputs()[0].shape)
else:
    print("no shapes.onnx: export.py failed before writing it (see the check above)")
rejected = [line for line in stage4.observations if "rejected" in line]
explanation = explain(rejected[0]) if rejected else None
explanation

# %% [markdown]
# Chapter 6 §3 exports with a dynamic batch axis: `torch.onnx.export(..., dynamic_shapes=...)`, one entry per
# argument of `forward` (here `x`, not the ONNX input name `images`). Compare with `export.py`.

# %% [markdown]
# **Exercise 4 — stage 4 (1 bug, in `export.py`).** Fix it and run the check again.
#
# ## 6. What was planted
#
# When every stage passes — or to check your list — here is what the project shipped with, and what found
# each bug. `bp.reset(folder)` starts you over.

# %%
solved_all = all(report.passed for report in (stage1, stage2, stage3, stage4))
if solved_all or solutions_in_place():
    print(f"{'bug':32s} {'chapter':>7s}  {'file':10s} found by")
    for bug in bp.BUGS:
        print(f"{bug.id:32s} {bug.chapter:7d}  {bug.file:10s} {bug.found_by}")
else:
    print(f"{sum(r.passed for r in (stage1, stage2, stage3, stage4))} of 4 stages pass; the list appears when all do.")

# %% [markdown]
# ## 7. Exercises: the probes `diagnose` runs, written by hand
#
# `diagnose` is not magic: it installs PyTorch's own hooks before the script runs and reads what they see.
# On the next project there may be no tool, so write four of its probes yourself, in plain PyTorch. Each is
# **real code with planted bugs** (the text says how many); fix the code in the cell and run it. The check runs
# your function on models and training steps of its own — not the project's — and says what it *observed*;
# each further failed attempt adds one hint, mildest first. The hooks you need:
#
# - `torch.nn.modules.module.register_module_forward_hook(hook)` calls `hook(module, args, output)` after every
#   `module(...)` call of every model — registered or not, so also the blocks of §2.2 held in a plain list —
#   until you call `.remove()` on the handle it returns (`register_optimizer_step_post_hook`, imported from
#   `torch.optim.optimizer`, does the same for every optimizer: what `diagnose` uses, since it does not hold the
#   script's optimizer);
# - `tensor.register_hook(hook)` on a parameter calls `hook(grad)` when a backward pass brings it a new
#   gradient, *before* that gradient is added into `.grad` (so `.grad` still holds what was there). Return
#   nothing from it: a tensor it returns replaces the gradient;
# - `optimizer.register_step_post_hook(hook)` calls `hook(optimizer, args, kwargs)` after every
#   `optimizer.step()` of that optimizer. Every `register_*` returns a handle to remove.
#
# A hook left installed keeps running. The check removes what your function leaves behind; if you call a
# function that leaves a global hook yourself, outside the check, restart the kernel (Kernel → Restart).
#
# **Exercise 5 — parameters that run but never learn (there are 3 bugs, one of them in two places).** `parameters_left_out(model,
# optimizer, x)` runs `model(x)` once and returns every parameter (the tensor itself) that requires a gradient,
# belongs to a module that ran, and that `optimizer` does not hold: each once, in any order. It changes no
# parameter and leaves no hook behind. This is `param-not-in-optimizer` in §2.3's table. The check tries blocks
# in a plain list (one of them applied twice), an optimizer with two parameter groups, an optimizer given only the head, and a backbone
# frozen with `requires_grad_(False)` (not a bug: nothing to report).

# %%
@exercise
def parameters_left_out(model, optimizer, x):
    held = list(optimizer.param_groups[0]["params"])
    left_out = []

    def record(module, args, output):          # after every module(...) call, of any model
        for p in module.parameters(recurse=False):
            if p.requires_grad and p not in held and p not in left_out:
                left_out.append(p)

    torch.nn.modules.module.register_module_forward_hook(record)
    with torch.no_grad():
        model(x)
    return left_out


check_parameters_left_out(parameters_left_out)

# %% [markdown]
# **Exercise 6 — gradients that leak into the next step (there are 3 bugs).** `leaks_gradients(train_step,
# model, optimizer, batches)` calls `train_step(batch)` for each batch and returns `True` when a backward pass
# adds its gradient onto one that an optimizer step has already used — a missing `zero_grad`, chapter 1 §5 —
# and `False` otherwise. Gradient accumulation on purpose (chapter 2 §7: several backward passes, then one
# step, then `zero_grad`) is not a leak, and neither is `zero_grad(set_to_none=False)`. It leaves no hook
# behind. This is `grad-not-cleared` in §2.3's table. The check tries six ways of writing a step, with SGD and
# with Adam.

# %%
@exercise
def leaks_gradients(train_step, model, optimizer, batches):
    stepped = set()                            # ids of the parameters an optimizer step has used
    leaked = False

    def after_step(optimizer, args, kwargs):
        stepped.update(id(p) for group in optimizer.param_groups for p in group["params"])

    def on_gradient(p, grad):                  # runs before the new gradient is added into p.grad
        nonlocal leaked
        if id(p) in stepped and p.grad is not None:
            leaked = True                      # a step used what is still there

    handles = [p.register_hook(functools.partial(on_gradient, p)) for p in model.parameters()]
    optimizer.register_step_post_hook(after_step)
    try:
        for batch in batches:
            train_step(batch)
    finally:
        for handle in handles:
            handle.remove()
    return leaked


check_leaks_gradients(leaks_gradients)

# %% [markdown]
# **Exercise 7 — an evaluation that changes the model (there are 3 bugs).** `accuracy_restoring_modes(model,
# loader)` returns, as a Python float, the fraction of samples whose largest logit (`(N, C)` logits) is the
# label, computed in eval mode without recording a graph (chapter 2 §8), and leaves **each module** in the mode
# it found it: the project's `evaluate` left the model in eval mode for the rest of training
# (`eval-mode-training`). The check tries a model in training mode, one in eval mode, and one fine-tuned with
# its BatchNorm backbone kept in eval mode while the head trains.

# %%
@exercise
def accuracy_restoring_modes(model, loader):
    model.eval()
    correct = total = 0
    for images, labels in loader:
        predictions = model(images).argmax(dim=0)
        correct += (predictions == labels).sum().item()
        total += len(labels)
    model.train()
    return correct / total


check_accuracy_restoring_modes(accuracy_restoring_modes)

# %% [markdown]
# **Exercise 8 — probabilities where the loss wants logits (there are 3 bugs).** `outputs_are_probabilities(model,
# x)` returns `True` when every row of `model(x)` is a probability distribution — no negative entry, sums to 1
# within 1e-4 — and `False` otherwise. That is what `nn.CrossEntropyLoss` must **not** be given: it applies
# `log_softmax` itself (chapter 3 §5), so a softmax before it squashes the scores and training stalls
# (`double-softmax`). The check tries nine heads (logits, softmax, log-softmax, sigmoid, ...; float32 and
# float64) on batches of 64 and of 1.

# %%
@exercise
def outputs_are_probabilities(model, x):
    with torch.no_grad():
        probabilities = model(x).softmax(dim=1)
    return bool((probabilities >= 0).all() and probabilities.sum() == 1)


check_outputs_are_probabilities(outputs_are_probabilities)

# %%
progress(chapter=7)
