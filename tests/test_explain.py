"""The error explainer, checked against exceptions raised by real PyTorch calls (not typed strings),
so a PyTorch release that rewords a message fails here first."""
import html
import io
import json
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils import explain
from course_utils.checkpoints import saved_as_if_on
from course_utils.error_origin import AREAS, TOPICS
from course_utils.explain import (RULES, Explanation, explanation_by_id, heading_anchor, normalise,
                                  troubleshooting_table)
from course_utils.models import mlp


SAFE = "!$&'()*+,;=:@/?-._~"


def notebook_headings(chapter: int) -> list[str]:
    """Markdown heading texts of a chapter, read from its jupytext twin (notebooks/0N_*.py)."""
    (path,) = (Path(__file__).parent.parent / "notebooks").glob(f"0{chapter}_*.py")
    return [m.group(1).strip() for m in re.finditer(r"^# #{1,6} (.+)$", path.read_text(), flags=re.MULTILINE)]


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


def label_out_of_range():
    # on CUDA this is "device-side assert triggered"; the CPU names the bad target
    nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 5]))


def broadcast_mismatch():
    torch.ones(8) + torch.ones(5)


def truncated_checkpoint():
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(10)}, buffer)
    torch.load(io.BytesIO(buffer.getvalue()[:-40]), weights_only=True)   # the end of the zip is missing


def recompile_limit_with_fullgraph():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False, fullgraph=True)
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in range(1, 5):
            compiled(torch.ones(n))


def graph_break_with_fullgraph():
    torch._dynamo.reset()

    def forward(x):
        torch._dynamo.graph_break()
        return x + 1
    torch.compile(forward, backend="eager", fullgraph=True)(torch.ones(2))


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


def backward_twice():
    w = torch.ones(2, requires_grad=True)
    loss = (w.exp() * 3).sum()
    loss.backward()
    loss.backward()


def non_scalar_backward():
    (torch.ones(3, requires_grad=True) * 2).backward()


# ---- the errors issue 23 names as the most common on the forums, raised for real ----------------------

def optimizer_without_parameters():
    class PlainList(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(2, 2)]           # a plain list: not registered
    torch.optim.SGD(PlainList().parameters(), lr=0.1)


def module_before_init():
    class Early(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)
            super().__init__()
    Early()


def conv_wrong_channels():
    nn.Conv2d(3, 8, 3)(torch.ones(2, 1, 8, 8))          # grayscale into an RGB conv


def conv_wrong_dimensions():
    nn.Conv2d(3, 8, 3)(torch.ones(2, 1, 3, 8, 8))


def loss_batch_mismatch():
    nn.functional.cross_entropy(torch.ones(32, 3), torch.zeros(64, dtype=torch.long))


def numpy_of_a_tensor_in_the_graph():
    (torch.ones(2, requires_grad=True) * 2).numpy()


def inplace_on_a_split_view():
    first, _ = (torch.ones(4, requires_grad=True) * 1).split(2)
    first.mul_(2)


def float64_target():
    nn.functional.binary_cross_entropy(torch.full((4,), 0.5), torch.ones(4, dtype=torch.float64))


def float_class_labels():
    nn.functional.cross_entropy(torch.ones(4, 3), torch.tensor([0.0, 1.0, 2.0, 1.0]))


def half_without_a_cpu_kernel():
    torch.cdist(torch.ones(3, 4).half(), torch.ones(3, 4).half())


def grad_scaler_with_half_weights():
    model = nn.Linear(3, 1).half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.ones(2, 3).half()).float().sum()).backward()
    scaler.step(optimizer)


def html_page_as_checkpoint(weights_only):
    def load():
        buffer = io.BytesIO(b"<!DOCTYPE html><html><body>404 Not Found</body></html>")
        torch.load(buffer, weights_only=weights_only)
    load.__name__ = f"html_page_as_checkpoint_weights_only_{weights_only}"
    return load


def git_lfs_pointer_as_checkpoint():
    torch.load(io.BytesIO(b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n"), weights_only=False)


def ddp_with_an_unused_layer():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.unused_head, self.head = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.body(x).relu())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(TwoHeads())
        for _ in range(2):
            model(torch.ones(3, 4)).sum().backward()
    finally:
        dist.destroy_process_group()


# ---- the common errors held-out set 4 showed unexplained, raised for real (rules written from tuning-3) --------

def tensor_in_an_if():
    if torch.tensor([1.0, -1.0]) > 0:
        pass


def unequal_samples_in_a_batch():
    samples = [torch.ones(3, 8, 8), torch.ones(3, 6, 6)]
    next(iter(torch.utils.data.DataLoader(samples, batch_size=2)))


def an_argument_forward_does_not_take():
    nn.Linear(2, 2)(torch.ones(1, 2), mask=torch.ones(1, 2))


def inference_tensor_in_training():
    with torch.inference_mode():
        features = torch.ones(4, 2)
    model = nn.Linear(2, 1)
    model(features).sum().backward()


def state_dict_used_as_a_model():
    buffer = io.BytesIO()
    torch.save(nn.Linear(2, 2).state_dict(), buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True).eval()


def optimizer_state_of_other_parameters():
    saved = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1).state_dict()
    grown = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    torch.optim.SGD(grown.parameters(), lr=0.1).load_state_dict(saved)


def export_with_a_branch_on_the_batch():
    class BatchAware(nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[0] > 4 else x
    batch = torch.export.Dim("batch", max=64)
    torch.export.export(BatchAware(), (torch.ones(8, 3),), dynamic_shapes={"x": {0: batch}})


CASES = [
    (backward_twice, "backward-twice"),
    (non_scalar_backward, "non-scalar-backward"),
    (matmul_shapes, "shape-mismatch"),
    (device_mismatch, "device-mismatch"),
    (cpu_out_of_memory, "out-of-memory"),
    (nan_in_backward, "nan-loss"),
    (missing_keys, "state-dict-mismatch"),
    (size_mismatch, "state-dict-mismatch"),
    (half_dtype, "dtype-mismatch"),
    (batchnorm_single_sample, "batchnorm-single-sample"),
    (weights_only_refused, "weights-only-load"),
    (no_rank_env, "distributed-launch"),
    (inplace_modified, "inplace-modified"),
    (leaf_inplace, "leaf-inplace"),
    (no_grad_fn, "no-grad-fn"),
    (label_out_of_range, "device-side-assert"),
    (broadcast_mismatch, "shape-mismatch"),
    (truncated_checkpoint, "corrupt-checkpoint"),
    (recompile_limit_with_fullgraph, "recompile-limit"),
    (graph_break_with_fullgraph, "compile-graph-break"),
    (optimizer_without_parameters, "optimizer-empty-params"),
    (module_before_init, "module-before-init"),
    (conv_wrong_channels, "layer-input-shape"),
    (conv_wrong_dimensions, "layer-input-shape"),
    (loss_batch_mismatch, "layer-input-shape"),
    (numpy_of_a_tensor_in_the_graph, "numpy-needs-detach"),
    (inplace_on_a_split_view, "view-inplace"),
    (float64_target, "dtype-double-long"),
    (float_class_labels, "dtype-double-long"),
    (half_without_a_cpu_kernel, "half-not-implemented"),
    (grad_scaler_with_half_weights, "grad-scaler-fp16-gradients"),
    (html_page_as_checkpoint(True), "corrupt-checkpoint"),
    (html_page_as_checkpoint(False), "corrupt-checkpoint"),
    (git_lfs_pointer_as_checkpoint, "corrupt-checkpoint"),
    (ddp_with_an_unused_layer, "ddp-unused-parameters"),
    (tensor_in_an_if, "tensor-bool-ambiguous"),
    (unequal_samples_in_a_batch, "collate-sizes"),
    (an_argument_forward_does_not_take, "forward-arguments"),
    (inference_tensor_in_training, "inference-tensor-backward"),
    (state_dict_used_as_a_model, "state-dict-not-a-model"),
    (optimizer_state_of_other_parameters, "optimizer-state-mismatch"),
    (export_with_a_branch_on_the_batch, "export-shape-constraints"),
]
if not torch.cuda.is_available():
    CASES.append((cuda_checkpoint_on_cpu, "cuda-checkpoint-on-cpu"))


@pytest.mark.parametrize("make_error, kind", CASES, ids=[c[0].__name__ for c in CASES])
def test_explains_real_errors(make_error, kind):
    error = raised(make_error)
    explanation = explain(error)
    assert explanation is not None, f"not recognised: {type(error).__name__}: {error}"
    assert explanation.id == kind, f"{type(error).__name__}: {error}\n-> {explanation.id}"
    assert explanation.causes and explanation.fix and explanation.section
    pasted = "".join(traceback.format_exception_only(error))      # the traceback's last line(s)
    assert explain(pasted) is explanation                          # a pasted message works too


def onnx_operator_the_old_exporter_lacks(tmp_path):
    class Spectrum(nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()
    torch.onnx.export(Spectrum(), (torch.ones(2, 16),), tmp_path / "f.onnx", dynamo=False, opset_version=17)


@pytest.mark.parametrize("make_error, kind", [(onnx_static_batch, "onnx-input-shape"),
                                              (data_dependent_export, "export-data-dependent"),
                                              (onnx_operator_the_old_exporter_lacks, "onnx-unsupported-operator")])
def test_explains_real_export_and_runtime_errors(tmp_path, make_error, kind):
    explanation = explain(raised(lambda: make_error(tmp_path)))
    assert explanation is not None and explanation.id == kind and explanation.chapter == 6


def test_explains_a_model_that_torch_save_cannot_pickle():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.activation = nn.Linear(2, 2), lambda x: x.relu()    # a lambda: not picklable

    error = raised(lambda: torch.save(Net(), io.BytesIO()))
    assert "pickle" in str(error)
    assert explain(error).id == "model-not-picklable"                  # its traceback shows torch.save
    pasted = "".join(traceback.format_exception(error))
    assert explain(pasted).id == "model-not-picklable"
    # Python's words alone say nothing of torch.save (they match torch.package's pickler, which no chapter teaches);
    # about a dataset, they are the DataLoader's starting its workers
    assert explain(f"AttributeError: {error}") is None
    assert explain("AttributeError: Can't pickle local object 'get_dataset.<locals>.Dataset'").id == "dataloader-worker"


@pytest.mark.slow
def test_explains_a_dataloader_worker_that_cannot_unpickle_the_dataset():
    # `python -c`: like a notebook, __main__ has no file a spawned worker could re-import
    done = subprocess.run([sys.executable, "-c", SPAWN_SCRIPT], capture_output=True, text=True, timeout=120)
    assert "Can't get attribute 'NotebookDataset'" in done.stderr      # the worker's own error
    main_error = done.stdout.strip().splitlines()[-1]                  # what the notebook cell shows
    assert explain(main_error).id == "dataloader-worker" and explain(done.stderr).id == "dataloader-worker"


@pytest.mark.slow
def test_explains_a_crashed_torchrun_job(tmp_path):
    from course_utils.distributed import launch_torchrun
    error = raised(lambda: launch_torchrun("course_utils.ddp_train", 2, "--log-dir", tmp_path,
                                           "--crash-rank", "0", echo=False))
    assert explain(error).id == "distributed-launch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real CUDA OOM needs CUDA")
def test_explains_a_real_cuda_oom():
    total = torch.cuda.get_device_properties(0).total_memory
    explanation = explain(raised(lambda: torch.empty(2 * total, dtype=torch.uint8, device="cuda")))
    assert explanation.id == "out-of-memory"


DEVICE_ASSERT_SCRIPT = """
import torch
try:
    torch.nn.functional.cross_entropy(torch.zeros(2, 3, device="cuda"), torch.tensor([0, 5], device="cuda"))
    torch.cuda.synchronize()
except RuntimeError as error:
    print(f"{type(error).__name__}: {error}")
"""


@pytest.mark.slow
def test_explains_a_store_based_barrier_that_times_out():
    # init_process_group's barrier (TORCH_DIST_INIT_BARRIER=1) and new_group's call this; one rank of two
    # arrives. It waits at least its 10 s logging interval whatever the timeout.
    from datetime import timedelta
    from torch.distributed.distributed_c10d import _store_based_barrier
    error = raised(lambda: _store_based_barrier(0, dist.HashStore(), "test", 2, timedelta(seconds=1)))
    assert "store based barrier" in str(error) and explain(error).id == "rendezvous-failure"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="an invalid device ordinal needs a CUDA device to count")
def test_explains_an_invalid_device_ordinal():
    error = raised(lambda: torch.ones(1, device=f"cuda:{torch.cuda.device_count()}"))
    assert explain(error).id == "invalid-device-ordinal", error


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device-side assert needs CUDA")
def test_explains_a_real_device_side_assert():
    # in a child process: a device-side assert leaves this process's CUDA context unusable
    done = subprocess.run([sys.executable, "-c", DEVICE_ASSERT_SCRIPT], capture_output=True, text=True, timeout=120)
    assert "device-side assert" in done.stdout, done.stdout + done.stderr
    assert explain(done.stdout).id == "device-side-assert"
    assert explain(done.stderr).id == "device-side-assert"       # the kernel's own `Assertion ... failed` lines


def test_unknown_errors_and_bad_input():
    assert explain(ValueError("something unrelated")) is None
    assert explain("KeyError: 'x'") is None
    with pytest.raises(TypeError, match="exception or a message"):
        explain(42)
    with pytest.raises(KeyError, match="known: cuda-driver"):
        explanation_by_id("no-such-kind")
    with pytest.raises(ValueError, match="non-empty heading"):
        heading_anchor("  ")


def test_normalisation_removes_colour_rank_prefixes_and_line_wrapping():
    raw = ("\x1b[31m[rank1]: RuntimeError: Expected all tensors to be on the same\n"
           "[rank1]:   device, but found at least two devices, cuda:1 and cpu!\x1b[0m")
    assert normalise(raw) == ("RuntimeError: Expected all tensors to be on the same device, "
                              "but found at least two devices, cuda:1 and cpu!")
    assert explain(raw).id == "device-mismatch"
    assert normalise("RuntimeError\uff1a CUDA out of memory") == "RuntimeError: CUDA out of memory"


def test_not_every_out_of_memory_or_busy_port_is_pytorchs():
    # decided: only PyTorch's wording is claimed; NumPy/OS/TensorFlow memory errors and a web server's busy
    # port would get the wrong advice from chapters 3 and 5
    assert explain("MemoryError: Unable to allocate 2.05 GiB for an array with shape (501, 550174)") is None
    assert explain("OSError: [Errno 12] Cannot allocate memory") is None
    assert explain("OSError: [Errno 98] Address already in use") is None
    # CuPy's own (cupy/cupy#1489): its words are the out-of-memory rule's, its frames another framework's
    assert explain("cupy/cuda/memory.pyx in cupy.cuda.memory.SingleDeviceMemoryPool._malloc()\n\n"
                   "OutOfMemoryError: out of memory to allocate 1200000000 bytes (total 7204800000 bytes)") is None
    assert explain("OutOfMemoryError: out of memory to allocate 1200000000 bytes").id == "out-of-memory"
    assert explain("RuntimeError: The server socket has failed to listen on any local network address. "
                   "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use."
                   ).id == "rendezvous-failure"


def test_every_explanation_has_a_unique_id_a_real_section_and_a_link():
    ids = [rule.explanation.id for rule in RULES]
    assert len(ids) == len(set(ids)), f"duplicate ids: {ids}"
    for rule in RULES:
        e = rule.explanation
        assert isinstance(e, Explanation) and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", e.id)
        assert e.notebook.startswith(f"0{e.chapter}_")
        headings = notebook_headings(e.chapter)
        assert e.section in headings, (f"{e.id}: chapter {e.chapter} has no heading {e.section!r}; "
                                       f"its headings: {headings}")
        assert e.link == f"/lab/tree/{e.notebook}#heading={quote(heading_anchor(e.section), safe=SAFE)}"
        assert f"chapter {e.chapter}" in str(e) and e.link in str(e) and e.href in e._repr_html_()
        assert explanation_by_id(e.id) is e


def stored_outputs(chapter: int) -> list[str]:
    """The text of every output a chapter's notebook stored on its last run (`./course outputs`)."""
    (path,) = (Path(__file__).parent.parent / "notebooks").glob(f"0{chapter}_*.ipynb")
    texts = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            texts.append("".join(text) if isinstance(text, list) else text)
    return texts


@pytest.mark.parametrize("rule", [rule for rule in RULES if rule.explanation.reproduced],
                         ids=lambda rule: rule.explanation.id)
def test_a_rule_that_says_reproduced_in_is_raised_by_its_chapters_stored_run(rule):
    # "Reproduced in chapter N" is a claim about the notebook: its stored run must show the error the rule
    # matches; a rule whose chapter teaches the fix without raising the error says "Taught in" instead
    outputs = stored_outputs(rule.explanation.chapter)
    assert any(rule.matches(normalise(text)) for text in outputs), \
        f"{rule.explanation.id}: no stored output of chapter {rule.explanation.chapter} shows its error"


def test_heading_anchor_follows_jupyterlab():
    # JupyterLab: rendered heading text, spaces -> '-'; inline code keeps its text, markup is dropped
    assert heading_anchor("1. `num_workers`: let other processes prepare the next batches") == \
        "1.-num_workers:-let-other-processes-prepare-the-next-batches"
    assert heading_anchor("8. Evaluation: `model.eval()` *and* `inference_mode`") == \
        "8.-Evaluation:-model.eval()-and-inference_mode"
    section = Explanation("x", "t", ("c",), "f", 4, "8. Keys and shapes that don't match")
    assert section.link == "/lab/tree/04_checkpointing.ipynb#heading=8.-Keys-and-shapes-that-don't-match"
    assert section.href == "04_checkpointing.ipynb#heading=8.-Keys-and-shapes-that-don't-match"


def test_every_readme_example_is_explained_by_its_own_rule():
    for rule in RULES:
        assert rule.examples, f"{rule.explanation.id} shows no example in README"
        for example in rule.examples:
            got = explain(example)
            assert got is rule.explanation, f"example {example!r} of {rule.explanation.id} -> {got and got.id}"
            assert "|" not in example and "`" not in example


def test_readme_troubleshooting_index_is_generated_from_the_rules():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    table = troubleshooting_table()
    assert table.count("\n") == len(RULES) + 2
    assert table in text, ("README's troubleshooting index differs from the rules; paste "
                           "`python -c 'from course_utils.explain import troubleshooting_table as t; print(t())'`")


def test_ipython_extension_shows_the_explanation_and_link_under_the_traceback(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "course_utils")
    try:
        shell.run_cell("import torch; torch.ones(2, 3) @ torch.ones(2, 3)")
        out = capsys.readouterr()
        text = out.out + out.err
        assert "RuntimeError" in text and "mat1 and mat2 shapes cannot be multiplied" in text   # traceback kept
        assert "course_utils.explain: shape mismatch" in text and "[shape-mismatch]" in text
        assert explanation_by_id("shape-mismatch").link in text
        assert text.index("mat1 and mat2 shapes") < text.index("course_utils.explain")
        shell.run_cell("raise ValueError('unrelated')")
        assert "course_utils.explain" not in capsys.readouterr().out
    finally:
        shell.run_line_magic("unload_ext", "course_utils")
        InteractiveShell.clear_instance()


# ---- the corpus of real messages (tests/data/error_messages.jsonl) ----------------------------------

CORPUS = Path(__file__).parent / "data" / "error_messages.jsonl"
RECALL_TARGET, FALSE_POSITIVE_LIMIT = 0.95, 0.05


def load_corpus() -> list[dict]:
    with CORPUS.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


# A message no curated rule covers is labelled with the area that teaches it ("area-compile"): it is explained
# right when it is sent to that area's chapter, by whichever layer (a rule of that chapter counts too).
AREA_CHAPTERS = {f"area-{area.id}": area.chapter for _, area in AREAS + TOPICS if area.chapter is not None}


def is_right(kind: str, got: Explanation | None) -> bool:
    if kind in AREA_CHAPTERS:
        return got is not None and got.chapter == AREA_CHAPTERS[kind]
    return got is not None and got.id == kind


def score(entries: list[dict]) -> tuple[dict[str, list], list[tuple[dict, str | None]], list[tuple[dict, str]]]:
    """Per kind [explained right, total]; the misses; the unrelated messages that were claimed."""
    per_kind: dict[str, list] = {}
    misses, claimed = [], []
    for entry in entries:
        got = explain(entry["message"])
        got_id = got.id if got else None
        if entry["kind"] is None:
            if got_id is not None:
                claimed.append((entry, got_id))
            continue
        counts = per_kind.setdefault(entry["kind"], [0, 0])
        counts[1] += 1
        if is_right(entry["kind"], got):
            counts[0] += 1
        else:
            misses.append((entry, got_id))
    return per_kind, misses, claimed


def report(per_kind, misses, claimed, unrelated: int) -> str:
    """Recall per kind, the false-positive count, then every miss and every wrongly claimed message."""
    lines = [f"{'kind':26} recall"]
    lines += [f"{kind:26} {right}/{total} = {right / total:.0%}" for kind, (right, total) in sorted(per_kind.items())]
    lines += [f"false positives: {len(claimed)}/{unrelated}"]
    lines += [f"MISSED {e['kind']} (got {got}): {e['source']}: {e['message'][:160]!r}" for e, got in misses]
    lines += [f"CLAIMED as {got}: {e['source']}: {e['message'][:160]!r}" for e, got in claimed]
    return "\n".join(lines)


def test_corpus_is_well_formed_with_sources():
    entries = load_corpus()
    ids = {rule.explanation.id for rule in RULES}
    for entry in entries:
        assert set(entry) == {"kind", "message", "source", "torch_version", "wrapper", "split"}, entry
        assert entry["split"] in {"tuning", "heldout-1", "heldout-2", "heldout-3", "heldout-4", "tuning-2", "tuning-3",
                                  "tuning-4", "tuning-5", "tuning-6", "tuning-7", "tuning-8",
                                  "tuning-9", "tuning-10", "tuning-11", "tuning-12", "tuning-13"}, entry
        assert entry["message"].strip() and entry["source"].startswith("https://"), entry
        assert entry["kind"] is None or entry["kind"] in ids | set(AREA_CHAPTERS), f"unknown kind {entry['kind']!r}"
        assert entry["torch_version"] is None or re.fullmatch(r"\d+(\.\d+){0,2}", entry["torch_version"]), entry
    pairs = [(e["source"], e["message"]) for e in entries]
    assert len(pairs) == len(set(pairs)), "duplicate entries"
    labelled = [e for e in entries if e["kind"] is not None]
    assert len(labelled) >= 150 and len(entries) - len(labelled) >= 30
    assert ids <= {e["kind"] for e in labelled}, f"kinds without a real message: {ids - {e['kind'] for e in labelled}}"


# `tuning-6` to `tuning-13` were collected for breadth (one message per error sentence, kinds nobody had written a
# rule for): the long tail. It is scored and printed with the rest, held to a floor that catches a broken placement
# layer, not to the target of the kinds the rules were written for.
LONG_TAIL = {"tuning-6", "tuning-7", "tuning-8", "tuning-9", "tuning-10", "tuning-11", "tuning-12",
             "tuning-13"}
LONG_TAIL_RECALL_FLOOR, LONG_TAIL_FALSE_POSITIVE_LIMIT = 0.70, 0.20


@pytest.mark.parametrize("long_tail", [False, True], ids=["written-for", "long-tail"])
def test_corpus_recall_and_false_positive_rate(long_tail):
    entries = [e for e in load_corpus() if (e["split"] in LONG_TAIL) == long_tail]
    per_kind, misses, claimed = score(entries)
    unrelated = sum(e["kind"] is None for e in entries)
    right = sum(r for r, _ in per_kind.values())
    total = sum(t for _, t in per_kind.values())
    table = report(per_kind, misses, claimed, unrelated)
    print(table)                                          # shown with -s, and in the failure message
    recall, false_positives = (LONG_TAIL_RECALL_FLOOR, LONG_TAIL_FALSE_POSITIVE_LIMIT) if long_tail else \
        (RECALL_TARGET, FALSE_POSITIVE_LIMIT)
    assert right / total >= recall and len(claimed) / unrelated <= false_positives, \
        f"recall {right}/{total}, false positives {len(claimed)}/{unrelated}\n{table}"


def test_normalisation_undoes_how_pastes_get_reformatted():
    pasted = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0, cpu"
    assert normalise(pasted.replace(",", "&#44;").replace(":", "&colon;")) == pasted   # a web page's escapes
    assert normalise("AttributeError: Can\u2019t get attribute \u2018Net\u2019 on <module \u2018__main__\u2019>") == \
        "AttributeError: Can't get attribute 'Net' on <module '__main__'>"            # a forum's typographer
    assert normalise("unrecognized arguments: \u2013local_rank=0") == "unrecognized arguments: --local_rank=0"
    assert normalise("```python\n> RuntimeError: boom\n> more\n```") == "RuntimeError: boom more"
    assert normalise("2024-05-01 12:34:56,789 - ERROR - RuntimeError: boom\n[2024-05-01 12:34:57] more") == \
        "RuntimeError: boom more"
    assert normalise('Traceback (most recent call last):\\n  File \\"x.py\\", line 1\\nRuntimeError: boom') == \
        'Traceback (most recent call last): File "x.py", line 1 RuntimeError: boom'     # a JSON log's newlines
    assert normalise("Exception has occurred: AttributeError\nCan't pickle local object 'f.<locals>.g'") == \
        "AttributeError: Can't pickle local object 'f.<locals>.g'"                      # VS Code's debugger
    for kept in (r'File "C:\Users\me\new_model\train.py", line 3, in main',             # not newlines: "\new",
                 r"ValueError: could not convert string to float: '1.5\n'",              # a quoted value's "\n",
                 "see https://example.com/?a=1&section=2&copy=3"):                      # a URL's "&copy" (no ";")
        assert normalise(kept) == kept
    assert normalise("RuntimeError: Expected index\n>= 0") == "RuntimeError: Expected index >= 0"   # a line's ">"
    assert normalise("a - b \u2013 c") == "a - b \u2013 c"                             # a dash in prose stays


# Each way a paste gets reformatted on its way to a user (a web page, a forum's typographer, a Markdown quote,
# a logger, a JSON log, Windows line ends, VS Code's debugger): the answer on the corpus must not change.
REFORMATTED = {
    "html-escaped": lambda text: html.escape(text, quote=True),
    "typographic-quotes": lambda text: text.replace("'", "\u2019").replace('"', "\u201d"),
    "markdown-quote": lambda text: "\n".join("> " + line for line in text.split("\n")),
    "code-fence": lambda text: f"```python\n{text}\n```",
    "logger-prefix": lambda text: "\n".join("2024-05-01 12:34:56,789 - ERROR - " + line for line in text.split("\n")),
    "json-escaped": lambda text: text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"),
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "debugger-label": lambda text: re.sub(r"(?m)^([\w.]+(?:Error|Exception)): ", r"Exception has occurred: \1\n", text),
}


@pytest.mark.parametrize("reformat", REFORMATTED, ids=list(REFORMATTED))
def test_the_answer_survives_how_pastes_get_reformatted(reformat):
    entries = load_corpus()[::3]
    changed = [(e["source"], e["message"][:120]) for e in entries
               if getattr(explain(REFORMATTED[reformat](e["message"])), "id", None) !=
               getattr(explain(e["message"]), "id", None)]
    # a JSON log's "\n" cannot always be told from a Windows path's "\new": a few stay one line
    assert len(changed) <= (0.01 * len(entries) if reformat == "json-escaped" else 0), changed


def test_the_corpus_score_can_fail():
    entries = load_corpus()
    relabelled = [dict(e, kind="nan-loss") if e["kind"] == "out-of-memory" else e for e in entries]
    per_kind, misses, _ = score(relabelled)
    assert per_kind["nan-loss"][0] < per_kind["nan-loss"][1] and misses
    swapped = [dict(e, kind=None) if e["kind"] == "shape-mismatch" else e for e in entries]
    assert score(swapped)[2], "claimed unrelated messages must be reported"


def test_explains_the_scheduler_order_warning_as_pytorch_writes_it():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler.step()                                  # before any optimizer.step()
    (warning,) = [w for w in caught if "lr_scheduler" in str(w.message)]
    message = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno)
    got = explain(message)
    assert got is not None and got.id == "scheduler-before-optimizer" and got.chapter == 2, message
