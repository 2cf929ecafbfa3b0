"""Chapter 4: kill a process with SIGKILL while it writes a checkpoint, to test what survives.

`kill_while_saving` runs this module as a child process (`python -m course_utils.interrupted_save`)
that writes a large checkpoint and stops at a **known point** — after exactly `after_bytes` bytes of
the file (the middle of a write), or after a complete save — tells the parent where it stands, and
waits there until the parent kills it. No sleep decides where the kill lands, so the result is the
same on a fast machine and on a busy one.
"""
from __future__ import annotations

import argparse
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from course_utils._display import ReadableResult

KILL_POINTS = ("mid-write", "after-save")


@dataclass
class KilledWriter(ReadableResult):
    """Where the writer stood when it was killed."""

    returncode: int       # -9: killed by SIGKILL
    kill_at: str          # "mid-write" or "after-save"
    bytes_written: int    # bytes of the file being written (mid-write) or of the complete file (after-save)

    def __str__(self) -> str:
        where = (f"in the middle of a write, {self.bytes_written:,} bytes into the file" if self.kill_at == "mid-write"
                 else f"after a complete save of {self.bytes_written:,} bytes")
        return f"writer killed {where} (exit code {self.returncode})"


def kill_while_saving(path: str | Path, *, atomic: bool = True, megabytes: int = 16, kill_at: str = "mid-write",
                      after_bytes: int = 2**20, timeout_s: float = 60.0) -> KilledWriter:
    """Start a child that writes a ~`megabytes` MB checkpoint of all-2.0 weights to `path` (with
    `save_checkpoint(..., version=2)` if `atomic`, else a bare `torch.save(state_dict, path)`), let it
    reach `kill_at` — "mid-write": exactly `after_bytes` bytes of the file written and flushed to the
    OS, the rest never; "after-save": one save complete — and SIGKILL it there."""
    if kill_at not in KILL_POINTS:
        raise ValueError(f"kill_at must be one of {KILL_POINTS}, got {kill_at!r}")
    child = subprocess.Popen([sys.executable, "-m", "course_utils.interrupted_save", str(path),
                              "--mode", "atomic" if atomic else "plain", "--megabytes", str(megabytes),
                              "--kill-at", kill_at, "--after-bytes", str(after_bytes)],
                             stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()

    def read_lines() -> None:                         # in a thread: a silent child cannot block past timeout_s
        for text in child.stdout:
            lines.put(text.split())
        lines.put(None)                               # the child's stdout closed: it exited

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    try:
        try:
            line = lines.get(timeout=timeout_s)       # the child prints one line when it reaches the point
        except queue.Empty:
            line = None
        if not line or line[0] not in KILL_POINTS:
            raise RuntimeError(f"the writer exited or stalled before reaching {kill_at} "
                               f"(exit code {child.poll()}, it said {line!r})")
        if line[0] != kill_at:
            raise RuntimeError(f"the writer reached {line[0]} instead of {kill_at}: the checkpoint is smaller "
                               f"than after_bytes={after_bytes}")
        written = int(line[1])
    finally:
        child.kill()  # SIGKILL: no cleanup, no finally blocks, no flush
        child.wait()
        reader.join(timeout=5)
        child.stdout.close()
    return KilledWriter(child.returncode, kill_at, written)


def big_model(megabytes: int, value: float) -> nn.Linear:
    """A linear layer whose weight takes about `megabytes` MB, filled with `value`."""
    model = nn.Linear(1024, max(1, megabytes) * 256, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


class _StopsMidWrite:
    """A file wrapper for torch.save: passes on the first `limit` bytes, then announces the point and
    waits forever (until killed), so the file holds exactly `limit` bytes of the archive."""

    def __init__(self, file: Any, limit: int):
        self.file, self.limit, self.written = file, limit, 0

    def write(self, data: Any) -> int:
        data = memoryview(data).cast("B")
        room = self.limit - self.written
        if len(data) < room:
            self.written += len(data)
            return self.file.write(data)
        self.file.write(data[:room])
        self.file.flush()                             # the bytes are in the OS's hands, as after any write
        print("mid-write", self.limit, flush=True)
        while True:
            time.sleep(3600)

    def flush(self) -> None:
        self.file.flush()


def _main() -> None:
    from course_utils.checkpoints import save_checkpoint

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--mode", choices=["atomic", "plain"], required=True)
    parser.add_argument("--megabytes", type=int, default=16)
    parser.add_argument("--kill-at", choices=KILL_POINTS, default="mid-write")
    parser.add_argument("--after-bytes", type=int, default=2**20)
    args = parser.parse_args()
    model = big_model(args.megabytes, 2.0)
    if args.kill_at == "mid-write":
        real_save = torch.save                        # every torch.save in this process now stops mid-write,
        torch.save = lambda obj, f, **kw: real_save(obj, _StopsMidWrite(f, args.after_bytes), **kw)  # also inside save_checkpoint
    if args.mode == "atomic":
        save_checkpoint(args.path, model=model, version=2)
    else:
        with open(args.path, "wb") as file:           # truncates the old file at once
            torch.save(model.state_dict(), file)
    print("after-save", Path(args.path).stat().st_size, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    _main()
