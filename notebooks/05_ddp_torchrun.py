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
# # Chapter 5 — From one device to DistributedDataParallel with `torchrun`
#
# **You will be able to:** turn chapter 2's training loop into a DDP script (about 80 lines, a third of them
# logging for this chapter's cells) and launch it with `torchrun` from a cell; see on the data itself what a
# forgotten `set_epoch`, every rank saving and the same seed on every rank do; evaluate each validation sample
# exactly once; make a hang fail in seconds and name the rank that never arrived; train on uneven inputs with
# `Join`; count the all-reduces `no_sync()` saves; form a two-node job on one machine, including what a
# missing node looks like; and have `torchrun` restart a job whose worker died, resuming from its checkpoint.
# **You write the PyTorch; `course_utils` holds the hardened versions** (a launcher that streams output,
# times out and kills every worker, and takes them down with the kernel; the chapter's checks).
#
# **Hardware and time.** On a CPU laptop (and in CI) each job runs **2 processes with the `gloo` backend**;
# on a machine with several GPUs the training script of sections 2–6 runs one process per GPU with `nccl`.
# Each `torchrun` launch starts fresh Python processes that import torch (about 1.5 s each on a 2-core
# CPU), and the launches make up nearly all of the *Run All* time.
#
# **Run All:** 44 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).

# %%
import json
import mmap
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from course_utils import (check_accumulate_no_sync, check_epoch_shards, check_eval_shard,
                          check_save_checkpoint_once, exercise, expect_error, explain, free_ports, get_device,
                          hardware_summary, launch_torchrun, mlp, progress, script_variant, seed_everything)

# %load_ext course_utils
device = get_device()
seed_everything(0)
gpus = torch.cuda.device_count()
nproc = gpus if gpus >= 2 else 2
print(hardware_summary())
print(f"{gpus} GPU(s) -> the training script runs {nproc} processes with {'nccl' if gpus >= 2 else 'gloo'}")

# %% [markdown]
# ## 1. Why not `nn.DataParallel`
#
# `DataParallel` is **one process with one thread per GPU**: each step it copies the model to every GPU,
# scatters the batch, gathers all outputs on GPU 0, computes the loss there and reduces the gradients back
# to GPU 0. GPU 0 does extra work and holds extra memory, and the Python GIL serialises the threads. DDP
# runs **one process per GPU**, each with its own model replica and data shard; only gradients travel,
# all-reduced in buckets while backward is still running.

# %%
model = mlp([32, 256, 256, 10]).to(device)
if gpus >= 2:
    from course_utils import benchmark
    wrapped = nn.DataParallel(model)                   # splits each batch over wrapped.device_ids
    x = torch.randn(64, 32, device=device)
    torch.testing.assert_close(wrapped(x), model(x), rtol=1e-4, atol=1e-5)   # the same maths, split over GPUs
    single = lambda: model(torch.randn(4096, 32, device=device)).sum().backward()
    parallel = lambda: wrapped(torch.randn(4096, 32, device=device)).sum().backward()
    print(benchmark({"one GPU": single, f"DataParallel on {gpus} GPUs": parallel}))
    print(f"Look for: DataParallel well short of {gpus}x faster (the copies to and from GPU 0 each step).")
else:
    print(f"{gpus} GPU(s): DataParallel has fewer than two devices to split a batch over, so nothing is compared\n"
          "or timed here. On 2+ GPUs this cell checks it computes the same outputs as one GPU and times a training\n"
          "step on one GPU against DataParallel. Below, the DDP job runs for real as processes on the CPU.")

# %% [markdown]
# ### DataParallel forgets what `forward` writes on the module
#
# Each step `DataParallel` makes **new replicas** of the module (`torch.nn.parallel.replicate`: a new module
# object per GPU whose attributes are a shallow copy of the original's `__dict__`) and calls `forward` on
# them. So `self.calls += 1` in `forward` — a step counter, a running statistic kept in a Python attribute,
# a cached tensor — rebinds the attribute **on a replica**, which is thrown away after the step: the original
# never changes (`Module._replicate_for_data_parallel` in torch/nn/modules/module.py: `replica.__dict__ =
# self.__dict__.copy()`). Only in-place updates of parameters and buffers on the first GPU survive, because
# replica 0 shares their storage with your module — BatchNorm's running statistics, say; the `DataParallel`
# documentation states both. DDP has no replicas: each process's model is the one that runs.

# %%
class CountsCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.calls = nn.Linear(32, 10), 0

    def forward(self, x):
        self.calls += 1                          # state written in forward: a plain Python attribute
        return self.linear(x)


counting = CountsCalls().to(device)
if gpus >= 2:
    wrapped_counting = nn.DataParallel(counting)
    for _ in range(3):
        wrapped_counting(torch.randn(64, 32, device=device))
    print(f"DataParallel on {gpus} GPUs: forward ran 3 times; counting.calls = {counting.calls}")
    assert counting.calls == 0                   # every increment happened on a replica, then was discarded
else:
    for _ in range(3):
        nn.DataParallel(counting)(torch.randn(64, 32, device=device))
    print(f"{gpus} GPU(s): DataParallel has no second device, so it calls the module itself and nothing is lost "
          f"(counting.calls = {counting.calls}); the bug needs 2+ GPUs and cannot show here.")
    assert counting.calls == 3
    try:                                         # and the replication step itself is GPU-only:
        torch.nn.parallel.replicate(counting, [torch.device("cpu")] * 2)
        raise AssertionError("replicate accepted CPU devices")
    except ValueError as error:
        print(f"replicate(model, [cpu, cpu]) -> ValueError: {error}")
        assert "non cpu device" in str(error)

# %% [markdown]
# ## 2. The training script: chapter 2's loop, distributed
#
# This is chapter 2's training step (`zero_grad`, forward, loss, `backward`, `step`) on a small regression.
# The lines marked `# DDP` are the whole difference:
#
# - `torchrun` starts one process per device and gives each `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
#   `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`; `init_process_group` reads them and connects them all.
# - `DistributedSampler` gives each rank its own share of the data; `set_epoch(epoch)` reshuffles it.
# - `DDP(model)` broadcasts rank 0's weights at construction, then averages the gradients in `backward()`.
# - Only rank 0 saves (the weights are the same everywhere), then `barrier()`: nobody goes on to read the
#   file before it is written. `destroy_process_group()` at the end.
#
# After training, each rank evaluates its own slice of 21 validation samples and all-reduces the result
# (section 6 says why not with `DistributedSampler`). Each rank also logs what it saw — the sample indices of
# every epoch, its augmentation noise, the bytes its save wrote (`/proc/self/io`, Linux only), its final
# weights — to `rank{N}.json` in `$COURSE_LOG_DIR`, or in the current folder when that is not set.

# %%
runs = Path("artifacts/ch5")                 # the scripts, and a folder of logs per job
shutil.rmtree(runs, ignore_errors=True)
runs.mkdir(parents=True)

# %%
# %%writefile artifacts/ch5/train_ddp.py
"""Chapter 2's training loop on a small regression, made distributed; `# DDP` marks each change."""
import datetime, json, os
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PER_RANK_BATCH, ACCUMULATION = 8, 1        # samples per rank per backward; backwards per optimizer step


def bytes_written():  # bytes this process has written so far: Linux reports it, other systems -> None
    try:
        return int(open("/proc/self/io").read().split("wchar:")[1].split()[0])
    except OSError:
        return None


def main():
    log_dir = os.environ.get("COURSE_LOG_DIR", ".")            # where model.pt and the logs go (default: here)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])         # DDP: set by torchrun
    use_cuda = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])        # DDP: a GPU for each rank?
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=2))  # DDP
    world = dist.get_world_size()
    global_batch = PER_RANK_BATCH * world * ACCUMULATION                               # DDP: log this one
    if rank == 0:
        print(f"global batch {global_batch} = {PER_RANK_BATCH} per rank x {world} ranks x {ACCUMULATION} "
              "accumulation step(s)", flush=True)

    torch.manual_seed(0)                   # the same dataset on every rank: the sampler splits indices into it
    x = torch.randn(48 + 21, 4)            # 48 training samples, then 21 for validation
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.3
    dataset = TensorDataset(torch.arange(48), x[:48], y[:48])
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)                        # DDP: this rank's share
    loader = DataLoader(dataset, batch_size=PER_RANK_BATCH, sampler=sampler,           # DDP: sampler, no shuffle
                        num_workers=1, persistent_workers=True,   # workers x ranks per machine <= its cores
                        pin_memory=use_cuda)                      # page-locked batches: faster copies to the GPU
    model = DDP(nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 1)).to(device))   # DDP: wrap
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    augment = torch.Generator().manual_seed(1000 + rank)                               # DDP: a seed per rank
    log = {"rank": rank, "backend": dist.get_backend(), "device": str(device), "global_batch": global_batch,
           "seen": [], "noise": [], "losses": []}
    for epoch in range(2):
        sampler.set_epoch(epoch)                                                       # DDP: reshuffle
        log["seen"].append([])
        for index, inputs, targets in loader:
            noise = 0.1 * torch.randn(inputs.shape, generator=augment)                 # "augmentation"
            log["seen"][-1] += index.tolist()
            log["noise"] += noise[:, 0].tolist()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model((inputs + noise).to(device)).squeeze(1), targets.to(device))
            loss.backward()                                         # DDP: gradients averaged over ranks here
            optimizer.step()
            log["losses"].append(loss.item())
    with torch.no_grad():                  # DDP: each validation sample once: every world-th one, from 48 + rank
        errors = (model.module(x[48 + rank::world].to(device)).squeeze(1) - y[48 + rank::world].to(device)) ** 2
    totals = torch.stack([errors.sum(), torch.tensor(float(len(errors)), device=device)])
    dist.all_reduce(totals)                                    # DDP: sum of squared errors and count, all ranks
    log["val_mse"], log["val_count"] = (totals[0] / totals[1]).item(), int(totals[1].item())
    before = bytes_written()
    if rank == 0:                                                                      # DDP: one writer
        torch.save(model.module.state_dict(), f"{log_dir}/model.pt")
    log["save_bytes"] = None if before is None else bytes_written() - before
    dist.barrier()                                                                     # DDP: wait for the file
    log["weights"] = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    with open(f"{log_dir}/rank{rank}.json", "w") as file:
        json.dump(log, file)
    dist.destroy_process_group()                                                       # DDP
    if os.environ.get("COURSE_CUDA_EVIDENCE"):  # only in the course's GPU test run: proof this worker used CUDA
        from course_utils.cuda_evidence import record
        record()


if __name__ == "__main__":    # not when a DataLoader worker started by spawn/forkserver re-imports this file
    main()

# %% [markdown]
# **Why `if __name__ == "__main__":`.** A DataLoader worker started with the `spawn` start method (the
# default on macOS and Windows) or `forkserver` (Python 3.14's default on Linux) does not inherit this
# process: it starts a new Python that first **re-runs this file**, under the name `__mp_main__`, to find
# what it needs. Without the guard, each worker would start training itself: `init_process_group` again with
# its parent's `RANK`, a new rendezvous, then more workers — a hang or a cryptic error. (`fork`, Linux's
# default up to Python 3.13, copies the process instead, so the missing guard goes unnoticed until the
# script runs elsewhere.) Running the file the way such a worker does shows that with the guard it only
# defines things:

# %%
before_import = dist.is_initialized()
as_worker_sees_it = runpy.run_path(str(runs / "train_ddp.py"), run_name="__mp_main__")   # what spawn does first
print(f"run as __mp_main__: defines main: {'main' in as_worker_sees_it}; a process group created: "
      f"{dist.is_initialized()}; files written: {sorted(p.name for p in runs.iterdir())}")
assert callable(as_worker_sees_it["main"]) and not dist.is_initialized() and not before_import
assert sorted(p.name for p in runs.iterdir()) == ["train_ddp.py"]          # nothing ran: no logs, no model.pt

# %% [markdown]
# ### Launching it
#
# In a terminal, from the `notebooks` folder: `cd artifacts/ch5 && torchrun --standalone --nproc-per-node=2
# train_ddp.py` (`--standalone`: one machine, torchrun picks a free port; the logs land in the current folder).
# From a notebook, the same command in a subprocess, with a timeout. `torchrun` is the console script of
# `python -m torch.distributed.run`; calling it through `sys.executable` uses this kernel's environment:

# %%
script = runs / "train_ddp.py"
(runs / "good").mkdir()
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(script.resolve())]
finished = subprocess.run(command, cwd=runs / "good", capture_output=True, text=True, timeout=300)
assert finished.returncode == 0, finished.stderr[-3000:]          # on failure: the end of what torchrun printed
good_logs = [json.loads((runs / "good" / f"rank{rank}.json").read_text()) for rank in range(nproc)]
for log in good_logs:
    print(f"rank {log['rank']}: backend {log['backend']}, device {log['device']}, {len(log['losses'])} steps, "
          f"batch loss {log['losses'][0]:.2f} at the first, {log['losses'][-1]:.2f} at the last")

# %% [markdown]
# That is enough while nothing goes wrong. When a worker hangs, `timeout=` kills `torchrun` but not its
# workers, which live on holding their port (and GPU); the output arrives only at the end; a failure leaves
# you digging the failing rank's traceback out of `stderr`; and restarting the Jupyter kernel mid-run kills the
# kernel, not `torchrun` (each worker even runs in a session of its own). `launch_torchrun` is this cell,
# hardened: it streams the output into the cell; on timeout it sends `torchrun`'s process group SIGTERM (torchrun
# then stops its workers), then SIGKILL; on Linux it starts `torchrun` with `prctl(PR_SET_PDEATHSIG, SIGTERM)`,
# so the kernel's death, however abrupt, stops the job too (a test SIGKILLs a launching process and checks
# that no worker survives); it raises `TorchrunFailed` quoting the failing rank's traceback (without torch's
# internal frames; for a rank killed by a signal, which prints none, torchrun's own summary that names it),
# with everything the job printed in the exception's `result.output`; it passes `$COURSE_LOG_DIR` to the
# workers and reads their `rank*.json` back. The rest of the chapter launches with it.

# %%
weights = [torch.tensor(log["weights"]) for log in good_logs]
print(f"largest difference between rank 0's and another rank's final weights: "
      f"{max((w - weights[0]).abs().max().item() for w in weights):.1e}")
assert len(good_logs) == nproc and all(torch.equal(w, weights[0]) for w in weights)   # bit-identical replicas
saved = torch.load(runs / "good" / "model.pt", weights_only=True)
assert torch.equal(torch.cat([t.flatten() for t in saved.values()]).cpu(), weights[0])  # rank 0 saved them

# %% [markdown]
# **The global batch.** Each step averages the gradients of `nproc` per-rank batches of 8, so one optimizer
# step consumes up to `8 × nproc` samples: each rank gets a share of the 48 samples (padded to equal shares
# when `nproc` does not divide 48) and takes fewer steps per epoch than one process's 6 (the logs above count
# both epochs: 2 × 3 = 6 for each of 2 ranks, against 12 for one process). With gradient accumulation
# (section 9) multiply by the number of micro-batches per step too. That product — per-rank batch × world size ×
# accumulation steps — is the batch size your learning rate sees, so the script logs it once, from rank 0,
# at start; a run's log then says what it trained with, whatever the number of devices. The logs confirm it:

# %%
printed = re.search(r"global batch (\d+) = 8 per rank x (\d+) ranks x 1 accumulation", finished.stdout)
shard = len(good_logs[0]["seen"][0])                      # samples per rank per epoch
steps_per_epoch = len(good_logs[0]["losses"]) // 2
seen = [i for log in good_logs for i in log["seen"][0]]
print(f"the script printed: {printed.group(0) if printed else None!r}")
print(f"{nproc} ranks: {shard} samples each, {steps_per_epoch} steps per epoch of up to {8 * nproc} samples "
      f"(one process: 6 steps of 8); {len(seen)} samples visited in epoch 0, {len(set(seen))} different")
assert printed and int(printed.group(1)) == 8 * nproc and int(printed.group(2)) == nproc
assert finished.stdout.count("global batch") == 1                       # once, from rank 0, not once per rank
assert (steps_per_epoch - 1) * int(printed.group(1)) < len(seen) <= steps_per_epoch * int(printed.group(1))
assert sorted(set(seen)) == list(range(48))                             # every sample, in some rank's share
assert {len(log["losses"]) for log in good_logs} == {2 * steps_per_epoch}   # every rank, the same number of steps
assert steps_per_epoch < 6

# %% [markdown]
# So going from 1 to N devices multiplies the batch of each optimizer step by N, with N times fewer steps.
# Either keep the global batch (per-device batch = global batch / N), or keep the per-device batch and
# retune the learning rate: Goyal et al., [*Accurate, Large Minibatch SGD: Training ImageNet in 1
# Hour*](https://arxiv.org/abs/1706.02677) (2017), scale SGD's learning rate linearly with the global batch
# (the "linear scaling rule") and ramp it up over the first epochs (warm-up), because the scaled rate
# diverges early in training. It is a starting point for SGD, not a law: for Adam the square-root rule is
# the common starting point, and either needs checking on your problem.

# %% [markdown]
# ### A parameter that gets no gradient
#
# During `backward()` DDP averages each parameter's gradient across the ranks as soon as it is ready, and
# before the next forward it checks that every parameter took part. A layer defined in `__init__` but
# not used in `forward` (an auxiliary head, a branch for another experiment) never gets a gradient, and the
# **second** step stops with the error below. The check runs inside each rank, so a process group of one
# process, created in this kernel, shows it:

# %%
class WithAnIdleHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head, self.aux_head = nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x):                         # aux_head is never used
        return self.head(self.body(x).relu())


def two_steps(ddp_model):
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        ddp_model(torch.randn(3, 4)).sum().backward()
        optimizer.step()


@contextmanager
def one_process_group():
    """A gloo process group of this kernel alone (world size 1), destroyed on the way out."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


with one_process_group(), expect_error(RuntimeError, match="Expected to have finished reduction in the prior"):
    two_steps(DistributedDataParallel(WithAnIdleHead()))

# %% [markdown]
# The message ends with the *indices* of the parameters that got no gradient, in `named_parameters()`
# order; their names:

# %%
print([name for i, (name, _) in enumerate(WithAnIdleHead().named_parameters()) if i in (4, 5)])
assert [name for name, _ in WithAnIdleHead().named_parameters()][4:6] == ["aux_head.weight", "aux_head.bias"]

# %% [markdown]
# (With `TORCH_DISTRIBUTED_DEBUG=DETAIL` in the environment before the process group starts, DDP prints the
# names itself.) The fix is to make every parameter DDP tracks take part: use or delete the idle layer, or
# freeze it (`requires_grad_(False)`; DDP ignores frozen parameters). `find_unused_parameters=True` is for
# models whose unused set changes from step to step (a branch taken only sometimes): it walks the autograd
# graph after every forward to find them, which costs time on every step.

# %%
with one_process_group():
    frozen = WithAnIdleHead()
    frozen.aux_head.requires_grad_(False)
    two_steps(DistributedDataParallel(frozen))
    searched = DistributedDataParallel(WithAnIdleHead(), find_unused_parameters=True)
    two_steps(searched)
print("frozen aux_head: 2 steps; find_unused_parameters=True: 2 steps, aux_head.weight.grad =",
      searched.module.aux_head.weight.grad)
assert searched.module.aux_head.weight.grad is None and searched.module.head.weight.grad is not None

# %% [markdown]
# ## 3. Pitfall: no `sampler.set_epoch(epoch)`
#
# `DistributedSampler` shuffles with a seed of `seed + epoch`, and the epoch is whatever `set_epoch` last
# set. We make three one-line changes to the script (this section and the next two) and run it once.

# %%
bad_script = runs / "train_ddp_bad.py"
print(script_variant(script, "sampler.set_epoch(epoch)", "", to=bad_script))
print(script_variant(bad_script, "# DDP: one writer", "    if True:  # every rank writes model.pt", to=bad_script))
print(script_variant(bad_script, "manual_seed(1000 + rank)",
                     "    augment = torch.Generator().manual_seed(1000)  # the same seed on every rank", to=bad_script))
bad = launch_torchrun(str(bad_script), nproc, log_dir=runs / "bad", timeout_s=300, echo=False)
print(bad)

# %%
for name, logs in (("without set_epoch", bad.logs), ("with set_epoch", good_logs)):
    epoch_0, epoch_1 = logs[0]["seen"]
    print(f"{name:17}: rank 0 saw samples {epoch_0[:8]}... in epoch 0, {epoch_1[:8]}... in epoch 1")
assert bad.logs[0]["seen"][0] == bad.logs[0]["seen"][1]      # every epoch, the same batches in the same order
assert good_logs[0]["seen"][0] != good_logs[0]["seen"][1]
shared = set(good_logs[0]["seen"][1]) & set(good_logs[1]["seen"][1])
print(f"with set_epoch, samples both rank 0 and rank 1 visited in epoch 1: {sorted(shared)}")
assert len(shared) <= -48 % nproc              # disjoint shares (but for the padding when nproc does not divide 48)

# %% [markdown]
# Without `set_epoch`, every epoch repeats epoch 0: the same samples grouped in the same batches, in the same
# order — the shuffle you asked for happens once. With `set_epoch` every rank still gets a disjoint share
# (all ranks shuffle with the same seed + epoch, then each takes every `nproc`-th index) but a new order each
# epoch.

# %% [markdown]
# ## 4. Pitfall: every rank saves the checkpoint
#
# All ranks hold the same weights, so all ranks writing `model.pt` is N times the writing for the same
# bytes — on a shared network file system, N nodes × 8 GPUs writing the same multi-GB file at once, to the
# same path. The kernel's count of bytes each process wrote during the save shows the cost. (The `barrier()`
# after rank 0's save is the other half: a rank that reads the file must not get there before it is written;
# exercise 2's check catches a barrier in the wrong place.)

# %%
file_size = (runs / "good" / "model.pt").stat().st_size
if good_logs[0]["save_bytes"] is None:
    print("This system does not report bytes written per process (/proc/self/io is Linux-only): "
          f"the file is {file_size} bytes, written once by rank 0 in the good run, {nproc} times in the bad one.")
else:
    for name, logs in (("every rank saves", bad.logs), ("rank 0 saves", good_logs)):
        print(f"{name:16}: bytes written during the save, per rank: {[log['save_bytes'] for log in logs]}"
              f" (the file is {file_size} bytes)")
    assert all(log["save_bytes"] >= file_size for log in bad.logs)                  # N full writes
    assert good_logs[0]["save_bytes"] >= file_size
    assert all(log["save_bytes"] < file_size // 10 for log in good_logs[1:])         # the others wrote nothing

# %% [markdown]
# ## 5. Pitfall: the same seed on every rank
#
# The augmentation generator seeded with `1000` instead of `1000 + rank` draws the **same "random" noise on
# every rank**: N devices, one augmentation stream. (The model does not need a seed per rank, or even the same
# seed: DDP's constructor broadcasts rank 0's weights to all. The dataset, however, must be the same on every
# rank, because the sampler only hands out indices into it — hence `torch.manual_seed(0)` before building it.)

# %%
for name, logs in (("seed 1000", bad.logs), ("seed 1000 + rank", good_logs)):
    print(f"{name:16}: first noise values per rank:",
          {log["rank"]: [round(v, 3) for v in log["noise"][:3]] for log in logs})
assert all(log["noise"] == bad.logs[0]["noise"] for log in bad.logs)           # identical on every rank
assert all(log["noise"] != good_logs[0]["noise"] for log in good_logs[1:])

# %% [markdown]
# ## 6. Pitfall: evaluating with `DistributedSampler`
#
# `DistributedSampler` gives every rank the same number of samples, so that every rank runs the same number of
# steps (and of collectives). When the world size does not divide the dataset, it **pads by repeating
# samples**. For training that hardly matters; for evaluation it means some samples are counted twice. The
# script's 21 validation samples on 2 ranks, through the sampler:

# %%
padded = [list(DistributedSampler(range(21), num_replicas=2, rank=rank, shuffle=False)) for rank in range(2)]
counted = Counter(i for shard in padded for i in shard)
print(f"2 ranks evaluate {sum(counted.values())} samples for 21; counted twice: "
      f"{[i for i, c in counted.items() if c > 1]}")
assert sum(counted.values()) == 22 and counted[0] == 2

# %% [markdown]
# The mean over those 22 is not the validation loss, and it changes with the number of devices. The script
# instead gives rank `r` every `world`-th sample from `r` (shards may differ by one; never a repeat) and
# all-reduces the **sum** of squared errors and the **count** before dividing — averaging the ranks' means
# would be wrong too, when the shards differ in length. Checked against the same loss on one process, with the
# saved model:

# %%
torch.manual_seed(0)                                     # the script's data, rebuilt here
x = torch.randn(48 + 21, 4)
y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.3
trained = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 1))
trained.load_state_dict(torch.load(runs / "good" / "model.pt", weights_only=True, map_location="cpu"))
with torch.no_grad():
    errors = (trained(x[48:]).squeeze(1) - y[48:]) ** 2     # one per validation sample
padded_mse = errors[[i for shard in padded for i in shard]].mean().item()
print(f"validation MSE on one process: {errors.mean():.4f}; all-reduced by the script: "
      f"{good_logs[0]['val_mse']:.4f} over {good_logs[0]['val_count']} samples; padded sampler: {padded_mse:.4f}")
assert all(log["val_count"] == 21 for log in good_logs)
torch.testing.assert_close(torch.tensor(good_logs[0]["val_mse"]), errors.mean(), rtol=1e-4, atol=1e-6)
assert abs(padded_mse - errors.mean().item()) > 1e-4

# %% [markdown]
# ## 7. A hang: one rank skips a collective
#
# Every collective — the gradient all-reduce in `backward()`, `barrier()`, `all_reduce` — waits for **every**
# rank. If one rank skips one, the others wait: by default for 10 minutes with `nccl`, 30 with `gloo`, while
# the job looks alive and burns its allocation. A common way to get there is uneven inputs: below, rank 0 has
# 3 batches and rank 1 has 5, so rank 0 leaves its loop while rank 1 waits in its fourth `backward()` for a
# gradient all-reduce that rank 0 will never join. Two lines of the script turn that hang into a diagnosis:
#
# - `timeout=` in `init_process_group`: every collective now fails after 3 s instead of 30 minutes;
# - `dist.monitored_barrier(timeout=...)` where a rank is done: rank 0 waits there for each other rank in
#   turn and, when one does not arrive (or dies on the way), raises an error that **names it**.
#
# (The scripts of sections 7–8 use `gloo` on every machine, GPUs or not: `monitored_barrier` needs it, and
# the hang is the same with `nccl`.)

# %%
# %%writefile artifacts/ch5/uneven.py
"""Rank 0 has 3 batches, rank 1 has 5: rank 1's all-reduce in step 4 has no partner (it never gets to 5)."""
import datetime
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))   # fail after 3 s, not after 30 min
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [torch.randn(8, 4) for _ in range(3 if rank == 0 else 5)]
for x in batches:
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()           # all-reduce: waits for every rank's gradients of this step
    optimizer.step()
dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))     # rank 0 names any rank that does not come
dist.destroy_process_group()

# %%
hung = launch_torchrun(str(runs / "uneven.py"), 2, log_dir=runs / "hang", timeout_s=120, echo=False, check=False,
                      torchrun_args=("--standalone", "--monitor-interval=1"))   # (why: below)
last_error = {}                              # each rank's error: the last line of its traceback
for line in hung.output.splitlines():
    if line.startswith("[rank") and "Error: " in line:
        prefix, message = line.split(": ", 1)                  # "[rank1]", "RuntimeError: ..."
        last_error[prefix] = re.sub(r"\[/\S+:\d+\] ", "", message)   # without the C++ source location
for prefix, message in sorted(last_error.items()):
    print(f"{prefix}: {message}")
print(f"exit code {hung.returncode} after {hung.seconds:.0f} s (startup included), not after 30 minutes")
assert hung.returncode != 0 and "Timed out waiting 3000ms" in last_error["[rank1]"]
assert "Rank 1 failed to pass monitoredBarrier" in last_error["[rank0]"]

# %% [markdown]
# Rank 1's error is what the timeout alone gives you: *its* all-reduce timed out — not which rank it was
# waiting for. (It times out because rank 0 is still alive, waiting in `monitored_barrier`; had rank 0 simply
# exited, rank 1 would get `Connection closed by peer` instead, the other symptom in the table at the end.)
# Rank 0's error names the culprit: rank 1 never reached the `monitored_barrier`. Rank 0 reports it as soon as
# rank 1 dies; the `10000 ms` in its message is the limit it was given, not the time it waited. (That same
# moment torchrun sees rank 1 gone and stops rank 0; `--monitor-interval=1` makes torchrun look once a second
# instead of ten times, so rank 0 has the time to print its error first.) Put
# `monitored_barrier` just before the collective you suspect; it is slow (rank 0 checks in with every rank one
# by one), so it is a debugging tool, not something to leave in every step. `launch_torchrun` with its default
# `check=True` raises `TorchrunFailed` quoting the traceback of the rank that failed first — usually rank 1's
# here.

# %% [markdown]
# On a real cluster, two more tools: `TORCH_DISTRIBUTED_DEBUG=DETAIL` in the environment makes every
# collective check that all ranks call the same one with the same shapes (and report the mismatch), and
# `py-spy dump --pid PID` on a hung worker prints its Python stack — the line each rank is stuck on.
# `monitored_barrier` is gloo-only; with `nccl`, create a gloo side group once, on every rank, after
# `init_process_group`, and pass it in (`wait_all_ranks=True` lists every missing rank, not only the first):
#
# ```python
# gloo_group = dist.new_group(backend="gloo")
# ...
# dist.monitored_barrier(group=gloo_group, timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
# ```
#
# ### What the same hang says with `nccl`
#
# On GPUs the timeout is enforced by ProcessGroupNCCL's **watchdog**, a thread in each rank that checks every
# pending collective; when one has run longer than `timeout=`, it logs the line below, then takes the process
# down (`TORCH_NCCL_ASYNC_ERROR_HANDLING`, on by default). The line names the rank, the
# collective's sequence number, its type and size, and how long it waited — the sequence number is what you
# compare across ranks (`TORCH_NCCL_TRACE_BUFFER_SIZE` plus `TORCH_NCCL_DUMP_ON_TIMEOUT=1` record which
# collectives each rank reached). On 2+ GPUs the cell below produces it for real (rank 1 skips an all-reduce,
# 5 s timeout); elsewhere it shows the line as torch's source writes it, **not produced on this machine**.

# %%
# %%writefile artifacts/ch5/nccl_timeout.py
"""Run on 2+ GPUs only: rank 1 skips an all-reduce; rank 0's NCCL watchdog fires after 5 s."""
import datetime, os, time
import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=5), device_id=torch.device("cuda", local_rank))
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)                       # both ranks: fine
if dist.get_rank() == 0:
    dist.all_reduce(x)                   # rank 1 never joins this one
    torch.cuda.synchronize()
else:
    time.sleep(30)                       # alive, busy elsewhere: rank 0 waits for it

# %%
watchdog_line = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=ALLREDUCE.*"
                           r"ran for \d+ milliseconds before timing out")
if gpus >= 2:
    nccl_hang = launch_torchrun(str(runs / "nccl_timeout.py"), 2, timeout_s=120, echo=False, check=False)
    message = watchdog_line.search(nccl_hang.output)
    print(f"exit code {nccl_hang.returncode}; rank 0 logged:\n  {message.group(0) if message else None}")
    assert nccl_hang.returncode != 0 and message
else:
    # Not produced here (no 2 GPUs): the line as ProcessGroupNCCL writes it — WorkNCCL::checkTimeout and
    # operator<<(WorkNCCL) in torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (pytorch/pytorch, read at commit
    # 0007e752; the same pieces are in torch 2.14.1+cu130's libtorch_cuda.so, and the check below looks for
    # them in this machine's torch when it is a CUDA build):
    # "[Rank R] Watchdog caught collective operation timeout: " + the
    # work as "WorkNCCL(SeqNum=..., OpType=..., NumelIn=..., NumelOut=..., Timeout(ms)=...)" + " ran for T
    # milliseconds before timing out." The numbers are illustrative: the 9th collective, a 1025-element
    # all-reduce, under the default 10-minute timeout. The log prefix "[rank0]:[E...] ProcessGroupNCCL.cpp:N"
    # varies with the version.
    message = watchdog_line.search(
        "[rank0]:[E1204 17:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1025, NumelOut=1025, Timeout(ms)=600000) ran for "
        "600031 milliseconds before timing out.")
    print(f"{gpus} GPU(s): no NCCL hang can run here. What rank 0 of a 2-GPU job logs (quoted from torch's "
          f"source, NOT produced on this machine):\n  [Rank 0] {message.group(0)}.")
    pieces = (b"Watchdog caught collective operation timeout: ", b"WorkNCCL(", b"SeqNum=", b", OpType=",
              b", Timeout(ms)=", b" milliseconds before timing out.")
    nccl_library = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"     # only in CUDA builds of torch
    if nccl_library.exists():
        with open(nccl_library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as library:
            missing = [piece for piece in pieces if library.find(piece) < 0]
        print(f"this torch's {nccl_library.name} holds every piece of that message: {not missing}")
        assert not missing, missing
    else:
        print(f"this torch ({torch.__version__}) is a CPU build, without NCCL: the source is the only reference here")
print(f"explain() on it: {explain(message.group(0)).id}")
assert explain(message.group(0)).id == "distributed-timeout"

# %% [markdown]
# ## 8. Uneven inputs, fixed with `Join`
#
# Padding every rank to the same number of batches (what `DistributedSampler` does) avoids the hang, but
# not every data source can be padded (streams, filtered data, variable-length batching). The `Join` context
# manager lets a rank that runs out of batches keep answering the others' all-reduces (with zero
# gradients) until everyone is done. The script of section 7 with its loop inside `Join` (and no
# `monitored_barrier`), counting the steps each rank really took:

# %%
# %%writefile artifacts/ch5/uneven_join.py
"""uneven.py with the loop inside Join (marked `# Join`), logging the steps each rank took."""
import datetime, json, os
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join                          # Join
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))   # no 3 s limit on a busy machine
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [torch.randn(8, 4) for _ in range(3 if rank == 0 else 5)]
steps = 0
with Join([model]):                    # Join: a rank out of batches answers the others' all-reduces
    for x in batches:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        steps += 1
dist.barrier()
weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
with open(f"{os.environ.get('COURSE_LOG_DIR', '.')}/rank{rank}.json", "w") as file:
    json.dump({"rank": rank, "steps": steps, "weights": weights}, file)
dist.destroy_process_group()

# %%
fixed = launch_torchrun(str(runs / "uneven_join.py"), 2, log_dir=runs / "join", timeout_s=120, echo=False)
print(fixed, {log["rank"]: f"{log['steps']} steps" for log in fixed.logs})
assert [log["steps"] for log in fixed.logs] == [3, 5]             # no timeout: rank 1 ran its last 2 steps
assert fixed.logs[0]["weights"] == fixed.logs[1]["weights"]      # Join's exit syncs the replicas

# %% [markdown]
# One detail: in rank 1's last two steps, the all-reduce still divides by the **initial** world size, 2, while
# rank 0 contributes zeros, so rank 1's gradients count half. `model.join(divide_by_initial_world_size=False)`
# (or `Join([model], divide_by_initial_world_size=False)`) divides by the ranks still training instead; which
# is right depends on whether you want every sample or every step to weigh the same. Rank 0 never calls
# `optimizer.step()` for steps 4 and 5: the replicas agree at the end because, when `Join` exits, DDP copies the
# weights of the last rank to finish to every rank (optimizer state, such as Adam's moments, is not copied).
# And `Join` only stands in for DDP's own all-reduces: any other collective in the loop — a
# `dist.all_reduce(loss)` for logging, say — still hangs.

# %% [markdown]
# ## 9. Gradient accumulation under DDP: `no_sync()`
#
# Accumulating 4 micro-batches before a step (chapter 2) under DDP all-reduces the gradients after **each**
# backward — 3 of those 4 all-reduces are wasted traffic. `with model.no_sync():` skips the all-reduce for
# the backwards inside it; the gradients keep accumulating locally and the next backward outside it
# all-reduces the total. A process group of one process is enough to count them (a DDP *communication hook*
# sees every all-reduce), so this runs right here, in the notebook's process:

# %%
allreduces = []


def counting_allreduce(state, bucket):    # a DDP communication hook: count the call, then all-reduce as usual
    allreduces.append(bucket.index())
    return allreduce_hook(state, bucket)


with tempfile.TemporaryDirectory() as folder:   # this process becomes rank 0 of a world of 1
    dist.init_process_group("gloo", store=dist.FileStore(f"{folder}/store", 1), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(nn.Linear(4, 1))
        ddp.register_comm_hook(None, counting_allreduce)
        micro_batches = [torch.randn(8, 4) for _ in range(4)]
        for x in micro_batches:
            ddp(x).sum().backward()
        without = len(allreduces)
        for i, x in enumerate(micro_batches):
            if i < len(micro_batches) - 1:
                with ddp.no_sync():
                    ddp(x).sum().backward()
            else:
                ddp(x).sum().backward()
        with_no_sync = len(allreduces) - without
    finally:
        dist.destroy_process_group()
print(f"4 micro-batches: {without} all-reduces without no_sync(), {with_no_sync} with it")
assert without == 4 and with_no_sync == 1

# %% [markdown]
# The same, hardened, is in `course_utils`: `single_process_group()` (the group above, destroyed on every
# exit path) and `count_allreduces(ddp)` (the counting hook, which waits for its all-reduce and returns a
# completed future, so that no gloo thread is left running a Python callback when the group is destroyed:
# with `allreduce_hook`, that once deadlocked this course's CI); exercise 3's check uses them.

# %% [markdown]
# ## 10. Several machines, on one machine
#
# Two nodes are two `torchrun` commands that meet at a **rendezvous**: the same `--rdzv-endpoint` (host:port
# of node 0, reachable from every node), the same `--rdzv-id`, `--nnodes=2`. Here both "nodes" run on this
# machine at `127.0.0.1`, each with one process, and train nothing — they only meet and all-reduce their
# ranks (the rendezvous is the same whatever the backend):

# %%
# %%writefile artifacts/ch5/meet.py
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on node {os.environ['GROUP_RANK']}: "
      f"sum of ranks {total.item():.0f}", flush=True)
dist.destroy_process_group()


# %%
def node(node_rank, port, join_timeout_s=60):
    """One node of a 2-node job: torchrun --nnodes=2 --node-rank=R --rdzv-backend=c10d ..."""
    return launch_torchrun(str(runs / "meet.py"), 1, timeout_s=120, echo=False, check=False, torchrun_args=(
        "--nnodes=2", f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=ch5", f"--rdzv-conf=join_timeout={join_timeout_s}", "--max-restarts=0"))


port, lonely_port = free_ports(2)                      # two different free ports (the second is for below)
with ThreadPoolExecutor(2) as pool:                    # two terminals, one per node
    nodes = list(pool.map(node, [0, 1], [port, port]))
for i, n in enumerate(nodes):
    print(f"-- the command given --node-rank={i}:")
    print("\n".join(line for line in n.output.splitlines() if line.startswith("rank") or "node_rank" in line))
assert [n.returncode for n in nodes] == [0, 0]
assert all("of 2" in n.output and "sum of ranks 1" in n.output for n in nodes)

# %% [markdown]
# With `--rdzv-backend=c10d`, the node whose address is the endpoint hosts the rendezvous store on that
# port (here both nodes have that address, so whichever binds the port first hosts it); `--node-rank` is
# ignored (torchrun says so): the rendezvous numbers the nodes itself, so the command given `--node-rank=0`
# may well come out as node 1. On two real machines, with 8 GPUs each and node 0 at 10.0.0.1, run the same
# command on both:
#
# ```bash
# torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29500 \
#          --rdzv-id=job42 train_ddp.py
# ```
#
# (`--max-restarts=0`, used above, makes torchrun fail instead of restarting a failed job;
# `--rdzv-conf=join_timeout=S` sets how long it waits for the other nodes.) Also check:
#
# - The port must be open between the nodes (a firewall between them looks exactly like a missing node,
#   below), and the backend then opens more ports between all nodes.
# - Nodes with several network interfaces: tell the backend which to use, `GLOO_SOCKET_IFNAME=eth0` or
#   `NCCL_SOCKET_IFNAME=eth0` (`NCCL_DEBUG=INFO` prints what NCCL picked).
#
# **A missing node, or a wrong endpoint.** Node 0 is started at `lonely_port` and node 1 never comes. Node 0
# waits for it until `join_timeout` (default 600 s; 2 s here) and fails. This is all node 0 ever sees when node
# 1 was not started, was given another `--rdzv-endpoint`, or cannot reach the port through a firewall (node 1
# itself would then fail to connect, or wait at its own wrong endpoint). The error carries no message: its
# name, at the end of torchrun's traceback, after the join timeout, is the whole symptom.

# %%
lost = node(0, lonely_port, join_timeout_s=2)
print(f"exit code {lost.returncode} after {lost.seconds:.0f} s; last line: {lost.output.strip().splitlines()[-1]}")
assert lost.returncode != 0 and lost.output.strip().endswith("RendezvousTimeoutError")
assert lost.seconds >= 2                                 # it waited out its join_timeout

# %% [markdown]
# On a machine with exactly one GPU, the jobs above ran on the CPU (two ranks cannot share one GPU with
# `nccl`). This cell shows the single-GPU `nccl` path runs too: section 2's script as a job of one process.

# %%
if gpus == 1:
    solo = launch_torchrun(str(script), 1, log_dir=runs / "gpu", timeout_s=300)
    print(solo, f"backend {solo.logs[0]['backend']}, device {solo.logs[0]['device']}")
    assert solo.logs[0]["backend"] == "nccl" and solo.logs[0]["device"].startswith("cuda")
    assert solo.logs[0]["val_count"] == 21
else:
    print(f"{gpus} GPU(s): the training script in section 2 already used "
          f"{'nccl on every GPU' if gpus >= 2 else 'gloo on the CPU'}")

# %% [markdown]
# ## 11. A worker dies: torchrun restarts the job, which resumes from its checkpoint
#
# On a long job a worker will die — the kernel's OOM killer, a GPU falling off the bus, a preempted node.
# `torchrun --max-restarts=N` then stops the surviving workers and starts the **whole group again**, up to N
# times; `TORCHELASTIC_RESTART_COUNT` tells each new worker which attempt it is. A restart only helps if the
# script resumes: it must load its last checkpoint (model, optimizer, step) and produce the same batches for
# a given step. The script below does that, with gradient accumulation (2 micro-batches per step, `no_sync()`
# on the first) and its global batch logged. Rank 1 kills itself with SIGKILL — nothing to catch, as with the
# OOM killer — after 5 completed steps of the first attempt, so the last checkpoint is the one written after
# 4 steps, and the fifth step (`step == 4`, counting from 0) is done again after the restart.

# %%
# %%writefile artifacts/ch5/resume_ddp.py
"""Checkpoint every 2 steps; when torchrun restarts the group, resume from the last checkpoint."""
import contextlib, datetime, json, os, signal
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

PER_RANK_BATCH, ACCUMULATION, STEPS, SAVE_EVERY, DIES_AT = 4, 2, 8, 2, 5


def batch(step, rank, micro):     # the data of a step is a function of the step: a resumed run sees the same
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    x = torch.randn(PER_RANK_BATCH, 4, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.3


def main():
    log_dir = os.environ.get("COURSE_LOG_DIR", ".")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])           # 0, then 1 after torchrun's restart
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"attempt {attempt}: global batch {PER_RANK_BATCH * world * ACCUMULATION} = {PER_RANK_BATCH} per rank"
              f" x {world} ranks x {ACCUMULATION} accumulation steps", flush=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)    # momentum: state to restore
    step, checkpoint = 0, f"{log_dir}/checkpoint.pt"
    if os.path.exists(checkpoint):                                            # resume
        state = torch.load(checkpoint, weights_only=True, map_location="cpu")   # on GPUs: each rank's own device
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank}: resumed from the checkpoint of step {step}", flush=True)
    resumed_from = step
    while step < STEPS:
        if attempt == 0 and rank == 1 and step == DIES_AT:
            open(f"{log_dir}/killed_at_step_{step}", "w").close()             # (for the notebook's assert)
            os.kill(os.getpid(), signal.SIGKILL)                              # a worker dies, no cleanup
        optimizer.zero_grad()
        for micro in range(ACCUMULATION):
            x, y = batch(step, rank, micro)
            with model.no_sync() if micro < ACCUMULATION - 1 else contextlib.nullcontext():
                (nn.functional.mse_loss(model(x).squeeze(1), y) / ACCUMULATION).backward()
        optimizer.step()
        step += 1
        if step % SAVE_EVERY == 0:
            if rank == 0:                                                     # one writer, written atomically
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           f"{checkpoint}.tmp")
                os.replace(f"{checkpoint}.tmp", checkpoint)
            dist.barrier()
    with open(f"{log_dir}/rank{rank}.json", "w") as file:
        json.dump({"rank": rank, "attempt": attempt, "resumed_from": resumed_from, "final_step": step,
                   "weights": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()}, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

# %%
resumed = launch_torchrun(str(runs / "resume_ddp.py"), 2, log_dir=runs / "resume", timeout_s=180, echo=False,
                          torchrun_args=("--standalone", "--max-restarts=1"),
                          env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})   # a fresh store per attempt: see below
for line in resumed.output.splitlines():          # the ranks' lines, and torchrun's report of a failed worker
    if line.startswith(("attempt", "rank")) or "exitcode" in line:
        print(re.sub(r"^\S+ \S+ \d+ \S+\] (.*) of binary: .*", r"torchrun: \1", line))
print(resumed, {log["rank"]: (log["attempt"], log["resumed_from"], log["final_step"]) for log in resumed.logs})
assert (runs / "resume" / "killed_at_step_5").exists()               # rank 1 killed itself after 5 steps...
assert [log["attempt"] for log in resumed.logs] == [1, 1]            # ...and the logs come from the restarted group
assert [log["resumed_from"] for log in resumed.logs] == [4, 4]       # the checkpoint after 4 steps; the 5th redone
assert [log["final_step"] for log in resumed.logs] == [8, 8]
assert "global batch 16 = 4 per rank x 2 ranks x 2 accumulation steps" in resumed.output

# %% [markdown]
# Did the restart lose or repeat anything? DDP with equal shards averages the ranks' gradients, and the
# accumulation divides by 2, so each step is one SGD step on the mean loss over its 16 samples. The same 8
# steps in this process, without any failure, must give the same weights, up to float rounding (two ranks add
# their gradients in another order than one process does):

# %%
resume_script = runpy.run_path(str(runs / "resume_ddp.py"))           # its batch() and constants, not main()
torch.manual_seed(0)
uninterrupted = nn.Linear(4, 1)
sgd = torch.optim.SGD(uninterrupted.parameters(), lr=0.05, momentum=0.9)
for step in range(resume_script["STEPS"]):
    xs, ys = zip(*(resume_script["batch"](step, rank, micro) for rank in range(2) for micro in range(2)))
    sgd.zero_grad()
    nn.functional.mse_loss(uninterrupted(torch.cat(xs)).squeeze(1), torch.cat(ys)).backward()
    sgd.step()
expected = torch.cat([p.detach().flatten() for p in uninterrupted.parameters()])
print(f"largest difference, resumed job vs uninterrupted: "
      f"{(torch.tensor(resumed.logs[0]['weights']) - expected).abs().max():.1e}")
torch.testing.assert_close(torch.tensor(resumed.logs[0]["weights"]), expected)
assert resumed.logs[0]["weights"] == resumed.logs[1]["weights"]

# %% [markdown]
# Three things made that work, and each is a classic way for it not to: the checkpoint holds the optimizer
# (SGD's momentum here) and the step, not only the weights; the data of a step depends on the step only, so
# the redone fifth step sees the same batches (with a `DataLoader`, that means `sampler.set_epoch(epoch)` and
# skipping the batches already done — or `torchdata`'s `StatefulDataLoader`, whose `state_dict()` holds the
# position inside the epoch); and rank 0 writes the checkpoint to a temporary file and renames it, so a death
# *during* a save leaves the previous checkpoint intact. One more, from torch itself: by default the restarted
# workers share torchrun's rendezvous store with the dead ones, and a restarted `gloo` group sometimes read a
# dead worker's address from it and failed with `Gloo connectFullMesh failed ... Connection refused` (1 run in
# 3 here; the same bug with NCCL is [pytorch/pytorch#135712](https://github.com/pytorch/pytorch/issues/135712)).
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` in torchrun's environment gives each attempt a store of its own (the
# workers' `MASTER_PORT` changes from one attempt to the next). Without `--max-restarts` (default 0) the first death
# ends the job; with several nodes, torchrun's rendezvous also lets a restarted group change its size
# (`--nnodes=MIN:MAX`), which is why the script reads the world size rather than assuming it.

# %% [markdown]
# ## 12. Exercises
#
# Three exercises are **real code with planted bugs** (the text says how many); the last is yours to write.
# Fix the code in the cell and run it: the check runs your function on its own small data and prints a
# verdict that says what it *observed*. Each further failed attempt adds one hint, mildest first; none of
# them is the solution. `progress(chapter=5)` at the end shows what you have solved. The checks run in this
# process (no launch), so they take a moment, not a `torchrun`.
#
# **Exercise 1 — the shard of each epoch (there are 2 bugs).** `epoch_shards` should return the sample
# indices rank `rank` of `world_size` visits in each of `epochs` epochs, shuffled with `DistributedSampler`
# and seed 0, as the training script's loader does.

# %%
@exercise
def epoch_shards(n_samples, rank, world_size, epochs):
    sampler = DistributedSampler(list(range(n_samples)), num_replicas=world_size, rank=0, shuffle=True, seed=0)
    orders = []
    for epoch in range(epochs):
        orders.append(list(sampler))
    return orders


check_epoch_shards(epoch_shards)

# %% [markdown]
# **Exercise 2 — saving once (there are 2 bugs).** Every rank calls `save_checkpoint_once` with its own
# `rank`, all at the same time; `barrier()` is a real barrier (it waits for every rank). Afterwards the file
# must hold the model's whole `state_dict`, have been written once, and no rank may leave its last `barrier()`
# before the file is complete. The check runs it on 2 and on 3 ranks.

# %%
@exercise
def save_checkpoint_once(model, path, rank, barrier):
    barrier()
    torch.save(model.state_dict(), path)


check_save_checkpoint_once(save_checkpoint_once)

# %% [markdown]
# **Exercise 3 — accumulation under DDP (there are 2 bugs).** `accumulate_no_sync` should make one optimizer
# step from equal-sized micro-batches, each through its own forward, with a single all-reduce that carries
# the gradient of the whole batch. `loss_fn` returns the **mean** loss over the samples it is given (the
# check passes `nn.MSELoss()`), so the step must match one step on the mean loss over all the micro-batches
# together — whatever their number (the check uses 3 and 5, not section 9's 4).

# %%
@exercise
def accumulate_no_sync(ddp_model, micro_batches, loss_fn, optimizer):
    optimizer.zero_grad()
    with ddp_model.no_sync():
        for inputs, targets in micro_batches:
            loss = loss_fn(ddp_model(inputs), targets)
            loss.backward()
    optimizer.step()


check_accumulate_no_sync(accumulate_no_sync)

# %% [markdown]
# **Exercise 4 — contiguous evaluation shards (write it).** Section 6's shards take every `world_size`-th
# sample. Here the validation set is stored in order in files (or is one long text whose metric needs
# neighbouring samples together), so each rank must evaluate **one contiguous block** of indices. Return rank
# `rank`'s block, as a list (or `range`) of sample indices, so that, over all ranks, each of the `n_samples` samples is evaluated exactly once and no rank
# gets more than one sample more than another (the ranks wait for the slowest). The check tries world sizes
# and dataset sizes the chapter did not use, including fewer samples than ranks.

# %%
@exercise
def eval_shard(n_samples, rank, world_size):
    ...  # your code here


check_eval_shard(eval_shard)

# %% [markdown]
# ## What to remember
# - DDP is one process per device, started by `torchrun`; the script: `init_process_group`,
#   `DistributedSampler` (and `sampler.set_epoch(epoch)` every epoch), `DDP(model)`, save on rank 0 then
#   `dist.barrier()`, `destroy_process_group()` — all inside `main()` behind `if __name__ == "__main__":`, so
#   DataLoader workers started with spawn/forkserver, which re-run the file, do not start training too.
# - DataLoader workers per rank × ranks per machine must fit the machine's cores; `pin_memory=True` only with
#   a GPU to copy to.
# - `nn.DataParallel` re-creates its replicas each step: state written in `forward` (`self.calls += 1`) is lost
#   on 2+ GPUs. DDP has no such replicas.
# - Seed what must differ per rank (augmentation) with `base + rank`; build the dataset identically on every
#   rank. The model's initial weights come from rank 0 (DDP broadcasts them).
# - One optimizer step consumes per-rank batch × world size × accumulation steps samples: log that global
#   batch once, at start; keep it, or retune the learning rate (linear scaling with warm-up for SGD).
# - Every rank must call every collective. A short `timeout=` turns a hang into an error (with `nccl`, the
#   watchdog's `Watchdog caught collective operation timeout: WorkNCCL(SeqNum=...)`); `monitored_barrier` names
#   the missing rank; uneven inputs need padding or `Join` (which divides by the initial world size unless
#   told otherwise).
# - Accumulate with `no_sync()` on all micro-batches but the last.
# - Evaluate each sample once (unpadded shards: strided or contiguous, balanced within one) and all-reduce
#   sums and counts before dividing.
# - `torchrun --max-restarts=N` restarts the whole group after a worker dies; it only helps a script that
#   resumes: a checkpoint with model, optimizer and step (written atomically, by rank 0), and data that is a
#   function of the step. With gloo, give each attempt its own store (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`).
# - `launch_torchrun` kills every process on timeout, and on Linux its torchrun dies with the kernel that
#   launched it (a kernel restart leaves no workers behind).
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | every epoch sees the same batches in the same order | `set_epoch` missing | 3 |
# | checkpoint written N times | every rank saves | 4 |
# | `RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one` | a parameter that gets no gradient (a layer not used in `forward`): use, delete or freeze it | 2 ("A parameter that gets no gradient") |
# | a rank loads a missing or stale checkpoint | the other ranks went on before rank 0's save was complete | 4 |
# | augmentation identical on every device | the same seed on every rank | 5 |
# | validation metric depends on the number of devices | `DistributedSampler` padding in evaluation | 6 |
# | job idle, then `Timed out waiting ...ms` or `Connection closed by peer` (or a hang with no timeout) | a rank skipped a collective: uneven batches, a collective inside `if rank == 0:` | 7 |
# | `Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..., OpType=ALLREDUCE, ...) ran for ... milliseconds` | the same, with `nccl`: compare the `SeqNum` each rank reached | 7 (nccl) |
# | `Rank N failed to pass monitoredBarrier` | rank N never reached that point: look at what it did instead | 7 |
# | `ChildFailedError` from torchrun | one rank raised: read its traceback (the first failure) | 7 |
# | a counter or attribute set in `forward` stays at 0 under `DataParallel` | the replicas got the update, not your module | 1 |
# | each DataLoader worker starts training, or `init_process_group` runs again in a worker | no `if __name__ == "__main__":` guard, with spawn/forkserver workers | 2 |
# | loss jumps when the number of GPUs changes | the global batch changed (per-rank × world × accumulation): log it, retune the learning rate | 2 |
# | after a restart: `Gloo connectFullMesh failed ... Connection refused` | the restarted group read the dead group's addresses from the shared store | 11 |
# | after a restart the job starts again from step 0, or the loss jumps | no resume: load model, optimizer and step from the last checkpoint | 11 |
# | `RendezvousTimeoutError` | a node did not arrive: wrong `--rdzv-endpoint`, port blocked, node not started | 10 |
# | `address already in use` | another job holds the port: use `--standalone` or another `--rdzv-endpoint` port | 10 |
# | workers still running after a kernel restart | a launcher that does not tie its children's life to its own (`launch_torchrun` does, on Linux) | 2 |

# %%
print(progress(chapter=5))
