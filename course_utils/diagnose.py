"""`diagnose`: run a plain training script under observation and name what is wrong with its training.

    diagnose("train.py")                          # in Python or a notebook: a Diagnosis
    ./course diagnose train.py [ARGS...]          # the same from a shell; exit 1 when something was found
    python -m course_utils diagnose train.py [--timeout S] [--max-steps N] [ARGS...]

The script is not changed: it runs as `__main__` in a child process (`course_utils/observe.py`), which
installs PyTorch's global hooks and a few wrappers first and writes its evidence to a JSON file as it
goes. A script that crashes, hangs or runs long is stopped at `timeout_s` (or after `max_steps`
optimizer steps) and what was seen so far is still diagnosed; a crash's message goes through
`explain()`. A script written for `torchrun` runs as a single process: its `init_process_group`
gets RANK=0, WORLD_SIZE=1 when torchrun's variables are not set.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import observe
from course_utils._display import ReadableResult
# The process-group handling of launch_torchrun: a child that dies with this process, killed with its workers.
from course_utils.distributed import _dies_with_this_process, _kill_group
from course_utils.diagnosis_rules import Finding, findings_from
from course_utils.explain import Explanation, explain

TAIL_LINES = 20


@dataclass
class Diagnosis(ReadableResult):
    """What `diagnose` observed: `findings` (empty for a healthy script), how the run ended (`status`:
    finished / crashed / stopped ...), its optimizer `steps`, its `wall_s`, the end of its output, and for
    a crash the `explanation` of its error."""
    script: str
    status: str
    steps: int
    wall_s: float
    findings: list[Finding] = field(default_factory=list)
    returncode: int | None = None
    output_tail: str = ""
    explanation: Explanation | None = None
    evidence: dict = field(default_factory=dict, repr=False)

    @property
    def healthy(self) -> bool:
        return not self.findings and self.explanation is None and self.status == "finished"

    def rules(self) -> list[str]:
        return [f.rule for f in self.findings]

    def __str__(self) -> str:
        head = (f"diagnose {self.script}: {self.status} after {self.steps} optimizer steps "
                f"({self.wall_s:.1f} s)")
        if self.healthy:
            return head + "\nNo problem found."
        lines = [head]
        if self.explanation is not None:
            lines += ["The script crashed:", "    " + str(self.explanation).replace("\n", "\n    ")]
        elif self.status not in ("finished",) and not self.status.startswith("stopped after"):
            lines += ["Last output:", "    " + self.output_tail.replace("\n", "\n    ")]
        lines.append(f"{len(self.findings)} finding(s):" if self.findings else "No training problem found.")
        lines += [f"  {n}. {finding}" for n, finding in enumerate(self.findings, 1)]
        return "\n".join(lines)


def _environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The script's environment: this one plus `extra`, its output unbuffered (so a stopped script's last
    lines show)."""
    return {**os.environ, **(extra or {}), "PYTHONUNBUFFERED": "1"}


def diagnose(script: str | Path, *args: str, timeout_s: float = 120.0, max_steps: int | None = None,
             cwd: str | Path | None = None, env: dict[str, str] | None = None) -> Diagnosis:
    """Run `script` (with `args`, in folder `cwd`, with the extra environment variables `env`) under
    observation for at most `timeout_s` seconds (and `max_steps` optimizer steps) and diagnose its training."""
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(f"diagnose: no script at {path.resolve()}; pass the path of a Python training script.")
    if timeout_s <= 0:
        raise ValueError(f"diagnose: timeout_s must be positive, got {timeout_s}.")
    with tempfile.TemporaryDirectory(prefix="diagnose-") as scratch:
        evidence_file = Path(scratch) / "evidence.json"
        command = [sys.executable, str(Path(observe.__file__)), str(evidence_file)]
        command += ["--max-steps", str(max_steps)] if max_steps else []
        command += [str(path.resolve()), *args]          # the child may run in another folder (cwd)
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=_environment(env), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                   preexec_fn=_dies_with_this_process())
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)                 # SIGTERM first: the observer writes its evidence, then exits
            output, _ = process.communicate()
        wall_s = time.perf_counter() - started
        evidence = json.loads(evidence_file.read_text()) if evidence_file.exists() else {}
    return _diagnosis(str(script), process.returncode, output or "", wall_s, evidence)


def _diagnosis(script: str, returncode: int | None, output: str, wall_s: float, evidence: dict) -> Diagnosis:
    tail = "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])
    if not evidence:
        status = "ended before observation started" if returncode is not None else "stopped at the timeout"
        return Diagnosis(script, status, 0, wall_s, [], returncode, tail, explain(output) if returncode else None)
    status = evidence["status"]
    if status == "running":                  # killed before it could write a final word
        status = "stopped at the timeout"
    crash = explain(evidence["crash"]) if evidence.get("crash") else None
    return Diagnosis(script, status, evidence["steps"], wall_s, findings_from(evidence), returncode, tail, crash,
                     evidence)


def main(argv: list[str]) -> int:
    """The CLI: print the diagnosis; exit 1 when a problem was found or the script crashed, 2 on bad usage."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m course_utils diagnose",
                                     description="Run a training script under observation and name what is wrong.")
    parser.add_argument("script")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before the script is stopped")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    options = parser.parse_args(argv)
    try:
        result = diagnose(options.script, *options.args, timeout_s=options.timeout, max_steps=options.max_steps)
    except (FileNotFoundError, ValueError) as error:
        print(error, file=sys.stderr)
        return 2
    print(result)
    return 0 if result.healthy else 1
