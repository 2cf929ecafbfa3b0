"""Settings shared by the unit tests and the notebooks that nbval executes.

COURSE_SOLUTIONS=1 is set before any notebook kernel starts (kernels inherit the environment),
so the exercises run with their reference solutions in place (see course_utils.exercises).

COURSE_REQUIRE_CUDA=1 (set by `./course gpu-test`) turns a silent CPU fallback into a failure:
the run stops at once without CUDA, `get_device()` raises in any notebook that would fall back to
the CPU, each notebook must leave evidence that its kernel (or a process it started) allocated
CUDA memory (course_utils.cuda_evidence), and the unit tests must have allocated CUDA memory.
"""
import os
import tempfile
from pathlib import Path

import pytest
import torch

from course_utils import cuda_evidence

os.environ.setdefault("COURSE_SOLUTIONS", "1")
REQUIRE_CUDA = os.environ.get("COURSE_REQUIRE_CUDA") == "1"
NOTEBOOKS_RAN: set[str] = set()
UNIT_TESTS_RAN: list[str] = []


def pytest_sessionstart(session):
    if REQUIRE_CUDA and not torch.cuda.is_available():
        pytest.exit("COURSE_REQUIRE_CUDA=1 but torch sees no CUDA device "
                    f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
                    "run `python -m course_utils doctor`", returncode=1)
    if REQUIRE_CUDA:
        os.environ[cuda_evidence.EVIDENCE_DIR_ENV] = tempfile.mkdtemp(prefix="course-cuda-evidence-")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Name the notebook before nbval starts its kernel, which inherits the environment."""
    if item.path.suffix == ".ipynb":
        os.environ[cuda_evidence.NOTEBOOK_ENV] = str(item.path)
        NOTEBOOKS_RAN.add(str(item.path))
    else:
        UNIT_TESTS_RAN.append(item.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if not REQUIRE_CUDA or exitstatus != 0:
        return
    problems = []
    if UNIT_TESTS_RAN and torch.cuda.max_memory_allocated() == 0:
        problems.append("no unit test allocated CUDA memory")
    evidence = os.environ[cuda_evidence.EVIDENCE_DIR_ENV]
    for name in cuda_evidence.notebooks_without_cuda(NOTEBOOKS_RAN, evidence):
        problems.append(f"{name}: neither its kernel nor a process it started allocated CUDA memory")
    if problems:
        print("\nCOURSE_REQUIRE_CUDA=1 but the GPU was not used:\n  " + "\n  ".join(problems)
              + f"\n(per-process records in {Path(evidence)})")
        session.exitstatus = 1
