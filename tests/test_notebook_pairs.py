"""Each notebook has a percent-format .py twin (jupytext) with the same cells, so review reads code."""
from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _cells(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_and_its_py_pair_hold_the_same_cells(ipynb):
    paired = ipynb.with_suffix(".py")
    assert paired.exists(), f"{paired.name} is missing: run `./course outputs {ipynb}`"
    assert _cells(jupytext.read(ipynb)) == _cells(jupytext.read(paired)), (
        f"{ipynb.name} and {paired.name} differ: edit one, then run `./course outputs {ipynb}` "
        "(the newer file wins)")
