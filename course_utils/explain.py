"""The error explainer: a known PyTorch failure → its likely causes, the fix, and the chapter that shows it.

`explain(error)` accepts an exception or a pasted message (a traceback, a log with `[rank0]:` prefixes,
a wrapper's re-raised text) and returns an `Explanation` with a stable `id` and a `link` that opens the
notebook section in JupyterLab. `%load_ext course_utils` shows the explanation, with that link, under
every traceback it recognises (the traceback itself is shown unchanged).

Rules match on meaning, not on one wording: each failure kind has several patterns, one per wording
that real users meet (older releases, wrappers, Windows), searched in the message after light
normalisation (ANSI colour codes, `[rank0]:`-style and loggers' prefixes, what web pages, forums, Markdown
and JSON logs do to a paste, full-width punctuation and line wrapping removed). The first matching rule
wins, so more specific kinds come first.

A message no rule matches is *placed* by `course_utils.error_origin`: where in PyTorch it was raised (the
message template of PyTorch's sources it matches, a traceback frame, its own words), and the chapter that
teaches that part of PyTorch; the explanation then says there is no curated fix, and which placements are
low-confidence. Where nothing says where it was raised, `course_utils.learned_placement` reads its words (a
classifier trained on the course's labelled real messages) and gives a chapter at low confidence, or no answer
when they read like an error that is not PyTorch's. `benchmarks/explain_heldout.py` measures both layers on messages collected after they were
written.

What is *not* claimed, on purpose: out-of-memory errors that are not PyTorch's (NumPy's
`Unable to allocate`, the OS's `Cannot allocate memory`, TensorFlow's `OOM when allocating`), an
`Address already in use` that does not come from torch.distributed's rendezvous, and CUDA driver
errors from programs other than PyTorch (CUDA samples, ONNX Runtime, Caffe, Lua Torch): the chapters
teach PyTorch's path, so their advice would be wrong there. `tests/data/error_messages.jsonl` holds
the real messages (with their sources) the rules are measured against.
"""
from __future__ import annotations

import html
import re
import traceback
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

from course_utils._display import ReadableResult
from course_utils.error_origin import (another_frameworks, file_system_or_pip, foreign_cpp, foreign_cuda, frames,
                                      looks_like_pytorch, origin, plain_pickle, topic_of, vocabulary_area)
from course_utils.learned_placement import learned_chapter

CHAPTERS = {1: "01_tensors_autograd.ipynb", 2: "02_data_and_modules.ipynb", 3: "03_debugging.ipynb",
            4: "04_checkpointing.ipynb", 5: "05_ddp_torchrun.ipynb", 6: "06_inference.ipynb"}
_FRAGMENT_SAFE = "!$&'()*+,;=:@/?-._~"     # characters left as they are in the URL fragment
CHAPTER_TITLES = {1: "Chapter 1 — Tensors and autograd",                 # each notebook's first heading
                  2: "Chapter 2 — The DataLoader, `nn.Module` pitfalls and the training loop",
                  3: "Chapter 3 — When training blows up: OOM, NaN and device mismatch",
                  4: "Chapter 4 — Checkpoints that survive crashes and resume exactly",
                  5: "Chapter 5 — From one device to DistributedDataParallel with `torchrun`",
                  6: "Chapter 6 — Faster inference: half precision, `torch.compile`, ONNX"}
CHAPTER_DOCS = {1: "tensors.html", 2: "data.html", 3: "notes/cuda.html", 4: "notes/serialization.html",
                5: "distributed.html", 6: "torch.compiler.html"}
# The learned placement (course_utils.learned_placement) answers where nothing places a message by where it was
# raised: a chapter when its probability is at least LEARNED_THRESHOLD, and no answer when "not PyTorch's" is the
# most probable class with at least LEARNED_NOT_PYTORCH. Chosen by leave-one-set-out on the spent held-out sets'
# wordings new to the rest (benchmarks/learned_placement_loso.py; today's code: 65.6 % right, 10.3 % false alarms on
# sets 5-24, in benchmarks/learned_placement_loso.txt; on sets 5-23, 65.9 % and 9.2 % before set 24 joined the
# training data (6c28d24), 64.9 % and 9.2 % with the code set 24 measured (1235c61); 63.9 % and 9.8 % on sets 5-22
# before set 23 joined). Before set 23's misses were read (7647829), 0.45 and 0.3 gave 63.7 % and 9.8 % on sets 5-22,
# 0.5 and 0.4 (chosen on sets 5-18, used up to set 22's measurement) 63.0 % and 10.0 %; on sets 5-21, 66.9 % and
# 10.1 % against 65.7 % and 10.5 % (benchmarks/learned_placement_loso_history/). Optimistic: chosen on the same folds.
LEARNED_THRESHOLD, LEARNED_NOT_PYTORCH = 0.45, 0.3


def heading_anchor(heading: str) -> str:
    """The id JupyterLab 4 gives a Markdown heading: its rendered text with spaces turned into '-'.

    JupyterLab renders the heading and takes `textContent.replace(/ /g, '-')` (rendermime's
    `createHeaderId`; `TableOfContentsUtils.Markdown.getHeadingId` does the same for `#heading=`
    fragments), so Markdown markup that does not render as text (backticks, `*`, link targets) is dropped.
    """
    if not isinstance(heading, str) or not heading.strip():
        raise ValueError(f"heading_anchor needs a non-empty heading text, got {heading!r}")
    parts = heading.strip().split("`")
    text = "".join(part if i % 2 else re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", part).replace("*", "")
                   for i, part in enumerate(parts))
    return text.replace(" ", "-")


@dataclass(frozen=True)
class Explanation(ReadableResult):
    """What an error means and where the course teaches it (`section` is the exact heading text in that
    chapter's notebook).

    A curated explanation (`confidence == "curated"`) gives the causes in the order to check them and the
    fix, and its chapter reproduces the error (`reproduced`; False when only a GPU can raise it, or the chapter
    teaches the fix without raising that error). A
    *placement* (`confidence` "placed" or "low") is what is known of a PyTorch message no rule covers:
    `origin` says where in PyTorch it was raised, `causes` and `fix` are empty, and the chapter is the
    one that teaches that part of PyTorch; "low" when that part is broad (any layer, any tensor op), or when only
    the message's words place it (id "chapter-N": course_utils.learned_placement)."""

    id: str
    title: str
    causes: tuple[str, ...]
    fix: str
    chapter: int
    section: str
    reproduced: bool = True
    confidence: str = "curated"
    origin: str = ""
    docs: str = ""

    @property
    def notebook(self) -> str:
        return CHAPTERS[self.chapter]

    @property
    def href(self) -> str:
        """Link from one course notebook to the section (all chapters live in the same folder).

        JupyterLab 4 opens the notebook and hands the fragment to the notebook widget's `setFragment`;
        `#heading=<id>` finds the heading by the id JupyterLab derives from its Markdown (kinds
        `heading=` and `cell-id=` were added in jupyterlab/jupyterlab#13285; notebook-to-notebook
        section links: jupyterlab/jupyterlab#4190, regressions fixed after #15207 and #17929). Checked
        against the JupyterLab 4.6 bundle this project installs: the router passes `location.hash` to
        `NotebookPanel.setFragment`, whose `heading=` branch compares `getHeadingId` of each heading."""
        return f"{self.notebook}#heading={quote(heading_anchor(self.section), safe=_FRAGMENT_SAFE)}"

    @property
    def link(self) -> str:
        """URL path of the section relative to the JupyterLab server root (`./course lab` serves `notebooks/`)."""
        return f"/lab/tree/{self.href}"

    def _lines(self) -> list[tuple[str, str]]:
        """(label, text) lines shared by the text and HTML forms."""
        where = f"chapter {self.chapter} ({self.notebook}), section \"{self.section}\""
        if self.confidence == "curated":
            lines = [("Likely causes, in the order to check them", ""), ("Fix", self.fix)]
            lines.append(("Reproduced in" if self.reproduced else "Taught in (the notebook does not raise this error)",
                          where))
            return lines
        learned = self.id.startswith("chapter-")        # placed by course_utils.learned_placement
        taught = "what messages worded like it are about" if learned else "the part of PyTorch that raised it"
        lines = [("Where it was raised", self.origin),
                 ("No curated fix", f"no rule of this course knows this message; the chapter below teaches {taught}"),
                 ("Read", where), ("PyTorch documentation", self.docs)]
        if learned:
            lines.append(("Low confidence", "only its words place it, as a model learned from labelled real "
                                            "messages reads them: read the message itself first"))
        elif self.confidence == "low":
            lines.append(("Low confidence", "that part of PyTorch is broad: the place alone does not say which "
                                            "mistake led there, so read the message itself first"))
        return lines

    def __str__(self) -> str:
        out = [f"course_utils.explain: {self.title} [{self.id}]"]
        for label, text in self._lines():
            if label.startswith("Likely causes"):
                out.append(f"{label}:")
                out += [f"  {i}. {cause}" for i, cause in enumerate(self.causes, 1)]
            elif label in {"Reproduced in", "Read"} or label.startswith("Taught in"):
                out.append(f"{label} {text}: {self.link}")
            else:
                out.append(f"{label}: {text}")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        out = [f"<div><b>course_utils.explain: {html.escape(self.title)}</b> <code>[{self.id}]</code>"]
        link = f"<a href=\"{html.escape(self.href, quote=False)}\">{html.escape(self.section)}</a>"
        for label, text in self._lines():
            if label.startswith("Likely causes"):
                causes = "".join(f"<li>{html.escape(cause)}</li>" for cause in self.causes)
                out.append(f"<br>{label}:<ol>{causes}</ol>")
            elif label in {"Reproduced in", "Read"} or label.startswith("Taught in"):
                out.append(f"<br>{html.escape(label)} chapter {self.chapter}: {link}")
            elif label == "PyTorch documentation":
                out.append(f"<br>{label}: <a href=\"{html.escape(text)}\">{html.escape(text)}</a>")
            else:
                out.append(f"<br>{html.escape(label)}: {html.escape(text)}")
        return "".join(out) + "</div>"


@dataclass(frozen=True)
class Rule:
    """One failure kind: its explanation, the regular expressions (one per real wording) searched in the
    normalised message, and short message fragments shown in README's troubleshooting index."""

    explanation: Explanation
    patterns: tuple[str, ...]
    examples: tuple[str, ...]

    def matches(self, text: str) -> bool:
        return any(regex.search(text) for regex in _compiled(self.patterns))


@lru_cache(maxsize=None)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    """A rule's wordings, each compiled alone: a search for one wording skips ahead to its literal start, which
    one alternation of all of them cannot (measured: a third less time per message than one alternation)."""
    return tuple(re.compile(pattern, flags=re.IGNORECASE) for pattern in patterns)


def _rule(id, title, causes, fix, chapter, section, patterns, examples, reproduced=True) -> Rule:
    _compiled(tuple(patterns))              # compiled at import, not on a learner's first error
    return Rule(Explanation(id, title, tuple(causes), fix, chapter, section, reproduced), tuple(patterns),
                tuple(examples))


# How torchrun and mp.spawn report that a worker process failed, whatever the worker's error was: the
# `distributed-launch` rule's, unless the worker's own error was pasted too (see `explain`)
_LAUNCHER_REPORTS = [r"ChildFailedError", r"failed \(exitcode: -?\d+\) local_rank:", r"torchrun exited with code",
                     r"Process(Raised|Exited)Exception", r"process \d+ terminated with (exit code|signal)"]

# The first matching rule wins: driver and compiler problems before what they cause, timeouts before
# launch failures, specific torch.compile/export kinds before the generic graph break.
RULES: list[Rule] = [
    _rule("cuda-driver", "PyTorch cannot use CUDA here: no driver, an old driver, or a CPU-only build",
          ["the driver is older than the CUDA version the PyTorch wheel was built with",
           "no NVIDIA driver or GPU at all (a CPU-only machine, a container started without --gpus)",
           "a CPU-only PyTorch build (torch.version.cuda is None) with code that calls .cuda()",
           "a wheel not built for this GPU's architecture (a new GPU, an old wheel; on ROCm, a gfx target it lacks)"],
          "update the driver, or install the wheel for an older CUDA (or a CUDA build at all); python -m "
          "course_utils doctor names the driver and the wheel's CUDA; pick the device with get_device()",
          1, "1. Pick the device once; a tensor carries it, and whether autograd tracks it",
          [r"NVIDIA driver on your system is too old", r"Found no NVIDIA driver on your system",
           r"Torch not compiled with CUDA enabled",
           r"CUDA initialization: CUDA unknown error",
           r"(RuntimeError|CUDA error)\s?:.{0,40}?CUDA driver version is insufficient",
           r"CUDA capability sm_\d+ is not compatible with the current PyTorch installation",
           r"no kernel image is available for execution on the device", r"hipErrorNoBinaryForGpu",
           r"CUDA error: invalid device function"],     # (also ROCm's "HIP error: ...", read as CUDA's)
          ["The NVIDIA driver on your system is too old", "Found no NVIDIA driver on your system",
           "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
           "AssertionError: Torch not compiled with CUDA enabled"],
          reproduced=False),                 # chapter 1 picks a device that works; it raises none of these
    _rule("invalid-device-ordinal", "a GPU number that this machine (or this process) does not have",
          ["cuda:N or set_device(N) with N >= torch.cuda.device_count(): a hard-coded cuda:1 on a one-GPU machine",
           "CUDA_VISIBLE_DEVICES hides GPUs, so the process sees them renumbered from 0",
           "more processes per node (torchrun --nproc-per-node, a LOCAL_RANK) than GPUs"],
          "pick the device once from what exists (get_device(); torch.cuda.device_count()); under torchrun use "
          "cuda:LOCAL_RANK with --nproc-per-node <= the GPU count",
          1, "1. Pick the device once; a tensor carries it, and whether autograd tracks it",
          [r"invalid device ordinal", r"Invalid device id\b", r"device >= 0 && device < num_gpus",
           r"Invalid device argument"],
          ["CUDA error: invalid device ordinal"], reproduced=False),
    _rule("device-side-assert", "a CUDA kernel assertion: usually a label or index out of range",
          ["a class label >= the number of outputs (or negative) in cross_entropy / nll_loss",
           "an index >= the embedding's vocabulary size, or a bad gather/index_select index",
           "CUDA reports errors asynchronously: the traceback may point at a later line"],
          "rerun on the CPU (or with CUDA_LAUNCH_BLOCKING=1) for an exact message, then check "
          "labels.min() >= 0 and labels.max() < num_classes before the loss",
          3, "A label out of range: the device-side assert",
          [r"device-side assert triggered", r"Assertion .?\w*t >= 0 && \w*t < n_classes.? failed",
           r"Target -?\d+ is out of bounds", r"index out of range in self"],
          ["CUDA error: device-side assert triggered", "Assertion t >= 0 && t < n_classes failed",
           "Target 5 is out of bounds"]),    # chapter 3 raises the CPU's form (and the GPU's, on a GPU)
    _rule("device-mismatch", "device mismatch",
          ["the model was moved with .to(device) but the batch was not (or the reverse)",
           "the targets, a mask or another extra input was left on the CPU",
           "a tensor kept as a plain attribute instead of register_buffer did not move with the model"],
          "move the model once and every batch with to_device(batch, device); check_devices(model, inputs, targets) "
          "names every tensor on the wrong device",
          3, "7. Model on one device, batch on another",
          [r"Expected all tensors to be on the same device", r"found at least two devices",
           r"is not on the expected device",
           r"is on (CPU|GPU|CUDA)\b.{0,80}?but expected (it|them) to be on (GPU|CPU|CUDA)",
           r"Expected object of (device type|backend) \w+ but got (device type|backend) \w+",
           r"Input type \(torch\.cuda\.\w+\) and weight type \(torch\.(?!cuda)\w+\)",
           r"Input type \(torch\.(?!cuda)\w+\) and weight type \(torch\.cuda\.\w+\)",
           r"Placeholder storage has not been allocated on MPS device",
           r"indices should be either on cpu or on the same device as the indexed tensor"],
          ["Expected all tensors to be on the same device", "is not on the expected device",
           "Expected object of device type cuda but got device type cpu",
           "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same"]),
    _rule("out-of-memory", "out of memory",
          ["the batch (activations saved for backward) is too large for the device",
           "tensors kept alive by accident: losses stored without .item(), evaluation without no_grad",
           "another process holds memory on the same GPU",
           "cuBLAS/cuDNN could not allocate a workspace (CUBLAS_STATUS_ALLOC_FAILED, 'unable to find an engine', "
           "no valid cuDNN algorithm): the same shortage in disguise"],
          "estimate_training_memory, then find_max_batch_size (with its safety margin); log loss.item(); "
          "evaluate under torch.inference_mode()",
          3, "2. A real OOM, caught and retried",
          [r"CUDA out of memory", r"OutOfMemoryError", r"CUDA error\s?(\(2\))?\s?:\s?out of memory",
           r"cuda runtime error \(2\)",      # 1.x's code for out of memory, pasted without its words
           # (ROCm's "HIP out of memory" arrives in CUDA's words: _in_cuda_words)
           r"DefaultCPUAllocator: (can't allocate memory|not enough memory)", r"MPS backend out of memory",
           r"CUDA error: CUBLAS_STATUS_ALLOC_FAILED", r"unable to find an engine to execute this computation",
           r"Unable to find a valid cuDNN algorithm", r"no valid convolution algorithms available in CuDNN",
           r"posix_memalign failed", r"enforce fail at (CPUAllocator|alloc_cpu)\.cpp",
           r"not enough GPU video memory"],
          ["CUDA out of memory", "torch.OutOfMemoryError", "CUDA error: out of memory",
           "DefaultCPUAllocator: can't allocate memory"]),
    _rule("distributed-timeout", "a collective timed out: one rank never joined it (a hang)",
          ["one rank skipped the collective: uneven batches per rank, or a collective inside `if rank == 0:`",
           "one rank crashed or is stuck elsewhere (a long save or evaluation on rank 0) while the others wait",
           "NCCL/gloo cannot reach a peer: the wrong network interface"],
          "make every rank run the same collectives (Join for uneven inputs); find the missing rank with "
          "dist.monitored_barrier, TORCH_DISTRIBUTED_DEBUG=DETAIL, and a short timeout in init_process_group",
          5, "7. A hang: one rank skips a collective",
          [r"Watchdog caught collective operation timeout", r"Some NCCL operations have failed or timed out",
           r"Timed out waiting \d+ ?ms for (recv|send)", r"failed to pass monitoredBarrier",
           r"Application timeout caused pair closure"],
          ["Watchdog caught collective operation timeout", "Timed out waiting 1800000ms for recv operation",
           "Rank 1 failed to pass monitoredBarrier"]),
    _rule("rendezvous-failure", "the ranks could not meet: the rendezvous timed out, could not connect, or its port is taken",
          ["a node or rank did not start, or points at the wrong --rdzv-endpoint / MASTER_ADDR:MASTER_PORT",
           "a firewall blocks the port, or the machine name does not resolve",
           "another job still holds the port (address already in use)"],
          "on one machine use torchrun --standalone; across machines check the endpoint and port from every node, "
          "and pick a free port for each job",
          5, "10. Several machines, on one machine",
          [r"RendezvousTimeoutError", r"RendezvousConnectionError", r"DistStoreError: Timed out",
           r"Timed out after \d+ seconds waiting for (clients|workers)", r"client socket has (timed out|failed to connect)",
           r"server socket has failed to (listen|bind)", r"store based barrier",
           r"RuntimeError: Address already in use", r"(TCPStore|c10d|gloo|rendezvous).{0,300}?Address already in use",
           r"use_libuv was requested but PyTorch was buil[dt] without libuv support"],
          ["RendezvousTimeoutError", "DistStoreError: Timed out after 1801 seconds waiting for clients",
           "Timed out initializing process group in store based barrier",
           "The server socket has failed to listen on any local network address", "RendezvousConnectionError"]),
    _rule("ddp-unused-parameters", "DDP waited for gradients that some parameters never received",
          ["a layer defined in __init__ but not used in forward (an auxiliary head, a branch taken only sometimes)",
           "part of forward's output does not reach the loss, so its parameters get no gradient",
           "a parameter used twice through activation checkpointing or a shared module (marked ready twice)"],
          "remove or use the idle layer, or freeze it (requires_grad_(False)) before wrapping; "
          "find_unused_parameters=True when the unused set really changes from step to step (it costs a graph "
          "walk per step); TORCH_DISTRIBUTED_DEBUG=DETAIL names the parameters",
          5, "A parameter that gets no gradient",
          [r"Expected to have finished reduction in the prior iteration",
           r"parameters that were not used in producing (the )?loss", r"Expected to mark a variable ready only once",
           r"find_unused_parameters=True"],
          ["Expected to have finished reduction in the prior iteration before starting a new one",
           "Expected to mark a variable ready only once"]),
    _rule("distributed-launch", "a distributed job failed to start or a rank died",
          ["the script was started with python instead of torchrun, so RANK/WORLD_SIZE are not set",
           "one rank crashed: read the first failure's traceback (Root Cause), not the others' SIGTERM",
           "NCCL cannot connect the ranks (wrong network interface, two ranks on one GPU): NCCL_DEBUG=INFO says why"],
          "torchrun --standalone --nproc-per-node=N your_script.py; set NCCL_SOCKET_IFNAME; launch_torchrun shows "
          "the failing rank's traceback",
          5, "Launching it",
          [r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) expected",
           r"env:// rendezvous: \w+ not set", r"Default process group has not been initialized",
           r"Duplicate GPU detected", r"NCCL error", *_LAUNCHER_REPORTS],
          ["environment variable RANK expected, but not set", "ChildFailedError", "NCCL error"]),
    _rule("corrupt-checkpoint", "the checkpoint file is truncated or not a checkpoint",
          ["the save was interrupted (a crash or kill during torch.save) and left half a file",
           "the download did not finish, or saved an HTML error page under the checkpoint's name (invalid load key, '<')",
           "the file is a Git LFS pointer (invalid load key, 'v'): the repository was cloned without git lfs pull",
           "a zip of another kind: torch.jit.load of a torch.save file finds no constants.pkl, torch.load of "
           "another program's zip finds no data.pkl",
           "the file was read with pickle.load instead of torch.load (a load persistent id instruction)"],
          "look at the file's first bytes (head -c 100) and its size; download or save again (git lfs pull for an LFS "
          "pointer); save_checkpoint writes a temporary file and renames it only when complete",
          4, "9. Crash safety under a real `SIGKILL`",
          [r"PytorchStreamReader failed (reading|locating) (zip archive|file)", r"failed finding central directory",
           r"unexpected EOF\W.{0,60}?The file might be corrupted", r"storage has wrong size: expected \d+ got \d+",
           r"invalid load key, ?'(<|v|\\x[0-9a-f]{2}|\W)'", r"Unsupported operand (60|118)\b",
           # (not in a process that spawn started: its parent died before sending what the child unpickles)
           r"^(?![\s\S]*spawn\.py\"?, line \d+, in _main)[\s\S]*Ran out of input",
           r"invalid magic number", r"Expected hasRecord\(\"version\"\) to be true",
           r"A load persistent id instruction was encountered"],
          ["PytorchStreamReader failed reading zip archive: failed finding central directory",
           "UnpicklingError: invalid load key, '<'."]),
    _rule("weights-only-load", "torch.load refused to unpickle the file (weights_only=True)",
          ["the file holds a whole pickled model (torch.save(model)) or another custom object",
           "the file comes from someone else and may run code when unpickled",
           "the file is damaged (WeightsUnpickler error: Unsupported operand)"],
          "save and load state_dict()s; allow-list a trusted class with torch.serialization.add_safe_globals; "
          "use weights_only=False only for a file you made yourself",
          4, "1. `torch.save(model)` versus `torch.save(model.state_dict())`",
          [r"Weights only load failed", r"WeightsUnpickler error", r"Unsupported global: GLOBAL"],
          ["Weights only load failed", "WeightsUnpickler error: Unsupported global: GLOBAL"]),
    _rule("pickled-class-missing", "torch.load cannot find the class of a whole pickled model",
          ["the file was written with torch.save(model): unpickling looks the class up by module and name",
           "the class was defined in the training script (__main__) or has moved or been renamed since"],
          "save and load state_dict()s; to read the old file once, import (or define) the class under the same "
          "name before torch.load",
          4, "1. `torch.save(model)` versus `torch.save(model.state_dict())`",
          [r"(torch\.load|serialization\.py|unpickler\.load).{0,800}?Can't get attribute '[^']*' on <module",
           r"Can't get attribute '[^']*' on <module '__main__' from '",
           # a notebook's __main__ has no file ("<module '__main__'>"); a spawned worker's is "(built-in)"
           r"Can't get attribute '[^']*' on <module '__main__'(>|$)",
           # a class looked up in a package's module ("models.common", "ultralytics.nn.modules.block") that no
           # longer defines it: a whole model pickled with an older or newer version of that package
           r"Can't get attribute '[^']*' on <module '(?!__)[\w.]+'",
           r"(torch\.load|serialization\.py|find_class).{0,800}?ModuleNotFoundError: No module named"],
          ["Can't get attribute 'Net' on <module '__main__' from 'train.py'>"]),
    _rule("model-not-picklable", "torch.save(model) cannot pickle something the model holds",
          ["torch.save(model) pickles the whole object: every attribute must be picklable, and a lambda, a local "
           "function, a lock, an open file or a C extension object is not",
           "a wrapper (a logger, a data pipeline, a tokenizer) kept as an attribute of the model"],
          "save model.state_dict() (tensors only); rebuild the model from code when loading",
          4, "1. `torch.save(model)` versus `torch.save(model.state_dict())`",
          [r"(torch\.save\(|serialization\.py\"?, line \d+, in _?save\b)[\s\S]{0,3000}?\b(can't|cannot) pickle",
           # Python's own words, naming a lambda or function made in a layer's or model's __init__: an
           # attribute of a module, which only pickling the whole model (torch.save(model)) must carry
           r"Can't (get|pickle) local object '\w*(Block|Net|Model|Layer|Module|Encoder|Decoder|Head|Attention|"
           r"Transformer|Conv)\w*\.__init__\.<locals>"],
          ["torch.save(model, path) ... Can't pickle local object 'Net.__init__.<locals>.<lambda>'"]),
    _rule("cuda-checkpoint-on-cpu", "a GPU checkpoint loaded where its GPU does not exist",
          ["the checkpoint was saved from CUDA tensors and torch.load has no map_location",
           "it was saved on cuda:N and this machine has fewer GPUs (or none visible)",
           "CUDA is installed but this PyTorch is a CPU-only build, or the driver is not usable"],
          "torch.load(path, map_location='cpu', weights_only=True), or load_checkpoint (defaults to the model's device)",
          4, "7. `map_location`: a GPU checkpoint on a CPU-only machine",
          [r"Attempting to ?deserializ\w* object on (a )?CUDA device"],
          ["Attempting to deserialize object on a CUDA device",
           "Attempting to deserialize object on CUDA device 1 but torch.cuda.device_count() is 1"]),
    _rule("state-dict-not-a-model", "a state_dict (a dict of tensors) used where a model was expected",
          ["the file holds model.state_dict(), so torch.load returns a dict, and the code calls .eval(), .to() "
           "or the model on it",
           "a whole pickled model was passed to load_state_dict (the reverse)"],
          "build the model first, then model.load_state_dict(torch.load(path, weights_only=True)); keep the "
          "returned dict apart from the model in your names",
          4, "1. `torch.save(model)` versus `torch.save(model.state_dict())`",
          [r"'(collections\.)?OrderedDict' object (has no attribute '\w+'|is not callable)",
           r"'dict' object has no attribute '(eval|train|to|cuda|cpu|parameters|state_dict|forward|load_state_dict)'",
           r"Expected state_dict to be dict-like, got"],
          ["'collections.OrderedDict' object has no attribute 'eval'"]),
    _rule("optimizer-state-mismatch", "the optimizer state in the checkpoint belongs to other parameters",
          ["the model changed since the checkpoint (a layer added, removed or frozen), so the optimizer now has "
           "another number of parameters",
           "the optimizer is built from a different parameter list or groups than when it was saved (a frozen "
           "backbone, a separate learning rate for the head)",
           "a scheduler created with last_epoch > -1 for an optimizer whose state was not loaded (no initial_lr)"],
          "build the optimizer exactly as when saving; to fine-tune a changed model, load only the model's weights "
          "and start a new optimizer",
          4, "8. Keys and shapes that don't match",
          [r"loaded state dict contains a parameter group that doesn't match the size of optimizer's group",
           r"loaded state dict has a different number of parameter groups",
           r"param 'initial_lr' is not specified in param_groups\[\d+\]"],
          ["loaded state dict contains a parameter group that doesn't match the size of optimizer's group"]),
    _rule("state-dict-mismatch", "state_dict keys or shapes do not match the model",
          ["a 'module.' prefix from DataParallel/DDP or '_orig_mod.' from torch.compile",
           "a different head (number of classes) or a changed architecture",
           "the wrong checkpoint for this model, or a checkpoint dict passed instead of its 'state_dict' entry"],
          "load_matching_state_dict(model, state_dict) strips the prefix, loads what matches and reports the rest; "
          "strict=False alone hides the problem",
          4, "8. Keys and shapes that don't match",
          [r"Missing key\(s\) in state_dict", r"Unexpected key\(s\) in state_dict",
           r"(unexpected|missing) keys? \"[^\"]*\" in state_dict", r"size mismatch for \S+: copying a param",
           r"Error\(s\) in loading state_dict"],
          ["Missing key(s) in state_dict", "Unexpected key(s) in state_dict",
           "size mismatch for head.weight: copying a param with shape"]),
    _rule("dtype-double-long", "a float64 (Double) or integer tensor where another dtype was expected",
          ["targets or inputs built from NumPy arrive as float64 (Double) while the model is float32",
           "class labels as floats (or int32) for cross_entropy / nll_loss, which want int64 (Long) indices",
           "an integer tensor where a float is needed (a regression target, a mask multiplied into a loss)"],
          "convert where the data enters: torch.from_numpy(a).float() for features and regression targets, "
          ".long() for class labels; print x.dtype next to x.shape when a loss complains",
          1, "Dtypes that pair up wrongly",
          [r"Found dtype (Double|Float|Long|Int|Byte|Bool) but expected (Float|Double|Long|Int)",
           r"expected target dtype to be Long",
           r"expected scalar type (Long|Double|Float|Int|Byte|Bool) but found (Float|Double|Long|Int|Byte|Bool|Char|Short)",
           # (a Half or BFloat16 beside it is half precision's: dtype-mismatch, chapter 6)
           r"Expected object of scalar type (Long|Int|Byte|Bool) but got scalar type",
           r"Expected object of scalar type (Double|Float) but got scalar type (?!Half|BFloat16)",
           r"result type \w+ can't be cast to the desired output type (Long|Int|Byte|Bool|Short|Char)",
           r"Expected floating point type for target with class probabilities",
           r"\"nll_loss\w*\" not implemented for '(Float|Double|Int)'",
           r"(mat1|m1) and (mat2|m2) (must )?(to )?have the same dtype, but got:? (Double and Float|Float and Double|"
           r"double != float|float != double)",
           r"Input type \(torch\.(cuda\.)?DoubleTensor\) and weight type \(torch\.(cuda\.)?FloatTensor\)",
           r"Input type \((double|float)\) and (weight|bias) type \((float|double)\) should be the same",
           r"to have scalar type (Long|Double|Float|Int); but got"],
          ["Found dtype Double but expected Float", "expected target dtype to be Long or Byte, but got Float",
           "expected scalar type Long but found Float"]),
    _rule("half-not-implemented", "an operation that has no float16 / bfloat16 kernel on this device",
          ["model.half() (or .bfloat16()) on the CPU, where some kernels exist only in float32",
           "an operation (linalg, some losses, FFT on the CPU) that has no low-precision kernel on any device"],
          "keep the weights in float32 and run under torch.autocast, which picks float32 for the operations that "
          "need it; or run that one operation in float32 (x.float()) and convert back",
          6, "1. Half precision: `.half()` or `autocast`",
          [r"not implemented for '(Half|BFloat16|ComplexHalf|Float8\w*)\b", r"Low precision dtypes not supported",
           r"doesn't support tensors of type: (Half|BFloat16)"],
          ["\"addmm_impl_cpu_\" not implemented for 'Half'", "\"cdist\" not implemented for 'Half'"]),
    _rule("grad-scaler-fp16-gradients", "GradScaler refuses float16 gradients: the weights themselves are float16",
          ["model.half() before training: parameters, and so their gradients, are float16",
           "GradScaler expects float32 weights whose forward runs under autocast"],
          "keep the model in float32, run the forward pass under torch.autocast(device_type, dtype=torch.float16), "
          "and keep GradScaler; or train in bfloat16 autocast without a scaler",
          6, "1. Half precision: `.half()` or `autocast`",
          [r"Attempting to unscale FP16 gradients"],
          ["Attempting to unscale FP16 gradients."]),
    _rule("dtype-mismatch", "dtype mismatch between the weights and the inputs (e.g. after .half())",
          ["model.half() (or bfloat16) converted the weights while the inputs are still float32",
           "inputs built from NumPy arrive as float64"],
          "keep the model in float32 and run under torch.autocast (choose_autocast(device) picks the dtype); "
          "convert inputs with .float()",
          6, "1. Half precision: `.half()` or `autocast`",
          [r"(mat1|m1) and (mat2|m2) must have the same dtype",
           r"expected (mat1|m1) and (mat2|m2) to have the same dtype",
           r"expected dtype (float|Half|BFloat16|c10::Half|c10::BFloat16) for \S+ but got dtype",
           r"expected scalar type (Half|Float|BFloat16|Double) but found (Half|Float|BFloat16|Double)",
           r"Expected object of scalar type (Half|BFloat16) but got scalar type (Float|Double)\b",    # (1.x's words)
           r"Expected object of scalar type (Float|Double) but got scalar type (Half|BFloat16)\b",
           r"Input type \([^)]*\) and (weight|bias) type \([^)]*\) should be the same"],
          ["mat1 and mat2 must have the same dtype, but got Float and Half",
           "expected scalar type Half but found Float",
           "Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same"]),
    _rule("batchnorm-single-sample", "BatchNorm got a batch with one sample in training mode",
          ["the last batch of the epoch holds a single sample (dataset size % batch size == 1)",
           "a batch size of 1 (or 1 per GPU) with BatchNorm in training mode"],
          "DataLoader(..., drop_last=True) for training; keep drop_last=False for validation, in model.eval()",
          2, "3. `drop_last` and BatchNorm",
          [r"Expected more than 1 value per channel when training"],
          ["Expected more than 1 value per channel when training"]),
    _rule("optimizer-empty-params", "the optimizer was given no parameters",
          ["the model's layers are in a plain Python list (or dict), so model.parameters() finds none",
           "model.parameters() was consumed before (a generator can be iterated once)",
           "every parameter was filtered out (requires_grad=False everywhere, a wrong name filter)"],
          "keep layers in nn.ModuleList / nn.ModuleDict; check sum(p.numel() for p in model.parameters()) > 0 "
          "before building the optimizer; pass list(model.parameters()) when you use it twice",
          2, "4. Layers in a plain Python list, a tensor that should be a buffer",
          [r"optimizer got an empty parameter list", r"got an empty parameter list"],
          ["optimizer got an empty parameter list"]),
    _rule("module-before-init", "a layer assigned before nn.Module.__init__() ran",
          ["super().__init__() is missing from the model's __init__, or comes after the first self.layer = ...",
           "a subclass overrides __init__ without calling the parent's"],
          "call super().__init__() as the first line of __init__",
          2, "4. Layers in a plain Python list, a tensor that should be a buffer",
          [r"cannot assign (module|parameters?|buffer) before Module\.__init__\(\) call",
           r"object has no attribute '_(parameters|modules|buffers)'"],
          ["cannot assign module before Module.__init__() call"]),
    _rule("layer-input-shape", "a layer got an input of the wrong shape (channels, dimensions or size)",
          ["images in (N, H, W, C) order, or a single image without its batch dimension, fed to a conv layer that "
           "wants (N, C, H, W)",
           "the first layer's in_channels / in_features differ from the data (RGB vs grayscale, a changed crop)",
           "a reshape or flatten that mixes the batch dimension into the features (view(-1, k) with the wrong k)",
           "an input smaller than the kernel after the pooling layers"],
          "write the expected shape at the top of forward and print x.shape before the failing layer; "
          "permute(0, 3, 1, 2) for channels-last images, unsqueeze(0) for one sample, x.flatten(1) to flatten",
          2, "The shapes a layer expects",
          [r"expected input\[[^\]]*\] to have \d+ channels, but got \d+ channels",
           r"Expected \d+D \(unbatched\) or \d+D \(batched\) input to \w+",
           r"Expected \d+-dimensional input for \d+-dimensional weight",
           r"expected \d+D or \d+D input \(got \d+D input\)",
           r"Expected input batch_size \(\d+\) to match target batch_size \(\d+\)",
           r"Kernel size can't be greater than actual input size", r"Output size is too small",
           r"Expected hidden(\[\d\])? size \(", r"doesn't match hidden\[?\d?\]? batch size",
           r"input\.size\(-1\) must be equal to input_size", r"0D or 1D target tensor expected, multi-target not supported"],
          ["Given groups=1, weight of size [64, 3, 7, 7], expected input[1, 1, 224, 224] to have 3 channels, but got 1 "
           "channels instead", "Expected 3D (unbatched) or 4D (batched) input to conv2d",
           "Expected input batch_size (32) to match target batch_size (64)"]),
    _rule("dataloader-worker", "a DataLoader worker died or could not load the dataset",
          ["the Dataset class is defined in a notebook/__main__ and workers are started with spawn (macOS, Windows)",
           "something the workers need is a local function or lambda, which spawn cannot pickle",
           "a crash inside __getitem__ in a worker: rerun with num_workers=0 to see it",
           "workers killed for lack of memory (signal: Killed) or shared memory (Docker: raise --shm-size)"],
          "move the Dataset to an importable module; guard scripts with if __name__ == '__main__':",
          2, "1. `num_workers`: let other processes prepare the next batches",
          [r"DataLoader worker (\(pid(\(s\))?[^)]*\) )?(exited unexpectedly|is killed by signal)",
           r"Can't get attribute '[^']*' on <module '__(mp_)?main__'",
           # Python's own words: the DataLoader's when the object or the traceback is about loading data
           r"Can't (get|pickle) local object '[^']*(worker_init|[Dd]ataset|[Ll]oader|collate|[Tt]ransform|[Ss]ampler)",
           r"(DataLoader|torch/utils/data/)[\s\S]{0,3000}?Can't (get|pickle) local object",
           # h5py's own words: an open HDF5 file in a Dataset, which spawn must pickle for each worker
           r"h5py objects cannot be pickled",
           r"unable to open shared memory object", r"unable to write to file </torch_",   # shm (/dev/shm) full
           # the signal handler of a DataLoader worker (torch/csrc/DataLoader.cpp: SIGBUS, SIGSEGV, SIGFPE)
           r"Unexpected (bus error|segmentation fault|floating-point exception) encountered in worker",
           r"start a new process before the current process has finished its bootstrapping phase",
           r"insufficient shared memory \(shm\)"],
          ["DataLoader worker (pid(s) 1234) exited unexpectedly", "DataLoader worker (pid 4024) is killed by signal",
           "Can't get attribute 'MyDataset' on <module '__main__' (built-in)>",
           "Can't pickle local object 'get_dataset.<locals>.Dataset'"]),
    _rule("collate-sizes", "the DataLoader could not stack the samples of a batch into one tensor",
          ["samples of different sizes (images not resized to one size, sequences of different lengths, a "
           "variable number of boxes per image)",
           "a sample that is not a tensor, array or number (a PIL image without ToTensor)"],
          "resize or crop every sample to one size in the Dataset, or pass a collate_fn that pads (pad_sequence) "
          "or keeps a list; index one sample (dataset[0]) and print its shape and type",
          2, "Samples of different sizes in one batch",
          [r"stack expects each tensor to be equal size", r"each element in list of batch should be of equal size",
           r"default_collate: batch must contain tensors"],
          ["stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and [3, 200, 200] at entry 1",
           "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists"]),
    _rule("forward-arguments", "the model was called with arguments its forward() does not take",
          ["the call passes an argument (a mask, labels, a keyword) that this model's forward() does not declare: "
           "another version of the model or library than the calling code expects",
           "forward() was written without `self`, or a layer in nn.Sequential given two inputs (Sequential passes one)"],
          "compare the call with forward's signature (inspect.signature(model.forward)); pass exactly what it "
          "declares, or change forward to take it",
          2, "5. A bloated `forward`",
          [r"forward\(\) got an unexpected keyword argument",
           r"forward\(\) takes (from )?\d+ (to \d+ )?positional arguments? but \d+ (were|was) given",
           r"forward\(\) missing \d+ required (positional|keyword-only) arguments?"],
          ["forward() got an unexpected keyword argument 'labels'", "forward() takes 2 positional arguments but 3 were given"]),
    _rule("scheduler-before-optimizer", "the learning-rate scheduler stepped before the optimizer",
          ["scheduler.step() is called at the start of the epoch or before optimizer.step() in the loop",
           "the optimizer skipped its step (GradScaler found inf gradients, or a condition skipped it), so the "
           "scheduler stepped alone"],
          "optimizer.step() first, then scheduler.step(): once per batch or once per epoch, as the scheduler is "
          "meant; with GradScaler the first steps may be skipped on purpose and the warning is harmless",
          2, "The rule behind the order",
          [r"Detected call of .?lr_scheduler\.step\(\).? before .?optimizer\.step\(\)",
           r"optimizer\.step\(\).? has been overridden after learning rate scheduler initialization"],
          ["Detected call of lr_scheduler.step() before optimizer.step()"]),
    _rule("inference-tensor-backward", "a tensor made under torch.inference_mode() was used in training",
          ["a tensor (a cached embedding, a preprocessed batch, a buffer) was created under inference_mode and then "
           "used in a computation that autograd records",
           "a model was run once under inference_mode (a warm-up, an evaluation) and the tensors it cached are "
           "reused for training"],
          "create tensors that training uses outside inference_mode (torch.no_grad() for evaluation that feeds "
          "training), or .clone() the inference tensor outside inference_mode",
          2, "8. Evaluation: `model.eval()` *and* `inference_mode`",
          # PyTorch's every message about an inference tensor (saved for backward, updated in place, its
          # version counter): a tensor made under inference_mode reached code that needs autograd's bookkeeping
          [r"\b[Ii]nference tensors?\b(?! ?RT)"],
          ["Inference tensors cannot be saved for backward"]),
    _rule("onnx-input-shape", "ONNX Runtime rejected the input shape",
          ["the model was exported with fixed sizes, so only the example's batch size (or image size) works"],
          "export_onnx(model, (x,), path, dynamic_batch=True), then verify_onnx at several batch sizes",
          6, "3. ONNX with a dynamic batch axis",
          [r"Got invalid dimensions for input", r"Invalid rank for input"],
          ["INVALID_ARGUMENT : Got invalid dimensions for input"]),
    _rule("onnx-unsupported-operator", "the ONNX exporter has no translation for an operator",
          ["the TorchScript-based exporter (dynamo=False) has no ONNX version of this operator at that opset",
           "the opset is too old for the operator (ONNX adds operators in later opsets)",
           "a custom autograd Function or C++ extension op with no ONNX translation"],
          "export with torch.onnx.export(..., dynamo=True) (the default since PyTorch 2.9) and a recent opset; "
          "otherwise register a translation (custom_translation_table) or rewrite that step with supported ops",
          6, "An operator the exporter cannot translate",
          [r"to ONNX opset version \d+ is not supported", r"Unsupported: ONNX export of operator",
           r"ONNX export failed on \w+, which is not implemented for opset", r"UnsupportedOperatorError",
           r"No Op registered for \w+ with domain_version", r"Could not find an implementation for \w+",
           r"No ONNX function found for"],
          ["Exporting the operator 'aten::fft_rfft' to ONNX opset version 17 is not supported"]),
    _rule("export-data-dependent", "torch.export cannot follow Python control flow that depends on tensor values",
          ["an `if` (or a shape) that depends on a tensor's values (e.g. x.sum() > 0) inside forward"],
          "move the branch to the caller, or write it with torch.cond",
          6, "4. Python control flow in `forward`",
          [r"Could not guard on data-dependent expression", r"GuardOnDataDependentSymNode",
           r"Dynamic control flow is not supported"],
          ["Could not guard on data-dependent expression", "GuardOnDataDependentSymNode"]),
    _rule("export-shape-constraints", "torch.export found that a dimension you marked dynamic is fixed by the code",
          ["forward branches on x.shape[0] or uses it as a Python number, so the traced batch size became a constant",
           "a Python loop over the batch (for row in x) unrolled for the example's size",
           "the example input's size is 0 or 1 on that axis, which export specialises"],
          "remove the use of the size as a Python value (x.view(-1, k), not x.view(bsz, k)); follow the "
          "'Suggested fixes' (a Dim with min/max); give an example with a size of 2 or more on that axis",
          6, "4. Python control flow in `forward`",
          [r"Constraints violated \(\w+\)", r"specialized it to be a constant",
           r"ConstraintViolationError"],
          ["Constraints violated (batch)!", "specialized it to be a constant (3)"]),
    _rule("recompile-limit", "torch.compile recompiled too often and gave up (recompile limit)",
          ["every new input shape (batch size, sequence length) compiles again with static shapes",
           "a Python value that changes every call (a step counter, a float) is baked into the graph"],
          "compile with dynamic=True or mark the varying dimension with torch._dynamo.mark_dynamic(x, 0); "
          "TORCH_LOGS=recompiles says why",
          6, "2. `torch.compile`, measured like for like",
          [r"hit config\.(cache_size_limit|recompile_limit)", r"(cache_size_limit|recompile_limit) reached",
           r"hit recompilation cache limit",
           r"FailOnRecompileLimitHit"],
          ["torch._dynamo hit config.recompile_limit (8)", "cache_size_limit reached"],
          reproduced=False),                 # chapter 6 shows each recompilation, not the limit
    _rule("compile-no-compiler", "torch.compile could not build its kernels",
          ["no working C/C++ compiler (or Python headers) for the CPU backend",
           "Triton missing or unusable for the GPU backend"],
          "install a compiler (build-essential, python3-dev), check with python -m course_utils doctor; "
          "try_compile falls back to eager and says why",
          6, "2. `torch.compile`, measured like for like",
          [r"InvalidCxxCompiler", r"No working C\+\+ compiler", r"CppCompileError", r"C\+\+ compile error",
           r"Failed to find C compiler", r"Cannot find a working triton installation"],
          ["InvalidCxxCompiler: No working C++ compiler found", "CppCompileError: C++ compile error",
           "RuntimeError: Failed to find C compiler"],
          reproduced=False),                 # chapter 6 falls back (try_compile) where no compiler works
    _rule("compile-graph-break", "torch.compile hit code it cannot trace (a graph break)",
          ["a Python builtin, print, a C extension or .item() in forward that Dynamo cannot put in the graph",
           "with fullgraph=True any graph break is an error; without it the model runs in pieces, slower"],
          "remove the offending call from forward (or wrap it as a custom op / allow_in_graph); "
          "TORCH_LOGS=graph_breaks lists every break",
          6, "2. `torch.compile`, measured like for like",
          [r"torch\._dynamo\.exc\.Unsupported", r"\bgraph[- ]breaks?\b", r"\[__graph_breaks\]",
           r"Failed to trace builtin operator"],
          ["torch._dynamo.exc.Unsupported", "Graph break due to unsupported builtin"]),
    _rule("nan-loss", "NaN in the loss or the gradients",
          ["NaN or Inf in the data (missing values, division by zero in normalisation)",
           "an unstable operation in the model, e.g. log(softmax(x)) instead of log_softmax",
           "numerics: learning rate too high, exploding gradients, float16 overflow, a bad initialisation"],
          "find_nonfinite(batch) for the data, locate_nonfinite(model, x) for the layer, then lower the learning "
          "rate or clip_grad_norm_; torch.autograd.detect_anomaly() names the backward op",
          3, "4. Data",
          [r"returned nan values", r"\b(\w+_)?loss\b[\w `]{0,40}?(\bis\b|\bbecame\b|=|:)\s*['\"]?nan\b",
           r"\b(\w+_)?loss +nan\b",      # a logger's "g_loss nan" (its "mask_loss:  nan": the pattern before)
           r"\[loss\]\s*nan\b",
           r"\b(nan|non-finite) loss\b", r"Minimum loss scale reached", r"overflow detected, setting loss scale",
           r"outputs? (is|are) nan\b", r"\bloss became infinite or nan\b",
           r"probability tensor contains either .?inf.?, .?nan.? or element < 0", r"invalid multinomial distribution"],
          ["Function 'LogSoftmaxBackward0' returned nan values", "loss=nan", "Loss is nan, stopping training",
           "FloatingPointError: Minimum loss scale reached"]),
    _rule("inplace-modified", "autograd needed a tensor that an in-place operation changed",
          ["a trailing-underscore op (relu_, mul_, add_, ...), inplace=True or x[...] = ... overwrote a value "
           "saved for backward"],
          "use the out-of-place version (x = x.relu()) for tensors autograd saved; "
          "torch.autograd.set_detect_anomaly(True) shows the forward line",
          1, "5. Pitfall: forgetting `grad.zero_()`, and other update mistakes",
          [r"modified by an inplace operation"],
          ["one of the variables needed for gradient computation has been modified by an inplace operation"]),
    _rule("view-inplace", "an in-place change to a view that autograd cannot follow",
          ["an in-place op on one output of split / unbind / chunk (functions that return several views)",
           "an in-place op on a view created under no_grad or inside a custom Function, then used with grad"],
          "use the out-of-place form (torch.cat, torch.stack, x * m) or .clone() the view before changing it",
          1, "5. Pitfall: forgetting `grad.zero_()`, and other update mistakes",
          [r"is a view and is being modified inplace", r"is a view and its base or another view of its base has "
           r"been modified inplace"],
          ["Output 0 of Split is a view and is being modified inplace"]),
    _rule("numpy-needs-detach", ".numpy() on a tensor that requires grad, or that lives on the GPU",
          ["the tensor is part of autograd's graph (a prediction, a parameter): NumPy cannot follow gradients",
           "the tensor is on a GPU: NumPy reads only CPU memory"],
          "t.detach().cpu().numpy() (or loss.item() for one number) for logging and plotting",
          1, "2. What `backward()` fills in",
          [r"Can't call numpy\(\) on (Tensor|Variable) that requires grad",
           r"can't convert (cuda|CUDA|mps|xpu)[:\d]* ?(device type )?tensor to numpy"],
          ["Can't call numpy() on Tensor that requires grad", "can't convert cuda:0 device type tensor to numpy"]),
    _rule("leaf-inplace", "in-place update of a parameter outside torch.no_grad()",
          ["a manual update w -= lr * w.grad (or w[...] = ..., w[0].zero_(), a view of the leaf) while autograd "
           "is recording"],
          "wrap the update in `with torch.no_grad():`",
          1, "5. Pitfall: forgetting `grad.zero_()`, and other update mistakes",
          [r"leaf Variable that requires grad (is being|has been) used in an in-place operation"],
          ["a leaf Variable that requires grad is being used in an in-place operation"]),
    _rule("non-leaf-grad", "reading .grad of a tensor autograd does not fill (not a leaf)",
          ["the parameter was converted (.to, .float(), * scale) after requires_grad=True, so you hold a copy",
           "you read an intermediate result's .grad"],
          "create the tensor on its device and dtype first, then requires_grad_(); call .retain_grad() for an "
          "intermediate you want to inspect",
          1, "3. Pitfall: converting a tensor after `requires_grad=True`",
          [r"\.grad attribute of a Tensor that is not a leaf Tensor is being accessed"],
          ["The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"]),
    _rule("no-grad-fn", "backward() on a tensor that autograd did not record",
          ["the loss was computed under torch.no_grad() / inference_mode",
           "no input of the computation has requires_grad=True (parameters frozen or detached)",
           "the loss was built from .item() / .detach() values"],
          "compute the loss with grad enabled from tensors that require grad",
          1, "2. What `backward()` fills in",
          [r"does not require grad and does not have a grad_fn"],
          ["element 0 of tensors does not require grad and does not have a grad_fn"]),
    _rule("backward-twice", "backward() through a graph whose saved values were already freed",
          ["a tensor computed once, before the loop (a preprocessing layer, a cached embedding), is part of "
           "every step's graph",
           "a hidden state carried from one batch to the next without .detach() (RNNs)",
           "two losses from one forward, each with its own backward()"],
          "compute the forward inside the loop (or .detach() what you carry over); add the losses and call "
          "backward() once; retain_graph=True only when you really backpropagate the same graph twice",
          1, "6. The dynamic graph: ordinary Python decides the computation",
          [r"Trying to backward through the graph a second time"],
          ["Trying to backward through the graph a second time"]),
    _rule("non-scalar-backward", "backward() on a tensor with more than one element",
          ["a per-sample loss (reduction='none') that was never reduced with .mean() or .sum()",
           "DataParallel gathered one loss per GPU into a vector",
           "you want a vector-Jacobian product and gave no gradient= vector"],
          "reduce the loss to one number (loss.mean()), or pass backward(gradient=v) / "
          "torch.autograd.grad(out, inputs, grad_outputs=v)",
          1, "2. What `backward()` fills in",
          [r"grad can be implicitly created only for scalar outputs"],
          ["grad can be implicitly created only for scalar outputs"]),
    _rule("tensor-bool-ambiguous", "a tensor of several values used where Python needs one value (a bool, a number)",
          ["`if x > 0:`, `while loss > eps`, `a == b` inside an `if`, or `and`/`or` between tensors with more than "
           "one element: Python asks the tensor for one bool",
           "a comparison meant for one sample applied to a whole batch (pred == label in an `if`)"],
          "reduce it to one value on purpose: (x > 0).all(), .any(), or compare with .item() for a one-element "
          "tensor; use torch.where(cond, a, b) for element-wise choices",
          1, "6. The dynamic graph: ordinary Python decides the computation",
          [r"(Boolean|bool) value of Tensor with more than (one|1) value is ambiguous",
           r"only one element tensors can be converted to Python scalars",
           r"a Tensor with \d+ elements cannot be converted to Scalar"],
          ["Boolean value of Tensor with more than one value is ambiguous"]),
    _rule("shape-mismatch", "shape mismatch in a matrix multiply or a broadcast",
          ["an input with the wrong number of features for the first Linear layer",
           "a missing flatten/reshape, or a transpose on one branch of forward only",
           "a broadcast that pairs the wrong dimensions"],
          "print shapes before the failing line and write expected shapes in comments at the top of forward",
          1, "6. The dynamic graph: ordinary Python decides the computation",
          [r"mat1 and mat2 shapes cannot be multiplied", r"size mismatch, m1: \[",
           r"The size of tensor a \(\d+\) must match the size of tensor b"],
          ["mat1 and mat2 shapes cannot be multiplied (64x2048 and 512x10)", "size mismatch, m1: [64 x 2048]",
           "The size of tensor a (8) must match the size of tensor b (5)"]),
]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_LINE_PREFIX = re.compile(r"^\s*(\[(rank|default)\d+\]:)+", flags=re.MULTILINE)
# a logger's timestamp and level before each line ("2024-05-01 12:34:56,789 - ERROR - ", "[2024-05-01 12:34:56] ");
# each run of blanks is followed by a separator or nothing, so a long run is not tried in every split
_SEPARATOR = r"[ \t]*(?:[-|:][ \t]*)?"
_LOG_PREFIX = re.compile(r"^[ \t]*\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]?" + _SEPARATOR +
                         r"(?:\[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]?" + _SEPARATOR + ")?", flags=re.MULTILINE)


_LAUNCHER_REPORT = re.compile("|".join(_LAUNCHER_REPORTS), flags=re.IGNORECASE)   # as the rules match


# how a paste gets reformatted on its way: a forum's typographer (Discourse, Slack, Word) curls quotes and makes
# "--" a dash outside code blocks; a web page escapes HTML ("&#39;", "&lt;module&gt;"); a JSON log or an
# exception's repr writes its newlines as "\n"
_TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                             "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"'})
_HTML_ENTITY = re.compile(r"&(?:#\d+|#[xX][0-9a-fA-F]+|[A-Za-z]+\d*);")    # with its ";": "&copy=3" in a URL stays
_DASHED_OPTION = re.compile(r"(?<![\w-])[\u2013\u2014](?=[a-z])")       # "–local_rank", "—nproc_per_node"
# an escaped newline where a line would start (a blank, a capital, "[", another one): not a Windows path's "\new",
# nor the "\n" inside a quoted value ("could not convert string to float: '1.5\n'")
_ESCAPED_NEWLINE = re.compile(r"(?<!\\)(?:\\r)?\\n(?=[ \tA-Z\[]|\\[nr]|$)")
_ESCAPE = re.compile(r'\\([\\nrt"])')
_UNESCAPED = {"\\": "\\", "n": "\n", "r": "", "t": "\t", '"': '"'}
_DEBUGGER_LABEL = re.compile(r"\bException has occurred: ([\w.]+)[^\n]*\n")   # VS Code's: the class, the message
_MARKDOWN = re.compile(r"^[ \t]*(?:>+(?:[ \t]|$))+|^[ \t]*(?:```|~~~)[\w+-]*[ \t]*$",      # quote marks, fences
                       flags=re.MULTILINE)


def normalise(text: str) -> str:
    """The message as the rules see it: without ANSI colour codes, `[rank0]:` / `[default2]:` and loggers'
    timestamp line prefixes, Markdown's quote marks and code fences, HTML escapes, typographic quotes and
    dashes, full-width punctuation (NFKC), escaped newlines, a debugger's "Exception has occurred: X" label
    (as "X: ") and line wrapping (all whitespace runs become one space)."""
    text = _HTML_ENTITY.sub(lambda entity: html.unescape(entity.group()), _ANSI.sub("", text))
    text = _DASHED_OPTION.sub("--", unicodedata.normalize("NFKC", text.translate(_TYPOGRAPHY)))
    if "\n" not in text and _ESCAPED_NEWLINE.search(text):    # one line, its newlines escaped: unescape it all
        text = _ESCAPE.sub(lambda escape: _UNESCAPED[escape.group(1)], text)
    text = _DEBUGGER_LABEL.sub(r"\1: ", _LINE_PREFIX.sub("", _LOG_PREFIX.sub("", _MARKDOWN.sub("", text))))
    return re.sub(r"\s+", " ", text).strip()


# PyTorch's ROCm build is its CUDA source hipified ("HIP error: ...", kernels in ATen/native/hip/*.hip), and 1.x
# framed the CUDA runtime's errors as "cuda runtime error (N) : ...": rules and templates read both in today's
# CUDA wording
_OTHER_CUDA_WORDINGS = [(re.compile(r"\bcuda runtime error \(\d+\) ?: ?"), "CUDA error: "),
                        (re.compile(r"\bHIP error: "), "CUDA error: "),
                        (re.compile(r"\bHIP (kernel errors|out of memory)\b"), r"CUDA \1"),
                        (re.compile(r"/hip/(\w+)\.hip\b"), r"/cuda/\1.cu")]


def _in_cuda_words(text: str) -> str:
    """The message with ROCm's and 1.x's CUDA wordings written as today's CUDA ones."""
    for pattern, replacement in _OTHER_CUDA_WORDINGS:
        text = pattern.sub(replacement, text)
    return text


def _message(error: BaseException | str) -> str:
    """The text the rules read: a pasted message as it is; an exception as its traceback's frame lines (without
    their code, whose words are the user's) and its last line, as a paste of it would read."""
    if isinstance(error, BaseException):
        frame_lines = "".join(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n'
                              for frame in traceback.extract_tb(error.__traceback__))
        return f"{frame_lines}{type(error).__name__}: {error}"
    if isinstance(error, str):
        return error
    raise TypeError(f"explain takes an exception or a message, got {type(error).__name__}")


def explain(error: BaseException | str) -> Explanation | None:
    """The `Explanation` of an exception (or a pasted message): a curated rule's when one matches, else a
    placement by where in PyTorch it was raised (`course_utils.error_origin`); None for a message that is
    not PyTorch's, or comes from a part of PyTorch no chapter teaches."""
    text = _in_cuda_words(normalise(_message(error)))
    if foreign_cpp(text) or another_frameworks(text) or foreign_cuda(text) or plain_pickle(text):
        return None
    for rule in RULES:
        if rule.matches(text):
            if _LAUNCHER_REPORT.search(text):       # torchrun's / mp.spawn's report that a worker failed:
                rest = _LAUNCHER_REPORT.sub(" ", text)  # the worker's own error, when pasted too, says why
                rule = next((other for other in RULES if other.matches(rest)), rule)
            return rule.explanation
    if file_system_or_pip(text):
        return None
    if isinstance(error, BaseException) and error.__traceback__ is not None:   # its frames say where, too
        text = _in_cuda_words(normalise("".join(traceback.format_exception(error))))
    found = origin(text)
    area = found.area if found else None
    placed_by_words = False             # placed by the topic or vocabulary layers, from the error's words
    raised_outside = _raised_outside_pytorch(text)
    where = found.describe() if found else ""
    # PyTorch's, but not placed: a library string whose file the layout could not tell
    unplaced = found is not None and found.found_by == "library" and area is None
    untaught = found is not None and found.found_by != "library" and area is None
    if (found is None and looks_like_pytorch(text)) or unplaced or untaught or \
            (area is not None and not area.confident and found.found_by != "spawn"):
        topic = topic_of(text)
        if topic is not None and topic.chapter is not None and (area is None or area.chapter is not None):
            where = (f"{where}; its words are about {topic.what}" if where else
                     f"no PyTorch message matches; its words are about {topic.what}")
            area = topic
            placed_by_words = True
    if area is None and (unplaced or found is None and looks_like_pytorch(text)) and not raised_outside:
        by_words = vocabulary_area(text)
        if by_words is not None:
            area, posterior = by_words
            where = (f"no PyTorch message matches; its words are those PyTorch's own messages use in "
                     f"{area.what} (probability {posterior:.2f})")
            placed_by_words = True
    # The learned placement reads the words of a message nothing placed (but not of one from a part of PyTorch no
    # chapter teaches), and may silence a placement by words alone when nothing shows the message is PyTorch's; it
    # reads no traceback whose innermost frame is the user's or another library's, as the vocabulary layer does not
    if (area is None and not untaught or found is None and placed_by_words) and not raised_outside:
        learned = learned_chapter(text)
        if learned is not None:
            chapter, probability = learned
            if chapter is None and probability >= LEARNED_NOT_PYTORCH and found is None:
                return None                          # worded like the errors that are not PyTorch's
            if area is None and chapter is not None and probability >= LEARNED_THRESHOLD:
                return _worded_like(chapter, probability, where)
    if area is None or area.chapter is None:
        return None
    return Explanation(f"area-{area.id}", f"an error from {area.what}", (), "", area.chapter, area.section,
                       reproduced=False, confidence="placed" if area.confident else "low", origin=where,
                       docs=area.docs)


def _worded_like(chapter: int, probability: float, where: str) -> Explanation:
    """A low-confidence placement by the message's words (course_utils.learned_placement); `where` is what else is
    known of it (a library string of PyTorch's whose file is unknown), if anything."""
    words = (f"among the course's labelled real messages, those worded like it are chapter {chapter}'s "
             f"(probability {probability:.2f})")
    return Explanation(f"chapter-{chapter}", f"an error worded like those chapter {chapter} teaches", (), "", chapter,
                       CHAPTER_TITLES[chapter], reproduced=False, confidence="low",
                       origin=f"{where}; {words}" if where else
                              f"not known: no rule, PyTorch message or traceback frame places it; {words}",
                       docs=f"https://docs.pytorch.org/docs/stable/{CHAPTER_DOCS[chapter]}")


def _raised_outside_pytorch(text: str) -> bool:
    """The traceback's innermost frame is the user's code or another library's, not PyTorch's."""
    seen = frames(text)
    return bool(seen) and seen[-1][0] is None


def explanation_by_id(id: str) -> Explanation:
    """The explanation with this stable id (e.g. 'device-mismatch'); KeyError naming the known ids."""
    for rule in RULES:
        if rule.explanation.id == id:
            return rule.explanation
    raise KeyError(f"no explanation with id {id!r}; known: {', '.join(r.explanation.id for r in RULES)}")


def troubleshooting_table() -> str:
    """README's troubleshooting index, rendered from RULES (a test checks README contains exactly this)."""
    rows = ["| You see (part of the message) | `explain()` id | What it is | Chapter, section |",
            "|---|---|---|---|"]
    for rule in RULES:
        e = rule.explanation
        seen = ", ".join(f"`{example}`" for example in rule.examples)
        rows.append(f"| {seen} | `{e.id}` | {e.title} | {e.chapter}, “{e.section}” |")
    return "\n".join(rows) + "\n"


def _show_explanation(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler: the normal traceback, then the explanation if there is one,
    as text and as HTML whose link opens the notebook section in JupyterLab."""
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    explanation = explain(value)
    if explanation is not None:
        from IPython.display import display
        display({"text/plain": f"\n{explanation}", "text/html": explanation._repr_html_()}, raw=True)


def load_ipython_extension(ipython) -> None:
    """`%load_ext course_utils`: explain recognised errors under their tracebacks (and, in a GPU
    test run, record that the kernel used CUDA: see `course_utils.cuda_evidence`)."""
    from course_utils import cuda_evidence
    ipython.set_custom_exc((Exception,), _show_explanation)
    cuda_evidence.register(ipython)


def unload_ipython_extension(ipython) -> None:
    ipython.set_custom_exc((), None)
