"""The pip metadata and the conda environment must name the same packages with the same pins."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)==([\w.]+)", dep).groups()
        pins[name.lower()] = version
    return pins


def _conda_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pins = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for pip_dep in dep["pip"]:
                name, version = pip_dep.split("==")
                pins[name.lower()] = version
        elif not dep.startswith(("python=", "pip")) or dep.startswith("pip="):
            name, version = dep.split("=", 1)
            pins[name.lower()] = version
    return pins


def test_every_pin_is_exact():
    assert all(v for v in _pyproject_pins().values())


def test_conda_environment_matches_pip_metadata():
    pip_pins, conda_pins = _pyproject_pins(), _conda_pins()
    assert pip_pins == conda_pins, (
        f"only in pyproject: {pip_pins.keys() - conda_pins.keys()}, "
        f"only in environment.yml: {conda_pins.keys() - pip_pins.keys()}, "
        f"different pins: { {k: (pip_pins[k], conda_pins[k]) for k in pip_pins.keys() & conda_pins.keys() if pip_pins[k] != conda_pins[k]} }")


def test_conda_python_is_311():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
