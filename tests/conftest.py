"""Unit-test fixtures: headless matplotlib, a fresh seed per test."""
import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield
    plt.close("all")
