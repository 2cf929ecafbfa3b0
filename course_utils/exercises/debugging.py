"""Chapter 3 exercises (debugging): the checks, their reference solutions and their private helpers.

Course scaffolding, not a tool a practitioner keeps: the topic modules (`memory`, `numerics`,
`devices`) hold those. Each check runs the learner's function on cases the chapter did not show
(other batch counts, other clip lengths, other sizes, another device) and returns a `Verdict`: what it
observed on the first failed attempt, one more hint on each later one; a function that raises gets a
failed verdict, never a crash.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from course_utils._display import format_bytes
from course_utils.devices import to_device, torch_threads
from course_utils.exercises import Verdict, reference_solution, report_check
from course_utils.memory import measure_peak_memory, saved_activation_bytes

__all__ = ["check_clip_loudness", "check_mean_kept_output", "check_rms_normalise", "check_validation_losses"]


def _raised(error: BaseException, where: str = "", limit: int = 200) -> str:
    """The first line of an exception, in the learner's terms."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{where + ' ' if where else ''}your function raised {type(error).__name__}: {first[:limit]}"


# --- exercise 1: a validation loop that keeps every batch's graph ------------------------------

@reference_solution("validation_losses", chapter=3)
def _validation_losses(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], float]:
    losses = []
    with torch.no_grad():
        for inputs, targets in batches:
            losses.append(nn.functional.mse_loss(model(inputs), targets).item())
    return losses, sum(losses) / len(losses)


def _validation_problem(n_batches: int, batch_size: int = 64, seed: int = 3
                        ) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A seeded 32 -> 256 -> 256 -> 1 MLP and `n_batches` batches of `batch_size` samples
    (the last one holds 5 samples fewer when `batch_size` > 5, as a real last batch often does)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    sizes = [batch_size] * n_batches
    if seed != 3 and batch_size > 5:
        sizes[-1] -= 5
    batches = [(torch.randn(n, 32, generator=generator), torch.randn(n, 1, generator=generator)) for n in sizes]
    return model, batches


def check_validation_losses(fn: Callable) -> Verdict:
    """Exercise: `fn(model, batches)` returns (the loss of each batch as a float, their mean as a float)
    without keeping anything alive between batches (its peak memory, measured on CPU, must not grow
    with the number of batches) and without recording anything for a backward pass that never comes
    (autograd must save no tensor). Values are checked for 2, 6 and 3 batches (the last run with
    batches of another size). Reports the first problem it observes, in that order."""
    name = "validation_losses"
    hints = ["a loss tensor remembers how it was computed: everything autograd saved for its backward "
             "stays alive as long as the tensor does",
             "keep Python numbers, not tensors",
             "a validation pass never calls backward(): autograd need not record anything while it runs"]
    problems = {2: _validation_problem(2), 6: _validation_problem(6), 3: _validation_problem(3, 40, seed=11)}
    try:
        peaks, returned = {}, {}
        for n in (2, 6):
            with torch_threads(1):      # small ops: a second thread only costs time on a busy machine
                report = measure_peak_memory(fn, *_validation_problem(n), device="cpu")
            peaks[n], returned[n] = report.peak_bytes, report.result
        if returned[6] is None:
            return report_check(name, False, None, hints)
        returned[3] = fn(*_validation_problem(3, 40, seed=11))
        model, batches = _validation_problem(2)
        saved, _ = saved_activation_bytes(fn, model, batches, exclude=list(model.parameters()))
    except Exception as error:  # the learner's code: report it, never crash
        return report_check(name, False, _raised(error), hints)
    growth = (peaks[6] - peaks[2]) / 4
    if growth > 1024:
        observed = (f"memory grows by {format_bytes(growth)} per batch (peak {format_bytes(peaks[2])} for 2 "
                    f"batches, {format_bytes(peaks[6])} for 6): something keeps each batch alive")
        return report_check(name, False, observed, hints)
    if saved:
        observed = (f"memory no longer grows, but during 2 batches autograd saved {format_bytes(saved)} of "
                    "tensors for a backward pass that never comes")
        return report_check(name, False, observed, hints)
    for n in (6, 2, 3):
        result = returned[n]
        losses, mean = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
        if not (isinstance(losses, list) and all(type(x) is float for x in losses)) or type(mean) is not float:
            kinds = sorted({type(x).__name__ for x in losses}) if isinstance(losses, list) else [type(losses).__name__]
            observed = (f"it returned losses of type {', '.join(kinds)} and a mean of type {type(mean).__name__}; "
                        "expected Python floats")
            return report_check(name, False, observed, hints)
        expected_losses, expected_mean = _validation_losses(*problems[n])
        if len(losses) != n or max(abs(a - b) for a, b in zip(losses, expected_losses)) > 1e-5:
            observed = (f"for {n} batches it returned {len(losses)} losses {[round(x, 4) for x in losses]}, "
                        f"not the {n} batches' MSE losses {[round(x, 4) for x in expected_losses]}")
            return report_check(name, False, observed, hints)
        if abs(mean - expected_mean) > 1e-5:
            observed = f"for {n} batches the mean is {mean:.4f}, but the batch losses average {expected_mean:.4f}"
            return report_check(name, False, observed, hints)
    return report_check(name, True, None, hints)


# --- exercise 2: per-frame loudness of audio clips, NaN and -inf -------------------------------

FRAME = 16                 # samples per frame
FLOOR = 1e-10              # the energy floor: -100 dB


@reference_solution("clip_loudness", chapter=3)
def _clip_loudness(clips: torch.Tensor) -> torch.utils.data.Dataset:
    class ClipLoudness(torch.utils.data.Dataset):
        def __init__(self, clips):
            self.clips = clips

        def __len__(self):
            return len(self.clips)

        def __getitem__(self, index):
            clip = self.clips[index]
            peak = clip.abs().max()
            clip = clip / peak if peak > 0 else clip                      # a silent clip stays all zeros
            energy = clip.unfold(0, FRAME, FRAME).pow(2).mean(dim=-1)      # (T // 16,)
            return 10 * torch.log10(energy.clamp(min=FLOOR))
    return ClipLoudness(clips)


def _clips(shape: tuple[int, int], seed: int, silent_clip: int, silent_frames: list[tuple[int, int]]) -> torch.Tensor:
    """Seeded noise clips of rising loudness, one of them all zeros, some frames (clip, frame) zeroed."""
    n, length = shape
    clips = torch.randn(n, length, generator=torch.Generator().manual_seed(seed)) * torch.linspace(0.2, 3, n)[:, None]
    clips[silent_clip] = 0.0
    for clip, frame in silent_frames:
        clips[clip, frame * FRAME:(frame + 1) * FRAME] = 0.0
    return clips


def _loudness_inputs() -> list[torch.Tensor]:
    """(12, 160) clips (10 frames) and (7, 256) clips (16 frames), silent clips and frames in other places."""
    return [_clips((12, 160), 5, silent_clip=3, silent_frames=[(7, 2), (7, 3), (7, 4), (10, 0)]),
            _clips((7, 256), 8, silent_clip=0, silent_frames=[(5, 15), (2, 7)])]


def _rounded(values: torch.Tensor, limit: int = 10) -> list[float]:
    return [round(v, 1) for v in values.flatten()[:limit].tolist()]


def check_clip_loudness(fn: Callable) -> Verdict:
    """Exercise: `fn(clips)` for clips (N, T) (T a multiple of 16) returns a Dataset whose sample i is the
    loudness of clip i per frame of 16 samples, in dB, after scaling the clip to a peak of 1:
    10 * log10(mean(frame**2)), with the energy floored at 1e-10 (-100 dB); a silent clip stays all zeros
    (so all its frames are at -100 dB). Checked on (12, 160) and (7, 256) clips."""
    name = "clip_loudness"
    hints = ["print the samples of the clips that hold silence: which value appears first, NaN or -inf, and "
             "from which operation?",
             "two divisions by nothing: a clip with no signal at all, and a frame with no energy",
             "-100 dB is the floor a silent frame should read; a clip of zeros scaled by anything is still zeros"]
    for clips in _loudness_inputs():
        shape = tuple(clips.shape)
        try:
            dataset = fn(clips.clone())
            if dataset is None:
                return report_check(name, False, None, hints)
            samples = torch.stack([torch.as_tensor(dataset[i]) for i in range(len(dataset))]).float()
        except Exception as error:
            return report_check(name, False, _raised(error, f"for clips of shape {shape}"), hints)
        expected = torch.stack([_clip_loudness(clips)[i] for i in range(len(clips))])
        if samples.shape != expected.shape:
            return report_check(name, False, f"for clips of shape {shape} the samples stack to shape "
                                             f"{tuple(samples.shape)}, expected {tuple(expected.shape)}", hints)
        bad_rows = (~torch.isfinite(samples)).any(dim=1).nonzero().flatten().tolist()
        if bad_rows:
            examples = "; ".join(f"sample {i} is {_rounded(samples[i])}" for i in bad_rows[:2])
            observed = (f"for clips of shape {shape}, {len(bad_rows)} of {len(samples)} samples hold NaN or "
                        f"-inf: {examples}")
            return report_check(name, False, observed, hints)
        wrong_rows = ((samples - expected).abs() > 0.01).any(dim=1).nonzero().flatten().tolist()
        if wrong_rows:
            i = wrong_rows[0]
            observed = (f"for clips of shape {shape} every sample is finite, but {len(wrong_rows)} of {len(samples)} "
                        f"are not the loudness in dB: sample {i} is {_rounded(samples[i])}, expected "
                        f"{_rounded(expected[i])}")
            return report_check(name, False, observed, hints)
    return report_check(name, True, None, hints)


# --- exercise 3: RMS normalisation in float16 --------------------------------------------------

@reference_solution("rms_normalise", chapter=3)
def _rms_normalise(x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 / torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + 1e-6)).to(x.dtype)


def _rms_inputs() -> dict[str, torch.Tensor]:
    """float16 activations of four sizes and two shapes: small, a few hundred (squares past 65504),
    a few thousand in another shape, and tiny (squares below float16's smallest positive number)."""
    generator = torch.Generator().manual_seed(6)
    return {"small": torch.randn(8, 64, generator=generator).half(),
            "a few hundred": (300 * torch.randn(8, 64, generator=generator)).half(),
            "a few thousand": (3000 * torch.randn(5, 96, generator=generator)).half(),
            "tiny": (0.01 * torch.randn(8, 64, generator=generator)).half()}


def check_rms_normalise(fn: Callable) -> Verdict:
    """Exercise: `fn(x)` for float16 activations x (N, D) returns x / sqrt(mean(x**2 over D) + 1e-6)
    in float16, finite and accurate for activations of every size: small, a few hundred and a few
    thousand (whose squares pass float16's largest value, 65504), and tiny (whose squares fall below
    float16's smallest), in two shapes."""
    name = "rms_normalise"
    hints = ["look at the largest intermediate value, and at the largest number float16 can hold",
             "the same formula in a dtype whose range holds the squares, cast back at the end",
             "a fixed rescaling moves the problem: very small activations then square to 0"]
    results = {}
    for label, x in _rms_inputs().items():
        try:
            out = fn(x.clone())
        except Exception as error:
            return report_check(name, False, _raised(error, f"for the {label} activations"), hints)
        if out is None:
            return report_check(name, False, None, hints)
        results[label] = out
    problems = []
    for label, x in _rms_inputs().items():
        out, expected = results[label], _rms_normalise(x)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != torch.float16:
            what = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
            problems.append(f"for the {label} activations it returned {what}, expected {tuple(x.shape)} torch.float16")
        elif not torch.isfinite(out).all():
            problems.append(f"for activations up to {x.abs().max():.3g} the output holds "
                            f"{int((~torch.isfinite(out)).sum())} non-finite values of {out.numel()} "
                            f"(and {int((out == 0).sum())} zeros)")
        elif not torch.allclose(out.float(), expected.float(), rtol=1e-2, atol=1e-2):
            error = (out.float() - expected.float()).abs().max().item()
            problems.append(f"for activations up to {x.abs().max():.3g} the output is off by up to {error:.3f} "
                            f"({int((out == 0).sum())} of {out.numel()} outputs are exactly 0)")
    return report_check(name, not problems, "; ".join(problems) or None, hints)


# --- exercise 4: a batch and a tensor left behind on the CPU ------------------------------------

@reference_solution("mean_kept_output", chapter=3)
def _mean_kept_output(model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    model.to(device)
    batch = to_device(batch, device)
    outputs = model(batch["x"]).squeeze(1)
    weights = torch.zeros(len(outputs), device=device)
    weights[batch["keep"]] = 1.0
    return (outputs * weights).sum() / weights.sum()


def _kept_output_problem(rows: int = 6, features: int = 3, seed: int = 7) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A seeded features -> 8 -> 1 MLP on the CPU and a batch of `rows` rows, about two thirds kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, 1))
        keep = torch.tensor([True, False, True, True, False, True]) if rows == 6 else torch.rand(rows) < 0.6
        keep[0] = True
        batch = {"x": torch.randn(rows, features), "keep": keep}
    return model, batch


class _Elsewhere(torch.Tensor):
    """A CPU tensor that reports the `meta` device: real values, another device as far as code can tell."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> "_Elsewhere":
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype,
                                                   storage_offset=data.storage_offset(), device="meta",
                                                   requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor) -> None:
        self.values = data

    def __repr__(self) -> str:
        return f"{self.values!r} (on the stand-in device)"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run_elsewhere(func, args, kwargs or {})


# Like CUDA, these accept CPU index tensors for a tensor on the other device.
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
             torch.ops.aten._index_put_impl_.default}


def _run_elsewhere(func, args: tuple, kwargs: dict) -> Any:
    """Run `func` on the CPU values; refuse, as CUDA would, to combine a stand-in tensor with a CPU tensor
    that is not a 0-dim scalar; label the results as on the stand-in device when an input was, or when
    `device=meta` was asked for."""
    elsewhere = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, _Elsewhere)]
    asked = kwargs.get("device")
    moving_there = asked is not None and torch.device(asked).type == "meta"
    moving_back = asked is not None and not moving_there
    if elsewhere and not moving_back:
        operands = [args[0], *args[2:]] if func in _INDEXING else tree_flatten((args, kwargs))[0]
        left = [t for t in operands if isinstance(t, torch.Tensor) and not isinstance(t, _Elsewhere) and t.dim()]
        if left:
            raise RuntimeError(f"{func}: a CPU tensor of shape {tuple(left[0].shape)} was combined with tensors "
                               "on the other device (on a GPU: 'Expected all tensors to be on the same device')")
    if moving_there:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    wrapper_of = {id(t.values): t for t in elsewhere}
    out = func(*tree_map(_values, args), **tree_map(_values, kwargs))
    if moving_back or not (elsewhere or moving_there):
        return out

    def label(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return wrapper_of[id(t)] if id(t) in wrapper_of else _Elsewhere(t)   # in-place ops return their input
    return tree_map(label, out)


def _values(t: Any) -> Any:
    return t.values if isinstance(t, _Elsewhere) else t


# Operations that move, alias or read a tensor without computing on it: they may see CPU tensors.
_TRANSFERS = {"_to_copy", "copy_", "to", "detach", "alias", "lift_fresh", "lift_fresh_copy", "clone",
              "_local_scalar_dense", "_has_compatible_shallow_copy_type", "set_", "empty_like", "_unsafe_view",
              "view", "t", "unsqueeze", "squeeze", "expand"}


class _OpDevices(TorchDispatchMode):
    """Records, for every ATen operation run while active, its name and whether it computed on a CPU tensor
    (a CPU input that is not a 0-dim scalar, moves and views excepted). Without a GPU it is also the stand-in
    device: `device="meta"` gives `_Elsewhere` tensors (a second device with real values, since a real `meta`
    tensor has no values, so masks and `.item()` would fail there)."""

    def __init__(self, stand_in: bool) -> None:
        super().__init__()
        self.stand_in = stand_in
        self.on_cpu: list[tuple[str, tuple[int, ...]]] = []     # (op, shape of the CPU tensor it computed on)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func.overloadpacket.__name__
        if op not in _TRANSFERS:
            cpu = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
                   and not isinstance(t, _Elsewhere) and t.device.type == "cpu" and t.dim()]
            if cpu:
                self.on_cpu.append((op, tuple(cpu[0].shape)))
        if self.stand_in:
            return _run_elsewhere(func, args, kwargs)
        return func(*args, **kwargs)


class _StandInDevice(TorchDispatchMode):
    """While active, `device="meta"` (in `.to`, `model.to`, factories) gives `_Elsewhere` tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run_elsewhere(func, args, kwargs or {})


def check_mean_kept_output(fn: Callable) -> Verdict:
    """Exercise: `fn(model, batch, device)` moves the model and the batch to `device` and returns the mean
    model output over the kept rows as a 0-dim tensor on `device`, **computed there**. Run on the CPU, then
    on another device with two problems of other sizes: CUDA when there is one; else a stand-in that keeps
    real values on the CPU, reports the `meta` device and, as CUDA would, refuses to combine its tensors
    with CPU tensors. Every operation is recorded, so an answer that computes on the CPU and moves only
    the result is seen."""
    name = "mean_kept_output"
    on_gpu = torch.cuda.is_available()
    other = torch.device("cuda" if on_gpu else "meta")
    where = "on cuda" if on_gpu else "on the stand-in device (another device with real values, reported as meta)"
    hints = ["read the error (or the list of operations): which tensor is on which device? print .device of "
             "the model's parameters, of every tensor in the batch, and of what you create",
             "moving a module changes it in place; moving a tensor does not",
             "a tensor created inside the function lands on the default device unless told otherwise"]
    expected = _mean_kept_output(*_kept_output_problem(), torch.device("cpu"))
    try:
        on_cpu = fn(*_kept_output_problem(), torch.device("cpu"))
    except Exception as error:
        return report_check(name, False, _raised(error, "on the CPU"), hints)
    if on_cpu is None:
        return report_check(name, False, None, hints)
    if not (isinstance(on_cpu, torch.Tensor) and on_cpu.shape == () and torch.allclose(on_cpu.detach(), expected)):
        return report_check(name, False, f"on the CPU it returned {on_cpu!r}, expected {expected!r}", hints)
    for rows, features, seed in ((6, 3, 7), (11, 5, 9)):
        expected = _mean_kept_output(*_kept_output_problem(rows, features, seed), torch.device("cpu"))
        recorder = _OpDevices(stand_in=not on_gpu)
        model, batch = _kept_output_problem(rows, features, seed)        # made before recording starts
        try:
            with recorder:
                result = fn(model, batch, other)
        except Exception as error:
            return report_check(name, False, _raised(error, f"{where}, with a batch of {rows} rows,"), hints)
        if not (isinstance(result, torch.Tensor) and result.device.type == other.type and result.shape == ()):
            got = f"{tuple(result.shape)} on {result.device}" if isinstance(result, torch.Tensor) else type(result).__name__
            return report_check(name, False, f"asked for device {other} (a batch of {rows} rows), the result is {got}",
                                hints)
        if recorder.on_cpu:
            ops = list(dict.fromkeys(op for op, _ in recorder.on_cpu))
            first, shape = recorder.on_cpu[0]
            observed = (f"asked for device {other}, the result is there, but {len(recorder.on_cpu)} operations ran on "
                        f"CPU tensors ({', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''}; the first, {first}, on "
                        f"a CPU tensor of shape {shape}): the work was done on the CPU")
            return report_check(name, False, observed, hints)
        value = _values(result).detach().cpu()
        if not torch.allclose(value, expected.detach()):
            return report_check(name, False, f"{where}, with a batch of {rows} rows, it returned {value.item():.4f}, "
                                             f"expected {expected.item():.4f}", hints)
    return report_check(name, True, None, hints)
