"""Chapter 7's broken project: a small image classifier with bugs planted from chapters 1-6.

    fresh_copy("broken_project")        # the project, every bug planted, in a working folder (again: a reset)
    project_folder("broken_project")    # the same the first time; afterwards the learner's edited copy
    check_training(folder)              # stage 1: does it train? (diagnose + the accuracy it reaches)
    check_resume(folder)                # stage 2: does --resume continue exactly?
    check_distributed(folder)           # stage 3: two processes under torchrun
    check_export(folder)                # stage 4: ONNX Runtime against PyTorch, batch 1 and 8

`reference/` holds the project as it should be; each `PlantedBug` replaces one snippet of it. Under
COURSE_SOLUTIONS=1, `fresh_copy` writes the reference (the reference fixes applied). Every check runs
the project's own scripts in fresh processes, as a learner would from a terminal, and returns a
`StageReport` saying what it observed; none imports the learner's files into the notebook's kernel.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from course_utils._display import ReadableResult
from course_utils.diagnose import Diagnosis, diagnose
from course_utils.distributed import _worker_traceback, launch_torchrun
from course_utils.exercises import _REFERENCES, _record, _Registered, solutions_in_place
from course_utils.explain import explain

REFERENCE = Path(__file__).parent / "reference"
FILES = ("data.py", "model.py", "train.py", "export.py")
OUTPUTS = ("checkpoint.pt", "train_log.jsonl", "shapes.onnx", "checkpoint.pt.tmp")
STAGES = ("training", "resume", "distributed", "export")
TARGET_ACCURACY = 0.95          # the reference reaches 1.0 on the validation set in 6 epochs
EPOCHS = 6


@dataclass(frozen=True)
class PlantedBug:
    """One planted bug: the `fixed` snippet of `file` (as in the reference) replaced by `broken`. `stage`
    is the check that shows it; `found_by` says what names it: diagnose, explain, or your own reasoning."""
    id: str
    chapter: int
    file: str
    fixed: str
    broken: str
    stage: str
    found_by: str
    silent: bool = True


BUGS = (
    PlantedBug("per-pixel-normalisation", 3, "data.py",
               "    mean, std = train_x.mean(), train_x.std()",
               "    mean, std = train_x.mean(0), train_x.std(0)            # per-pixel statistics",
               "training", "diagnose: nonfinite-input"),
    PlantedBug("unshuffled-sampler", 2, "data.py",
               "shuffle=True, seed=0)", "shuffle=False, seed=0)", "training", "diagnose: unshuffled-data"),
    PlantedBug("blocks-in-a-list", 2, "model.py",
               "        self.blocks = nn.ModuleList(ConvBlock(a, b) for a, b in zip(widths, widths[1:]))",
               "        self.blocks = [ConvBlock(a, b) for a, b in zip(widths, widths[1:])]",
               "training", "diagnose: param-not-in-optimizer"),
    PlantedBug("softmax-before-cross-entropy", 2, "model.py",
               "        return self.head(self.dropout(x.flatten(1)))",
               "        return torch.softmax(self.head(self.dropout(x.flatten(1))), dim=1)",
               "training", "diagnose: double-softmax"),
    PlantedBug("no-zero-grad", 1, "train.py",
               "            optimizer.zero_grad()\n", "", "training", "diagnose: grad-not-cleared"),
    PlantedBug("eval-mode-left-on", 2, "train.py",
               "        model.train()\n", "", "training", "diagnose: eval-mode-training"),
    PlantedBug("no-set-epoch", 5, "train.py",
               "        sampler.set_epoch(epoch)\n", "", "training", "diagnose: sampler-without-set-epoch"),
    PlantedBug("optimizer-state-not-restored", 4, "train.py",
               "        optimizer.load_state_dict(checkpoint[\"optimizer\"])\n", "", "resume",
               "diagnose: resume-without-optimizer-state"),
    PlantedBug("resume-repeats-an-epoch", 4, "train.py",
               "        start_epoch = checkpoint[\"epoch\"] + 1", "        start_epoch = checkpoint[\"epoch\"]",
               "resume", "your own reasoning"),
    PlantedBug("every-rank-writes", 5, "train.py",
               "        if rank == 0:\n            print(json.dumps(record), flush=True)\n"
               "            with open(args.log_file, \"a\") as log:\n                log.write(json.dumps(record) + \"\\n\")\n"
               "            save(args.checkpoint, model, optimizer, epoch)\n",
               "        print(json.dumps(record), flush=True)\n"
               "        with open(args.log_file, \"a\") as log:\n            log.write(json.dumps(record) + \"\\n\")\n"
               "        save(args.checkpoint, model, optimizer, epoch)\n",
               "distributed", "your own reasoning"),
    PlantedBug("export-fixed-batch", 6, "export.py",
               ",\n                      dynamic_shapes={\"x\": {0: torch.export.Dim(\"batch\", min=1, max=1024)}}, dynamo=True)",
               ", dynamo=True)", "export", "explain: the error ONNX Runtime raises", silent=False),
)


def project_source(bugs: tuple[PlantedBug, ...] = BUGS) -> dict[str, str]:
    """The project's files with `bugs` planted into the reference (each snippet must occur exactly once)."""
    files = {name: (REFERENCE / name).read_text() for name in FILES}
    for bug in bugs:
        count = files[bug.file].count(bug.fixed)
        if count != 1:
            raise ValueError(f"bug {bug.id}: its snippet occurs {count} times in reference/{bug.file} (needs 1)")
        files[bug.file] = files[bug.file].replace(bug.fixed, bug.broken)
    return files


def fresh_copy(folder: str | Path = "broken_project", *, bugs: tuple[PlantedBug, ...] | None = None) -> Path:
    """Write the project into `folder` (created; its project files and outputs replaced): with every bug
    planted, or under COURSE_SOLUTIONS=1 the reference. Call it again at any time to start over."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file; pass a folder for the project")
    folder.mkdir(parents=True, exist_ok=True)
    chosen = bugs if bugs is not None else (() if solutions_in_place() else BUGS)
    for name, text in project_source(chosen).items():
        (folder / name).write_text(text)
    for name in OUTPUTS:
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)
    return folder


reset = fresh_copy


def project_folder(folder: str | Path = "broken_project") -> Path:
    """The learner's copy: created broken (fresh_copy) the first time, left as the learner edited it after
    (under COURSE_SOLUTIONS=1: the reference, always)."""
    folder = Path(folder)
    if solutions_in_place() or not all((folder / name).is_file() for name in FILES):
        fresh_copy(folder)
    return folder


def as_shipped(folder: str | Path) -> bool:
    """Are the project's files exactly as fresh_copy wrote them (every bug still planted)?"""
    return all((Path(folder) / name).read_text() == text for name, text in project_source(BUGS).items())


@dataclass
class StageReport(ReadableResult):
    """What a stage's check observed: `passed`, one line per observation, and the diagnosis when it ran one."""
    stage: str
    passed: bool
    observations: list[str] = field(default_factory=list)
    diagnosis: Diagnosis | None = field(default=None, repr=False)

    def __str__(self) -> str:
        lines = [f"{self.stage}: {'PASSED' if self.passed else 'NOT YET'}"]
        lines += [f"  - {line}" for line in self.observations]
        return "\n".join(lines)


def _recorded(report: StageReport) -> StageReport:
    """Count the attempt in progress() (chapter 7, one exercise per stage). Under COURSE_SOLUTIONS=1 the
    reference project must pass: a failure there is a broken course, raised."""
    if not report.passed and solutions_in_place():
        raise AssertionError(f"the reference project fails its {report.stage} check:\n{report}")
    _record(f"broken_project_{report.stage}", solved=report.passed)
    return report


for _stage in STAGES:       # progress() lists chapter 7's stages beside the other chapters' exercises
    _REFERENCES[f"broken_project_{_stage}"] = _Registered(fresh_copy, 7)


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def _clean(folder: Path) -> None:
    for name in OUTPUTS:
        (folder / name).unlink(missing_ok=True)


def _project(folder: str | Path) -> Path:
    folder = Path(folder).resolve()
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} has no {', '.join(missing)}: create the project with fresh_copy({str(folder)!r})")
    return folder


def check_training(folder: str | Path, epochs: int = EPOCHS) -> StageReport:
    """Train from scratch under `diagnose`: passes when the script finishes, the loss stays finite, the last
    validation accuracy reaches TARGET_ACCURACY and diagnose finds nothing."""
    folder = _project(folder)
    _clean(folder)
    result = diagnose(folder / "train.py", "--epochs", str(epochs), cwd=folder, timeout_s=180)
    records = _records(folder / "train_log.jsonl")
    seen = [f"the script {result.status} after {result.steps} optimizer steps"]
    if records:
        last = records[-1]
        seen.append(f"epoch {last['epoch']}: loss {last['loss']:.4g}, validation accuracy {last['val_accuracy']:.3f} "
                    f"(target {TARGET_ACCURACY})")
    seen += [f"diagnose: {f.rule} - {f.message}" for f in result.findings]
    if result.explanation is not None:
        seen.append(f"explain: {result.explanation.title} (chapter {result.explanation.chapter})")
    learned = bool(records) and math.isfinite(records[-1]["loss"]) and records[-1]["val_accuracy"] >= TARGET_ACCURACY
    return _recorded(StageReport("training", result.healthy and learned, seen, result))


def check_resume(folder: str | Path) -> StageReport:
    """Four epochs in one run against two epochs, then --resume to four: the logs and the final weights must
    be identical. Also diagnoses the resumed run (a fresh optimizer is invisible in the log of a short run)."""
    folder = _project(folder)
    epochs, stop = 4, 2
    with tempfile.TemporaryDirectory() as scratch:
        whole, parts = Path(scratch) / "whole", Path(scratch) / "parts"
        runs = []
        for run, steps in ((whole, [f"--epochs={epochs}"]), (parts, [f"--epochs={stop}"])):
            run.mkdir()
            runs.append(subprocess.run([sys.executable, str(folder / "train.py"), *steps, "--checkpoint",
                                        str(run / "ck.pt"), "--log-file", str(run / "log.jsonl")], cwd=folder,
                                       capture_output=True, text=True, timeout=300))
        resumed = diagnose(folder / "train.py", f"--epochs={epochs}", "--resume", "--checkpoint", str(parts / "ck.pt"),
                           "--log-file", str(parts / "log.jsonl"), cwd=folder, timeout_s=180)
        failed = [r for r in runs if r.returncode] or ([] if resumed.status == "finished" else [resumed])
        if failed:
            return _recorded(StageReport("resume", False, ["a run failed: " + (
                getattr(failed[0], "stderr", "") or failed[0].output_tail).strip()[-400:]], resumed))
        a, b = _records(whole / "log.jsonl"), _records(parts / "log.jsonl")
        import torch
        wa, wb = (torch.load(run / "ck.pt", map_location="cpu", weights_only=True)["model"] for run in (whole, parts))
    same_epochs = [r["epoch"] for r in a] == [r["epoch"] for r in b]
    same_losses = same_epochs and all(math.isclose(x["loss"], y["loss"], rel_tol=1e-6) for x, y in zip(a, b))
    same_weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    seen = [f"epochs logged: uninterrupted {[r['epoch'] for r in a]}, stopped at {stop} and resumed "
            f"{[r['epoch'] for r in b]}",
            f"losses {'identical' if same_losses else 'differ'}: uninterrupted "
            f"{[round(r['loss'], 5) for r in a]}, resumed {[round(r['loss'], 5) for r in b]}",
            f"final weights {'identical' if same_weights else 'differ'}"]
    resuming = [f for f in resumed.findings if f.chapter == 4]
    seen += [f"diagnose (resumed run): {f.rule} - {f.message}" for f in resuming]
    if len(resumed.findings) > len(resuming):
        seen.append(f"diagnose (resumed run): {len(resumed.findings) - len(resuming)} more finding(s), the "
                    "training stage's (check_training)")
    return _recorded(StageReport("resume", same_losses and same_weights and not resumed.findings, seen, resumed))


def check_distributed(folder: str | Path, epochs: int = 2) -> StageReport:
    """Two processes under torchrun (gloo): each epoch logged once, and each epoch's order different."""
    folder = _project(folder)
    _clean(folder)
    result = launch_torchrun(str(folder / "train.py"), 2, f"--epochs={epochs}", "--checkpoint",
                             str(folder / "checkpoint.pt"), "--log-file", str(folder / "train_log.jsonl"),
                             check=False, echo=False, timeout_s=300)
    records = _records(folder / "train_log.jsonl")
    logged = [r["epoch"] for r in records]
    orders = {tuple(r["first_batch"]) for r in records}
    seen = [f"torchrun exited with {result.returncode}"]
    if result.returncode:       # the failing rank's own error, not a peer noticing that it died
        last_line = (_worker_traceback(result.output).strip().splitlines() or ["(no output)"])[-1]
        seen.append("the first worker error: " + last_line[:300])
    seen += [f"epochs in the log: {logged} (expected {list(range(epochs))})",
             f"{len(orders)} different first batches over {len(records)} log lines"]
    passed = result.returncode == 0 and logged == list(range(epochs)) and len(orders) == epochs
    return _recorded(StageReport("distributed", passed, seen))


_VERIFY = """
import json, torch
from model import ShapesNet
from course_utils.inference import verify_onnx
model = ShapesNet()
state = torch.load("checkpoint.pt", map_location="cpu", weights_only=True)["model"]
model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
torch.manual_seed(1)
result = verify_onnx(model, "shapes.onnx", [(torch.randn(1, 1, 16, 16),), (torch.randn(8, 1, 16, 16),)])
print("VERIFY " + json.dumps({"passed": result.passed, "report": str(result)}))
"""


def check_export(folder: str | Path) -> StageReport:
    """Train two epochs, run export.py, and compare ONNX Runtime with PyTorch on batches of 1 and 8."""
    folder = _project(folder)
    _clean(folder)
    steps = [[sys.executable, "train.py", "--epochs=2"], [sys.executable, "export.py"], [sys.executable, "-c", _VERIFY]]
    for command in steps:
        run = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)
        if run.returncode:
            errors = [line for line in run.stderr.splitlines() if re.match(r"^[\w.]+(Error|Exception)\b.*:", line)]
            last = (errors[:1] or run.stderr.strip().splitlines()[-1:] or ["(no output)"])[0]   # the root cause
            seen = [f"`{' '.join(command[1:2])}` failed: {last[:300]}"]
            explanation = explain(run.stderr)
            if explanation is not None:
                seen.append(f"explain: {explanation.title} (chapter {explanation.chapter}, {explanation.section})")
            return _recorded(StageReport("export", False, seen))
    verdict = json.loads(run.stdout.split("VERIFY ", 1)[1])
    return _recorded(StageReport("export", verdict["passed"], verdict["report"].splitlines()))
