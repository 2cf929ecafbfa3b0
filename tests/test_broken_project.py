"""Chapter 7's broken project: the reference trains, resumes exactly and exports an ONNX model that
matches PyTorch; each planted bug, alone, is still caught by its stage's check (so the project never
rots into a working one); and the chapter runs unsolved, showing the symptoms."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import broken_project as bp
from course_utils import explain

pytestmark = pytest.mark.slow
CHECKS = {"training": bp.check_training, "resume": bp.check_resume, "distributed": bp.check_distributed,
          "export": bp.check_export}
NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "07_broken_project.ipynb"


def test_the_planted_bugs_span_the_chapters_and_need_reasoning_too():
    assert len(bp.BUGS) >= 8 and len({b.id for b in bp.BUGS}) == len(bp.BUGS)
    assert {b.chapter for b in bp.BUGS} == {1, 2, 3, 4, 5, 6}
    assert sum(b.silent for b in bp.BUGS) >= 4
    assert sum(b.found_by == "your own reasoning" for b in bp.BUGS) >= 2
    assert {b.stage for b in bp.BUGS} == set(bp.STAGES)


def test_the_reference_trains_resumes_and_exports(tmp_path):
    folder = bp.fresh_copy(tmp_path / "project", bugs=())
    for stage, check in CHECKS.items():
        report = check(folder)
        assert report.passed, str(report)


@pytest.mark.parametrize("bug", bp.BUGS, ids=[b.id for b in bp.BUGS])
def test_each_planted_bug_alone_is_caught(bug, tmp_path, learner):
    folder = bp.fresh_copy(tmp_path / "project", bugs=(bug,))
    report = CHECKS[bug.stage](folder)
    assert not report.passed, f"{bug.id} slipped through the {bug.stage} check:\n{report}"
    if report.observations[0].startswith("torchrun exited with") and report.observations[0] != "torchrun exited with 0":
        assert report.observations[1].startswith("the first worker error: "), str(report)
    if bug.found_by.startswith("diagnose: "):
        assert bug.found_by.removeprefix("diagnose: ") in report.diagnosis.rules(), str(report)
    if bug.found_by.startswith("explain"):
        rejected = next(line for line in report.observations if "ONNX Runtime rejected" in line)
        assert explain(rejected).id == "onnx-input-shape"


def test_copies_resets_and_keeps_the_learners_edits(tmp_path, monkeypatch, learner):
    folder = bp.project_folder(tmp_path / "p")
    assert bp.as_shipped(folder)
    (folder / "train.py").write_text((folder / "train.py").read_text() + "# my fix\n")
    (folder / "checkpoint.pt").write_text("old output")
    assert bp.project_folder(folder) == folder and not bp.as_shipped(folder)      # kept
    bp.reset(folder)
    assert bp.as_shipped(folder) and not (folder / "checkpoint.pt").exists()
    monkeypatch.setenv("COURSE_SOLUTIONS", "1")
    bp.project_folder(folder)
    assert {n: (folder / n).read_text() for n in bp.FILES} == bp.project_source(())


def test_bad_input_gets_a_clear_error(tmp_path, learner):
    with pytest.raises(FileNotFoundError, match="fresh_copy"):
        bp.check_training(tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError):
        bp.fresh_copy(tmp_path / "afile")
    stale = bp.PlantedBug("x", 1, "train.py", "no such line", "", "training", "diagnose: x")
    with pytest.raises(ValueError, match="occurs 0 times"):
        bp.project_source((stale,))


def test_the_chapter_runs_unsolved_and_shows_the_symptoms(tmp_path):
    """CI runs every notebook with the reference in place (solved); this runs chapter 7 as a learner first
    meets it: every bug planted, each stage's cell asserting the symptom it shows."""
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    env = {**os.environ, "COURSE_SOLUTIONS": "0", "COURSE_PROGRESS_FILE": str(tmp_path / "progress.json")}
    run = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                          "--ExecutePreprocessor.timeout=600", NOTEBOOK.name], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert bp.as_shipped(tmp_path / "broken_project")


def test_the_stored_run_is_of_a_fresh_broken_copy():
    """The outputs a learner opens are those of the project as shipped (`./course outputs` resets it), not of
    a copy some earlier run had fixed."""
    import json
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    first = "".join("".join(o.get("text", "")) for o in cells[0]["outputs"])
    later = ["".join(o.get("text", "")) for c in cells[1:] for o in c["outputs"]]
    assert "the files are as shipped (every bug planted)" in first
    assert any("0 of 4 stages pass" in t for t in later)
