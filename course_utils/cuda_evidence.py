"""Proof, per notebook, that a GPU run really used CUDA (`./course gpu-test`).

Under `COURSE_REQUIRE_CUDA=1` the test session gives every notebook kernel two variables: where to
write evidence (`COURSE_CUDA_EVIDENCE`, a folder) and which notebook it runs (`COURSE_NOTEBOOK`,
inherited when nbval starts the kernel). `%load_ext course_utils` then records, after every cell,
the most CUDA memory the kernel has allocated; a process the notebook starts (a torchrun worker)
inherits both and records its own. At the end the session fails for each notebook that ran and left
no record of a CUDA allocation: a notebook that silently took its CPU path cannot pass.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch

EVIDENCE_DIR_ENV = "COURSE_CUDA_EVIDENCE"
NOTEBOOK_ENV = "COURSE_NOTEBOOK"


def record(peak_bytes: int | None = None) -> Path | None:
    """Write this process's CUDA peak (default: `torch.cuda.max_memory_allocated()`, 0 if CUDA was
    never initialised) for the notebook named in the environment; a no-op outside a GPU test run."""
    directory, notebook = os.environ.get(EVIDENCE_DIR_ENV), os.environ.get(NOTEBOOK_ENV)
    if not directory or not notebook:
        return None
    if peak_bytes is None:
        peak_bytes = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0
    path = Path(directory) / f"{Path(notebook).stem}.{os.getpid()}.json"   # one file per process: no races
    path.write_text(json.dumps({"notebook": notebook, "pid": os.getpid(), "cuda_peak_bytes": int(peak_bytes)}))
    return path


def cuda_peak_by_notebook(directory: str | Path) -> dict[str, int]:
    """The largest CUDA peak any process recorded, per notebook stem."""
    peaks: dict[str, int] = {}
    for path in Path(directory).glob("*.json"):
        entry = json.loads(path.read_text())
        stem = Path(entry["notebook"]).stem
        peaks[stem] = max(peaks.get(stem, 0), int(entry["cuda_peak_bytes"]))
    return peaks


def notebooks_without_cuda(notebooks: Iterable[str | Path], directory: str | Path) -> list[str]:
    """The notebooks (of those that ran) for which no process recorded a CUDA allocation."""
    peaks = cuda_peak_by_notebook(directory)
    return sorted(Path(nb).name for nb in notebooks if peaks.get(Path(nb).stem, 0) == 0)


def register(ipython) -> None:
    """Record after every cell (the `%load_ext course_utils` extension calls this)."""
    if os.environ.get(EVIDENCE_DIR_ENV) and os.environ.get(NOTEBOOK_ENV):
        ipython.events.register("post_run_cell", lambda result: record())
