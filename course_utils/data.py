"""Chapter 2: datasets that do real per-sample work, and measuring a DataLoader.

The course's datasets live here, in an importable module, because DataLoader workers started
with `spawn` (the default on macOS and Windows) must unpickle the dataset by import path; a
class defined in a notebook has no such path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from course_utils import _checks
from course_utils._display import ReadableResult


class SyntheticImages(Dataset):
    """`n` synthetic RGB images "decoded" and augmented on the fly, with a class label.

    Item: (image float32 (3, size, size) normalised, label int64 scalar in [0, classes)).
    Each `__getitem__` does single-threaded NumPy work (render, blur, random crop and flip,
    normalise) of roughly `work` milliseconds' worth, as a JPEG decode plus augmentation would.
    Deterministic for a given (seed, index, augmentation seed of the worker).
    """

    def __init__(self, n: int = 512, size: int = 32, classes: int = 10, *, work: int = 48, seed: int = 0):
        if n < 1 or size < 8 or classes < 1 or work < 0:
            raise ValueError(f"need n >= 1, size >= 8, classes >= 1, work >= 0; got {n}, {size}, {classes}, {work}")
        self.n, self.size, self.classes, self.work, self.seed = n, size, classes, work, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} images")
        rng = np.random.default_rng((self.seed, index))
        label = int(rng.integers(self.classes))
        pad = self.size + 8
        # "decode": a class-dependent pattern plus noise
        yy, xx = np.mgrid[0:pad, 0:pad] / pad
        image = np.stack([np.sin((label + 1 + c) * np.pi * (xx + yy)) for c in range(3)])
        image += 0.3 * rng.standard_normal(image.shape)
        for _ in range(self.work):  # repeated box blur: the CPU-heavy part
            image = (image + np.roll(image, 1, axis=1) + np.roll(image, 1, axis=2)) / 3
        # augment: random crop and horizontal flip (torch's RNG, seeded per worker)
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = image[:, top:top + self.size, left:left + self.size]
        if torch.rand(()) < 0.5:
            image = image[:, :, ::-1]
        image = (image - image.mean()) / (image.std() + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)), torch.tensor(label)


@dataclass
class LoaderStats(ReadableResult):
    """Throughput of one pass over a DataLoader. Rates per second of wall time after warm-up."""

    batches: int
    samples: int
    first_batch_s: float
    batches_per_s: float
    samples_per_s: float
    label: str = ""

    def __str__(self) -> str:
        name = f"{self.label}: " if self.label else ""
        return (f"{name}{self.samples_per_s:8.0f} samples/s, {self.batches_per_s:6.1f} batches/s, "
                f"first batch after {self.first_batch_s * 1000:.0f} ms ({self.batches} batches timed)")


def _batch_size(batch: object) -> int:
    while isinstance(batch, (list, tuple)):
        batch = batch[0]
    if isinstance(batch, dict):
        return _batch_size(next(iter(batch.values())))
    return len(batch)  # type: ignore[arg-type]


def benchmark_loader(loader: DataLoader, *, max_batches: int | None = None, warmup: int | None = None,
                     label: str = "") -> LoaderStats:
    """Iterate `loader` once and measure it.

    `first_batch_s` is the time from creating the iterator to the first batch (worker start-up
    included). The first `warmup` batches are then excluded from the rates (default: one per
    worker, at least one, so that every worker has started: `spawn` workers take seconds to
    import torch); `max_batches` caps the number of batches timed after warm-up.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"benchmark_loader needs a torch.utils.data.DataLoader, got {type(loader).__name__}")
    if warmup is None:
        warmup = max(1, loader.num_workers)
    if warmup < 1 or (max_batches is not None and max_batches < 1):
        raise ValueError(f"need warmup >= 1 and max_batches >= 1 (or None); got {warmup}, {max_batches}")
    start = time.perf_counter()
    iterator = iter(loader)
    batches = samples = 0
    first_batch_s = 0.0
    try:
        for seen, batch in enumerate(iterator, start=1):
            if seen == 1:
                first_batch_s = time.perf_counter() - start
            if seen == warmup:
                timed_from = time.perf_counter()
            elif seen > warmup:
                batches += 1
                samples += _batch_size(batch)
                if max_batches is not None and batches >= max_batches:
                    break
    finally:
        del iterator  # shuts worker processes down
    if batches == 0:
        raise ValueError(f"the loader gave no batch after {warmup} warm-up batch(es): "
                         "use a larger dataset or a smaller warmup")
    elapsed = time.perf_counter() - timed_from
    return LoaderStats(batches, samples, first_batch_s, batches / elapsed, samples / elapsed, label)


def compare_pinned_copy(nbytes: int, device: torch.device | str, *, min_run_time: float = 0.3,
                        repeats: int = 20) -> dict[str, float]:
    """Host-to-device copies of `nbytes`, in ms (medians).

    Four copies, timed with `torch.utils.benchmark` up to a CUDA synchronise (so until the copy is
    done): from pageable memory; pinning it by hand right before the copy (`pin_memory()` then
    copy, the pinning included); from memory pinned in advance; and pinned with `non_blocking=True`
    (the same copy, so about the same time). Then "non_blocking call returns after": how long the
    CPU waits in `pinned.to(device, non_blocking=True)` itself, over `repeats` calls, which is what
    lets a copy overlap with later work. Needs a CUDA device; raises `RuntimeError` elsewhere.
    """
    from torch.utils import benchmark

    _checks.positive_int(nbytes, "nbytes")
    device = _checks.device(device)
    if device.type != "cuda":
        raise RuntimeError(f"pinned memory only speeds up copies to a CUDA device; got {device}")
    pageable = torch.empty(nbytes // 4, dtype=torch.float32)
    pinned = pageable.pin_memory()
    results = {}
    for name, statement, src in [("pageable", "src.to(device)", pageable),
                                 ("pin_memory() then copy", "src.pin_memory().to(device)", pageable),
                                 ("pinned", "src.to(device)", pinned),
                                 ("pinned, non_blocking", "src.to(device, non_blocking=True)", pinned)]:
        timer = benchmark.Timer(f"{statement}; torch.cuda.synchronize()",
                                globals={"src": src, "device": device, "torch": torch})
        results[name] = timer.blocked_autorange(min_run_time=min_run_time).median * 1000
    returns = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)          # an empty queue: the call cannot wait for earlier copies
        start = time.perf_counter()
        pinned.to(device, non_blocking=True)
        returns.append(time.perf_counter() - start)
    torch.cuda.synchronize(device)
    results["non_blocking call returns after"] = float(np.median(returns)) * 1000
    return results
