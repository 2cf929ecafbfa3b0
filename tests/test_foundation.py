"""Chapter 1 foundation: devices, seeding, pitfall context managers, doctor, exercises."""
import random
import subprocess
import time
import sys
import warnings

import numpy as np
import pytest
import torch

import course_utils
from course_utils import (doctor, expect_error, expect_warning, get_device, hardware_summary,
                          seed_everything, to_device)
from course_utils import exercises
from course_utils.exercises import exercise, reference_solution, report_check


# --- devices -----------------------------------------------------------------------------

def test_get_device_defaults_to_best_available(capsys):
    device = get_device()
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.type in (expected, "mps")
    assert capsys.readouterr().out == ""  # prints nothing


def test_get_device_prefer_cpu():
    assert get_device("cpu") == torch.device("cpu")


def test_get_device_rejects_unknown_kind():
    with pytest.raises(ValueError, match="prefer must be one of"):
        get_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_get_device_cuda_unavailable_is_clear():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        get_device("cuda")


def test_to_device_preserves_nested_structure():
    from collections import namedtuple
    Pair = namedtuple("Pair", "a b")
    batch = {"x": torch.ones(2), "pair": Pair(torch.zeros(1), 3), "list": [torch.ones(1), "s"]}
    moved = to_device(batch, "meta")
    assert moved["x"].device.type == "meta"
    assert isinstance(moved["pair"], Pair) and moved["pair"].a.device.type == "meta"
    assert moved["pair"].b == 3 and moved["list"][1] == "s"
    assert moved["list"][0].device.type == "meta"


# --- seeding -----------------------------------------------------------------------------

def test_seed_everything_makes_all_generators_repeat():
    def draw():
        return random.random(), float(np.random.rand()), torch.rand(1).item()
    seed_everything(123)
    first = draw()
    seed_everything(123)
    assert draw() == first
    seed_everything(124)
    assert draw() != first


@pytest.mark.parametrize("bad, error", [(1.5, TypeError), ("1", TypeError), (True, TypeError),
                                        (-1, ValueError), (2**32, ValueError)])
def test_seed_everything_rejects_bad_seeds(bad, error):
    with pytest.raises(error, match="seed must"):
        seed_everything(bad)


# --- expect_error / expect_warning --------------------------------------------------------

def test_expect_error_swallows_and_shows_the_expected_error(capsys):
    with expect_error(RuntimeError, match="shape") as caught:
        torch.ones(2, 3) @ torch.ones(2, 3)
    assert isinstance(caught.value, RuntimeError)
    out = capsys.readouterr().out
    assert "RuntimeError" in out and "cannot be multiplied" in out


def test_expect_error_fails_when_nothing_is_raised():
    with pytest.raises(AssertionError, match="ran without it"):
        with expect_error(ValueError):
            pass


def test_expect_error_fails_when_message_does_not_match():
    with pytest.raises(AssertionError, match="does not match"):
        with expect_error(ValueError, match="banana"):
            raise ValueError("apple")


def test_expect_error_lets_other_errors_through():
    with pytest.raises(KeyError):
        with expect_error(ValueError):
            raise KeyError("unexpected")


def test_expect_error_accepts_a_tuple_and_rejects_non_exceptions():
    with expect_error((KeyError, ValueError)):
        raise ValueError("x")
    with pytest.raises(TypeError, match="subclass"):
        with expect_error("ValueError"):
            pass


def test_expect_warning_records_a_real_torch_warning():
    x = torch.ones(2, requires_grad=True)
    y = x * 2  # non-leaf
    y.sum().backward()
    with expect_warning(UserWarning, match="is not a leaf Tensor") as caught:
        _ = y.grad
    assert caught.value is not None


def test_expect_warning_fails_without_the_warning():
    with pytest.raises(AssertionError, match="expected a UserWarning"):
        with expect_warning(UserWarning):
            warnings.warn("other", DeprecationWarning)


# --- doctor ------------------------------------------------------------------------------

def test_doctor_reports_versions_and_is_ok_here():
    report = doctor()
    items = dict(report.rows)
    assert items["torch"].startswith(torch.__version__)
    assert "onnxruntime" in items and "nbval" in items
    assert report.ok, str(report)
    assert "All set." in str(report)


def test_doctor_reports_a_missing_package(monkeypatch):
    monkeypatch.setattr("course_utils.environment.REQUIRED", ("surely-not-installed-pkg",))
    report = doctor()
    assert not report.ok
    assert "surely-not-installed-pkg is not installed" in report.problems[0]


def test_doctor_command_line_exit_status():
    done = subprocess.run([sys.executable, "-m", "course_utils", "doctor"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "course_utils", "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_idle_cores_sees_a_busy_core():
    from course_utils import idle_cores
    import os
    quiet = idle_cores(0.3)
    assert 0 <= quiet <= os.cpu_count() + 0.01
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = idle_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy <= os.cpu_count() - 0.7, f"one core spinning, yet {busy:.2f} of {os.cpu_count()} idle"
    with pytest.raises(ValueError, match="interval_s"):
        idle_cores(0)


def test_doctor_names_the_tested_torch_and_warns_on_another(monkeypatch):
    report = doctor()
    assert "tested on 2.13.0 and 2.14.1" in dict(report.rows)["torch"]
    assert not any("not one the course was tested on" in note for note in report.notes)
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    assert any("torch 2.99.0+cpu is not one the course was tested on" in note for note in doctor().notes)


def test_hardware_summary_names_the_machine():
    summary = hardware_summary()
    assert torch.__version__ in summary
    assert ("GPU:" in summary) == torch.cuda.is_available()


# --- exercises protocol -----------------------------------------------------------------

def test_exercise_swaps_in_reference_only_with_solutions(monkeypatch):
    @reference_solution("double_it", chapter=1)
    def _ref(x):
        return 2 * x

    def double_it(x):
        ...

    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "0")
    assert exercise(double_it) is double_it
    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "1")
    assert exercise(double_it)(3) == 6


def test_exercise_without_reference_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "1")

    def no_such_exercise():
        ...
    with pytest.raises(KeyError, match="no reference solution"):
        exercise(no_such_exercise)


def test_report_check_raises_only_under_solutions(monkeypatch):
    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "1")
    with pytest.raises(AssertionError, match="reference solution of demo fails its own check: it was 1"):
        report_check("demo", False, "it was 1", ["nudge"])
def test_every_public_name_is_importable():
    for name in course_utils.__all__:
        assert getattr(course_utils, name) is not None


def test_capture_process_output_sees_child_processes():
    from course_utils import capture_process_output
    with capture_process_output() as captured:
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('boom from child\\n')"])
    assert captured.last_line == "boom from child"
    assert sys.stderr is not None  # fd 2 restored: writing still works
    print("after", file=sys.stderr)


def test_capture_process_output_takes_stdout_too_and_refuses_other_streams():
    from course_utils import capture_process_output
    with capture_process_output("stdout") as captured:
        subprocess.run([sys.executable, "-c", "print('to fd 1')"])
    assert captured.last_line == "to fd 1"
    with pytest.raises(ValueError, match="'stderr' or 'stdout'"):
        with capture_process_output("stdlog"):
            pass


def test_require_cuda_turns_a_cpu_fallback_into_an_error(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: nothing falls back")
    monkeypatch.setenv("COURSE_REQUIRE_CUDA", "1")
    with pytest.raises(RuntimeError, match="COURSE_REQUIRE_CUDA=1"):
        get_device()
    assert get_device("cpu").type == "cpu"          # an explicit CPU request stays allowed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_test_command_refuses_to_run_without_cuda():
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_foundation.py", "-k", "seed", "-q"],
                          cwd=root, env={**os.environ, "COURSE_REQUIRE_CUDA": "1"}, capture_output=True, text=True)
    assert done.returncode != 0 and "no CUDA device" in done.stdout + done.stderr
