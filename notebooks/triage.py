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
# # Triage: start from what you see
#
# Something is wrong with your training and you do not know which chapter it belongs to. Find the symptom
# below, ask its first question, and open the section that reproduces it (each link opens the section in
# JupyterLab). An error *message* goes to `explain()`, below the table; a run that raises nothing goes to
# `diagnose`. Four drills at the bottom of the page give you only a symptom to start from.
#
# **Run All:** 7.2 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).
#
# | You see | Ask first | Where the course reproduces it |
# |---|---|---|
# | Training is slow | Is the GPU (or are the cores) busy, or waiting for the next batch? | [2 §1 is the GPU busy?](02_data_and_modules.ipynb#heading=Training-is-slow:-is-the-GPU-busy?), [2 §1 `num_workers`](02_data_and_modules.ipynb#heading=1.-num_workers:-let-other-processes-prepare-the-next-batches), [2 §1 workers × processes](02_data_and_modules.ipynb#heading=Workers-%C3%97-processes-per-machine,-against-the-core-count) |
# | No error, but it does not learn, or learns worse than it should, and you cannot see why | Walk data → model → step with plain PyTorch (a batch's values and labels, `print(model)`, what the optimizer holds), then run the unchanged script under `diagnose` (below) | [7 §1 the symptom](07_broken_project.ipynb#heading=1.-The-symptom), [7 §2 stage 1](07_broken_project.ipynb#heading=2.-Stage-1:-does-it-train?) |
# | The loss does not go down; some weights never change | Did every parameter get a gradient, and did the optimizer see it? | [1 §5 forgotten `zero_()`](01_tensors_autograd.ipynb#heading=5.-Pitfall:-forgetting-grad.zero_(),-and-other-update-mistakes), [2 §4 layers in a plain list](02_data_and_modules.ipynb#heading=4.-Layers-in-a-plain-Python-list,-a-tensor-that-should-be-a-buffer), [2 §6 the training step](02_data_and_modules.ipynb#heading=6.-The-training-step,-written-out) |
# | The loss grows step after step, then turns `inf`/`nan` | Is the learning rate above what this model tolerates (Adam's too)? | [1 §7 learning rate](01_tensors_autograd.ipynb#heading=7.-Explore:-learning-rate-and-steps), [3 §6 numerics](03_debugging.ipynb#heading=6.-Numerics) |
# | A deep network's loss stays at "predict the mean" from the first step | Do the activations vanish (or explode) layer after layer? The initialisation | [3 §6 numerics](03_debugging.ipynb#heading=6.-Numerics) |
# | The loss is `nan` from the first steps, or once the model grows confident | Data, then model, then numerics — in that order | [3 §4 data](03_debugging.ipynb#heading=4.-Data), [3 §5 model](03_debugging.ipynb#heading=5.-Model:-log(softmax(x))-by-hand), [3 §5 a mean over zero elements](03_debugging.ipynb#heading=An-empty-sequence:-a-mean-over-zero-elements), [3 §6 numerics](03_debugging.ipynb#heading=6.-Numerics) |
# | `Trying to backward through the graph a second time` | Which tensor from an earlier step does this step's graph reach: a forward run once, outside the loop, or a value carried over from the last step? Or do two losses of one forward each call `backward()`? | [1 §6 backward twice](01_tensors_autograd.ipynb#heading=One-forward,-one-backward:-calling-backward()-twice), [1 §6 a carried value](01_tensors_autograd.ipynb#heading=A-value-carried-from-one-step-into-the-next:-.detach()-it) |
# | `grad can be implicitly created only for scalar outputs` | Is the loss reduced to one number? | [1 §2 a non-scalar `backward()`](01_tensors_autograd.ipynb#heading=backward()-on-a-non-scalar:-which-combination-of-the-outputs?) |
# | `CUDA out of memory` | How much should the step need, and who holds the rest? | [3 §1 estimate](03_debugging.ipynb#heading=1.-Estimate-first,-then-measure), [3 §2 a real OOM](03_debugging.ipynb#heading=2.-A-real-OOM,-caught-and-retried) |
# | Memory grows a little every step | Do you keep a tensor that holds its graph (`total += loss`)? | [3 §3 memory held by accident](03_debugging.ipynb#heading=3.-%22Fake-OOM%22:-memory-you-are-holding-by-accident) |
# | `Expected all tensors to be on the same device` | Which tensor is where? | [3 §7 device mismatch](03_debugging.ipynb#heading=7.-Model-on-one-device,-batch-on-another) |
# | Validation numbers change with the batch size, or between two runs | Is the model in `eval()` and the loop under `inference_mode`? | [2 §8 evaluation](02_data_and_modules.ipynb#heading=8.-Evaluation:-model.eval()-and-inference_mode) |
# | The last batch of an epoch crashes in BatchNorm | Does the last batch hold one sample? | [2 §3 `drop_last`](02_data_and_modules.ipynb#heading=3.-drop_last-and-BatchNorm) |
# | The loss jumps after resuming from a checkpoint | Did you restore the optimizer, scheduler, RNG and position in the epoch? | [4 §3 model alone](04_checkpointing.ipynb#heading=3.-Resuming-with-the-model-alone-is-not-resuming), [4 §5 mid-epoch](04_checkpointing.ipynb#heading=5.-Resuming-in-the-middle-of-an-epoch), [4 §6 `check_resume`](04_checkpointing.ipynb#heading=6.-Prove-a-resume-exact:-check_resume) |
# | `Missing key(s)` / `size mismatch` when loading | A `module.` prefix, another head, or the wrong dict? | [4 §8 keys and shapes](04_checkpointing.ipynb#heading=8.-Keys-and-shapes-that-don't-match) |
# | A GPU checkpoint will not load on another machine | Where were its tensors saved, and by a wrapped model? | [4 §7 `map_location`](04_checkpointing.ipynb#heading=7.-map_location:-a-GPU-checkpoint-on-a-CPU-only-machine), [4 §7 from a bigger machine](04_checkpointing.ipynb#heading=A-checkpoint-from-a-bigger-machine) |
# | A DDP job hangs, then times out | Which rank skipped a collective? | [5 §7 a hang](05_ddp_torchrun.ipynb#heading=7.-A-hang:-one-rank-skips-a-collective) |
# | One worker of a long DDP job died, and the whole job ended | Does the script resume from its checkpoint, and does `torchrun` restart it? | [5 §11 a worker dies](05_ddp_torchrun.ipynb#heading=11.-A-worker-dies:-torchrun-restarts-the-job,-which-resumes-from-its-checkpoint) |
# | DDP trains on the same data every epoch, or every rank on the same data | `set_epoch`? Per-rank seeds? | [5 §3 `set_epoch`](05_ddp_torchrun.ipynb#heading=3.-Pitfall:-no-sampler.set_epoch(epoch)), [5 §5 seeds](05_ddp_torchrun.ipynb#heading=5.-Pitfall:-the-same-seed-on-every-rank) |
# | A DDP evaluation disagrees with one process | Did the sampler pad the last shard? | [5 §6 evaluation](05_ddp_torchrun.ipynb#heading=6.-Pitfall:-evaluating-with-DistributedSampler) |
# | `torch.compile` is not faster, or recompiles | Measured like for like? What made it recompile? | [6 §2 `torch.compile`](06_inference.ipynb#heading=2.-torch.compile,-measured-like-for-like) |
# | The ONNX model is wrong or refuses another batch size | Is the batch axis dynamic? Does `forward` branch or loop on values? | [6 §3 ONNX](06_inference.ipynb#heading=3.-ONNX-with-a-dynamic-batch-axis), [6 §4 control flow](06_inference.ipynb#heading=4.-Python-control-flow-in-forward), [6 §4 a loop at export](06_inference.ipynb#heading=A-Python-loop-at-export-time) |
# | Half precision raises a dtype error, or gives `inf` | `.half()` or `autocast`? | [6 §1 half precision](06_inference.ipynb#heading=1.-Half-precision:-.half()-or-autocast) |

# %%
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from course_utils import (check_binary_loss, check_deep_regressor, check_train_on_chunks, check_train_one_epoch,
                          diagnose, exercise, explain, progress)

# %% [markdown]
# ## An error message: `explain()`
#
# Paste the whole message, traceback and all. Here is one a user pasted into a public issue
# ([ankitajaiswal00/Try-First#26](https://github.com/ankitajaiswal00/Try-First/issues/26)), cut as they pasted it:

# %%
pasted = '''RuntimeError: Error(s) in loading state_dict for DataParallel: Missing key(s) in state_dict: "module.conv1.weight", "module.bn1.weight", "module.bn1.bias", "module.bn1.running_mean", "module.bn1.running_var", "module.conv2.weight",
Unexpected key(s) in state_dict: "state_dict".
Traceback:
File "C:\\Users\\ASUS\\anaconda3\\lib\\site-packages\\streamlit\\runtime\\scriptrunner\\script_runner.py", line 552, in _run_script
    exec(code, module.__dict__)'''
explanation = explain(pasted)
explanation

# %% [markdown]
# Read the causes in order. The first (`module.` prefix) is what the missing keys suggest, but the one
# *unexpected* key, `"state_dict"`, says it is the third: the file holds a checkpoint dict and the model
# was handed the whole dict instead of its `"state_dict"` entry. The fix is
# `model.load_state_dict(checkpoint["state_dict"])` (and then, if the keys still start with `module.`, the
# prefix). Chapter 4 §8 reproduces both.

# %%
assert explanation.id == "state-dict-mismatch" and explanation.chapter == 4
assert any("'state_dict' entry" in cause for cause in explanation.causes)

# %% [markdown]
# In a notebook, `%load_ext course_utils` does this under every error it recognises, with the same link.
# A message only its words place gets a chapter marked *low confidence*; one with too little to go on gets
# nothing rather than a guess:

# %%
assert explain("KeyError: 'learning_rate'") is None
print(explain("KeyError: 'learning_rate'"))

# %% [markdown]
# ## No error at all: `diagnose`
#
# The worst bugs raise nothing. `diagnose` runs an unchanged training script (`./course diagnose train.py`
# from a terminal) with PyTorch's global module and optimizer hooks installed first, and names what the run
# shows — here a loop that never clears its gradients, written to a file as you would write it:

# %%
import tempfile
from pathlib import Path

script = Path(tempfile.mkdtemp()) / "train.py"
script.write_text("""
import torch
from torch import nn
torch.manual_seed(0)
x = torch.randn(256, 8)
y = (x[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(50):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
""")
diagnosis = diagnose(script)
diagnosis

# %%
assert diagnosis.rules() == ["grad-not-cleared"] and diagnosis.findings[0].chapter == 1


# %% [markdown]
# ## Drills: from a symptom to its cause
#
# Four short functions, each written as someone wrote it on a real project, each with one bug behind one row
# of the table above. You start where they did: from the symptom alone. Run a drill's cell: the check calls
# the function on its own data and says what it saw (the error and the line that raised it, the `nan`, the
# signal that faded). Find the row of the table, ask its first question with plain PyTorch (print a shape, a
# `grad`, what one layer outputs), fix the function, and run the cell again. Each further failed attempt adds
# a hint, mildest first; none of them is the solution. `progress(chapter=0)` at the bottom shows what you
# have solved.
#
# **Drill 1 — `Trying to backward through the graph a second time` (1 bug).** `train_on_chunks` trains a
# recurrent cell on a long signal read in chunks of a few steps: the hidden state carries from one chunk into
# the next, so the model can remember what it saw, and each chunk gets its own backward pass and optimizer
# step (a backward pass through the whole signal at once would keep the whole signal's activations in
# memory). It returns the loss of each chunk. The check trains a `GRUCell` and an `RNNCell` on other chunk
# counts, lengths and batch sizes, and compares the losses and weights with a correct loop.

# %%
@exercise
def train_on_chunks(cell, head, chunks, lr):
    optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=lr)
    h = torch.zeros(chunks[0][0].shape[1], cell.hidden_size)
    losses = []
    for x, y in chunks:               # x: (steps, batch, features), y: (steps, batch, 1)
        optimizer.zero_grad()
        outputs = []
        for x_t in x:
            h = cell(x_t, h)
            outputs.append(head(h))
        loss = F.mse_loss(torch.stack(outputs), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


check_train_on_chunks(train_on_chunks)

# %% [markdown]
# **Drill 2 — the loss is `nan` once the model is sure (1 bug).** `binary_loss` is a binary classifier's
# loss, written from its formula: the mean of −(t log σ(z) + (1 − t) log(1 − σ(z))) for logits z and targets
# t. On paper it is right. The check compares its value and its gradient with a numerically stable
# computation of the same formula, for logits of every size (a confident model's ±40 and ±100 included),
# smoothed targets, float64, and a multi-label batch.

# %%
@exercise
def binary_loss(logits, targets):
    p = torch.sigmoid(logits)
    return -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p)).mean()


check_binary_loss(binary_loss)

# %% [markdown]
# **Drill 3 — it crashes at the end of the epoch (1 bug).** `train_one_epoch` trains a classifier with
# BatchNorm for one epoch in shuffled batches and returns each step's loss. The check runs it for four models
# on datasets of 49, 64, 29 and 45 samples, and looks at every batch the model sees, its loss, the optimizer's
# steps and BatchNorm's running statistics.

# %%
@exercise
def train_one_epoch(model, dataset, batch_size, optimizer):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    model.train()
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


check_train_one_epoch(train_one_epoch)

# %% [markdown]
# **Drill 4 — a deep network that gives every input the same answer (1 bug).** `deep_regressor` builds a
# regression MLP of `depth` hidden layers (Linear + ReLU) and one output, with an initialisation its author
# copied from an older, shallower model. Keep the layers as they are (Linear and ReLU only). The check builds
# networks of 12, 24 and 6 hidden layers and measures, layer after layer, how much each layer's output varies
# with the input (the *signal*), how large it is (its root mean square, the *size*), and whether its units
# start out different from each other.

# %%
@exercise
def deep_regressor(n_in, width, depth):
    layers = []
    for i in range(depth):
        linear = nn.Linear(n_in if i == 0 else width, width)
        nn.init.normal_(linear.weight, std=0.01)
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.ReLU()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


check_deep_regressor(deep_regressor)

# %%
print(progress(chapter=0))
