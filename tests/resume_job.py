"""A small resumable training job for tests/test_resume.py, with switchable resume bugs.

Dropout (the torch RNG), Adam (optimizer state), StepLR (scheduler) and a shuffled DataLoader with
its own generator (the data order). A correct resume restores all of them and the position inside
the epoch; `probe.options` can make it forget the scheduler, the RNG, or the epoch position.
"""
import itertools

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils.checkpoints import load_checkpoint, save_checkpoint
from course_utils.rng import seed_everything

BATCHES_PER_EPOCH = 4


def build(num_workers: int):
    seed_everything(0)                    # Python, NumPy and torch: two fresh runs must agree
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    data = TensorDataset(torch.randn(8 * BATCHES_PER_EPOCH, 6), torch.randn(8 * BATCHES_PER_EPOCH, 1))
    shuffle = torch.Generator().manual_seed(1)
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=shuffle, num_workers=num_workers,
                        persistent_workers=False)
    return model, optimizer, scheduler, loader, shuffle


def run(probe):
    bugs = probe.options
    model, optimizer, scheduler, loader, shuffle = build(bugs.get("num_workers", 0))
    step, epoch_start_state = 0, shuffle.get_state()
    if probe.resuming:
        meta = load_checkpoint(probe.checkpoint, model=model, optimizer=optimizer,
                               scheduler=None if bugs.get("forget_scheduler") else scheduler,
                               restore_rng=not bugs.get("forget_rng"))
        step = meta["step"]
        epoch_start_state = torch.tensor(meta["epoch_start_shuffle_state"], dtype=torch.uint8)
    while step < probe.steps:
        shuffle.set_state(epoch_start_state)                  # the epoch's permutation comes from here
        skip = 0 if bugs.get("restart_epoch") else step % BATCHES_PER_EPOCH
        for x, y in itertools.islice(loader, skip, None):
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            probe.step(step, batch=(x, y), loss=loss, model=model, optimizer=optimizer, scheduler=scheduler)
            step += 1
            if step == probe.stop_at:
                save_checkpoint(probe.checkpoint, model=model, optimizer=optimizer, scheduler=scheduler,
                                step=step, epoch_start_shuffle_state=epoch_start_state.tolist())
                return
            if step == probe.steps:
                break
        epoch_start_state = shuffle.get_state()
    probe.finish(model=model, optimizer=optimizer, scheduler=scheduler)
