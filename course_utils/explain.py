"""The error explainer: a known PyTorch failure → its likely causes, the fix, and the chapter that shows it.

`explain(error)` accepts an exception or its message. `%load_ext course_utils` in a notebook prints the
explanation under every traceback it recognises (the traceback itself is shown unchanged).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from course_utils._display import ReadableResult

CHAPTERS = {1: "01_tensors_autograd.ipynb", 2: "02_data_and_modules.ipynb", 3: "03_debugging.ipynb",
            4: "04_checkpointing.ipynb", 5: "05_ddp_torchrun.ipynb", 6: "06_inference.ipynb"}


@dataclass(frozen=True)
class Explanation(ReadableResult):
    """What a recognised error usually means: causes in the order to check them, and the fix."""

    title: str
    causes: tuple[str, ...]
    fix: str
    chapter: int
    section: str

    @property
    def notebook(self) -> str:
        return CHAPTERS[self.chapter]

    def __str__(self) -> str:
        causes = "\n".join(f"  {i}. {cause}" for i, cause in enumerate(self.causes, 1))
        return (f"course_utils.explain: {self.title}\nLikely causes, in the order to check them:\n{causes}\n"
                f"Fix: {self.fix}\nReproduced in chapter {self.chapter} ({self.notebook}), {self.section}.")


# (pattern searched in "ExceptionType: message", explanation); the first match wins.
RULES: list[tuple[str, Explanation]] = [
    (r"Expected all tensors to be on the same device|is not on the expected device|"
     r"Input type \(.*\) and weight type \(.*\) should be the same", Explanation(
        "device mismatch",
        ("the model was moved with .to(device) but the batch was not (or the reverse)",
         "the targets, a mask or another extra input was left on the CPU",
         "a tensor kept as a plain attribute instead of register_buffer did not move with the model"),
        "move the model once and every batch with to_device(batch, device); check_devices(model, inputs, targets) "
        "names every tensor on the wrong device",
        3, "section 7 (device mismatch) and 8 (buffers)")),
    (r"OutOfMemoryError|CUDA out of memory|DefaultCPUAllocator: can't allocate memory|not enough memory",
     Explanation(
        "out of memory",
        ("the batch (activations saved for backward) is too large for the device",
         "tensors kept alive by accident: losses stored without .item(), evaluation without no_grad",
         "another process holds memory on the same GPU"),
        "estimate_training_memory, then find_max_batch_size (with its safety margin); log loss.item(); "
        "evaluate under torch.inference_mode()",
        3, "sections 1-3 (out of memory)")),
    (r"returned nan values|loss (is|became|=|:) ?nan|nan loss", Explanation(
        "NaN in the loss or the gradients",
        ("NaN or Inf in the data (missing values, division by zero in normalisation)",
         "an unstable operation in the model, e.g. log(softmax(x)) instead of log_softmax",
         "numerics: learning rate too high, exploding gradients, a bad initialisation"),
        "find_nonfinite(batch) for the data, locate_nonfinite(model, x) for the layer, then lower the learning "
        "rate or clip_grad_norm_; torch.autograd.detect_anomaly() names the backward op",
        3, "sections 4-6 (NaN and Inf)")),
    (r"Weights only load failed|weights_only", Explanation(
        "torch.load refused to unpickle the file (weights_only=True)",
        ("the file holds a whole pickled model (torch.save(model)) or another custom object",
         "the file comes from someone else and may run code when unpickled"),
        "save and load state_dict()s; use weights_only=False only for a file you made yourself",
        4, "section 1 (state_dict versus the whole model)")),
    (r"Attempting to deserialize object on a CUDA device", Explanation(
        "a GPU checkpoint loaded on a machine without CUDA",
        ("the checkpoint was saved from CUDA tensors and torch.load has no map_location",),
        "torch.load(path, map_location='cpu', weights_only=True), or load_checkpoint (defaults to the model's device)",
        4, "section 4 (map_location)")),
    (r"Missing key\(s\) in state_dict|Unexpected key\(s\) in state_dict|size mismatch for", Explanation(
        "state_dict keys or shapes do not match the model",
        ("a 'module.' prefix from DataParallel/DDP or '_orig_mod.' from torch.compile",
         "a different head (number of classes) or a changed architecture",
         "the wrong checkpoint for this model"),
        "load_matching_state_dict(model, state_dict) strips the prefix, loads what matches and reports the rest; "
        "strict=False alone hides the problem",
        4, "section 5 (keys and shapes that don't match)")),
    (r"mat1 and mat2 must have the same dtype|expected scalar type Half|"
     r"Input type \(.*Half.*\) and bias type|must have the same dtype, but got (Float and Half|Half and Float)",
     Explanation(
        "dtype mismatch after .half()",
        ("model.half() converted the weights while the inputs are still float32",),
        "keep the model in float32 and run under torch.autocast (choose_autocast(device) picks the dtype)",
        6, "section 1 (half precision)")),
    (r"Expected more than 1 value per channel when training", Explanation(
        "BatchNorm got a batch with one sample in training mode",
        ("the last batch of the epoch holds a single sample (dataset size % batch size == 1)",),
        "DataLoader(..., drop_last=True) for training; keep drop_last=False for validation, in model.eval()",
        2, "section 3 (drop_last and BatchNorm)")),
    (r"DataLoader worker \(pid\(s\)? ?[\d, ]*\) exited unexpectedly|Can't get attribute '.*' on <module '__main__'",
     Explanation(
        "a DataLoader worker died or could not load the dataset",
        ("the Dataset class is defined in a notebook/__main__ and workers are started with spawn (macOS, Windows)",
         "a crash inside __getitem__ in a worker: rerun with num_workers=0 to see it",
         "workers killed for lack of shared memory (Docker: raise --shm-size)"),
        "move the Dataset to an importable module; guard scripts with if __name__ == '__main__':",
        2, "section 1 (num_workers)")),
    (r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected|ChildFailedError|torchrun exited|"
     r"NCCL error|DistNetworkError|Default process group has not been initialized|"
     r"address already in use|The server socket has failed to listen|Duplicate GPU detected", Explanation(
        "a distributed job failed to start or a rank died",
        ("the script was started with python instead of torchrun, so RANK/WORLD_SIZE are not set",
         "one rank crashed: read the first failure's traceback, not the others' SIGTERM",
         "the rendezvous port is taken or unreachable, or NCCL uses the wrong network interface",
         "two ranks on one GPU with nccl"),
        "torchrun --standalone --nproc-per-node=N -m your.module; set NCCL_SOCKET_IFNAME; debug with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL and a short init_process_group timeout",
        5, "the launch cell (section 2), the crash cell and section 8")),
    (r"Got invalid dimensions for input|INVALID_ARGUMENT.*dimension", Explanation(
        "ONNX Runtime rejected the input shape",
        ("the model was exported without a dynamic batch axis, so only the example's batch size works",),
        "export_onnx(model, (x,), path, dynamic_batch=True), then verify_onnx at several batch sizes",
        6, "section 3 (ONNX with a dynamic batch axis)")),
    (r"Could not guard on data-dependent expression|data-dependent", Explanation(
        "torch.export cannot follow Python control flow that depends on tensor values",
        ("an `if` on a tensor's value (e.g. x.sum() > 0) inside forward",),
        "move the branch to the caller, or write it with torch.cond",
        6, "section 4 (data-dependent control flow)")),
    (r"has been modified by an inplace operation", Explanation(
        "autograd needed a tensor that an in-place operation changed",
        ("a trailing-underscore op (relu_, mul_, add_, ...) or x[...] = ... overwrote a value saved for backward",),
        "use the out-of-place version (x = x.relu()) for tensors autograd saved; "
        "torch.autograd.set_detect_anomaly(True) shows the forward line",
        1, "section 3 (in-place operations)")),
    (r"a leaf Variable that requires grad is being used in an in-place operation", Explanation(
        "in-place update of a parameter outside torch.no_grad()",
        ("a manual update w -= lr * w.grad while autograd is recording",),
        "wrap the update in `with torch.no_grad():`",
        1, "section 3 (forgetting grad.zero_() and other update mistakes)")),
    (r"does not require grad and does not have a grad_fn", Explanation(
        "backward() on a tensor that autograd did not record",
        ("the loss was computed under torch.no_grad() / inference_mode",
         "no input of the computation has requires_grad=True (parameters frozen or detached)",
         "the loss was built from .item() / .detach() values"),
        "compute the loss with grad enabled from tensors that require grad",
        1, "section 4 (what backward() fills in)")),
    (r"mat1 and mat2 shapes cannot be multiplied", Explanation(
        "shape mismatch in a matrix multiply",
        ("an input with the wrong number of features for the first Linear layer",
         "a missing flatten/reshape, or a transpose on one branch of forward only"),
        "print shapes before the failing line and write expected shapes in comments at the top of forward",
        1, "section 5 (the dynamic graph)")),
]


def explain(error: BaseException | str) -> Explanation | None:
    """The `Explanation` of an exception (or its message) this course teaches; None if unknown."""
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}"
    elif isinstance(error, str):
        text = error
    else:
        raise TypeError(f"explain takes an exception or a message, got {type(error).__name__}")
    for pattern, explanation in RULES:
        if re.search(pattern, text, flags=re.IGNORECASE | re.DOTALL):
            return explanation
    return None


def _show_explanation(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler: the normal traceback, then the explanation if there is one."""
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    explanation = explain(value)
    if explanation is not None:
        print(f"\n{explanation}", file=sys.stdout)


def load_ipython_extension(ipython) -> None:
    """`%load_ext course_utils`: explain recognised errors under their tracebacks."""
    ipython.set_custom_exc((Exception,), _show_explanation)


def unload_ipython_extension(ipython) -> None:
    ipython.set_custom_exc((), None)
