"""Chapter 4: atomic checkpoints, exact resume, RNG state, prefix stripping and partial loading."""
import copy
import itertools
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils.checkpoints import (CheckpointError, load_checkpoint, load_matching_state_dict,
                                      remove_stale_partials, save_checkpoint, saved_as_if_on)
from course_utils.interrupted_save import big_model, kill_while_saving
from course_utils.models import mlp
from course_utils.rng import capture_rng_state, restore_rng_state, seed_everything
from course_utils.training import train_step


def make_run(seed=0):
    seed_everything(seed)
    model = mlp([8, 32, 1], dropout=0.2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    return model, optimizer, scheduler


def train_epochs(model, optimizer, scheduler, loader, epochs):
    for _ in range(epochs):
        for batch in loader:
            train_step(model, batch, nn.MSELoss(), optimizer)
        scheduler.step()


@pytest.fixture
def loader():
    g = torch.Generator().manual_seed(123)
    x = torch.randn(64, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16, shuffle=True)


@pytest.fixture
def straight(loader):
    """Final weights of 4 uninterrupted epochs."""
    model, opt, sched = make_run()
    train_epochs(model, opt, sched, loader, 4)
    return [p.detach().clone() for p in model.parameters()]


def test_resume_is_bit_exact(tmp_path, loader, straight):
    model, opt, sched = make_run()
    train_epochs(model, opt, sched, loader, 2)
    save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, scheduler=sched, epoch=2)
    del model, opt, sched
    model, opt, sched = make_run(seed=99)          # fresh objects, other weights, other RNG
    random.random(), np.random.rand(), torch.rand(5)
    meta = load_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, scheduler=sched)
    assert meta == {"epoch": 2}
    train_epochs(model, opt, sched, loader, 2)
    assert all(torch.equal(a, b) for a, b in zip(straight, model.parameters()))


def test_resume_without_optimizer_state_diverges(tmp_path, loader, straight):
    model, opt, sched = make_run()
    train_epochs(model, opt, sched, loader, 2)
    save_checkpoint(tmp_path / "model_only.pt", model=model)
    model, opt, sched = make_run(seed=99)
    load_checkpoint(tmp_path / "model_only.pt", model=model)
    train_epochs(model, opt, sched, loader, 2)
    assert not all(torch.equal(a, b) for a, b in zip(straight, model.parameters()))


def test_everything_loads_with_weights_only(tmp_path):
    model, opt, sched = make_run()
    train_step(model, (torch.randn(4, 8), torch.randn(4, 1)), nn.MSELoss(), opt)
    scaler = torch.amp.GradScaler("cpu")
    save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                    epoch=1, best={"val": 0.5, "history": [1.0, 0.5]}, note=None)
    payload = torch.load(tmp_path / "c.pt", weights_only=True)
    assert set(payload) == {"format", "model", "optimizer", "scheduler", "scaler", "meta", "rng"}
    assert payload["meta"]["best"]["history"] == [1.0, 0.5]


def test_meta_must_be_json_like(tmp_path):
    with pytest.raises(TypeError, match="JSON-like"):
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]), when=object())
    assert not list(tmp_path.iterdir())


def test_missing_corrupt_truncated_and_foreign_files_are_clear_errors(tmp_path):
    model = mlp([2, 1])
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*nope.pt"):
        load_checkpoint(tmp_path / "nope.pt", model=model)
    good = save_checkpoint(tmp_path / "good.pt", model=model)
    data = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated.pt is truncated or corrupt \(.* bytes\): torch.load failed with"):
        load_checkpoint(tmp_path / "truncated.pt", model=model)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(tmp_path / "empty.pt", model=model)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all" * 100)
    with pytest.raises(CheckpointError, match="garbage.pt"):
        load_checkpoint(tmp_path / "garbage.pt", model=model)
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint written by save_checkpoint"):
        load_checkpoint(tmp_path / "bare.pt", model=model)


class Payload:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_unsafe_pickle_is_refused(tmp_path):
    torch.save({"format": "course_utils.checkpoint/1", "model": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="weights_only=True refuses"):
        load_checkpoint(tmp_path / "evil.pt", model=mlp([2, 1]))


def test_required_parts_and_mismatched_model(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", model=mlp([2, 1]))
    model = mlp([2, 1])
    with pytest.raises(CheckpointError, match="no optimizer state"):
        load_checkpoint(path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match="does not fit this model.*load_matching_state_dict"):
        load_checkpoint(path, model=mlp([3, 1]))


def test_cuda_saved_checkpoint_loads_on_this_device_with_default_map_location(tmp_path):
    model = mlp([2, 1])
    with saved_as_if_on("cuda:0"):
        save_checkpoint(tmp_path / "gpu.pt", model=model, epoch=3)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="map_location"):
            torch.load(tmp_path / "gpu.pt", weights_only=True)
    fresh = mlp([2, 1])
    assert load_checkpoint(tmp_path / "gpu.pt", model=fresh) == {"epoch": 3}
    assert fresh[0].weight.device.type == "cpu"
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_cuda_rng_state_from_a_gpu_machine_restores_on_cpu():
    state = capture_rng_state()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 8   # as if from an 8-GPU machine
    expected = torch.rand(3)
    restore_rng_state(state)
    torch.testing.assert_close(torch.rand(3), expected)


def test_restore_rng_state_rejects_incomplete_state():
    with pytest.raises(KeyError, match="missing"):
        restore_rng_state({"torch": torch.get_rng_state()})


@pytest.mark.slow
def test_atomic_save_survives_sigkill_mid_write(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model=big_model(64, 1.0), version=1)
    survived = 0
    for delay in (0.0, 0.05, 0.1, 0.2, 0.4):
        assert kill_while_saving(path, atomic=True, megabytes=64, delay_s=delay) == -9
        model = big_model(64, 0.0)
        meta = load_checkpoint(path, model=model)      # always loads: old or new, never half
        expected = {1: 1.0, 2: 2.0}[meta["version"]]
        assert torch.all(model.weight == expected)
        survived += 1
    assert survived == 5


@pytest.mark.slow
def test_killed_writers_leave_no_litter_after_the_next_save(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model=big_model(16, 1.0), version=1)
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
        assert kill_while_saving(path, atomic=True, megabytes=16, delay_s=delay) == -9
        # each new writer removed its dead predecessors' files first: only its own can be left
        assert len(list(tmp_path.glob(".ckpt.pt.*.partial"))) <= 1
    save_checkpoint(path, model=big_model(16, 3.0), version=3)
    assert list(tmp_path.glob(".ckpt.pt.*.partial")) == []
    assert load_checkpoint(path, model=big_model(16, 0.0))["version"] == 3


def test_only_dead_local_writers_files_are_removed(tmp_path):
    path = tmp_path / "ckpt.pt"
    host = socket.gethostname()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)                     # a process that has exited
    dead = tmp_path / f".ckpt.pt.{host}.{dead_pid}.k3j2h1g0.partial"
    live = tmp_path / f".ckpt.pt.{host}.{os.getpid()}.a1b2c3d4.partial"        # a writer still running: us
    remote = tmp_path / f".ckpt.pt.other.host.example.{dead_pid}.z9y8x7w6.partial"   # cannot check another host
    foreign = tmp_path / ".ckpt.pt.tmpabcd.partial"                               # someone else's naming
    for file in (dead, live, remote, foreign):
        file.write_bytes(b"half a checkpoint")
    save_checkpoint(path, model=nn.Linear(2, 2))
    assert not dead.exists() and live.exists() and remote.exists() and foreign.exists()
    dead.write_bytes(b"half a checkpoint")
    assert remove_stale_partials(path) == [dead] and not dead.exists()
    dead.write_bytes(b"half a checkpoint")
    load_checkpoint(path, model=nn.Linear(2, 2))        # loading tidies up too
    assert not dead.exists()


@pytest.mark.slow
def test_plain_torch_save_killed_mid_write_is_corrupt(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(big_model(64, 1.0).state_dict(), path)
    kill_while_saving(path, atomic=False, megabytes=64, delay_s=0.02)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path, model=big_model(64, 0.0))


# --- load_matching_state_dict ---------------------------------------------------------------

class Net(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.backbone = mlp([8, 16, 16])
        self.head = nn.Linear(16, classes)


def test_strips_dataparallel_prefix_and_skips_the_new_head():
    pretrained = Net(10)
    wrapped = nn.DataParallel(copy.deepcopy(pretrained))     # with one GPU it moves what it wraps to cuda:0
    new = Net(5)
    head_before = new.head.weight.detach().clone()
    report = load_matching_state_dict(new, wrapped.state_dict())
    assert report.stripped_prefix == "module."
    assert sorted(report.loaded) == ["backbone.0.bias", "backbone.0.weight", "backbone.2.bias", "backbone.2.weight"]
    assert report.shape_mismatch == [("head.weight", (10, 16), (5, 16)), ("head.bias", (10,), (5,))]
    assert report.missing == [] and report.unexpected == []
    assert torch.equal(new.backbone[0].weight, pretrained.backbone[0].weight)
    assert torch.equal(new.head.weight, head_before)
    assert "head.weight: checkpoint [10, 16] vs model [5, 16]" in str(report)


def test_strips_compile_prefix_and_reports_missing_and_unexpected():
    source = {f"_orig_mod.{k}": v for k, v in Net(5).state_dict().items()}
    source["_orig_mod.extra.weight"] = torch.ones(2)
    target = Net(5)
    del source["_orig_mod.head.bias"]
    report = load_matching_state_dict(target, source)
    assert report.stripped_prefix == "_orig_mod."
    assert report.unexpected == ["extra.weight"] and report.missing == ["head.bias"]


def test_a_prefix_on_only_some_keys_is_not_stripped():
    source = dict(Net(5).state_dict())
    source["module.head.weight"] = source.pop("head.weight")
    report = load_matching_state_dict(Net(5), source)
    assert report.stripped_prefix == "" and report.unexpected == ["module.head.weight"]
    assert report.missing == ["head.weight"]


def test_no_match_at_all_is_an_error_showing_both_sides():
    with pytest.raises(ValueError, match=r"(?s)nothing would load.*checkpoint keys: \[.encoder.*model keys: +\[.backbone"):
        load_matching_state_dict(Net(5), {"encoder.weight": torch.ones(3)})


# --- exercises: each reference passes its check, each planted bug alone is rejected -----------

from course_utils.checkpoints import (check_checkpoint_dict, check_epoch_batches_from,  # noqa: E402
                                      check_load_matching, check_resume_training)
from course_utils.exercises import reference  # noqa: E402


@pytest.mark.parametrize("name, check", [("resume_training", check_resume_training),
                                         ("checkpoint_dict", check_checkpoint_dict),
                                         ("load_matching", check_load_matching),
                                         ("epoch_batches_from", check_epoch_batches_from)])
def test_each_reference_passes_its_check(learner, name, check):
    assert check(reference(name))


def _restore(path, model, optimizer, scheduler, *, scheduler_too, rng_too):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if scheduler_too:
        scheduler.load_state_dict(checkpoint["scheduler"])
    if rng_too:
        torch.set_rng_state(checkpoint["rng"]["torch"])
    return checkpoint["epoch"]


@pytest.mark.parametrize("scheduler_too, rng_too, expected", [
    (False, True, "the schedule is at epoch 0 and the next epochs would use the learning rates [0.01, 0.01, 0.01]; the uninterrupted run, at epoch 2, uses [0.01, 0.005, 0.005]"),
    (True, False, "the next dropout mask"),
])
def test_resume_training_rejects_each_planted_bug(learner, scheduler_too, rng_too, expected):
    verdict = check_resume_training(lambda *a: _restore(*a, scheduler_too=scheduler_too, rng_too=rng_too))
    assert not verdict and expected in str(verdict), str(verdict)


def test_resume_training_rejects_a_wrong_epoch_and_reports_an_exception(learner):
    def off_by_one(*args):
        return _restore(*args, scheduler_too=True, rng_too=True) + 1
    assert "it returned 3" in str(check_resume_training(off_by_one))

    def crashes(path, *objects):
        return torch.load(path)["missing"]
    assert "your function raised KeyError" in str(check_resume_training(crashes))


def _checkpoint_dict(model, optimizer, scheduler, epoch, *, whole_model, with_optimizer):
    checkpoint = {"model": model if whole_model else model.state_dict(),
                  "scheduler": scheduler.state_dict(), "epoch": epoch, "rng": {"torch": torch.get_rng_state(), "cuda": []}}
    if with_optimizer:
        checkpoint["optimizer"] = optimizer.state_dict()
    return checkpoint


@pytest.mark.parametrize("whole_model, with_optimizer, expected", [
    (True, True, "refuses your checkpoint: it holds a torch.nn.modules.container.Sequential object"),
    (False, False, "no 'optimizer' entry"),
])
def test_checkpoint_dict_rejects_each_planted_bug(learner, whole_model, with_optimizer, expected):
    verdict = check_checkpoint_dict(lambda *a: _checkpoint_dict(*a, whole_model=whole_model,
                                                                with_optimizer=with_optimizer))
    assert not verdict and expected in str(verdict), str(verdict)


def _load_matching(model, state_dict, *, check_shapes, strict):
    own, matched = model.state_dict(), {}
    for key, value in state_dict.items():
        key = key.removeprefix("module.")
        if key in own and (value.shape == own[key].shape or not check_shapes):
            matched[key] = value
    model.load_state_dict(matched, strict=strict)
    return sorted(matched)


@pytest.mark.parametrize("check_shapes, strict, expected", [
    (False, False, "size mismatch for head.weight: copying a param with shape torch.Size([10, 16]) from "
                   "checkpoint, the shape in current model is torch.Size([5, 16])"),   # the key line, whole
    (True, True, "Missing key(s) in state_dict"),
])
def test_load_matching_rejects_each_planted_bug(learner, check_shapes, strict, expected):
    verdict = check_load_matching(lambda m, s: _load_matching(m, s, check_shapes=check_shapes, strict=strict))
    assert not verdict and expected in str(verdict), str(verdict)


def test_load_matching_rejects_a_silent_no_op(learner):
    verdict = check_load_matching(lambda m, s: m.load_state_dict(s, strict=False) and [])
    assert not verdict and "backbone tensors were not loaded" in str(verdict)


@pytest.mark.parametrize("attempt, expected", [
    (lambda loader, g, state, skip: list(itertools.islice(loader, skip, None)), "another shuffle"),
    (lambda loader, g, state, skip: (g.set_state(state), list(loader))[1], "it gave 6 batches"),
])
def test_epoch_batches_from_rejects_a_lost_generator_or_a_restarted_epoch(learner, attempt, expected):
    verdict = check_epoch_batches_from(attempt)
    assert not verdict and expected in str(verdict), str(verdict)


def test_the_checks_leave_the_random_stream_alone(learner):
    before = torch.get_rng_state()
    check_resume_training(reference("resume_training"))
    check_epoch_batches_from(lambda *a: None)
    assert torch.equal(torch.get_rng_state(), before)
