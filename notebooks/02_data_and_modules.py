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
# of folklore; see with `named_parameters()` and `state_dict()` which layers and tensors PyTorch never
# sees; write a training step whose order keeps the two rules that matter, with gradient clipping and
# accumulation; tell a data-bound run from a compute-bound one with the profiler; and
# evaluate with `model.eval()` *and* `torch.inference_mode()`, knowing what each of the two does.
#
# **You write the PyTorch; `course_utils` holds the hardened versions of what you write.** Each section
# first shows the plain code a practitioner writes and reproduces the pitfall with it; only then does a
# helper appear (`train_step`, `evaluate`, `find_unregistered_modules`, ...), used on the same case.
#
# **Hardware and time.** Every number below is measured on the machine running the notebook (printed next
# to it). Where workers start with `spawn` or `forkserver` (macOS, Windows, Linux from Python 3.14) each
# worker is a fresh Python that imports `torch`, so section 1, which starts about forty of them, takes
# longer than on Linux with `fork`. On a CUDA GPU the same cells run, and section 2 measures real
# host-to-device copies.
#
# **Run All:** 25 s of cell time in the run stored below, on CPU only: Intel(R) Xeon(R) Processor (2 logical cores, torch uses 2 threads); torch 2.13.0+cpu (written by `./course outputs`; the kernel's start adds a few seconds).

# %%
import collections
import inspect
import multiprocessing
import os
import pickle
import subprocess
import sys
import time
import warnings

import numpy as np
import psutil
import torch
from torch import nn
from torch.utils import benchmark
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset, TensorDataset

from course_utils import (SmallConvNet, SyntheticImages, capture_process_output, check_accumulate_step,
                          check_build_normalised_mlp, check_predict_batches, check_train_loop,
                          compare_pinned_copy, compare_speed, evaluate, exercise, expect_error, expect_warning,
                          find_unregistered_modules, fit, get_device, hardware_summary, idle_cores, mlp,
                          plot_losses, progress, saved_activation_bytes, seed_everything, snapshot,
                          torch_threads, train_accumulated, train_step, unchanged)

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
# workers, `N` **processes** each prepare whole batches in parallel. Timing a loader by hand is one loop:

# %%
dataset = SyntheticImages(n=256)
image, label = dataset[0]
print("one sample:", tuple(image.shape), image.dtype, "label", label.item())

start = time.perf_counter()
for images, labels in DataLoader(dataset, batch_size=32, num_workers=0):
    pass
print(f"one pass, num_workers=0, timed by hand: {time.perf_counter() - start:.2f} s")

# %% [markdown]
# That single number is one sample: on a shared machine it also measures whatever else ran at that moment,
# and with workers it would include their start-up. Two loaders timed one after the other measure the
# machine as much as the loaders. So we time whole **epochs** of both loaders in alternating blocks, inside one
# measurement, and call one faster only when the spreads (first to third quartile of the blocks) do not
# overlap. By hand, that is a loop and a percentile:
#
# ```python
# epoch_s = {name: [] for name in loaders}
# for block in range(7):                                         # round-robin blocks
#     for name, loader in loaders.items():                       # (rotate the order on each block)
#         start = time.perf_counter(); one_epoch(loader); epoch_s[name].append(time.perf_counter() - start)
# q1_a, q3_a = np.percentile(epoch_s["a"], [25, 75]); q1_b, q3_b = np.percentile(epoch_s["b"], [25, 75])
# b_is_faster = q3_b < q1_a                                      # the spreads do not overlap
# ```
#
# `compare_speed` is that loop, hardened (the order rotates, every variant gets the same warm-up, CUDA is
# synchronised, the verdict is worded for you). The loader with workers is built with
# `persistent_workers=True`: its workers start once, in the warm-up before the blocks (its time is the
# "first call" column), so the blocks compare steady-state epochs. A speed-up from workers also needs **idle
# cores**, and a laptop with a browser and a video call open (or a CI machine shared with other jobs) may
# not have them. `psutil` measures them in one line: how busy each logical core was over half a second,
# in percent. We measure before and after (`course_utils.idle_cores()` is that same line, as a function).

# %%
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1   # usable cores
busy_percent = psutil.cpu_percent(interval=0.5, percpu=True)     # e.g. [93.0, 8.2]: one number per core
idle_before = sum(100 - busy for busy in busy_percent) / 100

epoch_data = SyntheticImages(n=32)                               # one epoch: 4 batches of 8
main_process = DataLoader(epoch_data, batch_size=8, num_workers=0)
two_workers = DataLoader(epoch_data, batch_size=8, num_workers=2, persistent_workers=True)

def one_epoch(loader):
    for batch in loader:
        pass

children_before = {child.pid for child in psutil.Process().children(recursive=True)}
speed = compare_speed({"num_workers=0": lambda: one_epoch(main_process),
                       "num_workers=2": lambda: one_epoch(two_workers)}, blocks=7, block_s=0.01)
idle_after = idle_cores()
print(f"idle logical cores: {idle_before:.1f} of {cores} before, {idle_after:.1f} after the measurement")
print(speed)

# %%
outcome, idle = speed.outcome("num_workers=2"), min(idle_before, idle_after)
print(f"two workers: {speed.verdict('num_workers=2')}; {idle:.1f} of {cores} cores idle around the measurement")
if outcome == "faster":
    print("the epochs with two workers were faster: the spreads do not overlap"
          + ("" if idle >= 1.7 else " (measured while other programs kept cores busy: a repeat may differ)"))
elif outcome == "slower":
    print("two workers were slower here"
          + (f": with only {idle:.1f} idle cores they probably competed with other programs for the CPU"
             if idle < 1.7 else ", although the cores were idle before and after: the work per batch is too "
             "small to pay for the inter-process transfer, or other work ran in between"))
else:
    print(f"inconclusive here ({outcome}): the measurement cannot tell the two apart"
          + (f"; only {idle:.1f} cores were idle" if idle < 1.7 else ""))
print("The next cell shows where the work ran, which does not depend on the load.")

# %% [markdown]
# Whatever the verdict, **where** the work runs does not depend on how busy the machine is: CPU time counts
# the time a process actually computed, not the time it waited for a core. `time.process_time()` is the
# training process's CPU time; `psutil` reads the workers' (still alive between epochs, since they persist).
# Three epochs of each loader:

# %%
def cpu_seconds(process):
    times = process.cpu_times()
    return times.user + times.system

workers = [child for child in psutil.Process().children(recursive=True) if child.pid not in children_before]
cpu = {}
for name, loader in [("num_workers=0", main_process), ("num_workers=2", two_workers)]:
    main_start, workers_start = time.process_time(), [cpu_seconds(w) for w in workers]
    for epoch in range(3):
        one_epoch(loader)
    cpu[name] = (time.process_time() - main_start, [cpu_seconds(w) - s for w, s in zip(workers, workers_start)])
for name, (main_s, workers_s) in cpu.items():
    print(f"{name}: training process {main_s * 1000:4.0f} ms of CPU; worker processes: "
          + (", ".join(f"{s * 1000:.0f} ms" for s in workers_s) if name != "num_workers=0" else "none used"))
alone, (with_workers, per_worker) = cpu["num_workers=0"][0], cpu["num_workers=2"]
busiest = sorted(per_worker, reverse=True)[:2]
assert with_workers < 0.25 * alone              # the training process no longer does the work...
assert sum(per_worker) > 0.6 * alone            # ...the workers do (CPU time: independent of the load)
assert len(busiest) == 2 and min(busiest) > 0.2 * sum(per_worker)   # and both of them, each its share
del two_workers                                  # a persistent loader's workers end with it

# %% [markdown]
# **The first batch arrives later with workers**: each worker is a process that must start before it can
# deliver anything, and by default a loader shuts its workers down at the end of every epoch, so the next
# epoch starts them again. `persistent_workers=True` keeps them alive between epochs. The processes
# themselves show it: list the training process's children (`psutil`) right after the first batch of each
# of three epochs.

# %%
no_work = TensorDataset(torch.zeros(64, 4))
restarting = DataLoader(no_work, batch_size=8, num_workers=2)
persisting = DataLoader(no_work, batch_size=8, num_workers=2, persistent_workers=True)

def children_after_first_batch(loader):
    """The pids of the training process's child processes while an epoch of `loader` runs."""
    iterator = iter(loader)
    next(iterator)
    pids = {child.pid for child in psutil.Process().children(recursive=True)}
    for batch in iterator:             # finish the epoch (a loader without persistent workers then stops them)
        pass
    return pids

already_running = {child.pid for child in psutil.Process().children(recursive=True)}
seen = {name: [sorted(children_after_first_batch(loader) - already_running) for epoch in range(3)]
        for name, loader in [("persistent_workers=False", restarting), ("persistent_workers=True", persisting)]}
for name, epochs in seen.items():
    print(f"{name:25} worker pids in epochs 1, 2, 3: {epochs}")
assert len({tuple(pids) for pids in seen["persistent_workers=False"]}) == 3   # new processes every epoch
assert len({tuple(pids) for pids in seen["persistent_workers=True"]}) == 1    # the same two, kept alive

# %% [markdown]
# What a restart costs: on a dataset that does no work at all, an epoch is pure overhead. Five rounds, the
# three loaders' epochs interleaved in each (the order rotating), timed by hand (with `spawn` workers each
# restart takes seconds, so five are enough):

# %%
loaders = {"2 workers, restarted": restarting, "2 workers, persistent": persisting,
           "main process": DataLoader(no_work, batch_size=8)}
epoch_ms = {name: [] for name in loaders}
for round_index in range(5):
    names = list(loaders)[round_index % 3:] + list(loaders)[:round_index % 3]     # rotate the order
    for name in names:
        start = time.perf_counter()
        one_epoch(loaders[name])
        epoch_ms[name].append((time.perf_counter() - start) * 1000)
for name, times in epoch_ms.items():
    print(f"{name:22} epoch of 8 empty batches: median {np.median(times):7.2f} ms "
          f"(from {min(times):.2f} to {max(times):.2f} ms)")
restarted_ms, persistent_ms = epoch_ms["2 workers, restarted"], epoch_ms["2 workers, persistent"]
assert np.median(restarted_ms) > np.median(persistent_ms)    # every restart pays the start-up (seen: 10x)
del persisting, loaders

# %% [markdown]
# **Each worker is a process with its own memory.** `psutil` shows the worker processes while a loader
# runs: RSS (resident memory, which also counts pages shared with the training process) and USS (memory
# private to that worker). Not every new child process is a worker: with `spawn` or `forkserver`,
# `multiprocessing` also starts a resource tracker (and a fork server) that outlive the loader. The
# workers are the processes that **end with the loader**, so we keep only those. We read two million
# numbers in two forms: a NumPy array (one block of 16 MB = 15.3 MiB, like a tensor) and a Python list of
# two million `float` objects (64 MB = 61 MiB with its pointers), after a small array that shows what a
# worker costs by itself.

# %%
def worker_memory(loader):
    """Largest (USS, RSS) in MiB of each worker process of `loader`, sampled every 10 batches."""
    me = psutil.Process()
    running_before = {child.pid for child in me.children(recursive=True)}
    new_children, largest = {}, {}
    for i, _ in enumerate(loader):
        if i % 10 == 0:
            for child in me.children(recursive=True):
                if child.pid not in running_before:
                    new_children[child.pid] = child
                    memory = child.memory_full_info()
                    uss, rss = memory.uss / 2**20, memory.rss / 2**20
                    largest[child.pid] = max(largest.get(child.pid, (0.0, 0.0)), (uss, rss))
    # the epoch is over and the loader has shut its workers down; multiprocessing's helpers keep running
    ended, still_running = psutil.wait_procs(list(new_children.values()), timeout=10)
    return [largest[process.pid] for process in ended]

start_method = multiprocessing.get_start_method()
as_array = np.arange(2_000_000, dtype=np.float64)
as_list = as_array.tolist()
array_mib = as_array.nbytes / 2**20
memory = {name: worker_memory(DataLoader(data, batch_size=10_000, num_workers=2))
          for name, data in [("small array", np.zeros(200_000)), ("NumPy array", as_array),
                             ("list of floats", as_list)]}
print(f"workers started with {start_method!r}")
for name, workers in memory.items():
    print(f"{name:15}" + "   ".join(f"worker {i}: USS {uss:5.1f} MiB, RSS {rss:4.0f} MiB"
                                    for i, (uss, rss) in enumerate(workers)))
assert all(len(workers) == 2 for workers in memory.values())   # exactly the loader's two workers

# %% [markdown]
# The RSS column looks alarming and is misleading: it counts the libraries and memory each worker shares
# with the training process. The USS column is what each worker costs on its own. What the dataset adds
# to it depends on how the workers started:
#
# - With **`fork`** (Linux before Python 3.14) a worker starts as a copy-on-write copy of the training
#   process: it shares the dataset's pages until it writes to them. The array adds little (at most a few
#   MiB: the batches the worker builds), not a copy of itself. The list adds a lot, because **reading a Python object
#   writes to it** (its reference count), so each worker ends up with private copies of the pages it read.
# - With **`spawn`** or **`forkserver`** (macOS, Windows, Linux from Python 3.14) a worker is a fresh
#   Python that imports `torch` itself (the small array's line shows that cost) and receives the dataset
#   **pickled**: every worker holds its own full copy, the array's 15 MiB and the list's 61 MiB and more.
#
# Either way: keep big datasets in tensors or NumPy arrays, not in lists of Python objects, and count the
# cost per worker before raising `num_workers`.

# %%
baseline = max(uss for uss, _ in memory["small array"])
array_extra = max(uss for uss, _ in memory["NumPy array"]) - baseline
list_extra = max(uss for uss, _ in memory["list of floats"]) - baseline
print(f"private memory per worker above the small array's: {array_extra:.1f} MiB for the array "
      f"({array_mib:.1f} MiB of data), {list_extra:.1f} MiB for the list")
if start_method == "fork":
    assert array_extra < 0.8 * array_mib   # shared with the training process, not copied (seen: 0.6-8 MiB)
    assert list_extra > array_extra + 12   # each worker reads half the list: ~30 MiB of its pages get copied
else:
    assert array_extra > 0.7 * array_mib   # a whole pickled copy in each worker (seen: 14-20 MiB)
    assert list_extra > array_extra + 30   # the list's copy is bigger still (seen: 75-80 MiB)
del as_array, as_list

# %% [markdown]
# ### Workers × processes per machine, against the core count
#
# `num_workers` counts the workers of **one** loader, and every training process has its own. With DDP
# (chapter 5) there is one training process per GPU, so a machine runs `processes × num_workers` worker
# processes, plus the training processes themselves, each of which needs a core to keep its GPU fed. The
# budget that follows: `processes × (num_workers + 1)` busy processes should not exceed the logical cores.

# %%
def busy_processes(processes_per_machine, num_workers):
    """Processes that want a core: the loaders' workers plus the training processes."""
    return processes_per_machine * (num_workers + 1)

def most_workers(processes_per_machine, logical_cores):
    """The largest num_workers per training process that keeps every process on a core of its own."""
    return max(0, logical_cores // processes_per_machine - 1)

setups = [("this notebook", 1, 2, cores),
          ("chapter 5's CPU DDP on this machine", 2, 2, cores),
          ("8-GPU node, 96 vCPUs (e.g. AWS p4d.24xlarge)", 8, 8, 96),
          ("the same node with num_workers=16", 8, 16, 96)]
for label, processes, num_workers, logical_cores in setups:
    busy = busy_processes(processes, num_workers)
    print(f"{label:45} {processes} x ({num_workers} workers + 1) = {busy:3d} busy processes on {logical_cores:2d} "
          f"cores ({busy / logical_cores:.1f}x); at most num_workers={most_workers(processes, logical_cores)}")
assert busy_processes(8, 8) <= 96 < busy_processes(8, 16) and most_workers(8, 96) == 11

# %% [markdown]
# PyTorch checks part of this itself: a loader with more workers than the cores this process may use
# warns. It checks **one loader in one process**, though: the same two workers in each of chapter 5's two
# processes pass its check, although together they oversubscribe this machine.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    DataLoader(no_work, num_workers=min(cores, 2))          # what each DDP process of chapter 5 would build
caught = [w for w in caught if "suggested max number of worker" in str(w.message)]
print(f"num_workers={min(cores, 2)} in one process: {len(caught)} warning")
assert not caught
oversubscribed = 4 * cores
with expect_warning(UserWarning, match="suggested max number of worker"):
    DataLoader(no_work, num_workers=oversubscribed)

# %% [markdown]
# What oversubscribing does here, measured: epochs of `SyntheticImages` with as many workers as cores, and
# with four times as many, interleaved (both persistent, so start-up stays out of the blocks). More
# processes cannot make more CPU: at best they take a larger share of it **from other programs** (the
# scheduler shares the cores between busy processes), and on an 8-GPU node those other programs are the
# other GPUs' training processes. What they surely cost is start-up (the *first call* column) and a
# process's memory each (measured above).

# %%
if oversubscribed <= 32:
    idle_then = idle_cores()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)        # PyTorch's warning, shown in the cell above
        fitting = DataLoader(SyntheticImages(n=4 * oversubscribed, work=24), batch_size=4, num_workers=cores,
                             persistent_workers=True)
        crowded = DataLoader(SyntheticImages(n=4 * oversubscribed, work=24), batch_size=4,
                             num_workers=oversubscribed, persistent_workers=True)
        crowding = compare_speed({f"num_workers={cores}": lambda: one_epoch(fitting),
                                  f"num_workers={oversubscribed}": lambda: one_epoch(crowded)},
                                 blocks=5, block_s=0.02)
    print(f"idle logical cores: {idle_then:.1f} of {cores} before, {idle_cores():.1f} after the measurement")
    print(crowding)
    gain = crowding.speedup(f"num_workers={oversubscribed}")
    worker_mib = max(uss for uss, _ in memory["small array"])
    print(f"{oversubscribed} workers instead of {cores}: {gain:.2f}x the speed for 4x the processes, and about "
          f"{(oversubscribed - cores) * worker_mib:.0f} MiB more private memory ({worker_mib:.0f} MiB per worker "
          "measured above)")
    assert crowding.outcome(f"num_workers={oversubscribed}") != "faster" or gain < 2   # far from 4x the speed
    del fitting, crowded
else:
    print(f"this machine has {cores} logical cores: oversubscribing it 4x would start {oversubscribed} workers, "
          "too many for this notebook; the measurement is skipped")


# %% [markdown]
# **Pitfall: a `Dataset` defined in the notebook, with `spawn` or `forkserver` workers.** Workers started
# with `spawn` (the default on macOS and Windows) or `forkserver` are fresh Pythons that receive the
# dataset **pickled** and must **import** its class by its module path. A class defined in a notebook
# lives in the kernel's `__main__`, which a worker cannot import. Linux used `fork` (a copy of the running
# process, which needs no import) until **Python 3.14, whose default start method on Linux is
# `forkserver`** ([What's New in Python 3.14](https://docs.python.org/3/whatsnew/3.14.html): "the default
# start method for multiprocessing and ProcessPoolExecutor switches from fork to forkserver" on platforms
# other than macOS and Windows). The course allows Python ≥ 3.10, so this failure is the default on some
# of your machines. The next cell uses the start method this Python actually uses if it is `spawn` or
# `forkserver`, and forces `spawn` otherwise:

# %%
class NotebookDataset(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor(index)

context = start_method if start_method in ("spawn", "forkserver") else "spawn"
print(f"Python {sys.version_info.major}.{sys.version_info.minor} starts workers with {start_method!r} by "
      f"default; reproducing with {context!r}" + (" (forced)" if context != start_method else ""))
with capture_process_output() as terminal, expect_error(RuntimeError, match="exited unexpectedly"):
    for batch in DataLoader(NotebookDataset(), batch_size=4, num_workers=1, multiprocessing_context=context):
        pass

# %% [markdown]
# The exception itself only says *exited unexpectedly*: the worker died before it could send its error
# back. Its traceback went to its standard error, and where that shows up depends on your setup. On Linux
# and macOS a recent `ipykernel` forwards what child processes write there into the running cell, as a red
# block above the exception; on Windows (and in some other front ends) it appears only in the **terminal
# or log of the Jupyter server**. Look there when a worker dies. This cell caught it with
# `capture_process_output`, so the stored notebook shows no red block; its last line is printed below. (A
# `forkserver` worker writes where the fork server writes, which that redirect cannot reach.)
#
# The usual first move for a failing worker is `num_workers=0`: `__getitem__` then runs in the notebook,
# where a traceback shows in full. Here it simply works, and that is the clue: the failure is in getting
# the dataset *into* a worker. What a `spawn` or `forkserver` worker does first is unpickle the dataset in
# a fresh Python; do that by hand and the real error appears in the notebook:

# %%
in_main_process = [batch.tolist() for batch in DataLoader(NotebookDataset(), batch_size=4, num_workers=0)]
print("num_workers=0:", in_main_process, "- no worker, nothing pickled, no error")

fresh_python = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.load(sys.stdin.buffer)"],
                              input=pickle.dumps(NotebookDataset()), capture_output=True)
unpickling_error = fresh_python.stderr.decode().strip().splitlines()[-1]
print("a fresh Python unpickling the dataset:", unpickling_error)
print("the worker's own error (stderr):      ", terminal.last_line or "(written where the fork server writes)")
assert in_main_process == [[0, 1, 2, 3], [4, 5, 6, 7]]
assert "Can't get attribute 'NotebookDataset'" in unpickling_error
if context == "spawn":           # a spawned worker inherits this cell's redirected stderr
    assert "Can't get attribute 'NotebookDataset'" in terminal.last_line

# %% [markdown]
# The fix: put the dataset class in an importable module (the course keeps its own in `course_utils.data`;
# PyTorch's `TensorDataset` lives in `torch.utils.data`). In a **script**, also guard the training code with
# `if __name__ == "__main__":` — each spawned worker imports your script, and without the guard it would
# start training (and more workers) itself.

# %%
loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=1, multiprocessing_context=context)
batches = [values for (values,) in loader]
assert len(batches) == 2 and batches[1].tolist() == [4, 5, 6, 7]
print(f"a {context!r} worker delivered", len(batches), "batches of an importable dataset class")

# %% [markdown]
# ### Training is slow: is the GPU busy?
#
# When training is slow, ask first whether the GPU (on this CPU machine: the model's computation) is busy.
# If it waits for data, the run is **data-bound**: a faster GPU, mixed precision or a smaller model change
# nothing, and more workers (where cores are idle) or cheaper preprocessing do. If it is busy, the run is
# **compute-bound** and the loader is not the problem. `torch.profiler` tells them apart: the DataLoader
# marks every `__next__` as a profiler event (`enumerate(DataLoader)#...__next__`), and a
# `record_function` around the step marks the model's work. The same model, fed by two loaders: one that
# renders and augments every image in the training process, one that hands out images of the same
# size already in memory. On a CPU the model runs on one thread here, like the loader: with two threads each op waits
# at a barrier whenever another program holds a core, and the profile would measure that load rather than
# the loader.

# %%
# the profiler's library (kineto) logs each start and stop at its level 5 ("USDT", kineto/ILoggerObserver.h);
# it reads KINETO_LOG_LEVEL when the profiler first starts, and 6 silences that log
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
seed_everything(0)
rendering = SyntheticImages(n=96, work=64, seed=4)
ready_made = TensorDataset(torch.randn(96, 3, 32, 32), torch.randint(0, 10, (96,)))   # already in memory
model = SmallConvNet().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])

def profiled_epoch(loader):
    with profile(activities=activities) as prof:
        for images, labels in loader:
            with record_function("train step"):
                images, labels = images.to(device), labels.to(device)
                optimizer.zero_grad()
                loss_fn(model(images), labels).backward()
                optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return prof

profiled_epoch(DataLoader(ready_made, batch_size=32))   # warm-up: a device's first steps also initialise it
data_share = {}
for name, dataset in [("rendering loader", rendering), ("ready-made tensors", ready_made)]:
    with torch_threads(1 if device.type == "cpu" else torch.get_num_threads()):   # see the text above
        events = profiled_epoch(DataLoader(dataset, batch_size=32)).key_averages()
    # every DataLoader __next__ runs in record_function("enumerate(DataLoader)#<its iterator class>.__next__")
    waiting = sum(e.cpu_time_total for e in events if e.key.startswith("enumerate(DataLoader)")) / 1000
    computing = sum(e.cpu_time_total for e in events if e.key == "train step") / 1000
    data_share[name] = waiting / (waiting + computing)
    print(f"{name:19} in the loader's __next__: {waiting:5.0f} ms, in the train steps: {computing:4.0f} ms "
          f"-> {data_share[name]:.0%} of the time waiting for data")
    if name == "rendering loader":
        print(events.table(sort_by="cpu_time_total", row_limit=3, max_name_column_width=60))
assert data_share["rendering loader"] > 0.5                                     # data-bound
# then not: on a GPU this small model's step is mostly kernel launches, as quick as the loader's own Python
assert data_share["ready-made tensors"] < (0.5 if device.type == "cpu" else data_share["rendering loader"])

# %% [markdown]
# On a GPU, the GPU itself answers the question: `torch.cuda.utilization()` (the same number as the
# *GPU-Util* column of `nvidia-smi`; it needs the `nvidia-ml-py` package) is the percentage of time over
# the driver's last sample period (1/6 s to 1 s) in which a kernel was running. Read it while the loop
# runs; a data-bound run shows a low number. (Small models like this one can leave a GPU idle with any
# loader: then the time goes into launching kernels, which the profiler shows too.)

# %%
def gpu_utilization_percent():
    """What nvidia-smi reports as GPU-Util, for the current GPU."""
    try:
        return torch.cuda.utilization(device)                         # needs nvidia-ml-py
    except ModuleNotFoundError:
        query = ["nvidia-smi", f"--id={torch.cuda.current_device()}", "--query-gpu=utilization.gpu",
                 "--format=csv,noheader,nounits"]
        return int(subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip())

if device.type == "cuda":
    for name, dataset in [("rendering loader", rendering), ("ready-made tensors", ready_made)]:
        loader, started = DataLoader(dataset, batch_size=32, shuffle=True), time.perf_counter()
        while time.perf_counter() - started < 2.0:                    # train for 2 s, then ask the GPU
            for images, labels in loader:
                optimizer.zero_grad()
                loss_fn(model(images.to(device)), labels.to(device)).backward()
                optimizer.step()
        busy = gpu_utilization_percent()
        print(f"{name:19} GPU busy {busy:3d} % of the last sample period ({torch.cuda.get_device_name()})")
        assert 0 <= busy <= 100
else:
    print("CPU only: there is no GPU to ask, so no torch.cuda.utilization() or nvidia-smi reading here. "
          f"The CPU counterpart is the profiler above: the rendering loader kept the model waiting "
          f"{data_share['rendering loader']:.0%} of the time, the ready-made tensors "
          f"{data_share['ready-made tensors']:.0%}")

# %% [markdown]
# ## 2. `pin_memory` and `non_blocking`
#
# The official tutorial [A guide on good usage of `non_blocking` and `pin_memory()` in
# PyTorch](https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html) makes three points:
#
# - A copy from ordinary (pageable) host memory to a GPU goes through a page-locked ("pinned") staging
#   buffer; a copy from memory that is already pinned skips that step and can be asynchronous.
# - **Pinning is itself a copy** into a newly allocated page-locked buffer, and it blocks. So
#   `tensor.pin_memory().to(device)` written right before the copy usually costs *more* than a plain
#   `tensor.to(device)`; the tutorial measures `pin_memory().to(device, non_blocking=True)` at up to twice
#   as slow.
# - It pays when the pinning happens *off the critical path*: with `num_workers > 0`,
#   `DataLoader(..., pin_memory=True)` pins each batch in a background thread while your model trains (with
#   `num_workers=0` it pins in the training process itself, on the critical path), and `batch.to(device, non_blocking=True)` then
#   lets the copy overlap with work the CPU queues next.
#
# On a GPU, timing the first point takes a few lines of `torch.utils.benchmark` (it warms up, repeats and
# reports the median; each statement ends with `torch.cuda.synchronize()` so the copy is really finished).
# On a CPU there is no device to copy to, so there is nothing to time: the honest counterpart is what
# PyTorch itself says when you ask a loader to pin.

# %%
if device.type == "cuda":
    batch = torch.randn(16 * 2**20)                         # 64 MiB of float32, in ordinary (pageable) memory

    def copy_ms(statement):
        timer = benchmark.Timer(f"{statement}; torch.cuda.synchronize()",
                                globals={"batch": batch, "device": device, "torch": torch})
        return timer.blocked_autorange(min_run_time=0.3).median * 1000

    plain, pin_then_copy = copy_ms("batch.to(device)"), copy_ms("batch.pin_memory().to(device)")
    print(hardware_summary())
    print(f"batch.to(device):              {plain:6.2f} ms per 64 MiB\n"
          f"batch.pin_memory().to(device): {pin_then_copy:6.2f} ms per 64 MiB ({pin_then_copy / plain:.2f}x)")
    print("pinning by hand " + ("made the copy slower here, as the tutorial found" if pin_then_copy > plain
                                else "did not cost more than the plain copy on this host (it usually does)"))
else:
    print("CPU only: there is no device to copy to, so there is nothing to pin for. PyTorch says so:")
    with expect_warning(UserWarning, match="pin_memory"):
        next(iter(DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2, pin_memory=True)))

# %% [markdown]
# Whether pinning by hand loses depends on the host (memory bandwidth, and whether PyTorch's cache of
# pinned blocks already holds one of the right size), so the cell reports it rather than asserting it.
# `compare_pinned_copy` is that measurement, hardened: all four ways, plus the one thing a synchronised
# timing cannot show. `pinned.to(device, non_blocking=True)` does **not** copy faster than
# `pinned.to(device)` (both rows wait for the copy to finish); what changes is that the call **returns
# before the copy is done**, so the CPU can go on (queue the forward pass, fetch the next batch) while the
# copy runs. The last row times only the call:

# %%
if device.type == "cuda":
    times = compare_pinned_copy(64 * 2**20, device)
    for name, ms in times.items():
        print(f"{name:32} {ms:7.3f} ms")
    ratio = times['pageable'] / times['pinned']
    print(f"copying from pinned memory was {ratio:.1f}x as fast as from pageable memory here"
          + ("; that is typical of GPUs on PCIe" if ratio > 1.3 else
             ": no clear gain on this host (the gap shrinks where CPU and GPU share coherent memory)"))
    assert times["non_blocking call returns after"] < 0.5 * times["pinned"]   # the CPU was free during the copy
else:
    print("CPU only: no copy to a device takes place, so there is no copy to time or to overlap; "
          "compare_pinned_copy needs a CUDA GPU")

# %% [markdown]
# Where pinning belongs, in the loop you write: the **loader** pins (`pin_memory=True`, in a background
# thread, while the model computes), and the copy is `non_blocking`. The model's kernels run after the copy
# on the same CUDA stream, so using `images` right away is safe. The same code runs on a CPU with both
# switched off (there, `.to(device)` returns the very same tensor: nothing is copied):

# %%
on_gpu = device.type == "cuda"
loader = DataLoader(SyntheticImages(n=128, work=4, seed=3), batch_size=32, num_workers=2, pin_memory=on_gpu)
model = SmallConvNet().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
for host_images, host_labels in loader:
    images = host_images.to(device, non_blocking=on_gpu)    # returns at once from pinned memory on a GPU
    labels = host_labels.to(device, non_blocking=on_gpu)
    optimizer.zero_grad()
    loss_fn(model(images), labels).backward()
    optimizer.step()
print(f"on {device.type}: the loader's batches were pinned: {host_images.is_pinned()}; "
      f".to(device) made a copy: {images is not host_images}")
assert host_images.is_pinned() == on_gpu and (images is not host_images) == on_gpu

# %% [markdown]
# ## 3. `drop_last` and BatchNorm
#
# BatchNorm in training mode normalises with the statistics of the current batch. A batch of **one**
# sample has no spread to measure. 33 samples with `batch_size=32` leave a last batch of exactly 1. The
# training step here is the usual three lines (section 6 takes it apart):

# %%
features = torch.randn(33, 8)
targets = features.sum(dim=1, keepdim=True)
data_of_33 = TensorDataset(features, targets)
loss_fn = nn.MSELoss()

def make_bn_model():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

model = make_bn_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(data_of_33, batch_size=32, drop_last=False)      # the last batch holds 1 sample
with expect_error(ValueError, match="Expected more than 1 value per channel when training"):
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

# %% [markdown]
# Fix: `drop_last=True` for **training** (one sample less this epoch; with shuffling a different one each
# epoch), `drop_last=False` for **validation**, where every sample must count and the model is in `eval()`
# mode (running statistics, any batch size works). The validation batches then differ in size, so weight
# each batch's mean loss by its number of samples: a plain mean of the batch losses would give the lone
# 33rd sample as much weight as the other 32 together.

# %%
train_loader = DataLoader(data_of_33, batch_size=32, shuffle=True, drop_last=True)
val_loader = DataLoader(data_of_33, batch_size=32, drop_last=False)
for x, y in train_loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
model.eval()
with torch.inference_mode():
    val_losses = [(loss_fn(model(x), y).item(), len(x)) for x, y in val_loader]
    all_at_once = loss_fn(model(features), targets).item()
weighted = sum(loss * n for loss, n in val_losses) / sum(n for _, n in val_losses)
plain_mean = sum(loss for loss, _ in val_losses) / len(val_losses)
print(f"training: {len(train_loader)} batch of 32 per epoch; validation: batches of {[n for _, n in val_losses]}")
print(f"validation loss weighted by batch size {weighted:.4f}, all 33 samples at once {all_at_once:.4f}, "
      f"plain mean of the batch losses {plain_mean:.4f}")
assert len(train_loader) == 1 and [n for _, n in val_losses] == [32, 1]
assert abs(weighted - all_at_once) < 1e-5 * all_at_once    # eval(): batching changes nothing once weighted

# %% [markdown]
# The crash is the loud case. The quiet one is a last batch of **two or three** samples: no error, but
# BatchNorm folds that batch's mean and variance into its **running statistics** (`momentum=0.1`, so the
# last batch of an epoch weighs 10 %), and the mean of 2 samples is a poor estimate. Those running
# statistics are what the model uses at evaluation. 130 samples with `batch_size=32` leave a last batch of
# 2; we pass the data through a BatchNorm layer for 30 epochs and, after each, compare its running
# statistics with the true statistics of the data:

# %%
seed_everything(0)
data_of_130 = torch.randn(130, 8) * 2 + 3
true_mean, true_var = data_of_130.mean(dim=0), data_of_130.var(dim=0)

def running_stat_errors(drop_last, epochs=30):
    """Mean |running_mean - mean| and |running_var / var - 1| after each epoch (first 5 epochs skipped)."""
    torch.manual_seed(1)
    bn = nn.BatchNorm1d(8)
    loader = DataLoader(TensorDataset(data_of_130), batch_size=32, shuffle=True, drop_last=drop_last)
    mean_errors, var_errors = [], []
    for epoch in range(epochs):
        for (x,) in loader:
            bn(x)                      # training mode: updates running_mean and running_var
        if epoch >= 5:
            mean_errors.append((bn.running_mean - true_mean).abs().mean().item())
            var_errors.append((bn.running_var / true_var - 1).abs().mean().item())
    return sum(mean_errors) / len(mean_errors), sum(var_errors) / len(var_errors)

noisy = running_stat_errors(drop_last=False)
clean = running_stat_errors(drop_last=True)
print(f"drop_last=False (last batch of 2): running mean off by {noisy[0]:.3f}, running variance off by {noisy[1]:.0%}")
print(f"drop_last=True:                    running mean off by {clean[0]:.3f}, running variance off by {clean[1]:.0%}")
assert noisy[0] > 2 * clean[0] and noisy[1] > 2 * clean[1]    # averaged over 25 epochs (20 seeds tried: 3x at worst)


# %% [markdown]
# ### Samples of different sizes in one batch
#
# The default `collate_fn` stacks the samples of a batch with `torch.stack`, so every sample must have the
# same shape. One image that was never resized fails the first batch that contains it. The message names
# two shapes and their positions **in the batch** ("entry"), not in the dataset, and it blames whichever
# sample differs from the batch's first one:

# %%
sizes = [(3, 32, 32), (3, 32, 32), (3, 28, 28), (3, 32, 32)]          # the third image was never resized
images_of_two_sizes = [torch.rand(*size) for size in sizes]
with expect_error(RuntimeError, match=r"stack expects each tensor to be equal size, but got \[3, 32, 32\] at "
                                      r"entry 0 and \[3, 28, 28\] at entry 2"):
    next(iter(DataLoader(images_of_two_sizes, batch_size=4)))
shapes = collections.Counter(tuple(image.shape) for image in images_of_two_sizes)   # the diagnosis: all shapes
print("shapes in the dataset:", dict(shapes))
assert len(shapes) == 2

# %% [markdown]
# The fix belongs in the Dataset: bring every sample to one size in `__getitem__` (here with
# `interpolate`, which wants a batch dimension, hence `[None]` and `[0]`; with torchvision, a `Resize`
# transform). Where sizes must differ, as sequences of words do, a `collate_fn` pads the batch instead and
# returns the true lengths beside it:

# %%
class ResizedImages(Dataset):
    def __init__(self, images, size=(32, 32)):
        self.images, self.size = images, size

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):                                  # (3, H, W) -> (3, 32, 32)
        return nn.functional.interpolate(self.images[i][None], size=self.size, mode="bilinear",
                                         antialias=True)[0]

one_batch = next(iter(DataLoader(ResizedImages(images_of_two_sizes), batch_size=4)))

def pad_collate(batch):
    """Sequences of different lengths -> (N, longest) padded with 0, and each sequence's length."""
    return nn.utils.rnn.pad_sequence(batch, batch_first=True), torch.tensor([len(s) for s in batch])

sequences = [torch.arange(1, n + 1) for n in (5, 2, 4)]
padded, lengths = next(iter(DataLoader(sequences, batch_size=3, collate_fn=pad_collate)))
print("images:", tuple(one_batch.shape), "| sequences:", tuple(padded.shape), "lengths", lengths.tolist())
assert one_batch.shape == (4, 3, 32, 32) and padded.shape == (3, 5) and lengths.tolist() == [5, 2, 4]
assert padded[1].tolist() == [1, 2, 0, 0, 0]

# %% [markdown]
# ## 4. Layers in a plain Python list, a tensor that should be a buffer
#
# `nn.Module` finds sub-modules, parameters and buffers through attribute assignment. A plain `list`
# hides layers, and a plain tensor attribute is neither a parameter nor a buffer. Look at what PyTorch
# sees, by hand:

# %%
class BadModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(10, 10) for _ in range(3)]   # a plain list: invisible to PyTorch
        self.head = nn.Linear(10, 1)
        self.offset = torch.zeros(10)                          # a plain tensor: not a buffer

    def forward(self, x):
        x = x - self.offset
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)

model = BadModel()
print("named_children():  ", [name for name, _ in model.named_children()])
print("named_parameters():", [name for name, _ in model.named_parameters()])
print("state_dict() keys: ", list(model.state_dict()))
counted = sum(p.numel() for p in model.parameters())
print(f"parameters counted: {counted}; the four Linear layers hold {3 * (10 * 10 + 10) + 10 + 1}")
assert [name for name, _ in model.named_children()] == ["head"] and counted == 11
assert "offset" not in model.state_dict()

# %% [markdown]
# Not in `parameters()` means the optimizer never updates those layers; not in `state_dict()` means they
# are not saved; and `.to()` does not move them. `.to(device)` and `.to(dtype)` walk the same registered
# tensors, so a dtype shows it on any machine:

# %%
model.to(device, torch.float64)
for name, tensor in [("head.weight", model.head.weight), ("layers[0].weight", model.layers[0].weight),
                     ("offset", model.offset)]:
    print(f"{name:17} {tensor.dtype}  {tensor.device}")
assert model.head.weight.dtype == torch.float64
assert model.layers[0].weight.dtype == model.offset.dtype == torch.float32     # left behind

# %%
model = BadModel()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 10), torch.randn(64, 1)
first_layer, head = model.layers[0].weight.detach().clone(), model.head.weight.detach().clone()
for _ in range(20):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
print("after 20 steps: layers[0] changed:", not torch.equal(model.layers[0].weight, first_layer),
      "| head changed:", not torch.equal(model.head.weight, head))
assert torch.equal(model.layers[0].weight, first_layer) and not torch.equal(model.head.weight, head)

# %% [markdown]
# With **every** layer in the plain list, the optimizer gets nothing at all, and says so at once. That error
# is the lucky case of this bug:

# %%
class AllInAList(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1)]   # every layer unregistered

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

with expect_error(ValueError, match="optimizer got an empty parameter list"):
    torch.optim.SGD(AllInAList().parameters(), lr=0.1)
registered = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1))     # the fix: registered layers
registered_optimizer = torch.optim.SGD(registered.parameters(), lr=0.1)
print("nn.Sequential: the optimizer holds", len(registered_optimizer.param_groups[0]["params"]), "tensors")
assert len(registered_optimizer.param_groups[0]["params"]) == 4

# %% [markdown]
# Registration happens in `nn.Module.__setattr__`, which needs the bookkeeping `super().__init__()` sets
# up. A layer assigned before that call is refused:

# %%
class InitTooLate(nn.Module):
    def __init__(self):
        self.head = nn.Linear(10, 1)           # before super().__init__()
        super().__init__()

with expect_error(AttributeError, match=r"cannot assign module before Module.__init__\(\) call"):
    InitTooLate()


class InitFirst(nn.Module):
    def __init__(self):
        super().__init__()                     # the first line of every __init__
        self.head = nn.Linear(10, 1)

print("super().__init__() first:", [name for name, _ in InitFirst().named_parameters()])
assert [name for name, _ in InitFirst().named_parameters()] == ["head.weight", "head.bias"]

# %% [markdown]
# `find_unregistered_modules` is that inspection as a diagnostic: it walks every attribute of the model
# and its children (lists, tuples and dicts too) and names what PyTorch does not see. `snapshot` and
# `unchanged` are the clone-and-compare above for every parameter at once, unregistered ones included.

# %%
print("find_unregistered_modules:", find_unregistered_modules(model))
assert find_unregistered_modules(model) == ["layers.0", "layers.1", "layers.2", "offset"]
before = snapshot(model)
for _ in range(20):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
assert unchanged(model, before, names=["layers"])       # 20 more steps, not one change
assert not unchanged(model, before, names=["head"])     # only the head learned


# %%
class FixedModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(10, 10) for _ in range(3))   # registered
        self.head = nn.Linear(10, 1)
        self.register_buffer("offset", torch.zeros(10))                    # saved and moved, never trained

    forward = BadModel.forward                                             # the same computation

model = FixedModel()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
before = snapshot(model)
for _ in range(20):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
assert find_unregistered_modules(model) == []
assert "offset" in model.state_dict() and sum(p.numel() for p in model.parameters()) == 341
assert not unchanged(model, before, names=["layers.0", "layers.1", "layers.2"])
print("parameters():", len(list(model.parameters())), "tensors; every layer trained; offset in state_dict()")


# %% [markdown]
# A layer **created inside `forward`** is worse: new random weights on every call, never trained, never
# saved. The plain symptom: in `eval()` mode (no dropout, nothing random left) the same input gives
# different outputs on two calls, and the layer is in no listing of the model:

# %%
class BuildsHeadInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(10, 10)

    def forward(self, x):
        head = nn.Linear(10, 1)          # a fresh, untrained layer on every call
        return head(self.body(x))

suspect = BuildsHeadInForward().eval()
probe = torch.randn(2, 10)
with torch.no_grad():
    first_call, second_call = suspect(probe), suspect(probe)
print("same input, eval(): outputs equal on two calls?", torch.equal(first_call, second_call))
print("named_modules():", [name or "(the model)" for name, _ in suspect.named_modules()])
assert not torch.equal(first_call, second_call)
assert [name for name, _ in suspect.named_modules()] == ["", "body"]

# %% [markdown]
# No attribute scan can see that layer: it exists only while `forward` runs. Give
# `find_unregistered_modules` an example input and it also watches one forward pass (a global forward
# pre-hook records every module that runs) and names the stranger:

# %%
print("attribute scan:", find_unregistered_modules(suspect))
print("with a forward pass:", find_unregistered_modules(suspect, probe))
assert find_unregistered_modules(suspect) == []
assert find_unregistered_modules(suspect, probe) == ["<forward>:Linear"]


# %% [markdown]
# ## 5. A bloated `forward`
#
# A `forward` that grows a branch per experiment, with in-place edits in between, is hard to read and
# easy to break. Put the stable stack in `nn.Sequential` and the part that varies in small methods.
# (The two `relu_()` calls below happen to be safe: they edit the output of a Linear layer, which autograd
# does not keep. The next cell shows an edit that is not.)

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


# %% [markdown]
# Autograd keeps some tensors of the forward pass for `backward()`: a Linear layer keeps its input,
# `sigmoid` its output. Edit a kept tensor in place and the forward pass still runs; `backward()` fails.
# One "memory-saving" `mul_` added to the bloated `forward`:

# %%
class BloatedScaled(Bloated):
    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))         # sigmoid keeps its output for backward
        h.mul_(2)                              # in-place edit of that output
        return self.fc3(self.fc2(self.norm(h)).mean(dim=1))

out = BloatedScaled()(torch.randn(5, 7, 8))
print("the forward pass ran:", tuple(out.shape))
with expect_error(RuntimeError, match="modified by an inplace operation"):
    out.sum().backward()

# %% [markdown]
# The fix is `h = h * 2` (a new tensor). The refactored model has no in-place edits at all, and from the
# same weights it computes exactly what the bloated one does, in every configuration:

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
# The signature of `forward` is the model's interface. `model(...)` hands every argument to `forward`
# unchanged, so a caller that passes what `forward` does not declare (a mask, labels, a flag of another
# version of the model) fails at the call:

# %%
model = Refactored()
with expect_error(TypeError, match=r"forward\(\) got an unexpected keyword argument 'mask'"):
    model(torch.randn(5, 7, 8), mask=torch.ones(5, 7))
print("what forward takes:", inspect.signature(model.forward))

# %% [markdown]
# Either the caller passes only what `forward` declares, or `forward` declares the new input. A mask over
# the time steps, with a default, so old calls still work:

# %%
class Masked(Refactored):
    def forward(self, x, mask=None):          # x: (N, T, 8), mask: (N, T) of 0/1, 1 = a real step
        h = self.block(self.stem(x))          # (N, T, 32)
        if mask is None:
            return self.fc3(self.pool_time(h))
        mask = mask.unsqueeze(-1)             # (N, T, 1)
        return self.fc3((h * mask).sum(dim=1) / mask.sum(dim=1))     # the mean over real steps only

masked = Masked()
x, mask = torch.randn(5, 7, 8), torch.ones(5, 7)
mask[:, 4:] = 0                               # the last 3 steps are padding
assert torch.allclose(masked(x, mask=torch.ones(5, 7)), masked(x), atol=1e-6)   # all ones: the plain mean
assert not torch.allclose(masked(x, mask=mask), masked(x))                        # the padding no longer counts
assert torch.allclose(masked(x, mask=mask), masked(x[:, :4]), atol=1e-6)         # = the mean of the 4 real steps
print("forward(x, mask) takes the mask; an all-ones mask gives the plain mean")

# %% [markdown]
# ### The shapes a layer expects
#
# Each layer checks its input and names what it wanted. `nn.Conv2d` wants `(N, C, H, W)` with
# `C == in_channels` (one image `(C, H, W)` is accepted too); `nn.Linear` wants the last dimension equal to
# `in_features`. Two common ways to get it wrong: images in channels-last order `(N, H, W, C)`, as PIL and
# NumPy give them, and a 5-D tensor from stacking batches that were already batched:

# %%
conv = nn.Conv2d(3, 8, kernel_size=3)                      # in_channels=3: RGB
images_hwc = torch.rand(4, 32, 32, 3)                       # (N, H, W, C): channels last
with expect_error(RuntimeError, match=r"expected input\[4, 32, 32, 3\] to have 3 channels, but got 32 channels"):
    conv(images_hwc)
with expect_error(RuntimeError, match=r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d"):
    conv(torch.stack([images_hwc.permute(0, 3, 1, 2)] * 2))   # a batch of batches: (2, 4, 3, 32, 32)

# %% [markdown]
# The fix: move the channels to dimension 1 once, where the data enters, and write the shapes down in
# comments as `Refactored` does.

# %%
images = images_hwc.permute(0, 3, 1, 2)                     # (N, C, H, W) = (4, 3, 32, 32)
features = conv(images)                                     # (4, 8, 30, 30): 3x3 kernel, no padding
print("permute(0, 3, 1, 2):", tuple(images.shape), "->", tuple(features.shape))
assert features.shape == (4, 8, 30, 30)

# %% [markdown]
# `nn.Linear` checks the last dimension only. After the convolution, `flatten(1)` keeps the batch dimension
# and joins the rest; the head must be sized for the product, 8 × 30 × 30:

# %%
head = nn.Linear(8 * 28 * 28, 10)                          # sized for another input: 28 x 28
with expect_error(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(4x7200 and 6272x10\)"):
    head(features.flatten(1))                               # (4, 7200)
head = nn.Linear(8 * 30 * 30, 10)                          # the fix: in_features from the real shape
print("flatten(1):", tuple(features.flatten(1).shape), "-> head ->", tuple(head(features.flatten(1)).shape))
assert head(features.flatten(1)).shape == (4, 10)

# %% [markdown]
# ## 6. The training step, written out
#
# Every step does six things: forget the previous gradients, forward, loss, backward, clip, update. Here
# they come in the usual order; "The rule behind the order" below shows which other orders are just as
# right, and why. `nn.utils.clip_grad_norm_` rescales all gradients together so that their global
# norm is at most `max_norm`, and **returns the norm they had before clipping**: log it, it is the first
# thing to look at when a loss spikes. Pick `max_norm` above the norms your run usually has, so that it only
# catches spikes; the small `max_norm` below clips almost every step, which makes it a smaller learning rate
# in disguise (the printout shows it). Two epochs on 256 synthetic images (the loader reshuffles, and
# re-augments, every epoch):

# %%
seed_everything(0)
image_loader = DataLoader(SyntheticImages(n=256, work=4, seed=1), batch_size=32, shuffle=True)
model = SmallConvNet().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
max_norm = 0.5

losses = []
for epoch in range(2):
    for images, labels in image_loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()                                   # 1. forget the previous batch's gradients
        loss = loss_fn(model(images), labels)                   # 2.-3. forward and loss
        loss.backward()                                         # 4. this batch's gradients
        total_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)   # 5. clip, before the update
        optimizer.step()                                        # 6. update
        losses.append(loss.item())                              # a float: keeps no graph alive
        step = len(losses) - 1
        if step % 3 == 0 or step == 15:
            print(f"step {step:2d}  loss {loss.item():.3f}  gradient norm {total_norm.item():.2f}"
                  + (f" -> clipped to {max_norm}" if total_norm > max_norm else ""))
first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
print(f"mean loss of the first 4 steps {first:.3f}, of the last 4 steps {last:.3f}")
assert last < 0.85 * first

# %% [markdown]
# Orders that look plausible and go wrong. **`zero_grad()` between `backward()` and `step()`** wipes the
# gradients just computed. By default `zero_grad` sets them to `None`, and optimizers skip parameters
# without a gradient, so nothing moves. With `zero_grad(set_to_none=False)` they are zeros instead, and an
# optimizer with state (this SGD's momentum, Adam's moving averages) still moves the weights, with no
# gradient of this batch in it:

# %%
cpu_batch = next(iter(image_loader))                        # one batch, kept for the cells below
images, labels = (t.to(device) for t in cpu_batch)

def weights_moved(set_to_none):
    """One step with zero_grad between backward and step; did any weight change?"""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    loss_fn(model(images), labels).backward()
    optimizer.zero_grad(set_to_none=set_to_none)            # WRONG PLACE: wipes the gradients just computed
    optimizer.step()
    return not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))

moved_none, moved_zeros = weights_moved(set_to_none=True), weights_moved(set_to_none=False)
print("zero_grad between backward and step -> any weight moved:", moved_none)
print("the same with zero_grad(set_to_none=False) and momentum -> any weight moved:", moved_zeros)
assert not moved_none and moved_zeros

# %% [markdown]
# **`step()` before `backward()`**: with `zero_grad()` first there is no gradient yet, so `step()` does
# nothing and the model never learns. Without it, the gradients of the previous batch are still there:
# `step()` updates the weights **in place** with them, and `backward()` then finds that weights its graph
# kept for the backward pass have changed. That raises the error section 5 showed:

# %%
before = [p.detach().clone() for p in model.parameters()]
optimizer.zero_grad()
loss = loss_fn(model(images), labels)
optimizer.step()                 # WRONG PLACE: no gradient yet, nothing happens
loss.backward()
moved = not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
print("zero_grad, step, backward -> any weight moved:", moved)
assert not moved

loss = loss_fn(model(images), labels)    # no zero_grad: the gradients of the previous backward are still there
with expect_error(RuntimeError, match="modified by an inplace operation"):
    optimizer.step()             # WRONG PLACE: updates the weights in place...
    loss.backward()              # ...that this graph kept for its backward pass

# %% [markdown]
# ### The rule behind the order
#
# Each wrong order above breaks one of two rules, and any order that keeps both is right:
#
# 1. **The gradients are cleared before the next `backward()`**, because `backward()` adds into `.grad`.
# 2. **`step()` comes after the `backward()` whose gradients it should use** (and, as the error above
#    showed, not between a forward pass and its backward).
#
# So `zero_grad` need not come first: clearing at the end of each step, ready for the next one, keeps both
# rules too; never clearing breaks rule 1. Three runs of five steps from the same start on the same
# batches, with momentum (on the CPU, where these kernels are deterministic, so that the weights can be
# compared bit for bit):

# %%
seed_everything(0)
order_batches = [(torch.randn(16, 10), torch.randn(16, 1)) for _ in range(5)]
order_start = mlp([10, 32, 1]).state_dict()

def train_in_order(order):
    """Five SGD steps from `order_start` in the given order; returns all the weights, flattened."""
    model = mlp([10, 32, 1])
    model.load_state_dict(order_start)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in order_batches:
        if order == "zero_grad, forward, backward, step":
            optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if order == "forward, backward, step, zero_grad":
            optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])

orders = ["zero_grad, forward, backward, step", "forward, backward, step, zero_grad",
          "forward, backward, step (never cleared)"]
weights = {order: train_in_order(order) for order in orders}
for order, w in weights.items():
    print(f"{order:40} bit-identical to the first: {torch.equal(w, weights[orders[0]])!s:5}  "
          f"largest difference {(w - weights[orders[0]]).abs().max():.2e}")
assert torch.equal(weights[orders[0]], weights[orders[1]])          # both rules kept: the same weights, bit for bit
assert not torch.allclose(weights[orders[0]], weights[orders[2]])   # rule 1 broken: other weights

# %% [markdown]
# A learning-rate scheduler adds one more rule: **`scheduler.step()` after `optimizer.step()`**. Called
# before it, the schedule is shifted: its first learning rate is never used. Three steps of a schedule that
# halves the rate at every `scheduler.step()` (stepped once per batch here to keep it short; `StepLR` is
# usually stepped once per epoch, and then the whole first epoch's rate is the one skipped), in both orders:

# %%
def learning_rates_used(scheduler_first):
    """The learning rate of each of three SGD steps with StepLR(gamma=0.5), and the warnings raised."""
    model = mlp([10, 32, 1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    used = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in order_batches[:3]:
            if scheduler_first:
                scheduler.step()
            nn.functional.mse_loss(model(x), y).backward()
            used.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            optimizer.zero_grad()
            if not scheduler_first:
                scheduler.step()
    return used, [str(w.message) for w in caught if "lr_scheduler" in str(w.message)]

wrong_lrs, wrong_warnings = learning_rates_used(scheduler_first=True)
right_lrs, right_warnings = learning_rates_used(scheduler_first=False)
print("scheduler first:", wrong_lrs, "| warning:", wrong_warnings[0][:76], "...",
      wrong_warnings[0][wrong_warnings[0].index("Failure"):][:95], "...")
print("optimizer first:", right_lrs, "| warnings:", len(right_warnings))
assert wrong_lrs == [0.05, 0.025, 0.0125] and right_lrs == [0.1, 0.05, 0.025]   # the first rate, skipped
assert "before `optimizer.step()`" in wrong_warnings[0] and not right_warnings and len(wrong_warnings) == 1

# %% [markdown]
# PyTorch warns **once**, on the first `scheduler.step()`, and only while `optimizer.step()` has never run;
# after that the shift is silent. The same warning appears, harmlessly, in the right order when a
# `GradScaler` skips the first optimizer step because it found inf gradients (chapter 6).

# %% [markdown]
# **Clipping after `step()`** clips gradients that have already been used: the update is exactly the
# unclipped one. Three fresh copies of the same model take one SGD step each, with a tight `clip_norm`
# of 0.25 so that clipping certainly bites. An SGD update is `-lr * gradient`, so clipping the gradient
# norm to `clip_norm` *before* the step must make the update's norm exactly `lr * clip_norm`. (On a GPU,
# two runs of the same step may differ in the last bits, because cuDNN may use non-deterministic
# algorithms for convolution gradients; there the comparison allows a tolerance far below the effect of
# clipping.)

# %%
lr, clip_norm = 0.2, 0.25

def one_step(clip):
    """The update (new weights - old, flattened) of one SGD step from the same start.
    clip: "no clipping", "before step" or "after step"."""
    seed_everything(0)
    model = SmallConvNet().to(device)
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    loss_fn(model(images), labels).backward()
    if clip == "before step":
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    if clip == "after step":
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)   # WRONG: the update already happened
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - start

updates = {clip: one_step(clip) for clip in ("no clipping", "after step", "before step")}
for clip, update in updates.items():
    print(f"{clip:12} update norm {update.norm():.4f}")
print(f"lr * clip_norm = {lr * clip_norm:.4f}")
if device.type == "cpu":
    assert torch.equal(updates["after step"], updates["no clipping"])        # bit-identical: no effect at all
else:
    assert (updates["after step"] - updates["no clipping"]).norm() < 1e-4 * updates["no clipping"].norm()
assert abs(updates["before step"].norm() - lr * clip_norm) < 0.01 * lr * clip_norm   # before step, it bites
assert updates["no clipping"].norm() > 1.2 * lr * clip_norm                        # (this gradient needed clipping)

# %% [markdown]
# `train_step` is the step you just wrote, hardened: it moves the batch to the model's device (with
# `non_blocking=True` when the loader pinned it, as in section 2), returns the loss as a float, clips after
# unscaling when you pass a `torch.amp.GradScaler` (mixed precision: `scaler.scale(loss).backward()`,
# `scaler.unscale_(optimizer)`, `clip_grad_norm_(...)`, `scaler.step(optimizer)`, `scaler.update()`; the
# gradients must be unscaled before they are clipped, or `max_norm` applies to scaled ones), and says clearly when a batch is not
# an `(inputs, targets)` pair or the model has no registered parameters. From the same start it produces
# the same weights as the hand-written step:

# %%
seed_everything(0)
by_hand = SmallConvNet().to(device)
seed_everything(0)
hardened = SmallConvNet().to(device)
opt_by_hand = torch.optim.SGD(by_hand.parameters(), lr=0.2)
opt_hardened = torch.optim.SGD(hardened.parameters(), lr=0.2)

opt_by_hand.zero_grad()
loss = loss_fn(by_hand(images), labels)
loss.backward()
nn.utils.clip_grad_norm_(by_hand.parameters(), max_norm)
opt_by_hand.step()

loss_hardened = train_step(hardened, cpu_batch, loss_fn, opt_hardened, max_norm=max_norm)  # moves the batch
print(f"loss by hand {loss.item():.6f}, train_step {loss_hardened:.6f}")
assert isinstance(loss_hardened, float) and abs(loss_hardened - loss.item()) <= 1e-6 * loss.item()
for p, q in zip(by_hand.parameters(), hardened.parameters()):
    if device.type == "cpu":
        assert torch.equal(p, q)                             # bit-identical
    else:
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)   # cuDNN may differ in the last bits
print("same weights after one step")

# %% [markdown]
# ## 7. Gradient accumulation
#
# When a batch of 32 does not fit, run 4 micro-batches of 8 and step once. `backward()` **adds** gradients,
# and each micro-batch loss is already a mean over 8 samples, so the sum of 4 of them is 4× too large
# unless each loss is divided by 4. (Two practical points the cells below do not need: if the number of
# batches in an epoch is not a multiple of 4, step or zero the gradients after the last few, or they leak into
# the next epoch; and log `loss.item() * 4`, the micro-batch's real loss.)

# %%
def grads_of(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])

seed_everything(0)
x, y = torch.randn(32, 10), torch.randn(32, 1)
model = mlp([10, 16, 1])
start = {name: tensor.clone() for name, tensor in model.state_dict().items()}    # to restart from here
nn.functional.mse_loss(model(x), y).backward()
big_batch = grads_of(model)

model.zero_grad()
for xb, yb in zip(x.split(8), y.split(8)):
    nn.functional.mse_loss(model(xb), yb).backward()          # WRONG: not divided by 4
wrong = grads_of(model)
print(f"without dividing: gradient {wrong.norm() / big_batch.norm():.2f}x the big batch's")
torch.testing.assert_close(wrong, 4 * big_batch, rtol=1e-4, atol=1e-6)

# %% [markdown]
# The correct version divides each micro-batch loss by the number of micro-batches, and steps (then zeroes)
# once every `k` micro-batches:

# %%
k = 4
model = mlp([10, 16, 1])
model.load_state_dict(start)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i, (xb, yb) in enumerate(zip(x.split(8), y.split(8)), start=1):
    loss = nn.functional.mse_loss(model(xb), yb) / k            # each micro-batch's share
    loss.backward()                                             # gradients add up
    if i % k == 0:
        torch.testing.assert_close(grads_of(model), big_batch, rtol=1e-4, atol=1e-6)   # = one big batch
        optimizer.step()
        optimizer.zero_grad()
print("divided by k: the accumulated gradient equals the big batch's; one step, then zero_grad")

# %% [markdown]
# `train_accumulated` is that loop, hardened: it weights each micro-batch by its share of the samples (so
# unequal micro-batches also add up to the big batch), moves them to the model's device, clips if asked,
# steps once and zeroes. Same start, same weights as the hand-written loop. (With BatchNorm, micro-batches
# see different batch statistics than the big batch, so accumulation is close but not identical there.)

# %%
hardened = mlp([10, 16, 1])
hardened.load_state_dict(start)
train_accumulated(hardened, list(zip(x.split(8), y.split(8))), nn.MSELoss(),
                  torch.optim.SGD(hardened.parameters(), lr=0.1))
for p, q in zip(model.parameters(), hardened.parameters()):
    torch.testing.assert_close(p, q)
print("train_accumulated: the same weights as the hand-written accumulation")

# %% [markdown]
# ## 8. Evaluation: `model.eval()` *and* `inference_mode`
#
# Two different switches, often confused:
#
# - `model.eval()` changes how some **layers compute**: Dropout stops dropping, BatchNorm uses (and stops
#   updating) its running statistics. It does nothing to autograd.
# - `torch.no_grad()` / `torch.inference_mode()` stop **autograd** from recording the graph. They do
#   nothing to Dropout or BatchNorm. `inference_mode` is the faster of the two, at a price: a tensor made
#   under it cannot join a graph later unless cloned outside it ("Inference tensors cannot be saved for
#   backward"), so use `no_grad` when an output may feed training (a target from an EMA teacher, say).
#
# A model with both layers shows each switch alone going wrong. We run it twice on the same inputs:

# %%
seed_everything(0)
net = nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))
inputs = torch.randn(16, 6)

def twice(net):
    """Two forward passes on the same inputs: (same outputs?, running_mean drift, output requires grad?)."""
    running_mean = net[1].running_mean.clone()
    first, second = net(inputs), net(inputs)
    drift = (net[1].running_mean - running_mean).abs().max().item()
    return torch.equal(first, second), drift, first.requires_grad

net.train()
with torch.no_grad():
    no_grad_only = twice(net)
net.eval()
eval_only = twice(net)
with torch.inference_mode():
    both = twice(net)
for name, (same, drift, requires_grad) in [("no_grad, train mode", no_grad_only), ("eval(), grad on", eval_only),
                                           ("eval() + inference_mode", both)]:
    print(f"{name:24} same outputs twice: {same!s:5}  running_mean moved by {drift:.3f}  "
          f"output requires grad: {requires_grad}")
assert not no_grad_only[0] and no_grad_only[1] > 0 and not no_grad_only[2]   # dropout on, BN stats updated
assert eval_only[0] and eval_only[1] == 0 and eval_only[2]                   # layers right, graph recorded
assert both[0] and both[1] == 0 and not both[2]                              # both right

# %% [markdown]
# The price of `inference_mode`, reproduced: features computed once under it (the output of a frozen
# encoder, cached to save time) and then fed to a head that trains. The error comes from the head's
# **forward**, since a Linear layer saves its input for backward:

# %%
encoder, head = nn.Linear(6, 8), nn.Linear(8, 3)
targets = torch.zeros(16, dtype=torch.long)
with torch.inference_mode():
    cached = encoder(inputs)
print("cached is an inference tensor:", cached.is_inference())
with expect_error(RuntimeError, match="Inference tensors cannot be saved for backward"):
    logits = head(cached)                                     # raised here, not in backward()
assert cached.is_inference()

# %% [markdown]
# Two fixes. Where you make the tensor, make it under `no_grad`: an ordinary tensor without a graph. Where
# you receive inference tensors already made (from a library, say), `.clone()` them outside inference
# mode, as the message suggests:

# %%
with torch.no_grad():
    from_no_grad = encoder(inputs)
cloned = cached.clone()                                       # outside inference_mode: an ordinary tensor
for features in (from_no_grad, cloned):
    head.zero_grad()
    nn.functional.cross_entropy(head(features), targets).backward()
    assert not features.is_inference() and head.weight.grad is not None
print("both train the head; the encoder got no gradient:", encoder.weight.grad is None)
assert encoder.weight.grad is None and torch.equal(from_no_grad, cloned)

# %% [markdown]
# What does recording the graph cost? Autograd **keeps every activation it saved for backward alive** as
# long as the output is referenced, and in evaluation nobody calls `backward()`. `saved_activation_bytes`
# counts those bytes (with `torch.autograd.graph.saved_tensors_hooks`) for a small conv net in `eval()` mode.
# We leave out the parameters and the input images (the caller holds those anyway) and compare with the
# size of the images themselves:

# %%
seed_everything(0)
model = SmallConvNet().to(device).eval()
images = torch.randn(64, 3, 32, 32, device=device)
images_mib = images.nbytes / 2**20

kept_with_grad, out = saved_activation_bytes(model, images, exclude=[*model.parameters(), images])
print(f"eval(), grad on: output requires_grad={out.requires_grad}; the graph keeps "
      f"{kept_with_grad / 2**20:.2f} MiB of activations alive, {kept_with_grad / 2**20 / images_mib:.1f}x the "
      f"{images_mib:.2f} MiB of input images")
assert out.requires_grad and kept_with_grad > 2 * images.nbytes     # several activations per image are kept
detached = out.detach()
print(f"out.detach(): grad_fn={detached.grad_fn}, but only afterwards: the forward pass had already recorded "
      f"the graph and saved those {kept_with_grad / 2**20:.2f} MiB")
assert detached.grad_fn is None and out.grad_fn is not None
with torch.inference_mode():
    out = model(images)
print(f"eval() + inference_mode: output requires_grad={out.requires_grad}, grad_fn={out.grad_fn}: no graph, "
      "so nothing is kept for a backward pass")
assert not out.requires_grad and out.grad_fn is None

# %% [markdown]
# `evaluate` is the evaluation loop, hardened: `eval()` and `inference_mode()` together, the loss weighted
# by batch size (a short last batch counts correctly), the batch moved to the model's device, and the model
# put back in the mode it was in. It gives the same loss as the hand-written loop of section 3:

# %%
model = make_bn_model()
model.train()
by_hand = []
model.eval()
with torch.inference_mode():
    for x, y in val_loader:
        by_hand.append((nn.functional.mse_loss(model(x), y).item(), len(x)))
model.train()
hand_loss = sum(l * n for l, n in by_hand) / sum(n for _, n in by_hand)
hardened_loss = evaluate(model, val_loader, nn.MSELoss())
print(f"by hand {hand_loss:.6f}, evaluate {hardened_loss:.6f}; model back in training mode: {model.training}")
assert abs(hand_loss - hardened_loss) < 1e-6 and model.training

# %% [markdown]
# ## 9. Putting it together: `fit`
#
# `fit` runs `train_step` over a loader, steps the scheduler per epoch, evaluates after each epoch with
# `evaluate`, and returns the loss history; later chapters reuse it. By default it shows a progress bar;
# here we turn the bar off and print the history instead, so that the stored notebook reads well on the web.

# %%
seed_everything(0)
train_data, val_data = SyntheticImages(n=512, work=4, seed=1), SyntheticImages(n=256, work=4, seed=2)
train_loader = DataLoader(train_data, batch_size=32, shuffle=True, drop_last=True)
val_loader = DataLoader(val_data, batch_size=64)
model = SmallConvNet().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
loss_fn = nn.CrossEntropyLoss()
untrained = evaluate(model, val_loader, loss_fn)
history = fit(model, train_loader, loss_fn, optimizer, epochs=2, val_loader=val_loader, progress=False)
steps_per_epoch = len(train_loader)
for epoch, val_loss in enumerate(history.val_losses):
    epoch_losses = history.train_losses[epoch * steps_per_epoch:(epoch + 1) * steps_per_epoch]
    print(f"epoch {epoch + 1}: mean train loss {sum(epoch_losses) / len(epoch_losses):.3f}, "
          f"validation loss {val_loss:.3f}")
print(f"validation loss: {untrained:.3f} untrained -> {history.val_losses[-1]:.3f} after 2 epochs")
plot_losses({"train (per step)": history.train_losses}, title="fit on SyntheticImages")
assert history.val_losses[-1] < 0.85 * untrained

# %% [markdown]
# ## 10. Exercises
#
# Each exercise below is **real code with planted bugs** (the text says how many). Fix the code in the
# cell and run it: the check runs your function on its own small, seeded data and prints a verdict that
# says what it *observed* (for example "no weight changed in 24 steps"). Each further failed attempt adds
# one hint, mildest first; none of them is the solution. `progress()` at the end of the notebook shows
# what you have solved.
#
# **Exercise 1 — the training loop (there are 2 bugs).** `train_loop` should train for `epochs` passes
# over `loader` and return the loss of every step as a Python float. The check trains a regression MLP
# with SGD, and a classifier with Adam from a shuffling `DataLoader`, and compares the weights with those
# of a correct loop.

# %%
@exercise
def train_loop(model, loader, loss_fn, optimizer, epochs):
    losses = []
    for _ in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            optimizer.step()
            loss.backward()
            losses.append(loss.item())
    return losses


check_train_loop(train_loop)

# %% [markdown]
# **Exercise 2 — a model PyTorch cannot fully see (there are 2 bugs).** `NormalisedMLP` standardises its
# input with a fixed `mean` and `std` (computed from the training data), then applies an MLP. Every Linear
# layer must be trained and saved; `mean` and `std` must be saved and moved with the model, but they are
# **not parameters** (no optimizer should ever receive them). The check builds it with other layer sizes
# too, and checks that each sample is normalised with the saved `mean` and `std`.

# %%
class NormalisedMLP(nn.Module):
    def __init__(self, sizes, mean, std):
        super().__init__()
        self.hidden = [nn.Linear(a, b) for a, b in zip(sizes[:-2], sizes[1:-1])]
        self.head = nn.Linear(sizes[-2], sizes[-1])
        self.mean = mean
        self.std = std

    def forward(self, x):
        x = (x - self.mean) / self.std
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.head(x)


@exercise
def build_normalised_mlp(sizes, mean, std):
    return NormalisedMLP(sizes, mean, std)


check_build_normalised_mlp(build_normalised_mlp)

# %% [markdown]
# **Exercise 3 — gradient accumulation (there are 2 bugs).** `accumulate_step` should make **one**
# optimizer step from equal-sized micro-batches, with the gradients one big batch would give, feeding the
# model one micro-batch at a time. The check uses other numbers and sizes of micro-batches than section 7.

# %%
@exercise
def accumulate_step(model, micro_batches, loss_fn, optimizer):
    optimizer.zero_grad()
    for inputs, targets in micro_batches:
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()


check_accumulate_step(accumulate_step)

# %% [markdown]
# **Exercise 4 — predictions (there are 2 bugs).** `predict_batches` should return the model's outputs for
# every batch, concatenated, as an evaluation does: the same outputs every time, BatchNorm's statistics
# untouched, no graph recorded while the model runs, and autograd left as it was found. The check runs it
# on an MLP and on a small conv net, both with Dropout and BatchNorm, arriving in training mode, fed batches
# of uneven sizes.

# %%
@exercise
def predict_batches(model, batches):
    outputs = []
    for inputs in batches:
        outputs.append(model(inputs))
    return torch.cat(outputs)


check_predict_batches(predict_batches)

# %% [markdown]
# ## What to remember
# - Compare loaders by timing whole epochs **interleaved** (`compare_speed`), with persistent workers so
#   start-up stays out, and measure idle cores (`psutil.cpu_percent(percpu=True)`) around it: a speed-up
#   from workers needs idle cores, and when the spreads overlap the honest answer is "cannot tell". CPU
#   time (`time.process_time()`, `psutil`) shows where the work ran, whatever the load.
# - Without `persistent_workers=True` the workers are new processes every epoch, and each epoch's first
#   batch waits for them; each worker is a process with its own memory: lists of Python objects get copied
#   into every worker with `fork`, and the whole dataset with `spawn`/`forkserver`.
# - Budget workers per machine, not per loader: `processes × (num_workers + 1) ≤ logical cores` (one
#   process per GPU with DDP). PyTorch's warning checks one loader in one process only.
# - Training slow? First ask whether the GPU is busy (`torch.cuda.utilization()`, `nvidia-smi`): the
#   profiler's time in `enumerate(DataLoader)#...__next__` against the steps says data-bound or
#   compute-bound.
# - Datasets live in importable modules; scripts need `if __name__ == "__main__":` (`spawn`, and
#   `forkserver`, the Linux default from Python 3.14).
# - `pin_memory=True` in the DataLoader plus `.to(device, non_blocking=True)` only matter with a GPU:
#   the loader pins off the critical path and the call returns before the copy is done;
#   `.pin_memory()` by hand right before the copy is an extra copy. `persistent_workers=True` saves the
#   workers' start-up at every epoch.
# - `drop_last=True` for training with BatchNorm (a last batch of 1 crashes, of 2–3 skews the running
#   statistics), `False` for validation.
# - Sub-modules go in `nn.ModuleList` / `nn.ModuleDict` / `nn.Sequential`, built in `__init__`, fixed
#   tensors in `register_buffer`; check `named_parameters()` and `state_dict().keys()`, or
#   `find_unregistered_modules`. No in-place edits of tensors autograd keeps.
# - The step's two rules: gradients cleared before the next `backward`, `step` after the `backward` it
#   uses (and clipping between them: `clip_grad_norm_`, log the norm it returns). `zero_grad` first or
#   last are equally right (bit-identical weights); accumulate with each loss divided by the number of
#   micro-batches and one step per big batch.
# - `.detach()` on the outputs does not stop autograd from recording the graph (and saving activations)
#   during the forward pass; only `no_grad` / `inference_mode` around the forward do.
# - Evaluate under `model.eval()` **and** `torch.inference_mode()`: each alone leaves a symptom.
#
# ## Troubleshooting by symptom
# | You see | Likely cause | Section |
# |---|---|---|
# | training slow; `nvidia-smi` shows low GPU-Util; one CPU core at 100 % | data-bound: the profiler shows the time in `enumerate(DataLoader)#...__next__`; raise `num_workers` (if cores are idle) or make preprocessing cheaper | 1 ("is the GPU busy?") |
# | more workers, no faster | no idle cores: other programs, or `processes × num_workers` beyond the cores; or too little work per batch, so the transfer between processes costs more than it saves (an empty epoch above: slower with workers than in the main process) | 1 (interleaved epochs; workers × processes; what a restart costs) |
# | `UserWarning: This DataLoader will create N worker processes in total. Our suggested max number of worker in current system is M` | `num_workers` above the cores this process may use; with several processes per machine the limit is lower still, and not warned about | 1 (workers × processes) |
# | a speed-up measured once does not repeat | a single timing on a shared machine: time interleaved, and call it only when the spreads do not overlap | 1 |
# | memory grows with every worker | each worker is a process; a dataset of Python objects is copied into each | 1 |
# | `RuntimeError: DataLoader worker (pid(s) ...) exited unexpectedly` | the worker died; its own error is in a red block above it (Linux/macOS) or in the terminal running Jupyter. `Can't get attribute ...` there: a dataset defined in a notebook/`__main__` with `spawn`/`forkserver` workers | 1 |
# | the first batch of every epoch is slow | workers restart each epoch: `persistent_workers=True` | 1 |
# | `UserWarning: ... 'pin_memory' argument is set as true but no accelerator is found` | pinning on a CPU-only machine: set `pin_memory` only when a GPU is used | 2 |
# | `ValueError: Expected more than 1 value per channel when training` | a last batch of one with BatchNorm: `drop_last=True` | 3 |
# | `RuntimeError: stack expects each tensor to be equal size, but got [3, 32, 32] at entry 0 and [3, 28, 28] at entry 2` | samples of different sizes in one batch (entry = position in the batch): one size in `__getitem__`, or a padding `collate_fn` | 3 (samples of different sizes) |
# | validation much worse than training with BatchNorm, varying between epochs | running statistics skewed by a tiny last batch: `drop_last=True` | 3 |
# | some weights never change; `state_dict` misses layers or a tensor | layers in a plain list or dict, or built in `forward`; a tensor that should be a buffer | 4 |
# | in `eval()`, the same input gives different outputs | a layer built inside `forward` (fresh random weights each call) | 4 |
# | `TypeError: forward() got an unexpected keyword argument 'mask'` (or `takes 2 positional arguments but 3 were given`) | the call passes what `forward` does not declare: check `inspect.signature(model.forward)` | 5 |
# | `ValueError: optimizer got an empty parameter list` | every layer in a plain list: the model has no registered parameters | 4 |
# | `AttributeError: cannot assign module before Module.__init__() call` | `super().__init__()` missing or not first in `__init__` | 4 |
# | `RuntimeError: ... expected input[4, 32, 32, 3] to have 3 channels, but got 32 channels instead` | channels-last images into a conv (`permute(0, 3, 1, 2)`), or RGB/grayscale mixed up | 5 ("The shapes a layer expects") |
# | `RuntimeError: Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: [2, 4, 3, 32, 32]` | a batch of batches (a stacked list of batches, an extra `unsqueeze`) | 5 ("The shapes a layer expects") |
# | `RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x7200 and 6272x10)` after a conv | the head's `in_features` computed for another image size | 5 ("The shapes a layer expects") |
# | `RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation` | an in-place edit (`x.mul_()`, `relu_()`, `+=`) of a tensor autograd kept; or `optimizer.step()` between the forward pass and `backward()` while old gradients remain | 5, 6 |
# | the loss does not move at all | `zero_grad()` between `backward()` and `step()`, or `step()` before `backward()` right after `zero_grad()` | 6 |
# | the same loop ends with other weights than the textbook step; every update carries earlier batches' gradients | `zero_grad()` missing: each `backward()` adds to the last | 6 ("The rule behind the order") |
# | gradient clipping has no effect | `clip_grad_norm_` called after `step()` | 6 |
# | `UserWarning: Detected call of lr_scheduler.step() before optimizer.step()` | the scheduler stepped first: its first learning rate is skipped (harmless when a `GradScaler` skipped the first step) | 6 (the rule behind the order) |
# | training with accumulation diverges at the old learning rate | loss not divided by the number of micro-batches | 7 |
# | predictions change between two runs on the same input | evaluation without `model.eval()` (Dropout active) | 8 |
# | memory grows during evaluation | evaluation without `no_grad` / `inference_mode` (a `.detach()` afterwards does not stop the recording) | 8 |
# | `RuntimeError: Inference tensors cannot be saved for backward` | a tensor made under `inference_mode` fed to training: make it under `no_grad`, or `.clone()` it | 8 |

# %%
print(progress(chapter=2))
