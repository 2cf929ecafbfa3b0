"""Chapter 5: small helpers for multi-process training and launching `torchrun` from a notebook.
(The chapter's exercise checks are in `course_utils.exercises.ddp_torchrun`.)"""
from __future__ import annotations

import contextlib
import ctypes
import difflib
import functools
import importlib.util
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

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
        if not _finished_but_listed(pid):
            running.append(pid)
    return running


def _finished_but_listed(pid: int) -> bool:
    """A zombie (dead, not yet reaped), or reaped since os.kill found it; Linux's /proc tells, elsewhere no."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return Path("/proc").is_dir()


# --- launching torchrun -------------------------------------------------------------------

@dataclass
class TorchrunResult(ReadableResult):
    """A finished torchrun job: exit code, everything it printed, and the per-rank JSON logs."""

    returncode: int
    output: str = field(repr=False)
    logs: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        return f"torchrun exited with {self.returncode} after {self.seconds:.1f} s; {len(self.logs)} rank logs"


class TorchrunFailed(RuntimeError):
    """A torchrun job exited non-zero; the message ends with the failing rank's traceback, and `result`
    holds everything the job printed (`result.output`)."""

    def __init__(self, message: str, result: TorchrunResult | None = None) -> None:
        super().__init__(message)      # result has a default: unpickling calls __init__ with the message only
        self.result = result


# A rank that fails because *another* rank died or left says so; its traceback is a symptom.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "caused by a remote worker crashing")


def _worker_traceback(output: str) -> str:
    """The worker traceback that explains the failure: the first one that is not merely a rank noticing
    that a peer died (those come first when the failing rank is slower to print). When every traceback is
    such a symptom (the rank that died printed none: a signal, a crash in C++), torchrun's "Root Cause"
    summary follows it, or else the output's last lines; with no traceback, that summary or those lines."""
    lines = output.splitlines()
    blocks = []
    for start, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        prefix = line[:line.index("Traceback")]  # workers' lines may carry a "[rank1]: " prefix
        end = start + 1
        while end < len(lines) and lines[end].startswith(prefix) and lines[end][len(prefix):].startswith((" ", "\t")):
            end += 1
        block = lines[start:end + 1]
        if "ChildFailedError" not in "\n".join(block):  # torchrun's own traceback only says a child failed
            blocks.append((block, prefix))
    root_cause = output[output.index("Root Cause"):].strip() if "Root Cause" in output else ""
    last_lines = "\n".join(lines[-15:])
    if blocks:
        cause = next(((b, p) for b, p in blocks if not any(s in b[-1] for s in _PEER_GONE)), None)
        block, prefix = cause or blocks[0]
        shown = _shorten_paths("\n".join(_without_library_frames(block, prefix)))
        return shown if cause else f"{shown}\ntorchrun's last words:\n{root_cause or last_lines}"
    return root_cause or last_lines


def _without_library_frames(block: list[str], prefix: str) -> list[str]:
    """A traceback's lines without the frames inside installed packages (torch's internals) and
    without C++ source locations (`[/path/file.cc:78] `): the learner's lines and the error."""
    kept, skipped, in_library = [], 0, False
    for line in block[:-1]:
        body = line[len(prefix):]
        if body.startswith("  File "):
            in_library = "site-packages" in body or sys.prefix in body
            skipped += in_library
        if not in_library:
            kept.append(line)
    if skipped:
        kept.append(f"{prefix}  ... {skipped} frame{'s' if skipped > 1 else ''} inside torch left out")
    return kept + [re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\] ", "", block[-1])]


def _shorten_paths(text: str) -> str:
    """Paths relative to the course folder, and `<env>` for the Python environment: shorter to read."""
    course_root = str(Path(__file__).resolve().parent.parent) + os.sep
    return text.replace(sys.prefix + os.sep, "<env>" + os.sep).replace(course_root, "")   # the env may be inside


def launch_torchrun(module_or_script: str, nproc: int, *args: str, timeout_s: float = 120.0,
                    log_dir: str | Path | None = None, check: bool = True, echo: bool = True,
                    torchrun_args: Sequence[str] = ("--standalone",),
                    env: dict[str, str] | None = None) -> TorchrunResult:
    """Run `torchrun --standalone --nproc-per-node=nproc` on a module (`-m`) or a `.py` script.

    `--standalone` lets torchrun pick a free port itself; `torchrun_args` replaces it (one node of a
    multi-node job: `--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT ...`). Output is
    streamed line by line (into the notebook cell when `echo`). On timeout the whole process group —
    torchrun and every worker — gets SIGTERM, then SIGKILL, and `TimeoutError` is raised: nothing is
    left behind.
    `env` adds environment variables for torchrun and its workers.
    `log_dir` is created and handed to every worker as the environment variable `COURSE_LOG_DIR`
    (the course's script uses it as its default `--log-dir`), so it is named once. Per-rank logs
    (`rank*.json` in `log_dir`) are parsed into `result.logs`, ordered by rank. With `check`, a
    non-zero exit raises `TorchrunFailed` quoting the first worker traceback (its `result` holds the whole
    output). A script or module that does not exist fails here, before any process starts.
    On Linux torchrun also dies with the process that launched it (a Jupyter kernel restarted or
    killed mid-run): the kernel sends it SIGTERM, and torchrun stops its workers (`_dies_with_this_process`).
    Unless `env` sets TMPDIR, torchrun and its workers get a temporary folder of their own ($TMPDIR): torchrun
    makes a `torchelastic_*` folder of empty log folders there on every run and never removes it. Afterwards the
    folders that hold no file are removed; a file a worker or torchrun left there stays.
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
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_args, f"--nproc-per-node={nproc}",
               *target, *map(str, args)]
    given = env or {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **given}
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        env[LOG_DIR_ENV] = str(Path(log_dir).resolve())
    scratch = None if "TMPDIR" in given else tempfile.mkdtemp(prefix="torchrun-")
    if scratch is not None:
        env["TMPDIR"] = scratch
    start = time.monotonic()
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=env, start_new_session=True,   # its own process group, for clean kills
                                   preexec_fn=_dies_with_this_process())  # and no orphans if this process dies
    except BaseException:
        _remove_empty_folders(scratch)
        raise
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
        _remove_empty_folders(scratch)
    text = "".join(output)
    logs = sorted((json.loads(p.read_text()) for p in Path(log_dir).glob("rank*.json")),
                  key=lambda log: log["rank"]) if log_dir is not None else []
    result = TorchrunResult(process.returncode, text, logs, time.monotonic() - start)
    if check and process.returncode != 0:
        raise TorchrunFailed(f"torchrun exited with code {process.returncode}. First worker traceback:\n"
                             + _worker_traceback(text), result)
    return result


def _remove_empty_folders(folder: str | None) -> None:
    """Remove `folder` and every folder in it that holds no file, innermost first (rmdir refuses the others)."""
    for path, _, _ in os.walk(folder, topdown=False) if folder is not None else ():
        with contextlib.suppress(OSError):
            os.rmdir(path)


_PR_SET_PDEATHSIG = 1        # from <linux/prctl.h>: "send me this signal when my parent dies"


def _dies_with_this_process() -> Callable[[], None] | None:
    """A `preexec_fn` (Linux) that makes the child receive SIGTERM when this process dies, however it
    dies (SIGKILL included: a Jupyter kernel restart). torchrun, on SIGTERM, terminates its workers,
    which it starts in sessions of their own, out of reach of a process-group kill
    (`start_new_session=True` in torch/distributed/elastic/multiprocessing/subprocess_handler/
    subprocess_handler.py). Elsewhere None:
    macOS and Windows have no such call, and only the timeout's group kill applies.

    `prctl(PR_SET_PDEATHSIG)` fires when the *thread* that started the child ends; launch_torchrun
    waits for the child in that same thread, so the thread outlives it. The call is resolved here, in
    the parent, so the forked child runs no import and no lookup before it execs."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != parent:         # the parent died before the call: no signal will come
            os.kill(os.getpid(), sigterm)
    return set_death_signal


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


# --- small tools for the chapter's cells ----------------------------------------------------

def free_ports(count: int) -> list[int]:
    """`count` different TCP ports on 127.0.0.1 that nothing listens on right now (rendezvous
    endpoints): all are held open together while chosen, so no two can be the same."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a rendezvous endpoint)."""
    return free_ports(1)[0]


def script_variant(script: str | Path, old: str, new: str, to: str | Path) -> str:
    """Write a copy of `script` to `to` in which the one line containing `old` is replaced, whole
    (comment included), by the line(s) `new` (`""` deletes it); return the change as a unified diff
    (so a notebook shows exactly what differs)."""
    lines = Path(script).read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if old in line]
    if len(hits) != 1:
        raise ValueError(f"{old!r} occurs on {len(hits)} lines of {Path(script).name}; it must occur on exactly one")
    changed = lines[:hits[0]] + [line + "\n" for line in new.splitlines()] + lines[hits[0] + 1:]
    Path(to).write_text("".join(changed))
    diff = difflib.unified_diff(lines, changed, Path(script).name, Path(to).name, n=0)
    return "".join(line for line in diff if not line.startswith("@@"))


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A one-process `gloo` process group (a file store in a temporary folder) for the block, so
    `DistributedDataParallel` can run in this very process; destroyed on exit, errors included."""
    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; destroy it first")
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 1), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def waited_allreduce(state, bucket) -> torch.futures.Future:
    """DDP's default all-reduce (the bucket averaged over the ranks) as a comm hook that waits for it here and
    returns a completed future. torch's `allreduce_hook` chains a Python callback that a gloo thread runs; a
    DDP model freed while that thread waits for the GIL deadlocks: the group's destructor, holding the GIL,
    joins the thread (seen once in CI: gdb showed ~ProcessGroupGloo joining pt_gloo_runloop in take_gil)."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    dist.all_reduce(buffer)
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


def count_allreduces(ddp_model: DistributedDataParallel) -> list[int]:
    """Register a DDP communication hook that all-reduces as usual and counts each call (one per
    gradient bucket per synchronised backward); returns the one-element counter list it updates."""
    calls = [0]

    def counting_allreduce(state, bucket):  # no annotations: DDP checks them, and they are strings here
        calls[0] += 1
        return waited_allreduce(state, bucket)
    ddp_model.register_comm_hook(None, counting_allreduce)
    return calls
