"""The error explainer, checked against exceptions raised by real PyTorch calls (not typed strings),
so a PyTorch release that rewords a message fails here first."""
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils import explain
from course_utils.checkpoints import saved_as_if_on
from course_utils.explain import RULES, Explanation
from course_utils.models import mlp


def raised(fn):
    try:
        fn()
    except Exception as error:  # the real exception object
        return error
    raise AssertionError("expected the call to raise")


def matmul_shapes():
    torch.ones(2, 3) @ torch.ones(2, 3)


def device_mismatch():
    nn.Linear(3, 2).to("meta")(torch.ones(1, 3))


def cpu_out_of_memory():
    torch.empty(2**62, dtype=torch.uint8)


def nan_in_backward():
    x = torch.zeros(1, requires_grad=True)
    with warnings.catch_warnings():   # anomaly mode warns that it is on, and prints the forward trace
        warnings.simplefilter("ignore", UserWarning)
        with torch.autograd.detect_anomaly(check_nan=True):
            (torch.sqrt(x) * 0).sum().backward()


def missing_keys():
    mlp([2, 2]).load_state_dict(nn.DataParallel(mlp([2, 2])).state_dict())


def size_mismatch():
    nn.Linear(2, 5).load_state_dict(nn.Linear(2, 3).state_dict())


def half_dtype():
    nn.Linear(3, 2).half()(torch.ones(1, 3))


def batchnorm_single_sample():
    nn.BatchNorm1d(4).train()(torch.ones(1, 4))


class Evil:
    def __reduce__(self):
        return (print, ("x",))


def weights_only_refused():
    buffer = io.BytesIO()
    torch.save({"x": Evil()}, buffer)
    buffer.seek(0)
    torch.load(buffer)


def cuda_checkpoint_on_cpu():
    buffer = io.BytesIO()
    with saved_as_if_on("cuda:0"):
        torch.save({"w": torch.ones(1)}, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True)


def no_rank_env():
    saved = {name: os.environ.pop(name) for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
             if name in os.environ}
    try:
        dist.init_process_group("gloo", init_method="env://")   # as when a script is run without torchrun
    finally:
        os.environ.update(saved)


def onnx_static_batch(tmp_path):
    from course_utils.inference import export_onnx, onnx_session
    path = export_onnx(nn.Linear(3, 2), (torch.ones(2, 3),), tmp_path / "s.onnx", dynamic_batch=False)
    onnx_session(path).run(None, {"input": torch.ones(4, 3).numpy()})


def data_dependent_export(tmp_path):
    from course_utils.inference import export_onnx

    class Gated(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x
    export_onnx(Gated(), (torch.ones(2, 3),), tmp_path / "g.onnx")


def inplace_modified():
    x = torch.ones(3, requires_grad=True)
    y = x.sigmoid()
    y.mul_(2)
    y.sum().backward()


def leaf_inplace():
    w = torch.ones(2, requires_grad=True)
    w -= 1


def no_grad_fn():
    with torch.no_grad():
        loss = (mlp([2, 1])(torch.ones(1, 2)) ** 2).sum()
    loss.backward()


SPAWN_SCRIPT = """
import torch
from torch.utils.data import DataLoader, Dataset

class NotebookDataset(Dataset):          # defined in __main__, as in a notebook
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.tensor(i)

if __name__ == "__main__":
    try:
        list(DataLoader(NotebookDataset(), num_workers=1, multiprocessing_context="spawn"))
    except RuntimeError as error:
        print(f"{type(error).__name__}: {error}")
"""


CASES = [
    (matmul_shapes, 1, "shape mismatch"),
    (device_mismatch, 3, "device mismatch"),
    (cpu_out_of_memory, 3, "out of memory"),
    (nan_in_backward, 3, "NaN"),
    (missing_keys, 4, "state_dict keys"),
    (size_mismatch, 4, "state_dict keys"),
    (half_dtype, 6, "dtype mismatch"),
    (batchnorm_single_sample, 2, "BatchNorm"),
    (weights_only_refused, 4, "weights_only"),
    (no_rank_env, 5, "distributed"),
    (inplace_modified, 1, "in-place operation changed"),
    (leaf_inplace, 1, "in-place update of a parameter"),
    (no_grad_fn, 1, "did not record"),
]
if not torch.cuda.is_available():
    CASES.append((cuda_checkpoint_on_cpu, 4, "GPU checkpoint"))


@pytest.mark.parametrize("make_error, chapter, title_words", CASES, ids=[c[0].__name__ for c in CASES])
def test_explains_real_errors(make_error, chapter, title_words):
    error = raised(make_error)
    explanation = explain(error)
    assert explanation is not None, f"not recognised: {type(error).__name__}: {error}"
    assert explanation.chapter == chapter and title_words in explanation.title
    assert explanation.causes and explanation.fix and explanation.section
    assert explain(str(error)) is not None           # a pasted message works too


@pytest.mark.parametrize("make_error, title_words", [(onnx_static_batch, "ONNX Runtime"),
                                                     (data_dependent_export, "torch.export")])
def test_explains_real_export_and_runtime_errors(tmp_path, make_error, title_words):
    explanation = explain(raised(lambda: make_error(tmp_path)))
    assert explanation is not None and title_words in explanation.title and explanation.chapter == 6


@pytest.mark.slow
def test_explains_a_dataloader_worker_that_cannot_unpickle_the_dataset():
    # `python -c`: like a notebook, __main__ has no file a spawned worker could re-import
    done = subprocess.run([sys.executable, "-c", SPAWN_SCRIPT], capture_output=True, text=True, timeout=120)
    assert "Can't get attribute 'NotebookDataset'" in done.stderr      # the worker's own error
    main_error = done.stdout.strip().splitlines()[-1]                  # what the notebook cell shows
    assert explain(main_error).chapter == 2 and explain(done.stderr).chapter == 2


@pytest.mark.slow
def test_explains_a_crashed_torchrun_job(tmp_path):
    from course_utils.distributed import launch_torchrun
    error = raised(lambda: launch_torchrun("course_utils.ddp_train", 2, "--log-dir", tmp_path,
                                           "--crash-rank", "0", echo=False))
    assert explain(error).chapter == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real CUDA OOM needs CUDA")
def test_explains_a_real_cuda_oom():
    total = torch.cuda.get_device_properties(0).total_memory
    explanation = explain(raised(lambda: torch.empty(2 * total, dtype=torch.uint8, device="cuda")))
    assert explanation.title == "out of memory"


def test_unknown_errors_and_bad_input():
    assert explain(ValueError("something unrelated")) is None
    assert explain("KeyError: 'x'") is None
    with pytest.raises(TypeError, match="exception or a message"):
        explain(42)


def test_every_explanation_points_at_a_real_chapter_and_is_printable():
    for _, explanation in RULES:
        assert isinstance(explanation, Explanation)
        assert explanation.notebook.startswith(f"0{explanation.chapter}_")
        assert f"chapter {explanation.chapter}" in str(explanation)


def test_readme_troubleshooting_index_lists_every_explanation():
    readme = (os.path.dirname(__file__) + "/../README.md")
    text = open(readme).read()
    missing = [e.title for _, e in RULES if e.title not in text]
    assert not missing, f"README troubleshooting index lacks: {missing}"


def test_ipython_extension_prints_explanation_under_the_traceback(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "course_utils")
    try:
        shell.run_cell("import torch; torch.ones(2, 3) @ torch.ones(2, 3)")
        out = capsys.readouterr()
        text = out.out + out.err
        assert "RuntimeError" in text and "mat1 and mat2 shapes cannot be multiplied" in text   # traceback kept
        assert "course_utils.explain: shape mismatch" in text
        assert text.index("mat1 and mat2 shapes") < text.index("course_utils.explain")
        shell.run_cell("raise ValueError('unrelated')")
        assert "course_utils.explain" not in capsys.readouterr().out
    finally:
        shell.run_line_magic("unload_ext", "course_utils")
        InteractiveShell.clear_instance()
