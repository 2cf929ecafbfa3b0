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
# **You will be able to:** turn chapter 2's training loop into a DDP script (about 40 lines) and launch it
# with `torchrun` from a cell; see on the data itself what a forgotten `set_epoch`, every rank saving and the
# same seed on every rank do; make a hang fail in seconds and name the rank that never arrived; train on
# uneven inputs with `Join`; count the all-reduces `no_sync()` saves; and form a two-node job on one machine,
# including what a wrong endpoint looks like. **You write the PyTorch; `course_utils` holds the hardened
# versions** (a launcher that streams output, times out and kills every worker; the chapter's checks).
#
# **Hardware and time.** On a CPU laptop (and in CI) each job runs **2 processes with the `gloo` backend**;
# on a machine with several GPUs the training script of sections 2–5 runs one process per GPU with `nccl`.
# Each `torchrun` launch starts fresh Python processes that import torch, and the launches make up nearly
# all of the *Run All* time: 120 s on the 2-core CPU of the stored run, whose cores other jobs were sharing
# (each launch 12–18 s there); expect less on an idle machine.

# %%
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from course_utils import (TorchrunFailed, check_accumulate_no_sync, check_epoch_shards, check_eval_shard,
                          check_save_checkpoint_once, exercise, expect_error, free_port, get_device,
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
wrapped = nn.DataParallel(model)
print("DataParallel would split each batch over devices:", wrapped.device_ids or "none (no GPU here)")
x = torch.randn(64, 32, device=device)
torch.testing.assert_close(wrapped(x), model(x))      # same results; the question is speed
if gpus >= 2:
    from course_utils import benchmark
    single = lambda: model(torch.randn(4096, 32, device=device)).sum().backward()
    parallel = lambda: wrapped(torch.randn(4096, 32, device=device)).sum().backward()
    print(benchmark({"one GPU": single, f"DataParallel on {gpus} GPUs": parallel}))
else:
    print(f"With {gpus} GPU(s) there is nothing to split, so DataParallel cannot be measured here.\n"
          "On a machine with 2+ GPUs this cell times a training step on one GPU against DataParallel;\n"
          "below, the DDP job runs for real as several processes on the CPU.")

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
# Each rank also logs what it saw — the sample indices of every epoch, its augmentation noise, the bytes its
# save wrote (`/proc/self/io`, Linux only) and its final weights — to a JSON file that the cells below read.

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


def bytes_written():  # bytes this process has written so far: Linux reports it, other systems -> None
    try:
        return int(open("/proc/self/io").read().split("wchar:")[1].split()[0])
    except OSError:
        return None


rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])             # DDP: set by torchrun
use_cuda = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])            # DDP: a GPU for each rank?
device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
if use_cuda:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=2))      # DDP

torch.manual_seed(0)                       # the same dataset on every rank: the sampler splits indices into it
x = torch.randn(48, 4)
dataset = TensorDataset(torch.arange(48), x, x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.3)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)                            # DDP: this rank's share
loader = DataLoader(dataset, batch_size=8, sampler=sampler)                            # DDP: sampler, no shuffle
model = DDP(nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 1)).to(device))  # DDP: wrap
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
augment = torch.Generator().manual_seed(1000 + rank)                                   # DDP: a seed per rank
log = {"rank": rank, "backend": dist.get_backend(), "device": str(device), "seen": [], "noise": [], "losses": []}
for epoch in range(2):
    sampler.set_epoch(epoch)                                                           # DDP: reshuffle
    log["seen"].append([])
    for index, inputs, targets in loader:
        noise = 0.1 * torch.randn(inputs.shape, generator=augment)                     # "augmentation"
        log["seen"][-1] += index.tolist()
        log["noise"] += noise[:, 0].tolist()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model((inputs + noise).to(device)).squeeze(1), targets.to(device))
        loss.backward()                                             # DDP: gradients averaged over ranks here
        optimizer.step()
        log["losses"].append(loss.item())
before = bytes_written()
if rank == 0:                                                                          # DDP: one writer
    torch.save(model.module.state_dict(), f"{os.environ['COURSE_LOG_DIR']}/model.pt")
log["save_bytes"] = None if before is None else bytes_written() - before
dist.barrier()                                                                         # DDP: wait for the file
log["weights"] = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
with open(f"{os.environ['COURSE_LOG_DIR']}/rank{rank}.json", "w") as file:
    json.dump(log, file)
dist.destroy_process_group()                                                           # DDP

# %% [markdown]
# ### Launching it
#
# In a terminal: `torchrun --standalone --nproc-per-node=2 artifacts/ch5/train_ddp.py` (`--standalone`:
# one machine, torchrun picks a free port). From a notebook, run the same command in a subprocess — plus a
# timeout, and a way to kill every worker if one hangs. `launch_torchrun` is that, hardened: it streams the
# output into the cell, kills the whole process group on timeout, raises `TorchrunFailed` quoting the failing
# rank's traceback, and tells the workers where to write their logs (`$COURSE_LOG_DIR`).

# %%
script = runs / "train_ddp.py"
good = launch_torchrun(str(script), nproc, log_dir=runs / "good", timeout_s=300)
print(good)
for log in good.logs:
    print(f"rank {log['rank']}: backend {log['backend']}, device {log['device']}, {len(log['losses'])} steps, "
          f"batch loss {log['losses'][0]:.2f} at the first, {log['losses'][-1]:.2f} at the last")

# %%
weights = [torch.tensor(log["weights"]) for log in good.logs]
print(f"largest difference between rank 0's and another rank's final weights: "
      f"{max((w - weights[0]).abs().max().item() for w in weights):.1e}")
assert len(good.logs) == nproc and all(torch.equal(w, weights[0]) for w in weights)   # bit-identical replicas
saved = torch.load(runs / "good" / "model.pt", weights_only=True)
assert torch.equal(torch.cat([t.flatten() for t in saved.values()]).cpu(), weights[0])  # rank 0 saved them

# %% [markdown]
# **The global batch.** Each step averages the gradients of `nproc` per-device batches of 8, so one
# optimizer step consumes `8 × nproc` samples: with the same 48 samples, each rank takes `48 / (8 × nproc)`
# steps per epoch instead of 6. The logs show it:

# %%
steps_per_epoch = len(good.logs[0]["losses"]) // 2
samples_per_epoch = sum(len(log["seen"][0]) for log in good.logs)
print(f"{nproc} ranks: {steps_per_epoch} steps per epoch, {samples_per_epoch} samples per epoch -> "
      f"{samples_per_epoch // steps_per_epoch} samples per optimizer step (one process: 6 steps of 8)")
assert samples_per_epoch == 48 and steps_per_epoch == -(-48 // (8 * nproc))

# %% [markdown]
# So going from 1 to N devices multiplies the batch of each optimizer step by N, with N times fewer steps.
# Either keep the global batch (per-device batch = global batch / N), or keep the per-device batch and
# retune the learning rate: Goyal et al., [*Accurate, Large Minibatch SGD: Training ImageNet in 1
# Hour*](https://arxiv.org/abs/1706.02677) (2017), scale SGD's learning rate linearly with the global batch
# (the "linear scaling rule") and ramp it up over the first epochs (warm-up), because the scaled rate
# diverges early in training. It is a starting point for SGD, not a law: for Adam the square-root rule is
# the common starting point, and either needs checking on your problem.

# %% [markdown]
# ## 3. Pitfall: no `sampler.set_epoch(epoch)`
#
# `DistributedSampler` shuffles with a seed of `seed + epoch`, and the epoch is whatever `set_epoch` last
# set. We make three one-line changes to the script (this section and the next two) and run it once.

# %%
bad_script = runs / "train_ddp_bad.py"
print(script_variant(script, "    sampler.set_epoch(epoch)", "    pass  # forgot set_epoch", to=bad_script))
print(script_variant(bad_script, "if rank == 0:   ", "if True:        ", to=bad_script))
print(script_variant(bad_script, "manual_seed(1000 + rank)", "manual_seed(1000)       ", to=bad_script))
bad = launch_torchrun(str(bad_script), nproc, log_dir=runs / "bad", timeout_s=300, echo=False)
print(bad)

# %%
for name, run in (("without set_epoch", bad), ("with set_epoch", good)):
    epoch_0, epoch_1 = run.logs[0]["seen"]
    print(f"{name:17}: rank 0 saw samples {epoch_0[:8]}... in epoch 0, {epoch_1[:8]}... in epoch 1")
assert bad.logs[0]["seen"][0] == bad.logs[0]["seen"][1]      # every epoch, the same batches in the same order
assert good.logs[0]["seen"][0] != good.logs[0]["seen"][1]

# %% [markdown]
# Without `set_epoch`, every epoch repeats epoch 0: the same samples grouped in the same batches, in the same
# order — the shuffle you asked for happens once. With `set_epoch` every rank still gets disjoint shares
# (they use the same seed + epoch) but a new order each epoch.

# %% [markdown]
# ## 4. Pitfall: every rank saves the checkpoint
#
# All ranks hold the same weights, so all ranks writing `model.pt` is N times the writing for the same
# bytes — on a shared network file system, N nodes × 8 GPUs writing the same multi-GB file at once. Worse,
# `torch.save` opens the file with truncation: while one rank rewrites it, another rank that has finished
# and reads it (to evaluate, or to resume after a restart) can find it half-written. The kernel's count of
# bytes each process wrote during the save shows the cost:

# %%
file_size = (runs / "good" / "model.pt").stat().st_size
if good.logs[0]["save_bytes"] is None:
    print("This system does not report bytes written per process (/proc/self/io is Linux-only): "
          f"the file is {file_size} bytes, written once by rank 0 in the good run, {nproc} times in the bad one.")
else:
    for name, run in (("every rank saves", bad), ("rank 0 saves", good)):
        print(f"{name:16}: bytes written during the save, per rank: {[log['save_bytes'] for log in run.logs]}"
              f" (the file is {file_size} bytes)")
    assert all(log["save_bytes"] >= file_size for log in bad.logs)                  # N full writes
    assert good.logs[0]["save_bytes"] >= file_size
    assert all(log["save_bytes"] < file_size // 10 for log in good.logs[1:])         # the others wrote nothing

# %% [markdown]
# ## 5. Pitfall: the same seed on every rank
#
# The augmentation generator seeded with `1000` instead of `1000 + rank` draws the **same "random" noise on
# every rank**: N devices, one augmentation stream. (The model does not need a seed per rank, or even the same
# seed: DDP's constructor broadcasts rank 0's weights to all. The dataset, however, must be the same on every
# rank, because the sampler only hands out indices into it — hence `torch.manual_seed(0)` before building it.)

# %%
for name, run in (("seed 1000", bad), ("seed 1000 + rank", good)):
    print(f"{name:16}: first noise values per rank:",
          {log["rank"]: [round(v, 3) for v in log["noise"][:3]] for log in run.logs})
assert all(log["noise"] == bad.logs[0]["noise"] for log in bad.logs)           # identical on every rank
assert all(log["noise"] != good.logs[0]["noise"] for log in good.logs[1:])

# %% [markdown]
# ## 6. A hang: one rank skips a collective
#
# Every collective — the gradient all-reduce in `backward()`, `barrier()`, `all_reduce` — waits for **every**
# rank. If one rank skips one, the others wait: by default for 10 minutes (30 with `gloo`), while the job
# looks alive and burns its allocation. A common way to get there is uneven inputs: below, rank 1 has 3
# batches and rank 0 has 5, so rank 1 finishes its loop and waits at the final `barrier()` while rank 0 waits
# in its fourth backward for a gradient all-reduce rank 1 will never join. A short `timeout=` in
# `init_process_group` turns the hang into an error after 3 s. (The scripts of sections 6–7 use `gloo` on
# every machine, GPUs or not: `monitored_barrier` below needs it, and the hang is the same with `nccl`.)

# %%
# %%writefile artifacts/ch5/uneven.py
"""Rank 0 has 5 batches, rank 1 only 3: the collectives of steps 4 and 5 have no partner on rank 1."""
import datetime, json, os
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))   # fail after 3 s, not after 30 min
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [torch.randn(8, 4) for _ in range(5 if rank == 0 else 3)]
for x in batches:
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()           # all-reduce: waits for every rank's gradients of this step
    optimizer.step()
dist.barrier()
weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
with open(f"{os.environ['COURSE_LOG_DIR']}/rank{rank}.json", "w") as file:
    json.dump({"rank": rank, "steps": len(batches), "weights": weights}, file)
dist.destroy_process_group()

# %%
uneven = runs / "uneven.py"
with expect_error(TorchrunFailed, match="Timed out waiting 3000ms"):
    launch_torchrun(str(uneven), 2, log_dir=runs / "hang", timeout_s=120, echo=False)

# %% [markdown]
# The job now fails instead of hanging, but the message only says that *this* rank timed out. To learn
# **which rank never arrived**, put `dist.monitored_barrier(timeout=...)` (gloo) just before the collective
# you suspect: rank 0 waits for each rank in turn and names the ones that did not come.

# %%
monitored = runs / "uneven_monitored.py"
print(script_variant(uneven, "for x in batches:\n",
                     "for x in batches:\n    dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))\n",
                     to=monitored))
with expect_error(TorchrunFailed, match="Rank 1 failed to pass monitoredBarrier"):
    launch_torchrun(str(monitored), 2, log_dir=runs / "monitored", timeout_s=120, echo=False)

# %% [markdown]
# On a real cluster, two more tools: `TORCH_DISTRIBUTED_DEBUG=DETAIL` in the environment makes every
# collective check that all ranks call the same one with the same shapes (and report the mismatch), and
# `py-spy dump --pid PID` on a hung worker prints its Python stack — the line each rank is stuck on.
# `monitored_barrier` is gloo-only: with `nccl`, make a side group with `dist.new_group(backend="gloo")` for it.
#
# ## 7. Uneven inputs, fixed with `Join`
#
# Padding every rank to the same number of batches (what `DistributedSampler` does) avoids the hang, but
# not every data source can be padded (streams, filtered data, variable-length batching). The `Join` context
# manager lets a rank that runs out of batches keep answering the others' all-reduces (with zero
# gradients) until everyone is done:

# %%
joined = runs / "uneven_join.py"
loop = uneven.read_text().split("for x in batches:\n")[1].split("dist.barrier()")[0]
print(script_variant(uneven, "for x in batches:\n" + loop,
                     "with Join([model]):    # a rank out of batches answers the others' all-reduces\n"
                     "    for x in batches:\n" + "".join("    " + line for line in loop.splitlines(keepends=True)),
                     to=joined))
print(script_variant(joined, "from torch import nn\n",
                     "from torch import nn\nfrom torch.distributed.algorithms.join import Join\n", to=joined))
fixed = launch_torchrun(str(joined), 2, log_dir=runs / "join", timeout_s=120, echo=False)
print(fixed, {log["rank"]: f"{log['steps']} steps" for log in fixed.logs})
assert [log["steps"] for log in fixed.logs] == [5, 3]
assert fixed.logs[0]["weights"] == fixed.logs[1]["weights"]      # the replicas still agree

# %% [markdown]
# ## 8. Gradient accumulation under DDP: `no_sync()`
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
# exit path) and `count_allreduces(ddp)` (the counting hook); exercise 3's check uses them.

# %% [markdown]
# ## 9. Several machines, on one machine
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


port = free_port()
with ThreadPoolExecutor(2) as pool:                    # two terminals, one per node
    nodes = list(pool.map(node, [0, 1], [port, port]))
for n in nodes:
    print("\n".join(line for line in n.output.splitlines() if line.startswith("rank") or "node_rank" in line))
assert [n.returncode for n in nodes] == [0, 0]
assert all("of 2" in n.output and "sum of ranks 1" in n.output for n in nodes)

# %% [markdown]
# With `--rdzv-backend=c10d`, the node whose address is the endpoint hosts the rendezvous store on that
# port; `--node-rank` is ignored (torchrun says so): the rendezvous numbers the nodes itself. On real
# machines, also check:
#
# - The port must be open between the nodes (a firewall between them looks exactly like a missing node,
#   below), and the backend then opens more ports between all nodes.
# - Nodes with several network interfaces: tell the backend which to use, `GLOO_SOCKET_IFNAME=eth0` or
#   `NCCL_SOCKET_IFNAME=eth0` (`NCCL_DEBUG=INFO` prints what NCCL picked).
#
# **A wrong endpoint, or a missing node.** Node 1 is given the wrong port. Both addresses are this machine,
# so node 1 opens a rendezvous of its own there, and each node waits for a second node that never comes,
# until `join_timeout` (default 600 s; 5 s here). Node 0 sees exactly what it would see if node 1 were never
# started, or if a firewall blocked the port; across machines, node 1 itself would fail to connect instead.

# %%
with ThreadPoolExecutor(2) as pool:
    lost = list(pool.map(node, [0, 1], [free_port(), free_port()], [5, 5]))
for n in lost:
    last_error = [line for line in n.output.splitlines() if "RendezvousTimeoutError" in line][-1]
    print(f"exit code {n.returncode}: {last_error}")
assert all(n.returncode != 0 and "RendezvousTimeoutError" in n.output for n in lost)

# %% [markdown]
# On a machine with exactly one GPU, the jobs above ran on the CPU (two ranks cannot share one GPU with
# `nccl`). This cell shows the single-GPU `nccl` path runs too, with the course's full script
# `course_utils/ddp_train.py` (the same steps as ours, plus switches for each pitfall; `--help` lists them):

# %%
if gpus == 1:
    solo = launch_torchrun("course_utils.ddp_train", 1, log_dir=runs / "gpu", timeout_s=300)
    assert solo.logs[0]["backend"] == "nccl" and solo.logs[0]["device"].startswith("cuda")
else:
    print(f"{gpus} GPU(s): the training script in section 2 already used "
          f"{'nccl on every GPU' if gpus >= 2 else 'gloo on the CPU'}")

# %% [markdown]
# ## 10. Exercises
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
# `rank`; afterwards the file must hold the weights, have been written once, and no rank may get past
# `barrier()` before it is complete.

# %%
@exercise
def save_checkpoint_once(model, path, rank, barrier):
    barrier()
    torch.save(model.state_dict(), path)


check_save_checkpoint_once(save_checkpoint_once)

# %% [markdown]
# **Exercise 3 — accumulation under DDP (there are 2 bugs).** `accumulate_no_sync` should make one optimizer
# step from equal-sized micro-batches, with the gradient of the whole batch and a single all-reduce.

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
# **Exercise 4 — an evaluation shard (write it).** `DistributedSampler` pads each rank's share by repeating
# samples, so an evaluation over it counts some samples twice. Return the indices rank `rank` should evaluate
# so that, over all ranks, each of the `n_samples` samples is evaluated exactly once.

# %%
@exercise
def eval_shard(n_samples, rank, world_size):
    ...  # your code here


check_eval_shard(eval_shard)

# %% [markdown]
# ## What to remember
# - DDP is one process per device, started by `torchrun`; the script: `init_process_group`,
#   `DistributedSampler` (and `sampler.set_epoch(epoch)` every epoch), `DDP(model)`, save on rank 0 then
#   `dist.barrier()`, `destroy_process_group()`.
# - Seed what must differ per rank (augmentation) with `base + rank`; build the dataset identically on every
#   rank. The model's initial weights come from rank 0 (DDP broadcasts them).
# - One optimizer step consumes per-device batch × world size samples; keep the global batch, or retune the
#   learning rate (linear scaling with warm-up as a starting point for SGD).
# - Every rank must call every collective. A short `timeout=` turns a hang into an error;
#   `monitored_barrier` names the missing rank; uneven inputs need padding or `Join`.
# - Accumulate with `no_sync()` on all micro-batches but the last.
# - Evaluate each sample once (unpadded shards) and all-reduce sums and counts before dividing.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | every epoch sees the same batches in the same order | `set_epoch` missing | 3 |
# | checkpoint written N times, or half-written when read | every rank saves; no `barrier()` after rank 0's save | 4 |
# | augmentation identical on every device | the same seed on every rank | 5 |
# | job idle, then `Timed out waiting ...ms` (or a hang with no timeout) | a rank skipped a collective: uneven batches, a collective inside `if rank == 0:` | 6 |
# | `Rank N failed to pass monitoredBarrier` | rank N never reached that point: look at what it did instead | 6 |
# | `ChildFailedError` from torchrun | one rank raised: read its traceback (the first failure) | 6 |
# | validation metric depends on the number of devices | `DistributedSampler` padding in evaluation | exercise 4 |
# | `RendezvousTimeoutError` | a node did not arrive: wrong `--rdzv-endpoint`, port blocked, node not started | 9 |
# | `address already in use` | another job holds the port: use `--standalone` or another `--rdzv-endpoint` port | 9 |

# %%
print(progress(chapter=5))
