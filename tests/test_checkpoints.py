"""Chapter 4: atomic checkpoints, exact resume, RNG state, prefix stripping and partial loading."""
import copy
import os
import pickle
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


def test_numpy_float_is_refused_before_writing_because_weights_only_would_refuse_it(tmp_path):
    # the reason, checked against torch itself: json.dumps takes np.float64 (a float subclass), weights_only does not
    torch.save({"best": np.float64(0.5)}, tmp_path / "plain.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "plain.pt", weights_only=True)
    previous = save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]), epoch=1)
    before = previous.read_bytes()
    with pytest.raises(TypeError, match=r"meta 'best' is a numpy.float64 .*weights_only=True.*pass float\(x\)"):
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]), epoch=2, best=np.float64(0.5))
    with pytest.raises(TypeError, match=r"meta 'history'\['val'\]\[1\] is a numpy.int64.*pass int\(x\)"):
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]), history={"val": [1, np.int64(2)]})
    with pytest.raises(TypeError, match=r"meta 'best' is a torch.Tensor.*x.item\(\)"):
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]), best=torch.tensor(0.5))
    assert previous.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "plain.pt"]
    save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]), best=float(np.float64(0.5)), steps=(1, 2), by_epoch={3: 0.1})
    assert torch.load(tmp_path / "c.pt", weights_only=True)["meta"] == {"best": 0.5, "steps": (1, 2), "by_epoch": {3: 0.1}}


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_file_mode_is_what_torch_save_gives(tmp_path, umask):
    old = os.umask(umask)
    try:
        torch.save({}, tmp_path / "oracle.pt")
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]))
        os.chmod(tmp_path / "oracle.pt", 0o604)                  # an existing file keeps its mode under torch.save
        os.chmod(tmp_path / "c.pt", 0o604)
        torch.save({}, tmp_path / "oracle.pt")
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]))
        again = {name: (tmp_path / name).stat().st_mode & 0o777 for name in ("oracle.pt", "c.pt")}
    finally:
        os.umask(old)
    assert again == {"oracle.pt": 0o604, "c.pt": 0o604}


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_new_file_mode_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        torch.save({}, tmp_path / "oracle.pt")
        save_checkpoint(tmp_path / "c.pt", model=mlp([2, 1]))
    finally:
        os.umask(old)
    modes = {name: (tmp_path / name).stat().st_mode & 0o777 for name in ("oracle.pt", "c.pt")}
    assert modes == {"oracle.pt": 0o666 & ~umask, "c.pt": 0o666 & ~umask}


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


def test_a_file_from_a_gpu_this_machine_lacks_loads_only_with_map_location(tmp_path):
    model = mlp([2, 1])
    missing = f"cuda:{max(3, torch.cuda.device_count())}"
    with saved_as_if_on(missing):
        torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "rank3.pt")
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on (a )?CUDA device"):
        torch.load(tmp_path / "rank3.pt", weights_only=True)
    locations = set()
    torch.load(tmp_path / "rank3.pt", weights_only=True, map_location=lambda s, loc: locations.add(loc) or s)
    assert locations == {missing}
    fresh = mlp([2, 1])
    report = load_matching_state_dict(fresh, torch.load(tmp_path / "rank3.pt", map_location="cpu", weights_only=True))
    assert report.stripped_prefix == "module." and torch.equal(fresh[0].weight, model[0].weight)


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
def test_atomic_save_killed_mid_write_keeps_the_old_file_and_after_a_save_has_the_new(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model=big_model(4, 1.0), version=1)
    killed = kill_while_saving(path, atomic=True, megabytes=4, kill_at="mid-write", after_bytes=100_000)
    assert (killed.returncode, killed.kill_at, killed.bytes_written) == (-9, "mid-write", 100_000)
    partials = list(tmp_path.glob(".ckpt.pt.*.partial"))
    assert [p.stat().st_size for p in partials] == [100_000]          # the killed write: in its temporary file
    model = big_model(4, 0.0)
    assert load_checkpoint(path, model=model) == {"version": 1} and torch.all(model.weight == 1.0)
    assert not list(tmp_path.glob(".ckpt.pt.*.partial"))               # the load removed the dead writer's file
    killed = kill_while_saving(path, atomic=True, megabytes=4, kill_at="after-save")
    assert killed.kill_at == "after-save" and killed.bytes_written == path.stat().st_size
    assert load_checkpoint(path, model=model) == {"version": 2} and torch.all(model.weight == 2.0)


@pytest.mark.slow
def test_killed_writers_leave_no_litter_after_the_next_save(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model=big_model(4, 1.0), version=1)
    for after_bytes in (10, 50_000, 500_000):
        assert kill_while_saving(path, atomic=True, megabytes=4, after_bytes=after_bytes).returncode == -9
        # each new writer removed its dead predecessors' files first: exactly its own is left
        assert [p.stat().st_size for p in tmp_path.glob(".ckpt.pt.*.partial")] == [after_bytes]
    save_checkpoint(path, model=big_model(4, 3.0), version=3)
    assert list(tmp_path.glob(".ckpt.pt.*.partial")) == []
    assert load_checkpoint(path, model=big_model(4, 0.0))["version"] == 3


@pytest.mark.slow
def test_an_unknown_or_unreachable_kill_point_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="kill_at must be one of"):
        kill_while_saving(tmp_path / "x.pt", kill_at="soon")
    with pytest.raises(RuntimeError, match="reached after-save instead of mid-write"):
        kill_while_saving(tmp_path / "x.pt", atomic=False, megabytes=1, after_bytes=10**9)


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
    torch.save(big_model(4, 1.0).state_dict(), path)
    killed = kill_while_saving(path, atomic=False, megabytes=4, after_bytes=200_000)
    assert path.stat().st_size == killed.bytes_written == 200_000     # the old file is gone, the new one cut
    with pytest.raises(RuntimeError, match="failed finding central directory"):
        torch.load(path, weights_only=True)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path, model=big_model(4, 0.0))


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
