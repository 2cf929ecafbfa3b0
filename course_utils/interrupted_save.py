"""Chapter 4: kill a process with SIGKILL while it writes a checkpoint, to test what survives.

`kill_while_saving` runs this module as a child process (`python -m course_utils.interrupted_save`)
that saves a large model over and over, and kills it in the middle of a write.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn


def kill_while_saving(path: str | Path, *, atomic: bool = True, megabytes: int = 128,
                      delay_s: float = 0.02, after_bytes: int = 0, timeout_s: float = 60.0) -> int:
    """Start a child that writes a ~`megabytes` MB checkpoint of all-2.0 weights to `path` in a
    loop (with `save_checkpoint` if `atomic`, else a bare `torch.save`), wait until it announces
    a write, wait `delay_s` more (plain writes: and until `path` holds at least `after_bytes`
    bytes, so the kill lands in the middle of the data), then SIGKILL it. Returns the child's exit
    code (-9)."""
    mode = "atomic" if atomic else "plain"
    child = subprocess.Popen([sys.executable, "-m", "course_utils.interrupted_save", str(path),
                              "--mode", mode, "--megabytes", str(megabytes)],
                             stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while child.stdout.readline().strip() != "writing":
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the writer exited or stalled before writing (exit code {child.poll()})")
        time.sleep(delay_s)
        while not atomic and Path(path).stat().st_size < after_bytes:
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the writer exited or stalled before writing {after_bytes} bytes")
            time.sleep(0.001)
    finally:
        child.kill()  # SIGKILL: no cleanup, no finally blocks, no flush
        child.wait()
        child.stdout.close()
    return child.returncode


def big_model(megabytes: int, value: float) -> nn.Linear:
    """A linear layer whose weight takes about `megabytes` MB, filled with `value`."""
    model = nn.Linear(1024, max(1, megabytes) * 256, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def _main() -> None:
    from course_utils.checkpoints import save_checkpoint

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--mode", choices=["atomic", "plain"], required=True)
    parser.add_argument("--megabytes", type=int, default=128)
    args = parser.parse_args()
    model = big_model(args.megabytes, 2.0)
    while True:  # until killed
        if args.mode == "atomic":
            print("writing", flush=True)
            save_checkpoint(args.path, model=model, version=2)
        else:
            with open(args.path, "wb") as file:  # truncates the old file at once
                print("writing", flush=True)
                torch.save(model.state_dict(), file)


if __name__ == "__main__":
    _main()
