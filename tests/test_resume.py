"""check_resume: a correct resume passes; each planted resume bug is named, with its step."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.resume import ResumeProbe, check_resume

JOB = str(Path(__file__).with_name("resume_job.py")) + ":run"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_correct_resume_is_exact(workers):
    report = check_resume(JOB, steps=10, stop_at=6, options={"num_workers": workers})
    assert report, str(report)
    assert "bit for bit" in str(report)


@pytest.mark.slow
@pytest.mark.parametrize("bug, expected", [
    ("forget_scheduler", "scheduler: last_epoch"),
    ("forget_rng", "random streams (torch) differ"),
    ("restart_epoch", "the epoch restarted"),
])
def test_each_resume_bug_is_named_at_its_step(bug, expected):
    report = check_resume(JOB, steps=10, stop_at=6, options={bug: True})
    assert not report
    assert expected in str(report) and report.step == 6, str(report)


@pytest.mark.slow
def test_a_job_that_is_not_reproducible_is_told_apart_from_a_resume_bug(tmp_path):
    script = tmp_path / "unseeded.py"
    script.write_text(
        "import random, torch\n"
        "def run(probe):\n"
        "    model = torch.nn.Linear(2, 1)            # a fresh random init in every process: no seed\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for step in range(probe.steps):\n"
        "        x = torch.randn(4, 2)\n"
        "        loss = model(x).pow(2).mean(); optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "        probe.step(step, batch=x, loss=loss, model=model, optimizer=optimizer)\n"
        "        if step + 1 == probe.stop_at:\n"
        "            torch.save(model.state_dict(), probe.checkpoint); return\n"
        "    probe.finish(model=model, optimizer=optimizer)\n")
    report = check_resume(f"{script}:run", steps=4, stop_at=2)
    assert not report and "not reproducible" in str(report) and report.step == 0


def test_bad_targets_fail_before_any_run(tmp_path):
    with pytest.raises(ValueError, match="package.module:function"):
        check_resume("resume_job.run", steps=4, stop_at=2)
    with pytest.raises(FileNotFoundError, match="no training script"):
        check_resume(str(tmp_path / "missing.py") + ":run", steps=4, stop_at=2)
    with pytest.raises(ModuleNotFoundError):
        check_resume("no_such_package.train:run", steps=4, stop_at=2)
    with pytest.raises(AttributeError, match="no function 'main'"):
        check_resume(JOB.replace(":run", ":main"), steps=4, stop_at=2)
    with pytest.raises(ValueError, match="0 < stop_at < steps"):
        check_resume(JOB, steps=4, stop_at=4)


def test_a_run_that_does_not_stop_is_reported(tmp_path):
    script = tmp_path / "never_stops.py"
    script.write_text("def run(probe):\n    pass\n")
    with pytest.raises(RuntimeError, match="without writing probe.checkpoint"):
        check_resume(f"{script}:run", steps=4, stop_at=2)


def test_the_probe_fingerprints_change_with_the_data():
    import torch
    probe = ResumeProbe(steps=2, stop_at=None, checkpoint=Path("unused"), resuming=False)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in (torch.ones(2, 2), torch.zeros(2, 2)):
        probe.step(len(probe.records), batch=batch, loss=torch.tensor(1.0), model=model, optimizer=optimizer)
    assert probe.records[0]["batch"] != probe.records[1]["batch"]
    assert probe.records[0]["parameters"] == probe.records[1]["parameters"]     # no update happened


@pytest.mark.slow
def test_a_job_that_prints_and_one_that_raises(tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(
        "import random, numpy, torch\n"
        "def run(probe):\n"
        "    random.seed(0); numpy.random.seed(0); torch.manual_seed(0)\n"
        "    print('starting', probe.resuming)          # must not disturb check_resume\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    if probe.options.get('crash'):\n"
        "        raise ValueError('planted crash')\n"
        "    start = torch.load(probe.checkpoint)['step'] if probe.resuming else 0\n"
        "    for step in range(start, probe.steps):\n"
        "        probe.step(step, batch=torch.ones(1), loss=1.0, model=model, optimizer=optimizer)\n"
        "        if step + 1 == probe.stop_at:\n"
        "            torch.save({'step': step + 1}, probe.checkpoint); return\n"
        "    probe.finish(model=model, optimizer=optimizer)\n")
    assert check_resume(f"{script}:run", steps=4, stop_at=2)
    with pytest.raises(RuntimeError, match="(?s)failed in the resumed run.*planted crash"):
        check_resume(f"{script}:run", steps=4, stop_at=2, resume_options={"crash": True})


@pytest.mark.slow
def test_without_the_fork_server_each_run_is_a_new_interpreter(monkeypatch):
    import course_utils.resume as resume
    monkeypatch.setattr(resume.sys, "platform", "darwin")       # macOS and Windows take this path
    monkeypatch.setattr(resume, "_REFERENCE_RUNS", {})
    report = check_resume(JOB, steps=4, stop_at=2)
    assert report, str(report)


@pytest.mark.slow
def test_the_temporary_folder_is_removed_when_python_exits(tmp_path):
    # the reference runs are kept for later calls, so their folder lives as long as they do, and no longer
    code = (f"from course_utils.resume import check_resume\nassert check_resume({JOB!r}, steps=4, stop_at=2)\n"
            f"from pathlib import Path\nprint(len(list(Path({str(tmp_path)!r}).glob('check_resume-*/resume_check.pt'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "1"                      # the runs used a folder of their own...
    assert not list(tmp_path.glob("check_resume-*"))           # ...which is gone once Python has exited


@pytest.mark.slow
def test_a_run_in_a_callers_folder_does_not_replace_the_kept_runs(tmp_path):
    assert check_resume(JOB, steps=4, stop_at=2)
    folder = tmp_path / "mine"
    assert check_resume(JOB, steps=4, stop_at=2, workdir=folder)
    for path in folder.iterdir():                # the caller's folder is theirs to remove
        path.unlink()
    folder.rmdir()
    assert check_resume(JOB, steps=4, stop_at=2)             # still the kept runs, in a folder of their own
