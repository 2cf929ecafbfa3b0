"""Chapter 5: small helpers for multi-process training, and launching `torchrun` from a notebook."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from course_utils._display import ReadableResult

LOG_DIR_ENV = "COURSE_LOG_DIR"   # where launch_torchrun tells its workers to write their logs

F = TypeVar("F", bound=Callable[..., Any])


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def is_main_process() -> bool:
    """True on global rank 0 (and in a plain single-process run)."""
    return _rank() == 0


def seed_for_rank(base_seed: int) -> int:
    """`base_seed + rank`: different random augmentation on each rank, reproducible run to run."""
    if isinstance(base_seed, bool) or not isinstance(base_seed, int) or base_seed < 0:
        raise ValueError(f"base_seed must be a non-negative int, got {base_seed!r}")
    return base_seed + _rank()


def global_batch_size(per_device: int) -> int:
    """Samples per optimizer step across all ranks: `per_device * world_size`
    (world size from the process group when initialised, else 1)."""
    if isinstance(per_device, bool) or not isinstance(per_device, int) or per_device < 1:
        raise ValueError(f"per_device must be a positive int, got {per_device!r}")
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return per_device * world


def rank_zero_only(fn: F) -> F:
    """Decorator: run `fn` on the main process only; other ranks get None."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if is_main_process() else None
    return wrapper  # type: ignore[return-value]


def shard_indices(n: int, rank: int, world_size: int) -> range:
    """Evaluation shard of rank `rank`: indices rank, rank + world, ... < n. Unlike
    `DistributedSampler` it never pads by repeating samples, so a summed metric counts each
    sample exactly once; shards may differ in length by one, and be empty when n < world_size."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if n < 0:
        raise ValueError(f"n (the number of samples) must be >= 0, got {n}")
    return range(rank, n, world_size)


def worker_pids(log_dir: str | Path) -> list[int]:
    """PIDs of the workers of a `course_utils.ddp_train` run (each writes `pid{RANK}` at start)."""
    if not Path(log_dir).is_dir():
        raise FileNotFoundError(f"no log folder at {Path(log_dir).resolve()}: pass the log_dir the run used")
    return [int(path.read_text()) for path in sorted(Path(log_dir).glob("pid*"))]


def still_running(pids: list[int]) -> list[int]:
    """The PIDs in `pids` that are still running (zombies, already dead but unreaped, don't count)."""
    running = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        status = Path(f"/proc/{pid}/status")
        if not (status.exists() and "zombie" in status.read_text()):
            running.append(pid)
    return running


# --- launching torchrun -------------------------------------------------------------------

class TorchrunFailed(RuntimeError):
    """A torchrun job exited non-zero; the message ends with the failing rank's traceback."""


@dataclass
class TorchrunResult(ReadableResult):
    """A finished torchrun job: exit code, everything it printed, and the per-rank JSON logs."""

    returncode: int
    output: str = field(repr=False)
    logs: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        return f"torchrun exited with {self.returncode} after {self.seconds:.1f} s; {len(self.logs)} rank logs"


def _worker_traceback(output: str) -> str:
    """The first worker traceback in torchrun's output; else its "Root Cause" summary; else the tail."""
    lines = output.splitlines()
    for start, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        prefix = line[:line.index("Traceback")]  # workers' lines may carry a "[rank1]: " prefix
        end = start + 1
        while end < len(lines) and lines[end].startswith(prefix) and lines[end][len(prefix):].startswith((" ", "\t")):
            end += 1
        block = "\n".join(lines[start:end + 1])
        if "ChildFailedError" not in block:  # torchrun's own traceback only says a child failed
            return _shorten_paths(block)
    if "Root Cause" in output:
        return output[output.index("Root Cause"):].strip()
    return "\n".join(lines[-15:])


def _shorten_paths(text: str) -> str:
    """Paths relative to the course folder, and `<env>` for the Python environment: shorter to read."""
    course_root = str(Path(__file__).resolve().parent.parent) + os.sep
    return text.replace(course_root, "").replace(sys.prefix + os.sep, "<env>" + os.sep)


def launch_torchrun(module_or_script: str, nproc: int, *args: str, timeout_s: float = 120.0,
                    log_dir: str | Path | None = None, check: bool = True, echo: bool = True) -> TorchrunResult:
    """Run `torchrun --standalone --nproc-per-node=nproc` on a module (`-m`) or a `.py` script.

    `--standalone` lets torchrun pick a free port itself. Output is streamed line by line (into
    the notebook cell when `echo`). On timeout the whole process group — torchrun and every
    worker — gets SIGTERM, then SIGKILL, and `TimeoutError` is raised: nothing is left behind.
    `log_dir` is also handed to every worker as the environment variable `COURSE_LOG_DIR` (the
    course's script uses it as its default `--log-dir`), so it is named once. Per-rank logs
    (`rank*.json` in `log_dir`) are parsed into `result.logs`, ordered by rank. With `check`, a
    non-zero exit raises `TorchrunFailed` quoting the first worker traceback. A script or module
    that does not exist fails here, before any process starts.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a whole number >= 1, got {nproc!r}")
    if module_or_script.endswith(".py"):
        if not Path(module_or_script).is_file():
            raise FileNotFoundError(f"no training script at {Path(module_or_script).resolve()}")
        target = [module_or_script]
    else:
        if importlib.util.find_spec(module_or_script) is None:
            raise ModuleNotFoundError(f"no module named {module_or_script!r} (a script needs its .py ending; a module "
                                      "must be importable from here)")
        target = ["-m", module_or_script]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               *target, *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if log_dir is not None:
        env[LOG_DIR_ENV] = str(Path(log_dir).resolve())
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, start_new_session=True)  # its own process group, for clean kills
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:  # a thread, so that waiting for output can time out
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    output: list[str] = []
    try:
        while True:
            remaining = timeout_s - (time.monotonic() - start)
            if remaining <= 0:
                raise TimeoutError(f"torchrun did not finish within {timeout_s} s; all its processes were killed")
            try:
                line = lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                break
            output.append(line)
            if echo:
                print(line, end="", flush=True)
        process.wait()
    finally:
        if process.poll() is None or _group_alive(process.pid):
            _kill_group(process)
        reader.join(timeout=5)
        process.stdout.close()
    text = "".join(output)
    logs = sorted((json.loads(p.read_text()) for p in Path(log_dir).glob("rank*.json")),
                  key=lambda log: log["rank"]) if log_dir is not None else []
    result = TorchrunResult(process.returncode, text, logs, time.monotonic() - start)
    if check and process.returncode != 0:
        raise TorchrunFailed(f"torchrun exited with code {process.returncode}. First worker traceback:\n"
                             + _worker_traceback(text))
    return result


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_group(process: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(process.pid):
            if process.poll() is None:
                try:
                    process.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.1)
        if not _group_alive(process.pid):
            return
