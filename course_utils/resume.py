"""Chapter 4: prove that resuming a training job is exact, and name the first thing that is not.

`check_resume("my_job.py:run", steps=12, stop_at=5)` runs your training function three times, each
in a fresh Python process: once uninterrupted; once stopped after step `stop_at` (your code saves
its checkpoint there and returns, as a job killed right after that save would); once started from
that checkpoint with freshly built objects. Your function reports every step to the `ResumeProbe`
it is given; the two histories are then compared step by step — parameters and optimizer state
before the step, learning rate and scheduler position, the batch it received, the random streams,
the loss — and at the end bit for bit. A mismatch names what differed first and at which step.

A fresh process is, on Linux, a fork of a server process that has imported torch and
course_utils and run nothing else (started once, on the first call), so a run costs no import time;
elsewhere a new interpreter. The uninterrupted and stopped runs are reused across calls that differ
only in `resume_options`.

Your function (importable: "package.module:function" or "path/to/file.py:function"):

    def run(probe: ResumeProbe) -> None:
        model, optimizer, scheduler, loader = build()          # fresh objects, every time
        step = load_my_checkpoint(probe.checkpoint, ...) if probe.resuming else 0
        while step < probe.steps:
            ...                                                 # one training step on `batch`
            probe.step(step, batch=batch, loss=loss, model=model, optimizer=optimizer, scheduler=scheduler)
            step += 1
            if step == probe.stop_at:
                save_my_checkpoint(probe.checkpoint, ...)
                return                                          # "killed" right after the save
        probe.finish(model=model, optimizer=optimizer, scheduler=scheduler)
"""
from __future__ import annotations

import argparse
import atexit
import gc
import hashlib
import importlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_utils._display import ReadableResult

RECORD_ENV = "COURSE_RESUME_RECORD"


def _fingerprint(obj: Any) -> str:
    """A short hash of every tensor (bytes, dtype, shape) and plain value in a nested structure."""
    digest = hashlib.sha1()

    def feed(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{t.dtype}{tuple(x.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            for key in sorted(x, key=str):
                digest.update(str(key).encode())
                feed(x[key])
        elif isinstance(x, (list, tuple)):
            for item in x:
                feed(item)
        elif isinstance(x, np.ndarray):
            digest.update(x.tobytes())
        else:
            digest.update(repr(x).encode())
    feed(obj)
    return digest.hexdigest()[:16]


def _rng_fingerprints() -> dict[str, str]:
    streams = {"torch": _fingerprint(torch.get_rng_state()), "python": _fingerprint(random.getstate()),
               "numpy": _fingerprint(np.random.get_state()[1])}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        streams["cuda"] = _fingerprint(torch.cuda.get_rng_state_all())
    return streams


@dataclass
class ResumeProbe:
    """Handed to your training function: what this run should do, and where it reports each step."""

    steps: int
    stop_at: int | None
    checkpoint: Path
    resuming: bool
    options: dict[str, Any] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)
    final: dict | None = None

    def step(self, step: int, *, batch: Any, loss: torch.Tensor | float, model: nn.Module,
             optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
        """Report step `step` (0-based), called after the optimizer step with the batch it used and its
        loss. The parameters and optimizer state recorded are those *after* the update."""
        self.records.append({
            "step": step, "batch": _fingerprint(batch),
            "loss": float(loss.detach() if isinstance(loss, torch.Tensor) else loss).hex(),
            "lr": [group["lr"] for group in optimizer.param_groups],
            "scheduler": None if scheduler is None else getattr(scheduler, "last_epoch", None),
            "rng": _rng_fingerprints(), "parameters": _fingerprint(model.state_dict()),
            "optimizer": _fingerprint(optimizer.state_dict()["state"]),
        })

    def finish(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
        """Report the state at the end of training."""
        self.final = {"parameters": _fingerprint(model.state_dict()),
                      "optimizer": _fingerprint(optimizer.state_dict()["state"]),
                      "scheduler": None if scheduler is None else getattr(scheduler, "last_epoch", None),
                      "rng": _rng_fingerprints()}


@dataclass
class ResumeReport(ReadableResult):
    """The verdict of `check_resume`: `exact`, or the first difference, where and what it suggests."""

    exact: bool
    steps: int
    stop_at: int
    first_difference: str = ""
    step: int | None = None

    def __bool__(self) -> bool:
        return self.exact

    def __str__(self) -> str:
        if self.exact:
            return (f"resume is exact: stopped after step {self.stop_at} and resumed in a fresh process, the run "
                    f"matches the uninterrupted one bit for bit over {self.steps} steps (data order, losses, "
                    f"learning rate, RNG streams, parameters, optimizer state)")
        where = f" at step {self.step}" if self.step is not None else ""
        return f"resume is NOT exact{where}: {self.first_difference}"


def _compare(straight: dict, resumed: dict, stop_at: int, prefix_only: bool = False) -> tuple[str, int | None]:
    """The first difference between the uninterrupted and the stopped-then-resumed histories
    (`prefix_only`: compare only the steps `resumed` reported, nothing at the end)."""
    before = {r["step"]: r for r in straight["records"]}
    after = {r["step"]: r for r in resumed["records"]}
    first_epoch_batches = [r["batch"] for r in straight["records"]]
    for step in sorted(after):
        if step not in before:
            return f"the resumed run reported step {step}, which the uninterrupted run never reached", step
        a, b = before[step], after[step]
        if a["batch"] != b["batch"]:
            if b["batch"] in first_epoch_batches[:step] and first_epoch_batches.index(b["batch"]) < step:
                seen = first_epoch_batches.index(b["batch"])
                return (f"data order differs from step {step}: it received the batch the uninterrupted run saw at step "
                        f"{seen} — the epoch restarted; the sampler's position (and its generator) was not saved"), step
            return (f"data order differs from step {step}: another batch than the uninterrupted run's — the "
                    "shuffling generator's state was not restored"), step
        if a["scheduler"] != b["scheduler"] or a["lr"] != b["lr"]:
            return (f"scheduler: last_epoch {b['scheduler']} vs {a['scheduler']} (lr {b['lr']} vs {a['lr']}) after "
                    "resume — the scheduler state was not restored"), step
        if a["rng"] != b["rng"]:
            streams = sorted(k for k in a["rng"] if a["rng"][k] != b["rng"].get(k))
            return (f"random streams ({', '.join(streams)}) differ after step {step} — the RNG state was not restored "
                    "(dropout masks and augmentation change)"), step
        if a["loss"] != b["loss"]:
            return (f"loss differs at step {step} ({float.fromhex(b['loss']):.6g} vs {float.fromhex(a['loss']):.6g}) "
                    "with the same batch, lr and random streams — the model or optimizer state was not restored"), step
        if a["optimizer"] != b["optimizer"]:
            return (f"optimizer state differs after step {step} (same loss) — e.g. Adam's moments or step counts "
                    "were not restored"), step
        if a["parameters"] != b["parameters"]:
            return f"parameters differ after step {step}", step
    if prefix_only:
        return "", None
    if len(after) != len(before) - stop_at:
        return (f"the resumed run reported steps {sorted(after)[:3]}..., expected steps {stop_at} to "
                f"{len(before) - 1}"), None
    for part in ("parameters", "optimizer", "scheduler", "rng"):
        if (straight["final"] or {}).get(part) != (resumed["final"] or {}).get(part):
            return f"final {part} differ", None
    return "", None


def _load_target(target: str) -> Callable[[ResumeProbe], None]:
    """`package.module:function` or `path/to/file.py:function`."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"target must look like 'package.module:function' or 'path/to/file.py:function', got {target!r}")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"no training script at {path.resolve()}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module       # so that pickling (DataLoader workers) finds its classes
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"{where} has no function {name!r}")
    return fn


def _run_in_fresh_process(target: str, probe_args: dict, cwd: Path) -> dict:
    """One run of `target` in a new process; returns its record. On Linux the process is forked from a
    server process that has imported torch and course_utils and run nothing else (so no import cost per
    run); elsewhere (macOS frameworks are not fork-safe, Windows has no fork) it is a new interpreter."""
    with tempfile.TemporaryDirectory(prefix="check_resume-run-") as folder:
        record, failure = Path(folder) / "record.json", Path(folder) / "failure.txt"
        if sys.platform.startswith("linux"):
            failed = _fork_server().run(target=target, probe_args=probe_args, record=str(record),
                                        failure=str(failure), cwd=str(cwd)) != 0
            lines = failure.read_text().splitlines() if failure.exists() else ["the run was killed"]
        else:
            done = subprocess.run([sys.executable, "-m", "course_utils.resume", target, json.dumps(probe_args),
                                   str(record)], cwd=cwd, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))})
            failed, lines = done.returncode != 0, done.stderr.strip().splitlines()
        if failed:
            raise RuntimeError(f"the training function failed in the {probe_args['label']} run:\n"
                               + "\n".join(lines[-12:]))
        return json.loads(record.read_text())


_SERVER_LOOP = """
import json, os, signal, sys
import course_utils.resume, torch._dynamo      # what every run imports (the optimizer imports dynamo)
signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C in the notebook stops the run, not the server
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(2, 1)                          # the run's prints go to stderr; stdout answers the parent
        os._exit(course_utils.resume._forked_run(**json.loads(line)))
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class _ForkServer:
    """A Python process that has imported torch and course_utils; each run is a fork of it."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _SERVER_LOOP], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def run(self, **request: str | dict) -> int:
        """Fork one run, wait for it; its exit code."""
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
            if not answer:
                raise RuntimeError("the check_resume server process exited; run the check again")
            return int(answer)
        except BaseException:
            self.process.kill()         # interrupted mid-run: the next call starts a new server
            self.process.wait()
            raise

    def close(self) -> None:
        self.process.stdin.close()          # the loop ends at end of input
        self.process.wait()


_SERVER: list[_ForkServer] = []


def _fork_server() -> _ForkServer:
    if not _SERVER or _SERVER[0].process.poll() is not None:
        _SERVER[:] = [_ForkServer()]
        atexit.register(_SERVER[0].close)
    return _SERVER[0]


def _forked_run(target: str, probe_args: dict, record: str, failure: str, cwd: str) -> int:
    """The body of a forked run, started as a new interpreter would be: in `cwd`, with fresh random seeds
    (Python's `random` reseeds itself on fork; NumPy is seeded from the OS here). Returns the exit code."""
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    np.random.seed()
    signal.alarm(600)           # a run that hangs is killed, as the subprocess timeout does elsewhere
    try:
        _run(target, probe_args, Path(record))
    except BaseException:
        Path(failure).write_text(traceback.format_exc())
        return 1
    finally:
        gc.collect()            # shut down DataLoader workers before os._exit
    return 0


def _run(target: str, probe_args: dict, record: Path) -> None:
    spec = dict(probe_args)
    sys.path.insert(0, spec.pop("pythonpath"))
    probe = ResumeProbe(steps=spec["steps"], stop_at=spec["stop_at"], checkpoint=Path(spec["checkpoint"]),
                        resuming=spec["resuming"], options=spec["options"])
    _load_target(target)(probe)
    record.write_text(json.dumps({"records": probe.records, "final": probe.final}))


def check_resume(target: str, *, steps: int, stop_at: int, options: dict[str, Any] | None = None,
                 resume_options: dict[str, Any] | None = None,
                 workdir: str | os.PathLike | None = None) -> ResumeReport:
    """Run `target` uninterrupted for `steps` steps, then stopped after `stop_at` steps and resumed in a
    fresh process from its checkpoint, and compare the two runs step by step (see the module doc).

    options: passed to your function as `probe.options` in every run (e.g. to switch a planted bug on).
    resume_options: added to `options` in the resumed run only (e.g. a planted resume bug). The
    uninterrupted and stopped runs are then reused by later calls with the same unchanged script,
    `steps`, `stop_at` and `options`, so checking several resume variants costs one process each.
    workdir: where the runs start and the checkpoint is written (default: a temporary folder);
    a relative script path in `target` is taken from the current folder.
    """
    if not 0 < stop_at < steps:
        raise ValueError(f"need 0 < stop_at < steps, got stop_at={stop_at}, steps={steps}")
    where = target.rpartition(":")[0]
    if where.endswith(".py"):
        target = f"{Path(where).resolve()}:{target.rpartition(':')[2]}"
    _load_target(target)                    # a wrong module, file or function name fails here, before any run
    key = (target, _source_digest(target), steps, stop_at, json.dumps(options or {}, sort_keys=True, default=repr))
    reused = _REFERENCE_RUNS.get(key) if workdir is None else None
    if reused is None:
        # a folder of our own is removed when its reference runs are forgotten, at the latest when Python exits
        scratch = tempfile.TemporaryDirectory(prefix="check_resume-") if workdir is None else None
        cwd = Path(workdir) if scratch is None else Path(scratch.name)
        cwd.mkdir(parents=True, exist_ok=True)
        common = {"steps": steps, "checkpoint": str(cwd / "resume_check.pt"), "options": options or {},
                  "pythonpath": os.getcwd()}
        straight = _run_in_fresh_process(target, {**common, "stop_at": None, "resuming": False,
                                                  "label": "uninterrupted"}, cwd)
        stopped = _run_in_fresh_process(target, {**common, "stop_at": stop_at, "resuming": False,
                                                 "label": "stopped"}, cwd)
        if not Path(common["checkpoint"]).exists():
            raise RuntimeError(f"the stopped run returned without writing probe.checkpoint ({common['checkpoint']})")
        if [r["step"] for r in stopped["records"]] != list(range(stop_at)):
            raise RuntimeError(f"the stopped run should report steps 0..{stop_at - 1} and return; it reported "
                               f"{[r['step'] for r in stopped['records']]}")
        difference, step = _compare(straight, {"records": stopped["records"], "final": None}, 0, prefix_only=True)
        if difference:                      # not a resume problem: two fresh runs already disagree
            return ResumeReport(False, steps, stop_at, "the job is not reproducible: two fresh runs differ before "
                                f"any resume ({difference}); seed Python, NumPy and torch at the start "
                                "(seed_everything)", step)
        reused = (scratch, cwd, common, straight, Path(common["checkpoint"]).read_bytes())
        if workdir is None:                 # runs in a caller's folder are not kept: the folder is the caller's
            _REFERENCE_RUNS[key] = reused
    _, cwd, common, straight, checkpoint = reused
    Path(common["checkpoint"]).write_bytes(checkpoint)        # as the stopped run left it
    resumed = _run_in_fresh_process(target, {**common, "options": {**common["options"], **(resume_options or {})},
                                             "stop_at": None, "resuming": True, "label": "resumed"}, cwd)
    difference, step = _compare(straight, resumed, stop_at)
    return ResumeReport(not difference, steps, stop_at, difference, step)


# (target, its source's digest, steps, stop_at, options) -> (the temporary folder that owns it, the folder, run
# arguments, uninterrupted record, the stopped run's checkpoint bytes)
_REFERENCE_RUNS: dict[tuple, tuple[tempfile.TemporaryDirectory | None, Path, dict, dict, bytes]] = {}


def _source_digest(target: str) -> str:
    """A hash of the file that defines `target`, so an edited script is run afresh."""
    where = target.rpartition(":")[0]
    if where.endswith(".py"):
        path = Path(where)
    else:
        spec = importlib.util.find_spec(where)
        path = Path(spec.origin) if spec is not None and spec.origin else None
    return hashlib.sha1(path.read_bytes()).hexdigest() if path is not None and path.is_file() else ""


def _main() -> None:
    parser = argparse.ArgumentParser(description="one run of check_resume (internal)")
    parser.add_argument("target")
    parser.add_argument("probe")
    parser.add_argument("record")
    args = parser.parse_args()
    _run(args.target, json.loads(args.probe), Path(args.record))


if __name__ == "__main__":
    _main()
