"""The GPU runner's rule, checked on any machine: every notebook must prove it used CUDA.

`./course gpu-test` (COURSE_REQUIRE_CUDA=1) gives each notebook kernel COURSE_NOTEBOOK and
COURSE_CUDA_EVIDENCE; the kernel (through `%load_ext course_utils`) and any process it starts record
their CUDA peak; the session fails for each notebook without a record above 0. The real counters
run on a GPU; here the records are written with explicit peaks.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import cuda_evidence
from course_utils.explain import load_ipython_extension, unload_ipython_extension


@pytest.fixture
def evidence(tmp_path, monkeypatch):
    monkeypatch.setenv(cuda_evidence.EVIDENCE_DIR_ENV, str(tmp_path))
    return tmp_path


def test_a_notebook_that_never_touched_cuda_is_named(evidence, monkeypatch):
    ran = ["notebooks/01_tensors_autograd.ipynb", "notebooks/05_ddp_torchrun.ipynb", "notebooks/06_inference.ipynb"]
    monkeypatch.setenv(cuda_evidence.NOTEBOOK_ENV, ran[0])
    cuda_evidence.record(peak_bytes=4096)
    monkeypatch.setenv(cuda_evidence.NOTEBOOK_ENV, ran[1])
    cuda_evidence.record(peak_bytes=0)                      # the kernel itself stayed on the CPU ...
    monkeypatch.setenv(cuda_evidence.NOTEBOOK_ENV, ran[2])
    cuda_evidence.record(peak_bytes=0)
    assert cuda_evidence.notebooks_without_cuda(ran, evidence) == ["05_ddp_torchrun.ipynb", "06_inference.ipynb"]


def test_a_worker_process_records_for_its_notebook(evidence, monkeypatch):
    monkeypatch.setenv(cuda_evidence.NOTEBOOK_ENV, "notebooks/05_ddp_torchrun.ipynb")
    cuda_evidence.record(peak_bytes=0)                      # the kernel: CPU only
    child = subprocess.run([sys.executable, "-c", "from course_utils import cuda_evidence; "
                            "cuda_evidence.record(peak_bytes=123)"], check=True)   # ... a torchrun worker: CUDA
    assert child.returncode == 0 and len(list(evidence.glob("05_ddp_torchrun.*.json"))) == 2
    assert cuda_evidence.notebooks_without_cuda(["notebooks/05_ddp_torchrun.ipynb"], evidence) == []
    assert cuda_evidence.cuda_peak_by_notebook(evidence) == {"05_ddp_torchrun": 123}


def test_a_notebook_with_no_record_at_all_is_named(evidence):
    assert cuda_evidence.notebooks_without_cuda(["notebooks/03_debugging.ipynb"], evidence) == ["03_debugging.ipynb"]


def test_nothing_is_recorded_outside_a_gpu_test_run(monkeypatch, tmp_path):
    monkeypatch.delenv(cuda_evidence.EVIDENCE_DIR_ENV, raising=False)
    monkeypatch.setenv(cuda_evidence.NOTEBOOK_ENV, "notebooks/01_tensors_autograd.ipynb")
    assert cuda_evidence.record(peak_bytes=1) is None


class _FakeIPython:
    """The two IPython hooks the extension uses."""

    def __init__(self):
        self.callbacks = []
        self.events = self

    def register(self, event, callback):
        assert event == "post_run_cell"
        self.callbacks.append(callback)

    def set_custom_exc(self, exc_tuple, handler):
        pass


def test_the_extension_records_after_every_cell_in_a_gpu_test_run(evidence, monkeypatch):
    monkeypatch.setenv(cuda_evidence.NOTEBOOK_ENV, "notebooks/02_data_and_modules.ipynb")
    ipython = _FakeIPython()
    load_ipython_extension(ipython)
    assert len(ipython.callbacks) == 1
    ipython.callbacks[0](None)                              # after a cell: records the real counter
    entry = json.loads(next(evidence.glob("02_data_and_modules.*.json")).read_text())
    assert entry["notebook"].endswith("02_data_and_modules.ipynb") and entry["cuda_peak_bytes"] >= 0
    unload_ipython_extension(ipython)


def test_the_extension_adds_no_hook_outside_a_gpu_test_run(monkeypatch):
    monkeypatch.delenv(cuda_evidence.EVIDENCE_DIR_ENV, raising=False)
    ipython = _FakeIPython()
    load_ipython_extension(ipython)
    assert ipython.callbacks == []


def test_the_session_names_each_notebook_before_its_kernel_starts(monkeypatch):
    """The root conftest's setup hook runs before nbval's file setup, which starts the kernel."""
    import importlib.util
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    monkeypatch.delenv(cuda_evidence.NOTEBOOK_ENV, raising=False)
    root_conftest.pytest_runtest_setup(SimpleNamespace(path=Path("notebooks/04_checkpointing.ipynb"), nodeid="nb"))
    import os
    assert os.environ[cuda_evidence.NOTEBOOK_ENV] == "notebooks/04_checkpointing.ipynb"
    assert root_conftest.NOTEBOOKS_RAN == {"notebooks/04_checkpointing.ipynb"}
    assert root_conftest.pytest_runtest_setup.pytest_impl["tryfirst"]


# --- doctor and torch.compile on a GPU runner ----------------------------------------------

@pytest.mark.parametrize("driver, verdict", [("11.4", "problem"), ("12.4", "note"), ("12.8", "ok"), ("13.0", "ok")])
def test_doctor_names_a_driver_older_than_the_wheel(monkeypatch, driver, verdict):
    import torch
    from course_utils import environment
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(environment, "nvidia_driver_cuda_version", lambda: driver)
    report = environment.DoctorReport()
    environment._check_cuda_driver(report)
    said = {"problem": report.problems, "note": report.notes}
    for kind, lines in said.items():
        assert bool(lines) == (kind == verdict), (kind, lines)
    if verdict != "ok":
        assert f"supports CUDA {driver}" in said[verdict][0] and "12.8" in said[verdict][0]


def test_doctor_names_what_torch_compile_needs_on_a_gpu(monkeypatch):
    from course_utils import environment
    monkeypatch.setattr(environment, "_version", lambda dist: None if dist == "triton" else "1.0")
    report = environment.DoctorReport()
    environment._check_gpu_compile_toolchain(report)
    assert ("triton", "MISSING") in report.rows
    assert report.problems and "triton" in report.problems[0] and "gpu-test" in report.problems[0]


def test_try_compile_falls_back_for_a_learner_but_not_on_the_gpu_runner(monkeypatch):
    import torch
    from course_utils import try_compile

    def broken_compile(model, **kwargs):
        def run(*args):
            raise RuntimeError("Triton: no C compiler for the launcher")
        return run
    monkeypatch.setattr(torch, "compile", broken_compile)
    model = torch.nn.Linear(2, 2)
    monkeypatch.delenv("COURSE_REQUIRE_CUDA", raising=False)
    fallback = try_compile(model, torch.randn(1, 2))
    assert not fallback.compiled and "no C compiler for the launcher" in fallback.reason
    monkeypatch.setenv("COURSE_REQUIRE_CUDA", "1")
    with pytest.raises(RuntimeError, match="must not fall back"):
        try_compile(model, torch.randn(1, 2))
