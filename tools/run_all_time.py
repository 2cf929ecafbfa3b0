"""The opening cell's *Run All* time, written from the run whose outputs are stored.

Each chapter's first markdown cell holds one line that starts with `**Run All:**`. `./course outputs`
executes the notebook and then calls `stamp(notebook)`, which rewrites that line from the cells'
execution timestamps (nbclient stores them in `metadata.execution`) and names this machine.
`tests/test_notebook_times.py` fails when the line and the stored run disagree by more than 25 %.

    python tools/run_all_time.py notebooks/01_tensors_autograd.ipynb   # stamp one notebook
"""
from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

import nbformat

LINE_START = "**Run All:**"
TOLERANCE = 0.25
_STATED = re.compile(r"^\*\*Run All:\*\* (\d+(?:\.\d+)?) s\b", re.MULTILINE)


def stored_run_seconds(notebook: dict) -> float:
    """Cell time of the stored run: first cell's start to last cell's end, in seconds."""
    stamps = [c["metadata"]["execution"] for c in notebook["cells"] if "execution" in c.get("metadata", {})]
    if not stamps:
        raise ValueError("the notebook stores no execution timestamps: run it with ./course outputs")
    parse = lambda key: [datetime.fromisoformat(s[key].rstrip("Z")) for s in stamps if key in s]
    return (max(parse("iopub.status.idle")) - min(parse("iopub.execute_input"))).total_seconds()


def stated_run_seconds(notebook: dict) -> float | None:
    """The seconds the opening cell's `**Run All:**` line states, or None without such a line."""
    found = _STATED.findall("".join(notebook["cells"][0]["source"]))
    if len(found) > 1:
        raise ValueError(f"the opening cell has {len(found)} '{LINE_START}' lines; keep one")
    return float(found[0]) if found else None


def run_all_line(seconds: float, hardware: str) -> str:
    shown = f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}"
    return (f"{LINE_START} {shown} s of cell time in the run stored below, on {hardware} "
            f"(written by `./course outputs`; the kernel's start adds a few seconds).")


def stamp(path: Path, hardware: str) -> str:
    """Rewrite the `**Run All:**` line of `path` from its stored run; return the new line."""
    notebook = nbformat.read(path, as_version=4)
    head = "".join(notebook["cells"][0]["source"])
    if not re.search(r"^\*\*Run All:\*\*", head, re.MULTILINE):
        raise ValueError(f"{path}: the opening cell needs a line starting with '{LINE_START}' to rewrite")
    line = run_all_line(stored_run_seconds(notebook), hardware)
    head = re.sub(r"^\*\*Run All:\*\*.*$", lambda _: line, head, count=1, flags=re.MULTILINE)
    notebook["cells"][0]["source"] = head
    nbformat.write(notebook, path)
    return line


if __name__ == "__main__":
    from course_utils import hardware_summary
    for arg in sys.argv[1:]:
        print(stamp(Path(arg), hardware_summary()))
