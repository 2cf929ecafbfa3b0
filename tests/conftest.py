"""Unit-test fixtures: headless matplotlib, a fresh seed per test."""
import matplotlib
import pytest
import torch

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield
    matplotlib.pyplot.close("all")
