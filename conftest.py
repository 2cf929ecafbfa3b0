"""Settings shared by the unit tests and the notebooks that nbval executes.

COURSE_SOLUTIONS=1 is set before any notebook kernel starts (kernels inherit the environment),
so the exercises run with their reference solutions in place (see course_utils.exercises).

COURSE_REQUIRE_CUDA=1 (set by `./course gpu-test`) turns a silent CPU fallback into a failure:
the run stops at once without CUDA, `get_device()` raises in any notebook that would fall back to
the CPU, and the run fails if no test allocated CUDA memory at all.
"""
import os

import pytest
import torch

os.environ.setdefault("COURSE_SOLUTIONS", "1")
REQUIRE_CUDA = os.environ.get("COURSE_REQUIRE_CUDA") == "1"


def pytest_sessionstart(session):
    if REQUIRE_CUDA and not torch.cuda.is_available():
        pytest.exit("COURSE_REQUIRE_CUDA=1 but torch sees no CUDA device "
                    f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
                    "run `python -m course_utils doctor`", returncode=1)


def pytest_sessionfinish(session, exitstatus):
    if REQUIRE_CUDA and exitstatus == 0 and torch.cuda.max_memory_allocated() == 0:
        print("\nCOURSE_REQUIRE_CUDA=1 but no test allocated CUDA memory: the GPU was not used")
        session.exitstatus = 1
