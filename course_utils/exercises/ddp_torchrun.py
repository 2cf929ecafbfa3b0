"""Chapter 5 exercises (DDP and torchrun): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those. Each check runs the
learner's function on sizes and world sizes the chapter did not show, returns a `Verdict` (never raises on
a wrong answer), and says first what it observed; the hints come on later attempts.
"""
from __future__ import annotations

import contextlib
import copy
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from course_utils.distributed import single_process_group, waited_allreduce
from course_utils.exercises import Verdict, reference_solution, report_check

__all__ = ["check_accumulate_no_sync", "check_epoch_shards", "check_eval_shard", "check_save_checkpoint_once"]


def _raised(error: BaseException) -> str:
    return f"your function raised {type(error).__name__}: {error}"


def _as_indices(value) -> list[int] | None:
    """A list of ints from a list/range/tensor of indices, or None when `value` is not one."""
    try:
        if isinstance(value, torch.Tensor):
            value = value.flatten().tolist()
        out = [int(i) for i in value]
    except (TypeError, ValueError):
        return None
    return out


# --- exercise 1: the shard of each epoch ------------------------------------------------------

@reference_solution("epoch_shards", chapter=5)
def _epoch_shards(n_samples: int, rank: int, world_size: int, epochs: int) -> list[list[int]]:
    sampler = DistributedSampler(list(range(n_samples)), num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


EPOCH_SHARD_CASES = ((12, 2, 3), (10, 3, 2), (7, 4, 2))   # (samples, world size, epochs): none is the chapter's


def check_epoch_shards(fn: Callable) -> Verdict:
    """Exercise 1: `fn(n_samples, rank, world_size, epochs)` returns the sample indices rank `rank` visits
    in each epoch (a list per epoch), as `DistributedSampler(shuffle=True, seed=0)` with `set_epoch` gives
    them. Checked for every rank of 12 samples on 2 ranks (3 epochs), 10 on 3 and 7 on 4 (2 epochs)."""
    name = "epoch_shards"
    hints = ["a DistributedSampler is told which rank it serves and how many ranks there are: look at what "
             "each call tells it",
             "the sampler shuffles with a seed of seed + epoch: how does it learn the epoch?"]
    observed = None
    for n, world, epochs in EPOCH_SHARD_CASES:
        try:
            got = [fn(n, rank, world, epochs) for rank in range(world)]
        except Exception as error:  # the learner's bug, reported rather than raised
            observed = f"with {n} samples on {world} ranks, {_raised(error)}"
            break
        if all(orders is None for orders in got):
            return report_check(name, False, None, [])
        try:
            got = [[_as_indices(order) for order in orders] for orders in got]
        except TypeError:
            got = None
        if got is None or any(order is None for orders in got for order in orders):
            observed = "it should return, for each epoch, a list of sample indices; it returned something else"
            break
        expected = [_epoch_shards(n, rank, world, epochs) for rank in range(world)]
        where = f"with {n} samples on {world} ranks"
        if any(len(orders) != epochs for orders in got):
            observed = (f"{where}, it returned {[len(o) for o in got]} epochs for ranks 0..{world - 1}; "
                        f"{epochs} were asked for")
        elif any(orders[0] == orders[1] for orders in got):
            rank = next(r for r, orders in enumerate(got) if orders[0] == orders[1])
            observed = (f"{where}, rank {rank} visited the samples in the same order in epochs 0 and 1 "
                        f"({got[rank][0]}): the shuffle never changes")
        elif any(set(got[a][0]) & set(got[b][0]) for a in range(world) for b in range(a + 1, world)) \
                and n % world == 0:
            shared = sorted(set(got[0][0]) & set(got[1][0]))
            observed = (f"{where}, ranks 0 and 1 both visited samples {shared} in epoch 0: the ranks train on "
                        "the same data instead of splitting it")
        elif got != expected:
            rank, epoch = next((r, e) for r in range(world) for e in range(epochs) if got[r][e] != expected[r][e])
            observed = (f"{where}, rank {rank} visited {got[rank][epoch]} in epoch {epoch}; the training script's "
                        f"sampler (seed 0) gives that rank {expected[rank][epoch]}")
        if observed:
            break
    return report_check(name, observed is None, observed, hints)


# --- exercise 2: saving once ----------------------------------------------------------------

@reference_solution("save_checkpoint_once", chapter=5)
def _save_checkpoint_once(model: nn.Module, path: Path, rank: int, barrier: Callable[[], None]) -> None:
    if rank == 0:
        torch.save(model.state_dict(), path)
    barrier()


BARRIER_TIMEOUT_S = 3.0      # a rank that waits this long at barrier() is a rank the others never joined


def _run_ranks(fn: Callable, world: int, path: Path) -> dict:
    """Run `fn(model, path, rank, barrier)` for every rank in its own thread, with a real barrier
    (a `threading.Barrier` with a timeout), and record what happened: torch.save calls per rank, the
    barrier calls per rank, and at each release of the barrier whether the file held the weights."""
    torch.manual_seed(world)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))     # a buffer too: the checkpoint holds all
    model(torch.randn(6, 3))                                        # running statistics that are not 0/1
    wanted = {k: v.clone() for k, v in model.state_dict().items()}
    releases: list[bool] = []

    def file_complete() -> bool:
        try:
            saved = torch.load(path, weights_only=True)
            return set(saved) == set(wanted) and all(torch.equal(saved[k], v) for k, v in wanted.items())
        except Exception:
            return False

    barrier = threading.Barrier(world, action=lambda: releases.append(file_complete()), timeout=BARRIER_TIMEOUT_S)
    saves: Counter = Counter()
    barrier_calls: Counter = Counter()
    errors: dict[int, BaseException] = {}
    broken: set[int] = set()
    thread_rank = threading.local()
    real_save = torch.save

    def counting_save(*args, **kwargs):
        saves[getattr(thread_rank, "rank", -1)] += 1
        return real_save(*args, **kwargs)

    def rank_barrier() -> None:
        rank = thread_rank.rank
        barrier_calls[rank] += 1
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            broken.add(rank)
            raise TimeoutError(f"rank {rank} waited at barrier() for {BARRIER_TIMEOUT_S} s") from None

    def run(rank: int) -> None:
        thread_rank.rank = rank
        try:
            fn(copy.deepcopy(model), path, rank, rank_barrier)
        except BaseException as error:  # the learner's bug, reported rather than raised
            errors[rank] = error
            barrier.abort()             # the others would wait for this rank forever

    with mock.patch.object(torch, "save", counting_save):
        threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=4 * BARRIER_TIMEOUT_S)
    return {"saves": saves, "barrier_calls": barrier_calls, "releases": releases, "errors": errors,
            "broken": broken, "complete_at_end": file_complete(), "exists": path.exists(),
            "hung": any(thread.is_alive() for thread in threads)}


def check_save_checkpoint_once(fn: Callable) -> Verdict:
    """Exercise 2: `fn(model, path, rank, barrier)` runs once per rank, the ranks at the same time (threads
    with a real barrier), on 2 and on 3 ranks with a model that has buffers. Exactly one rank must write
    the file, every rank must pass the same barriers, and when the ranks leave their last barrier the
    file must already hold the model's state_dict (a barrier before the save as well is fine)."""
    name = "save_checkpoint_once"
    hints = ["every rank holds the same weights: how many of them need to write them?",
             "the barrier is where the other ranks wait for the file: what must have happened before the last "
             "barrier lets anyone through?"]
    observed = None
    for world in (2, 3):
        with tempfile.TemporaryDirectory() as folder:
            seen = _run_ranks(fn, world, Path(folder) / "model.pt")
        where = f"on {world} ranks"
        own_errors = {r: e for r, e in seen["errors"].items() if r not in seen["broken"]}
        writers = sorted(r for r, count in seen["saves"].items() if count)
        if not seen["saves"] and not seen["barrier_calls"] and not seen["exists"] and not seen["errors"]:
            return report_check(name, False, None, [])
        if own_errors:
            rank, error = min(own_errors.items())
            observed = f"{where}, rank {rank}: {_raised(error)}"
        elif seen["hung"]:
            observed = f"{where}, a rank was still running {4 * BARRIER_TIMEOUT_S:.0f} s after it started"
        elif sum(seen["saves"].values()) > 1:
            observed = (f"{where}, the checkpoint was written {sum(seen['saves'].values())} times (by ranks "
                        f"{writers}), all to the same path")
        elif seen["broken"] or len(set(seen["barrier_calls"][r] for r in range(world))) > 1:
            calls = {r: seen["barrier_calls"][r] for r in range(world)}
            observed = (f"{where}, the ranks called barrier() {calls} times (rank: calls): a rank waited there "
                        f"{BARRIER_TIMEOUT_S:.0f} s for ranks that never came — in a real job, until the timeout")
        elif not seen["complete_at_end"]:
            observed = (f"{where}, afterwards the file does not hold the model's state_dict (all weights and "
                        "buffers, loadable with torch.load(weights_only=True))")
        elif not seen["releases"]:
            observed = f"{where}, no rank ever waited at barrier(): the others may read the file before it is written"
        elif not seen["releases"][-1]:
            observed = (f"{where}, the ranks left their last barrier() before the file was complete: a rank "
                        "that reads the checkpoint there may find it missing or half written")
        elif writers != [0]:
            observed = f"{where}, rank {writers} wrote the checkpoint, not rank 0"
        if observed:
            break
    return report_check(name, observed is None, observed, hints)


# --- exercise 3: accumulation under DDP ------------------------------------------------------

@reference_solution("accumulate_no_sync", chapter=5)
def _accumulate_no_sync(ddp_model: nn.Module, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                        loss_fn: Callable, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    for i, (inputs, targets) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            loss = loss_fn(ddp_model(inputs), targets) / len(micro_batches)
            loss.backward()
    optimizer.step()


ACCUMULATION_CASES = ((3, 5), (5, 4))    # (micro-batches, samples in each): not the chapter's 4 × 8


def _one_accumulation(fn: Callable, n_micro: int, size: int) -> dict:
    generator = torch.Generator().manual_seed(10 * n_micro + size)
    x, y = torch.randn(n_micro * size, 4, generator=generator), torch.randn(n_micro * size, 2, generator=generator)
    with torch.random.fork_rng():
        torch.manual_seed(n_micro)
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    expected = copy.deepcopy(model)
    nn.functional.mse_loss(expected(x), y).backward()
    full_grads = [p.grad.clone() for p in expected.parameters()]
    with torch.no_grad():
        for p in expected.parameters():
            p -= 0.1 * p.grad
    seen: dict = {"allreduces": 0, "synced": {}, "forward_sizes": [], "error": None}
    with single_process_group():
        ddp_model = DistributedDataParallel(model)
        index = {id(p): i for i, p in enumerate(model.parameters())}

        def recording_allreduce(state, bucket):   # what this all-reduce carries, per parameter
            seen["allreduces"] += 1
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                seen["synced"][index[id(p)]] = g.detach().clone()
            return waited_allreduce(state, bucket)
        ddp_model.register_comm_hook(None, recording_allreduce)
        model.register_forward_pre_hook(lambda module, args: seen["forward_sizes"].append(len(args[0])))
        try:
            seen["result"] = fn(ddp_model, list(zip(x.split(size), y.split(size))), nn.MSELoss(),
                                torch.optim.SGD(ddp_model.parameters(), lr=0.1))
        except Exception as error:  # the learner's bug, reported rather than raised
            seen["error"] = error
    seen["untouched"] = all(p.grad is None for p in model.parameters()) and seen["allreduces"] == 0
    seen["weight_gap"] = max((a - b).abs().max().item() for a, b in zip(model.parameters(), expected.parameters()))
    seen["sync_gap"] = (max((seen["synced"][i] - g).abs().max().item() for i, g in enumerate(full_grads))
                        if len(seen["synced"]) == len(full_grads) else float("inf"))
    return seen


def check_accumulate_no_sync(fn: Callable) -> Verdict:
    """Exercise 3: `fn(ddp_model, micro_batches, loss_fn, optimizer)` makes one optimizer step from
    equal-sized micro-batches (3 of 5 samples, then 5 of 4; `loss_fn` is a mean), on a one-process gloo
    group. The model must see each micro-batch in its own forward, DDP must all-reduce once, and what it
    all-reduces must be the gradient of the whole batch; the step must equal one step on the whole batch."""
    name = "accumulate_no_sync"
    hints = ["no_sync() turns off the all-reduce for the backward passes run inside it: which backward must "
             "still synchronise, so that what is all-reduced is the sum of every micro-batch's gradient?",
             "compare the summed gradient of the micro-batch losses with the gradient of one mean loss over all "
             "the samples: how many micro-batches are there in this call?"]
    observed = None
    for n_micro, size in ACCUMULATION_CASES:
        seen = _one_accumulation(fn, n_micro, size)
        where = f"with {n_micro} micro-batches of {size}"
        if seen["error"] is not None:
            observed = f"{where}, {_raised(seen['error'])}"
        elif seen["untouched"] and seen.get("result") is None:
            return report_check(name, False, None, [])
        elif seen["forward_sizes"] != [size] * n_micro:
            observed = (f"{where}, the model's forward passes saw batches of {seen['forward_sizes']} samples: "
                        "not one micro-batch at a time")
        elif seen["allreduces"] != 1:
            observed = (f"{where}, DDP all-reduced the gradients {seen['allreduces']} times in one optimizer step"
                        + ("; with 0 the ranks step with their own gradients and drift apart"
                           if seen["allreduces"] == 0 else ""))
        elif not seen["sync_gap"] <= 1e-5:
            observed = (f"{where}, the one all-reduce carried gradients that differ from the whole batch's gradient "
                        f"by up to {seen['sync_gap']:.3g}: on several ranks, what was not all-reduced never "
                        "reaches the other ranks")
        elif not seen["weight_gap"] <= 1e-5:
            observed = (f"{where}, one all-reduce, but the weights after the step differ from one step on the "
                        f"whole batch of {n_micro * size} by up to {seen['weight_gap']:.3g}")
        if observed:
            break
    return report_check(name, observed is None, observed, hints)


# --- exercise 4: contiguous evaluation shards -------------------------------------------------

@reference_solution("eval_shard", chapter=5)
def _eval_shard(n_samples: int, rank: int, world_size: int) -> list[int]:
    start, end = rank * n_samples // world_size, (rank + 1) * n_samples // world_size
    return list(range(start, end))


EVAL_SHARD_CASES = ((21, 2), (10, 4), (13, 5), (2, 3), (100, 7), (1, 1), (0, 2))   # (samples, world size)


def check_eval_shard(fn: Callable) -> Verdict:
    """Exercise 4: `fn(n_samples, rank, world_size)` returns the indices rank `rank` evaluates, one
    contiguous block. Over all ranks every sample must be evaluated exactly once, and no rank may get more
    than one sample more than another. Checked on (samples, ranks) = (21, 2), (10, 4), (13, 5), (2, 3),
    (100, 7), (1, 1), (0, 2)."""
    name = "eval_shard"
    hints = ["count the samples each rank got in the case above: who gets the remainder of n / world_size?",
             "rank r's block can start at r * n // world_size: where does it end?"]
    observed = None
    for n, world in EVAL_SHARD_CASES:
        try:
            shards = [fn(n, rank, world) for rank in range(world)]
        except Exception as error:  # the learner's bug, reported rather than raised
            observed = f"with {n} samples on {world} ranks, {_raised(error)}"
            break
        if all(shard is None for shard in shards):
            return report_check(name, False, None, [])
        shards = [_as_indices(shard) for shard in shards]
        where = f"with {n} samples on {world} ranks"
        if any(shard is None for shard in shards):
            observed = f"{where}, a rank's shard was not a list of sample indices"
            break
        counts = Counter(i for shard in shards for i in shard)
        twice = sorted(i for i, c in counts.items() if c > 1)
        missing = sorted(set(range(n)) - set(counts))
        outside = sorted(set(counts) - set(range(n)))
        sizes = [len(shard) for shard in shards]
        if twice or missing or outside:
            observed = f"{where}: " + "; ".join(part for part in (
                f"samples {twice} are evaluated more than once" if twice else "",
                f"samples {missing} are never evaluated" if missing else "",
                f"indices {outside} do not exist" if outside else "") if part)
        elif max(sizes) - min(sizes) > 1:
            observed = (f"{where}, the ranks evaluate {sizes} samples (rank 0 first): the slowest rank takes "
                        f"{max(sizes)} steps while another waits after {min(sizes)}")
        else:
            broken = [r for r, shard in enumerate(shards)
                      if shard and shard != list(range(shard[0], shard[0] + len(shard)))]
            if broken:
                observed = (f"{where}, rank {broken[0]}'s shard {shards[broken[0]][:8]} is not one contiguous "
                            "block of consecutive indices")
        if observed:
            break
    return report_check(name, observed is None, observed, hints)
