"""Unit-test fixtures: headless matplotlib, a fresh seed per test, a private exercise record."""
import matplotlib
import pytest
import torch

from course_utils import exercises

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield
    plt.close("all")


@pytest.fixture(autouse=True)
def _private_progress_file(tmp_path, monkeypatch):
    """Tests never touch the learner's ~/.pytorch-field-guide/progress.json."""
    monkeypatch.setenv(exercises.PROGRESS_ENV, str(tmp_path / "progress.json"))


@pytest.fixture
def learner(monkeypatch):
    """Learner mode: the learner's own functions run and a failing check returns a falsy Verdict."""
    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "0")
