"""`doctor()`: the environment report a learner runs first, and the hardware line printed next to numbers."""
from __future__ import annotations

import os
import platform
import re
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import psutil
import torch

from course_utils._display import ReadableResult

FIX = "run `./course lab` (or `pip install -e .` in the course folder) to install the pinned set"
# The torch releases CI runs the whole course on (`./course test` and `./course test --torch 2.14.1`).
TESTED_TORCH = ("2.13.0", "2.14.1")
# Packages the course needs, with the one-line fix printed when one is missing.
REQUIRED = ("numpy", "matplotlib", "ipywidgets", "jupyterlab", "tqdm", "nbval",
            "onnx", "onnxscript", "onnxruntime")


@dataclass
class DoctorReport(ReadableResult):
    """Rows of (item, value) and the problems found; `ok` is True when nothing is missing."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows)
        lines = [f"{k:<{width}}  {v}" for k, v in self.rows]
        lines += [f"NOTE: {n}" for n in self.notes]
        lines += [f"PROBLEM: {p}" for p in self.problems]
        lines.append("All set." if self.ok else "Fix the problems above, then run the doctor again.")
        return "\n".join(lines)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo where there is one, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpp_compiler() -> str | None:
    """Path of a C++ compiler, which `torch.compile` (Inductor) needs to build CPU kernels, or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and (path := shutil.which(name)):
            return path
    return None


def hardware_summary() -> str:
    """One line naming the hardware that produced a measurement, e.g. for the top of a table."""
    threads = torch.get_num_threads()
    cpu = f"{cpu_name()} ({os.cpu_count()} logical cores, torch uses {threads} thread{'s' * (threads != 1)})"
    if torch.cuda.is_available():
        gpus = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return f"GPU: {gpus}; CPU: {cpu}; torch {torch.__version__}"
    return f"CPU only: {cpu}; torch {torch.__version__}"


def idle_cores(interval_s: float = 0.5) -> float:
    """How many logical cores were idle over the next `interval_s` seconds (e.g. 1.1 of 2).

    A speed-up from parallel work (DataLoader workers, threads) needs idle cores; a learner's laptop
    with a browser and a video call open may not have them. Measure before claiming one.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    return sum(100.0 - busy for busy in psutil.cpu_percent(interval=interval_s, percpu=True)) / 100.0


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def nvidia_driver_cuda_version() -> str | None:
    """The newest CUDA version the installed NVIDIA driver supports ("12.4"), read from nvidia-smi
    with PyTorch's own environment collector; None without a driver."""
    from torch.utils import collect_env
    return collect_env.run_and_parse_first_match(collect_env.run, collect_env.get_nvidia_smi(), r"CUDA Version: (\S+)")


def _as_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def _check_cuda_driver(report: DoctorReport) -> None:
    """Name an NVIDIA driver older than the CUDA this torch was built with."""
    driver = nvidia_driver_cuda_version()
    report.rows.append(("NVIDIA driver", f"supports CUDA {driver}" if driver else "not found (nvidia-smi)"))
    if driver is None:
        return
    wheel, supported = _as_version(torch.version.cuda), _as_version(driver)
    if supported[:1] < wheel[:1]:
        report.problems.append(f"the NVIDIA driver supports CUDA {driver} but this torch needs CUDA "
                               f"{torch.version.cuda}: update the driver, or install a torch built for CUDA {driver}")
    elif supported < wheel:
        report.notes.append(f"the NVIDIA driver supports CUDA {driver}, older than this torch's CUDA "
                            f"{torch.version.cuda}: it may work (minor-version compatibility); if CUDA "
                            "errors appear, update the driver")


def _check_gpu_compile_toolchain(report: DoctorReport) -> None:
    """torch.compile on a GPU needs Triton, a C compiler (Triton builds its launcher) and Python's headers."""
    triton = _version("triton")
    report.rows.append(("triton", triton or "MISSING"))
    c_compiler = next((path for name in (os.environ.get("CC"), "cc", "gcc", "clang") if name
                       and (path := shutil.which(name))), None)
    report.rows.append(("C compiler", c_compiler or "none found"))
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = [what for what, ok in (("triton (pip install triton)", triton), ("a C compiler (gcc)", c_compiler),
                                     (f"Python's headers ({headers}; python3-dev)", headers.exists())) if not ok]
    if missing:
        report.problems.append("torch.compile on the GPU needs " + ", ".join(missing)
                               + "; chapter 6 would fall back to eager (and `./course gpu-test` fails)")


def doctor() -> DoctorReport:
    """Check what the course needs and return a printable report (also `python -m course_utils doctor`)."""
    report = DoctorReport()
    rows, problems = report.rows, report.problems
    rows.append(("python", sys.version.split()[0] + f" ({sys.executable})"))
    if sys.version_info < (3, 10):
        problems.append("Python 3.10 or newer is needed; install it and re-run ./course lab")
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    rows.append(("torch", f"{torch.__version__} ({build}); the course is tested on {' and '.join(TESTED_TORCH)}"))
    if torch.__version__.split("+")[0] not in TESTED_TORCH:
        report.notes.append(f"torch {torch.__version__} is not one the course was tested on ({', '.join(TESTED_TORCH)}): "
                            "errors and numbers may differ from the notebooks' (./course lab installs the pinned one)")
    rows.append(("cpu", f"{cpu_name()}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            rows.append((f"cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
                                      f"compute capability {props.major}.{props.minor}"))
    else:
        rows.append(("cuda", "not available: CUDA-only cells run their labelled CPU counterpart"))
        if torch.version.cuda:
            report.notes.append("this torch is a CUDA build but no GPU is visible (driver? CUDA_VISIBLE_DEVICES?)")
    if torch.version.cuda:
        _check_cuda_driver(report)
    if torch.cuda.is_available():
        _check_gpu_compile_toolchain(report)
    rows.append(("mps", "available" if torch.backends.mps.is_available() else "not available"))
    compiler = cpp_compiler()
    rows.append(("C++ compiler", compiler or "none found"))
    if compiler is None:
        report.notes.append("torch.compile needs a C++ compiler on CPU (install g++ or clang++); "
                            "chapter 6 falls back to eager without one")
    for dist in REQUIRED:
        version = _version(dist)
        rows.append((dist, version or "MISSING"))
        if version is None:
            problems.append(f"{dist} is not installed: {FIX}")
    return report


def main() -> int:
    """Entry point of `python -m course_utils doctor`: prints the report; exit status 1 on problems."""
    report = doctor()
    print(report)
    return 0 if report.ok else 1
