"""Chapter 5's exercise checks: each rejects plausible wrong answers (a planted bug left in, an answer tuned
to the sizes the chapter shows, the right result computed the wrong way) and accepts the reference and a
differently written correct answer."""
import contextlib
import math

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from course_utils.exercises import reference
from course_utils.exercises.ddp_torchrun import (check_accumulate_no_sync, check_epoch_shards, check_eval_shard,
                                                 check_save_checkpoint_once)

# --- exercise 1: epoch_shards ------------------------------------------------------------------


def _shards(n, rank, world, epochs, *, sampler_rank=None, replicas=None, set_epoch=lambda e: e, before=True):
    sampler = DistributedSampler(list(range(n)), num_replicas=replicas or world,
                                 rank=rank if sampler_rank is None else sampler_rank, shuffle=True, seed=0)
    orders = []
    for epoch in range(epochs):
        if before and set_epoch(epoch) is not None:
            sampler.set_epoch(set_epoch(epoch))
        orders.append(list(sampler))
        if not before:
            sampler.set_epoch(epoch)
    return orders


def shards_by_hand(n_samples, rank, world_size, epochs):
    """What DistributedSampler does, written out: one permutation per epoch (seed 0 + epoch), padded
    by repeating its head to a multiple of the world size, then every world_size-th index from rank."""
    orders = []
    total = math.ceil(n_samples / world_size) * world_size
    for epoch in range(epochs):
        order = torch.randperm(n_samples, generator=torch.Generator().manual_seed(epoch)).tolist()
        order = (order * math.ceil(total / max(n_samples, 1)))[:total]
        orders.append(order[rank:total:world_size])
    return orders


EPOCH_WRONG = {
    "bug left in: no set_epoch": lambda n, r, w, e: _shards(n, r, w, e, set_epoch=lambda epoch: None),
    "bug left in: rank 0 on every rank": lambda n, r, w, e: _shards(n, r, w, e, sampler_rank=0),
    "tuned to the chapter's 2 ranks": lambda n, r, w, e: _shards(n, r, w, e, replicas=2),
    "set_epoch after the epoch's order is read": lambda n, r, w, e: _shards(n, r, w, e, before=False),
    "epochs counted from 1": lambda n, r, w, e: _shards(n, r, w, e, set_epoch=lambda epoch: epoch + 1),
    "returns an int": lambda n, r, w, e: 3,
}


@pytest.mark.parametrize("name", EPOCH_WRONG)
def test_check_epoch_shards_rejects(name, learner):
    verdict = check_epoch_shards(EPOCH_WRONG[name])
    assert not verdict and "attempt 1" in str(verdict), name


@pytest.mark.parametrize("answer", [reference("epoch_shards"), shards_by_hand])
def test_check_epoch_shards_accepts(answer, learner):
    assert check_epoch_shards(answer)


# --- exercise 2: save_checkpoint_once ----------------------------------------------------------

def save_on_every_rank(model, path, rank, barrier):
    torch.save(model.state_dict(), path)
    barrier()


def barrier_before_rank_0_saves(model, path, rank, barrier):
    barrier()
    if rank == 0:
        torch.save(model.state_dict(), path)


def barrier_on_rank_0_only(model, path, rank, barrier):
    if rank == 0:
        torch.save(model.state_dict(), path)
        barrier()


def saved_by_rank_not_1(model, path, rank, barrier):          # tuned to 2 ranks: on 3, rank 2 writes too
    if rank != 1:
        torch.save(model.state_dict(), path)
    barrier()


def saves_parameters_only(model, path, rank, barrier):        # the BatchNorm's running statistics are lost
    if rank == 0:
        torch.save(dict(model.named_parameters()), path)
    barrier()


def saves_the_whole_model(model, path, rank, barrier):        # a pickled module: weights_only=True refuses it
    if rank == 0:
        torch.save(model, path)
    barrier()


def no_barrier(model, path, rank, barrier):
    if rank == 0:
        torch.save(model.state_dict(), path)


def barrier_before_and_after(model, path, rank, barrier):
    barrier()                       # everyone has finished the epoch
    if rank == 0:
        torch.save(model.state_dict(), path)
    barrier()                       # nobody goes on before the file is written


def written_by_the_last_rank(model, path, rank, barrier):   # one writer, not rank 0: still one complete file
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if rank == 0:
        with open(path, "wb") as file:
            torch.save(state, file)
    barrier()


SAVE_WRONG = {
    "bug left in: every rank saves": save_on_every_rank,
    "bug left in: barrier before the save only": barrier_before_rank_0_saves,
    "barrier on rank 0 only": barrier_on_rank_0_only,
    "tuned to 2 ranks: every rank but 1 saves": saved_by_rank_not_1,
    "parameters only, buffers dropped": saves_parameters_only,
    "whole pickled model": saves_the_whole_model,
    "no barrier at all": no_barrier,
}


@pytest.mark.parametrize("name", SAVE_WRONG)
def test_check_save_checkpoint_once_rejects(name, learner):
    verdict = check_save_checkpoint_once(SAVE_WRONG[name])
    assert not verdict and "attempt 1" in str(verdict), name


@pytest.mark.parametrize("answer", [reference("save_checkpoint_once"), barrier_before_and_after,
                                    written_by_the_last_rank])
def test_check_save_checkpoint_once_accepts(answer, learner):
    assert check_save_checkpoint_once(answer)


def test_check_save_checkpoint_once_says_what_it_saw(learner):
    assert "written 2 times" in str(check_save_checkpoint_once(save_on_every_rank))
    assert "before the file was complete" in str(check_save_checkpoint_once(barrier_before_rank_0_saves))
    assert "called barrier() {0: 1, 1: 0} times" in str(check_save_checkpoint_once(barrier_on_rank_0_only))
    assert "written 2 times (by ranks [0, 2])" in str(check_save_checkpoint_once(saved_by_rank_not_1))


# --- exercise 3: accumulate_no_sync ------------------------------------------------------------

def no_sync_on_every_micro_batch(ddp_model, micro_batches, loss_fn, optimizer):
    optimizer.zero_grad()
    with ddp_model.no_sync():
        for inputs, targets in micro_batches:
            (loss_fn(ddp_model(inputs), targets) / len(micro_batches)).backward()
    optimizer.step()


def loss_not_divided(ddp_model, micro_batches, loss_fn, optimizer):
    optimizer.zero_grad()
    for i, (inputs, targets) in enumerate(micro_batches):
        with ddp_model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
            loss_fn(ddp_model(inputs), targets).backward()
    optimizer.step()


def divided_by_the_chapters_4(ddp_model, micro_batches, loss_fn, optimizer):
    optimizer.zero_grad()
    for i, (inputs, targets) in enumerate(micro_batches):
        with ddp_model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
            (loss_fn(ddp_model(inputs), targets) / 4).backward()
    optimizer.step()


def synchronised_on_the_first(ddp_model, micro_batches, loss_fn, optimizer):   # one all-reduce, the wrong one
    optimizer.zero_grad()
    for i, (inputs, targets) in enumerate(micro_batches):
        with ddp_model.no_sync() if i > 0 else contextlib.nullcontext():
            (loss_fn(ddp_model(inputs), targets) / len(micro_batches)).backward()
    optimizer.step()


def one_big_batch(ddp_model, micro_batches, loss_fn, optimizer):   # right step, but no accumulation at all
    optimizer.zero_grad()
    inputs, targets = (torch.cat(t) for t in zip(*micro_batches))
    loss_fn(ddp_model(inputs), targets).backward()
    optimizer.step()


def step_per_micro_batch(ddp_model, micro_batches, loss_fn, optimizer):
    for i, (inputs, targets) in enumerate(micro_batches):
        optimizer.zero_grad()
        with ddp_model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
            loss_fn(ddp_model(inputs), targets).backward()
        optimizer.step()


def sum_losses_then_one_backward(ddp_model, micro_batches, loss_fn, optimizer):
    """Correct, written differently: the losses of all micro-batches summed into one backward (one
    all-reduce, each micro-batch still its own forward)."""
    optimizer.zero_grad()
    total = sum(loss_fn(ddp_model(inputs), targets) for inputs, targets in micro_batches) / len(micro_batches)
    total.backward()
    optimizer.step()


def weighted_by_samples(ddp_model, micro_batches, loss_fn, optimizer):
    """Correct, written differently: each mean loss weighted by its share of the samples."""
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    *early, last = micro_batches
    with ddp_model.no_sync():
        for inputs, targets in early:
            (loss_fn(ddp_model(inputs), targets) * len(inputs) / total).backward()
    (loss_fn(ddp_model(last[0]), last[1]) * len(last[0]) / total).backward()
    optimizer.step()


ACCUMULATE_WRONG = {
    "bug left in: no_sync on every micro-batch": no_sync_on_every_micro_batch,
    "bug left in: loss not divided": loss_not_divided,
    "tuned to the chapter's 4 micro-batches": divided_by_the_chapters_4,
    "all-reduce after the first micro-batch": synchronised_on_the_first,
    "one concatenated batch": one_big_batch,
    "a step per micro-batch": step_per_micro_batch,
}


@pytest.mark.parametrize("name", ACCUMULATE_WRONG)
def test_check_accumulate_no_sync_rejects(name, learner):
    verdict = check_accumulate_no_sync(ACCUMULATE_WRONG[name])
    assert not verdict and "attempt 1" in str(verdict), name
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("answer", [reference("accumulate_no_sync"), sum_losses_then_one_backward,
                                    weighted_by_samples])
def test_check_accumulate_no_sync_accepts(answer, learner):
    assert check_accumulate_no_sync(answer)


# --- exercise 4: eval_shard ---------------------------------------------------------------------

EVAL_WRONG = {
    "rank 0 gets every sample": lambda n, r, w: list(range(n)) if r == 0 else [],
    "strided, not contiguous": lambda n, r, w: list(range(r, n, w)),
    "the padded DistributedSampler": lambda n, r, w: list(DistributedSampler(range(n), w, r, shuffle=False)),
    "floor-sized blocks: the remainder dropped": lambda n, r, w: list(range(r * (n // w), (r + 1) * (n // w))),
    "ceil-sized blocks: the last rank short": lambda n, r, w: list(range(r * -(-n // w), min(n, (r + 1) * -(-n // w)))),
    "tuned to 2 ranks": lambda n, r, w: list(range(r * n // 2, (r + 1) * n // 2)),
    "the remainder all on the last rank":
        lambda n, r, w: list(range(r * (n // w), n if r == w - 1 else (r + 1) * (n // w))),
    "raises on an empty shard": lambda n, r, w: list(range(r * n // w, (r + 1) * n // w)) if n >= w else [][0],
}


@pytest.mark.parametrize("name", EVAL_WRONG)
def test_check_eval_shard_rejects(name, learner):
    verdict = check_eval_shard(EVAL_WRONG[name])
    assert not verdict and "attempt 1" in str(verdict), name


def test_check_eval_shard_names_the_imbalance_not_the_fix(learner):
    verdict = str(check_eval_shard(EVAL_WRONG["rank 0 gets every sample"]))
    assert "[21, 0]" in verdict and "//" not in verdict


@pytest.mark.parametrize("answer", [
    reference("eval_shard"),
    lambda n, r, w: torch.tensor_split(torch.arange(n), w)[r],            # a tensor of indices
    lambda n, r, w: np.array_split(np.arange(n), w)[r].tolist(),
    lambda n, r, w: range(r * (n // w) + min(r, n % w), (r + 1) * (n // w) + min(r + 1, n % w)),
])
def test_check_eval_shard_accepts(answer, learner):
    assert check_eval_shard(answer)


# --- every check: a verdict, never a crash ------------------------------------------------------

@pytest.mark.parametrize("check", [check_epoch_shards, check_save_checkpoint_once, check_accumulate_no_sync,
                                   check_eval_shard])
def test_a_check_reports_an_exception_instead_of_raising(check, learner):
    def broken(*args):
        raise KeyError("oops")
    verdict = check(broken)
    assert not verdict and "KeyError" in str(verdict) and "hint 1:" not in str(verdict)
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("check", [check_epoch_shards, check_save_checkpoint_once, check_accumulate_no_sync,
                                   check_eval_shard])
def test_an_untouched_function_is_not_an_attempt(check, learner):
    verdict = check(lambda *args: None)
    assert not verdict and "not attempted" in str(verdict)
