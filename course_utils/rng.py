"""Seeding every random number generator the course touches."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global RNG and torch on the CPU and every CUDA device.

    `seed` must be an int in [0, 2**32) (NumPy's limit).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture_rng_state() -> dict:
    """The state of Python's `random`, NumPy's global RNG, torch's CPU RNG and every CUDA device's RNG,
    as tensors and plain containers only, so it loads with `torch.load(..., weights_only=True)`."""
    version, python_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict) -> None:
    """Restore what `capture_rng_state` captured. CUDA states are restored for the devices present
    (a checkpoint written on a GPU machine restores its CPU, Python and NumPy state on a CPU-only one)."""
    missing = {"python", "numpy", "torch", "cuda"} - set(state)
    if missing:
        raise KeyError(f"RNG state is missing {sorted(missing)}; was it made by capture_rng_state()?")
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].cpu().numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)
