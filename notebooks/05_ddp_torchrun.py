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
# **You will be able to:** explain why `DistributedDataParallel` (DDP) replaced `DataParallel`; launch a
# real multi-process job from a notebook with `torchrun`; and recognise, from the logs, the classic
# multi-process mistakes — no `set_epoch`, every rank saving, the same seed everywhere, double-counted
# evaluation — and the global batch size.
#
# **Hardware and time.** On a CPU laptop (and in CI) the job runs **2 processes with the `gloo` backend**;
# on a machine with several GPUs, one process per GPU with `nccl`. *Run All* takes about a minute on
# 2 CPU cores: each launch starts fresh Python processes.
#
# The training script is `course_utils/ddp_train.py` — read it alongside this notebook. Each rank writes a
# JSON log that the cells below read.

# %%
import shutil
from pathlib import Path

import torch
from torch import nn

from course_utils import (TorchrunFailed, expect_error, get_device, global_batch_size, hardware_summary,
                          launch_torchrun, mlp, seed_everything, still_running, worker_pids)

# %load_ext course_utils
device = get_device()
seed_everything(0)
runs = Path("artifacts/ch5")
shutil.rmtree(runs, ignore_errors=True)
gpus = torch.cuda.device_count()
nproc = gpus if gpus >= 2 else 2
print(hardware_summary())
print(f"{gpus} GPU(s) -> {nproc} processes, backend {'nccl' if gpus >= 2 else 'gloo'}")

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
    table = benchmark({"one GPU": single, f"DataParallel on {gpus} GPUs": parallel})
    print(table)
else:
    print(f"With {gpus} GPU(s) there is nothing to split, so DataParallel cannot be measured here.\n"
          "On a machine with 2+ GPUs this cell times a training step on one GPU against DataParallel;\n"
          "below, the DDP job runs for real as several processes on the CPU.")

# %% [markdown]
# ## 2. The launch cell
#
# `torchrun --standalone --nproc-per-node=N -m course_utils.ddp_train ...` starts N processes and sets
# `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` for each (`--standalone` picks a free
# port). `launch_torchrun` runs exactly that in a subprocess, streams its output here, enforces a timeout
# and returns the per-rank logs.

# %%
good = launch_torchrun("course_utils.ddp_train", nproc, "--epochs", "2",
                       log_dir=runs / "good", timeout_s=300)
print(good)
for log in good.logs:
    print(f"rank {log['rank']}: env {log['env']}, backend {log['backend']}, device {log['device']}")

# %%
fingerprints = {log["rank"]: log["weights_fingerprint"] for log in good.logs}
print("SHA-256 of each rank's final weights:", fingerprints)
assert len(good.logs) == nproc
assert len(set(fingerprints.values())) == 1        # identical: the gradients really were all-reduced

# %% [markdown]
# ## 3. Pitfall: no `sampler.set_epoch(epoch)`
#
# `DistributedSampler` shuffles with a seed of `seed + epoch`. Without `set_epoch` the epoch stays 0, and
# every epoch visits the data in **the same order**. We rerun with the three pitfalls of this chapter
# switched on at once (`--no-set-epoch --same-seed --all-ranks-save`).

# %%
bad = launch_torchrun("course_utils.ddp_train", nproc, "--epochs", "2",
                      "--no-set-epoch", "--same-seed", "--all-ranks-save", log_dir=runs / "bad", timeout_s=300)
rank0_bad, rank0_good = bad.logs[0], good.logs[0]
print("without set_epoch, rank 0's first samples per epoch:", [order[:6] for order in rank0_bad["epoch_orders"]])
print("with set_epoch:                                     ", [order[:6] for order in rank0_good["epoch_orders"]])
assert rank0_bad["epoch_orders"][0] == rank0_bad["epoch_orders"][1]
assert rank0_good["epoch_orders"][0] != rank0_good["epoch_orders"][1]

# %% [markdown]
# ## 4. Pitfall: every rank saves the checkpoint
#
# All ranks write the same path: the file is rewritten `N` times, whichever rank finishes last wins, and a
# rank that reads it meanwhile can see a half-written file (our `save_checkpoint` is atomic, so here it is
# "only" N-fold work and a winner decided by timing). The fix in the script:
#
# ```python
# if is_main_process():
#     save_checkpoint(path, model=model.module, optimizer=optimizer, epoch=epoch)
# dist.barrier()            # nobody reads before rank 0 has finished writing
# ```

# %%
writes_bad = sum(log["checkpoint_writes"] for log in bad.logs)
writes_good = sum(log["checkpoint_writes"] for log in good.logs)
print(f"all ranks save: the file was written {writes_bad} times; the copy on disk came from rank "
      f"{bad.logs[0]['checkpoint_meta']['saved_by_rank']}")
print(f"rank 0 only:    written {writes_good} time, by rank {good.logs[0]['checkpoint_meta']['saved_by_rank']}; "
      f"every rank then loaded it and found its own weights: {all(l['checkpoint_matches_my_weights'] for l in good.logs)}")
assert writes_bad == nproc and writes_good == 1
assert all(log["checkpoint_meta"]["saved_by_rank"] == 0 for log in good.logs)
assert all(log["checkpoint_matches_my_weights"] for log in good.logs)

# %% [markdown]
# ## 5. Pitfall: the same seed on every rank
#
# Random augmentation seeded identically on every rank gives **identical "random" noise** on all of
# them: N GPUs, one augmentation stream. Seed with `seed_for_rank(base_seed)` (`base_seed + rank`).

# %%
for name, run in (("same seed", bad), ("base_seed + rank", good)):
    print(f"{name:16}: first augmentation draws per rank:", {log["rank"]: log["augmentation_draws"][:2] for log in run.logs})
assert len({tuple(log["augmentation_draws"]) for log in bad.logs}) == 1
assert len({tuple(log["augmentation_draws"]) for log in good.logs}) == nproc

# %% [markdown]
# And it stays reproducible: the same command twice gives the same draws and the same final weights.

# %%
again = launch_torchrun("course_utils.ddp_train", nproc, "--epochs", "2",
                        log_dir=runs / "again", timeout_s=300, echo=False)
assert [log["augmentation_draws"] for log in again.logs] == [log["augmentation_draws"] for log in good.logs]
if good.logs[0]["backend"] == "gloo":
    assert again.logs[0]["weights_fingerprint"] == good.logs[0]["weights_fingerprint"]
    print("second run: identical augmentation draws and identical final weights")
else:   # NCCL's all-reduce may sum in a different order from run to run: weights agree to rounding only
    print("second run: identical augmentation draws (final weights not compared bit for bit under nccl)")

# %% [markdown]
# ## 6. Evaluation with `DistributedSampler` counts some samples twice
#
# To give every rank the same number of samples, `DistributedSampler` **pads** by repeating samples from
# the start. With 21 validation samples on 2 ranks, 22 are evaluated. The script evaluates twice: over the
# padded shards (naive) and over `shard_indices` (each sample once; a shard may be empty), then sums loss
# and count with `all_reduce` before dividing.

# %%
log = good.logs[0]
print(f"naive:   {log['eval_naive']['count']} samples, mean loss {log['eval_naive']['mean_loss']:.6f}")
print(f"correct: {log['eval_correct']['count']} samples, mean loss {log['eval_correct']['mean_loss']:.6f}")
assert log["eval_correct"]["count"] == 21
assert log["eval_naive"]["count"] == -(-21 // nproc) * nproc       # padded up to a multiple of N
assert nproc == 1 or log["eval_naive"]["count"] > 21 or 21 % nproc == 0

# %% [markdown]
# ## 7. The global batch
#
# Each optimizer step averages gradients over **per-device batch × world size** samples. The script logs
# both. To keep the global batch (and so the learning-rate tuning) fixed when the number of devices
# changes, divide: `per_device = global_batch // world_size`. If you instead let the global batch grow
# with the devices, the learning rate usually has to grow too (the "linear scaling rule" is a starting
# point, with warm-up) — that is a tuning task, left to you.

# %%
print(f"per-device batch {log['per_device_batch']} x {log['world_size']} ranks = global batch {log['global_batch']}")
assert log["global_batch"] == log["per_device_batch"] * log["world_size"]
assert global_batch_size(8) == 8          # in this notebook's process there is no process group: world size 1
target = 64
for world in (1, 2, 4, 8):
    print(f"  {world} devices -> per-device batch {target // world:2} keeps the global batch at {target}")

# %% [markdown]
# ## A job that will not start, or dies
#
# When one rank raises, torchrun stops the others and reports the failure; `launch_torchrun` raises
# `TorchrunFailed` with that rank's traceback, and leaves no process behind.

# %%
with expect_error(TorchrunFailed, match="deliberate crash on rank 1"):
    launch_torchrun("course_utils.ddp_train", 2, "--crash-rank", "1",
                    log_dir=runs / "crash", timeout_s=300, echo=False)
leftover = still_running(worker_pids(runs / "crash"))
print(f"{len(worker_pids(runs / 'crash'))} worker processes were started; still running: {leftover}")
assert leftover == []

# %% [markdown]
# On a machine with exactly one GPU, the pitfall runs above used 2 CPU processes (two ranks cannot share one
# GPU with `nccl`). This cell shows the single-GPU `nccl` path runs too:

# %%
if gpus == 1:
    solo = launch_torchrun("course_utils.ddp_train", 1, log_dir=runs / "gpu", timeout_s=300)
    assert solo.logs[0]["backend"] == "nccl" and solo.logs[0]["device"].startswith("cuda")
else:
    print(f"{gpus} GPU(s): the launch in section 2 already used {'nccl on every GPU' if gpus >= 2 else 'gloo on the CPU'}")

# %% [markdown]
# ## 8. Several machines (not run here)
#
# On each of two nodes with 8 GPUs (node 0 at 10.0.0.1):
#
# ```bash
# torchrun --nnodes=2 --nproc-per-node=8 --node-rank=0 \
#          --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29500 --rdzv-id=job42 \
#          -m course_utils.ddp_train --log-dir runs/multi    # node-rank=1 on the second node
# ```
#
# - The rendezvous port (29500 here) must be reachable from every node; NCCL also opens ports between all
#   nodes. If nodes have several network interfaces, tell NCCL which to use: `NCCL_SOCKET_IFNAME=eth0`
#   (and `GLOO_SOCKET_IFNAME` for gloo).
# - A hang is usually one rank that never reached a collective (a crash, a different number of batches, a
#   rank-0-only branch containing a collective). Debug with `TORCH_DISTRIBUTED_DEBUG=DETAIL`, `NCCL_DEBUG=INFO`
#   and a short `timeout=datetime.timedelta(minutes=5)` in `init_process_group`, so the job fails with a
#   message instead of hanging.
#
# ## What to remember
# - DDP: one process per GPU; launch with `torchrun`; wrap the model in `DistributedDataParallel`.
# - `DistributedSampler` + `sampler.set_epoch(epoch)` every epoch.
# - Save on rank 0 only, then `dist.barrier()`; `destroy_process_group()` on every exit path.
# - Seed augmentation with `base_seed + rank`; initialise the model identically (DDP broadcasts rank 0's weights).
# - Evaluate with unpadded shards and all-reduce sums and counts before dividing.
# - Global batch = per-device batch × world size.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | every epoch looks the same; loss curve periodic | `set_epoch` missing | 3 |
# | corrupt or half-written checkpoint; N identical files written | all ranks save | 4 |
# | augmentation identical on every GPU | same seed on every rank | 5 |
# | validation metric slightly off, depends on the GPU count | `DistributedSampler` padding | 6 |
# | `ChildFailedError` from torchrun | one rank crashed: read its traceback (first failure) | crash cell |
# | job hangs at start | a rank cannot reach `MASTER_ADDR:MASTER_PORT`, wrong interface | 8 |
