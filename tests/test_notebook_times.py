"""The Run All time each opening cell states is the one its stored run took (within 25 %)."""
import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("run_all_time", ROOT / "tools" / "run_all_time.py")
run_all_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_all_time)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_opening_cell_states_the_stored_run_time(path):
    notebook = json.loads(path.read_text())
    stated, stored = run_all_time.stated_run_seconds(notebook), run_all_time.stored_run_seconds(notebook)
    assert stated is not None, f"{path.name}: no '**Run All:** N s' line in the opening cell"
    assert abs(stated - stored) <= run_all_time.TOLERANCE * stored, (
        f"{path.name}: the opening cell says {stated:.0f} s, the stored run took {stored:.0f} s; "
        "run ./course outputs to store a fresh run and its time")


def _notebook(head: str, start: str, end: str) -> dict:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(head), nbformat.v4.new_code_cell(),
                                               nbformat.v4.new_code_cell()])
    notebook.cells[1].metadata["execution"] = {"iopub.execute_input": start}
    notebook.cells[2].metadata["execution"] = {"iopub.status.idle": end}
    return notebook


def test_stamp_rewrites_only_the_run_all_line(tmp_path):
    path = tmp_path / "nb.ipynb"
    head = "# Title\n\n**Run All:** 999 s of cell time, stale.\n\nMore text.\n"
    nbformat.write(_notebook(head, "2026-01-01T00:00:00.0Z", "2026-01-01T00:00:42.4Z"), path)
    line = run_all_time.stamp(path, "CPU only: a test machine")
    notebook = json.loads(path.read_text())
    assert run_all_time.stated_run_seconds(notebook) == 42 and "a test machine" in line
    assert "".join(notebook["cells"][0]["source"]) == head.replace(
        "**Run All:** 999 s of cell time, stale.", line)


def test_a_stale_line_is_caught_and_a_missing_one_refused(tmp_path):
    stale = _notebook("**Run All:** 10 s\n", "2026-01-01T00:00:00Z", "2026-01-01T00:00:20Z")
    assert run_all_time.stated_run_seconds(stale) == 10 != run_all_time.stored_run_seconds(stale)
    path = tmp_path / "nb.ipynb"
    nbformat.write(_notebook("# no line\n", "2026-01-01T00:00:00Z", "2026-01-01T00:00:20Z"), path)
    with pytest.raises(ValueError, match=r"needs a line starting with '\*\*Run All:\*\*'"):
        run_all_time.stamp(path, "cpu")
