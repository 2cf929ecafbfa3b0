"""The exercise protocol: progressive hints, the progress record, and every shipped exercise rejected.

`shipped_exercises()` reads each notebook (the chapters and the triage page) and rebuilds the exercise
functions exactly as a learner receives them (a `...` body, or code with planted bugs); each must fail
its own check, or the exercise would be solved before the learner touched it. That each check *accepts*
its reference is proven by the notebook run itself (COURSE_SOLUTIONS=1 makes a failing check raise).
"""
import ast
import json
from pathlib import Path

import pytest

import course_utils
from course_utils import exercises, progress
from course_utils.exercises import report_check

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))     # the chapters and triage


def _code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _without_magics(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def _is_check_call(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id.startswith("check_"))


def _is_exercise(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Name) and d.id == "exercise" for d in node.decorator_list)


def is_find_the_bug(source: str, name: str) -> bool:
    """A find-the-bug exercise ships working-looking code; a write-it exercise ships a `...` body."""
    node = next(n for n in ast.parse(_without_magics(source)).body if _is_exercise(n) and n.name == name)
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                          and isinstance(s.value.value, str))]          # drop the docstring
    return not (len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and body[0].value.value is Ellipsis)


def shipped_exercises():
    """(notebook, exercise name, cell source) for every `@exercise` function in every chapter."""
    for notebook in NOTEBOOKS:
        for source in _code_cells(notebook):
            tree = ast.parse(_without_magics(source))
            for node in tree.body:
                if _is_exercise(node):
                    yield pytest.param(notebook, node.name, source, id=f"{notebook.stem}:{node.name}")


def build_shipped(notebook: Path, name: str, source: str):
    """Run the notebook's set-up cell, then the exercise cell without its check call; return the function."""
    namespace: dict = {"__name__": "__shipped__"}
    exec(compile(_without_magics(_code_cells(notebook)[0]), f"{notebook.name}:setup", "exec"), namespace)
    tree = ast.parse(_without_magics(source))
    tree.body = [node for node in tree.body if not _is_check_call(node)]
    exec(compile(tree, f"{notebook.name}:{name}", "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("notebook, name, source", list(shipped_exercises()))
def test_the_shipped_exercise_fails_its_check(notebook, name, source, learner, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # chapter 7's set-up cell writes the broken project where it runs
    fn = build_shipped(notebook, name, source)
    check = getattr(course_utils, f"check_{name}")
    verdict = check(fn)
    assert not verdict, f"{notebook.name}: exercise {name} passes before the learner changed anything"
    assert name in str(verdict)


def test_every_chapter_has_four_exercises_three_of_them_find_the_bug():
    by_chapter: dict[str, list[bool]] = {}
    for param in shipped_exercises():
        notebook, name, source = param.values
        by_chapter.setdefault(notebook.stem, []).append(is_find_the_bug(source, name))
    for notebook in NOTEBOOKS:
        if notebook.stem == "07_broken_project":
            # besides its @exercise cells, chapter 7 has the project's four stages, fixed in its files
            code = "\n".join(_code_cells(notebook))
            assert all(f"bp.check_{stage}(folder)" in code for stage in course_utils.broken_project.STAGES)
        kinds = by_chapter.get(notebook.stem, [])
        assert len(kinds) >= 4, f"{notebook.name}: {len(kinds)} exercises, need 4"
        assert sum(kinds) >= 3, f"{notebook.name}: {sum(kinds)} find-the-bug exercises, need 3"


def test_every_exercise_has_a_reference_and_a_check():
    names = [param.values[1] for param in shipped_exercises()]
    assert len(names) == len(set(names)), "exercise names must be unique across chapters"
    for name in names:
        assert callable(exercises.reference(name))
        assert callable(getattr(course_utils, f"check_{name}"))


def test_hints_grow_one_per_attempt_and_solving_is_recorded(learner):
    exercises.reference_solution("demo_hints", chapter=9)(lambda: None)
    first = report_check("demo_hints", False, "layer 2 did not change", ["nudge one", "nudge two"])
    assert not first and first.attempt == 1
    assert "layer 2 did not change" in str(first) and "nudge" not in str(first)
    second = report_check("demo_hints", False, "layer 2 did not change", ["nudge one", "nudge two"])
    assert "hint 1: nudge one" in str(second) and "nudge two" not in str(second)
    third = report_check("demo_hints", False, "still", ["nudge one", "nudge two"])
    fourth = report_check("demo_hints", False, "still", ["nudge one", "nudge two"])
    assert "hint 2: nudge two" in str(third) and str(fourth).count("\n  hint ") == 2
    assert report_check("demo_hints", True, None, [])
    row = dict((n, (a, s)) for n, a, s in progress().chapters[9])["demo_hints"]
    assert row == (5, True)
    assert "Chapter 9: 1/1" in str(progress())
    assert list(progress(chapter=9).chapters) == [9] and progress(chapter=99).total == 0


def test_a_verdict_displays_once_without_a_bool_echo(learner):
    verdict = report_check("demo_display", False, None, ["nudge"])
    assert repr(verdict) == str(verdict) and "not attempted" in repr(verdict)
    assert "False" not in repr(verdict)


def test_an_untouched_exercise_is_not_an_attempt(learner):
    exercises.reference_solution("demo_untouched", chapter=9)(lambda: None)
    for _ in range(3):
        verdict = report_check("demo_untouched", False, None, ["nudge one"])
        assert "not attempted" in str(verdict) and "hint" not in str(verdict)
    first_real = report_check("demo_untouched", False, "it returned 3", ["nudge one"])
    assert first_real.attempt == 1 and "hint 1" not in str(first_real)
    assert dict((n, a) for n, a, _ in progress().chapters[9])["demo_untouched"] == 1


def test_an_unreadable_progress_file_starts_afresh(learner, tmp_path, monkeypatch):
    bad = tmp_path / "progress.json"
    bad.write_text("{not json")
    monkeypatch.setenv(exercises.PROGRESS_ENV, str(bad))
    assert report_check("demo_bad_file", False, "x", []).attempt == 1
    assert json.loads(bad.read_text())["demo_bad_file"]["attempts"] == 1


def test_the_references_leave_the_learners_record_alone(monkeypatch, tmp_path):
    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "1")
    assert report_check("demo_ci", True, None, [])
    assert not (tmp_path / "progress.json").exists()
