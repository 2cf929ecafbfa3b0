"""`diagnose` on the benchmark of buggy and fixed training scripts: recall, false alarms, overhead.

Run: .venv/bin/python benchmarks/diagnose_cases.py [--heldout] [--jobs 2] [-v]
     .venv/bin/python benchmarks/diagnose_cases.py --overhead     (observation's cost on the correct scripts)

benchmarks/diagnosis/NNN_name/{buggy.py,fixed.py,case.json} are pairs that differ by one planted bug
(the defects4ML layout); benchmarks/diagnosis/correct/*.py are correct scripts written with the
techniques a naive detector mistakes for bugs. That set is the development set: `diagnose`'s rules were
tuned on it. benchmarks/diagnosis_heldout/ has the same layout, written by someone who had not seen the
rules and frozen before they were measured on it; `--heldout` measures it (once, for the README). A bug counts as **found** when `diagnose(buggy.py)`
names the case's rule; a **false alarm** is any finding on a fixed or correct script. `--overhead`
runs each correct script alone and under `diagnose` and reports the ratio of wall times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVELOPMENT = ROOT / "benchmarks" / "diagnosis"
HELDOUT = ROOT / "benchmarks" / "diagnosis_heldout"
sys.path.insert(0, str(ROOT))

from course_utils.diagnose import _environment, diagnose  # noqa: E402

# What the research tools report on their own benchmarks (Keras programs), shown beside ours in the README.
PUBLISHED = (
    ("AUTOTRAINER (Zhang, Zhai, Ma, Shen; ICSE 2021)",
     "495 models, 262 with a training problem: 316 problems detected, 97.3 % repaired; no false positive "
     "seen; thresholds tuned on 100 separate cases (github.com/shiningrain/AUTOTRAINER README and rebuttal)"),
    ("DeepDiagnosis (Wardat, Cruz, Le, Rajan; ICSE 2022)",
     "444 models (53 real, 391 from AUTOTRAINER); more accurate than UMLAUT and DeepLocalize (arXiv 2112.04036)"),
    ("DeepFD (Cao et al.; ICSE 2022)",
     "52 % of faulty programs diagnosed, 42 % localised; an independent study measured recall 0.61, "
     "precision 0.41 (arXiv 2412.11304)"),
)


@dataclass
class Case:
    """One planted bug: its folder, the rule that should name it, its chapter, and how the buggy script's
    own measurements must differ from its fixed twin's."""
    path: Path
    rule: str
    chapter: int
    bug: str
    symptom: dict

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Run:
    script: Path
    kind: str                                   # buggy / fixed / correct
    rules: list[str]
    status: str
    result: dict | None                         # the script's RESULT line
    wall_s: float
    case: Case | None = None
    messages: list[str] = field(default_factory=list)


def cases(root: Path = DEVELOPMENT) -> list[Case]:
    found = []
    for folder in sorted(p for p in root.iterdir() if (p / "case.json").is_file()):
        spec = json.loads((folder / "case.json").read_text())
        found.append(Case(folder, spec["rule"], spec["chapter"], spec["bug"], spec["symptom"]))
    return found


def correct_scripts(root: Path = DEVELOPMENT) -> list[Path]:
    return sorted((root / "correct").glob("*.py"))


def _result_line(output: str) -> dict | None:
    for line in reversed(output.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


def _diagnosed(script: Path, kind: str, case: Case | None, threads: int) -> Run:
    d = diagnose(script, timeout_s=180, cwd=script.parent, env={"OMP_NUM_THREADS": str(threads)})
    return Run(script, kind, d.rules(), d.status, _result_line(d.output_tail), d.wall_s, case,
               [f.message for f in d.findings])


def run_all(root: Path = DEVELOPMENT, jobs: int = 2) -> list[Run]:
    """Diagnose every buggy, fixed and correct script of the set in `root`, `jobs` at a time (each with its
    share of the cores: two 2-thread scripts on 2 cores run 10x slower than one after the other)."""
    work = [(c.path / f"{kind}.py", kind, c) for c in cases(root) for kind in ("buggy", "fixed")]
    work += [(path, "correct", None) for path in correct_scripts(root)]
    with ThreadPoolExecutor(jobs) as pool:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        return list(pool.map(lambda item: _diagnosed(*item, threads), work))


def symptom_shown(case: Case, buggy: dict, fixed: dict) -> bool:
    """Does the buggy script's own RESULT show the symptom against its fixed twin's?"""
    metric, fixed_is = case.symptom["metric"], case.symptom["fixed_is"]
    if isinstance(fixed_is, bool):
        return fixed[metric] is fixed_is and buggy[metric] is (not fixed_is)
    gap = fixed[metric] - buggy[metric] if fixed_is == "higher" else buggy[metric] - fixed[metric]
    return gap >= case.symptom["min_gap"]


def score(runs: list[Run]) -> dict:
    buggy = [r for r in runs if r.kind == "buggy"]
    silent_expected = [r for r in runs if r.kind in ("fixed", "correct")]
    found = [r for r in buggy if r.case.rule in r.rules]
    alarms = [r for r in silent_expected if r.rules]
    by_chapter: dict[int, list[int]] = {}
    for r in buggy:
        hits = by_chapter.setdefault(r.case.chapter, [0, 0])
        hits[0] += r.case.rule in r.rules
        hits[1] += 1
    return {"bugs": len(buggy), "found": len(found), "recall": len(found) / max(1, len(buggy)),
            "silent_scripts": len(silent_expected), "false_alarms": len(alarms),
            "false_alarm_rate": len(alarms) / max(1, len(silent_expected)),
            "missed": sorted(r.case.name for r in buggy if r.case.rule not in r.rules),
            "alarms": sorted(f"{r.script.parent.name}/{r.script.name}: {', '.join(r.rules)}" for r in alarms),
            "by_chapter": dict(sorted(by_chapter.items()))}


def table(s: dict, name: str = "benchmarks/diagnosis") -> str:
    """The README's table (generated from a run; a test keeps the development set's in step)."""
    rows = [f"| | `diagnose` on {name} |", "|---|---|",
            f"| bugs named with the right rule (recall) | {s['found']} of {s['bugs']} ({s['recall']:.0%}) |",
            f"| fixed and correct scripts given a finding (false alarms) | {s['false_alarms']} of "
            f"{s['silent_scripts']} ({s['false_alarm_rate']:.0%}) |"]
    rows += [f"| chapter {ch}: bugs found | {hit} of {n} |" for ch, (hit, n) in s["by_chapter"].items()]
    return "\n".join(rows)


def overhead(scripts: list[Path], repeats: int = 3) -> dict:
    """Wall time of each script alone and under `diagnose`, interleaved, best of `repeats` each (the
    least disturbed run of a busy machine); the ratio of the sums is observation's cost."""
    plain_s, observed_s = [], []
    for script in scripts:
        plain, observed = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            subprocess.run([sys.executable, str(script)], cwd=script.parent, env=_environment(),
                           capture_output=True, timeout=300, check=False)
            plain.append(time.perf_counter() - started)
            observed.append(diagnose(script, timeout_s=300, cwd=script.parent).wall_s)
        plain_s.append(min(plain))
        observed_s.append(min(observed))
    ratios = [o / p for o, p in zip(observed_s, plain_s)]
    return {"scripts": len(scripts), "plain_s": sum(plain_s), "observed_s": sum(observed_s),
            "ratio": sum(observed_s) / sum(plain_s), "worst": max(ratios), "median": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", action="store_true", help="the held-out set (measure it once)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--overhead", action="store_true",
                        help="only the overhead: the set's correct scripts, alone and observed, one at a time")
    parser.add_argument("-v", "--verbose", action="store_true")
    options = parser.parse_args()
    root = HELDOUT if options.heldout else DEVELOPMENT
    if options.overhead:
        cost = overhead(correct_scripts(root))
        print(f"overhead on the {cost['scripts']} correct scripts of {root.relative_to(ROOT)} "
              f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, best of 3 each): "
              f"{cost['plain_s']:.1f} s alone, {cost['observed_s']:.1f} s observed: x{cost['ratio']:.2f} in total "
              f"(median x{cost['median']:.2f}, worst x{cost['worst']:.2f}; Python's start and `import torch` included)")
        return
    runs = run_all(root, options.jobs)
    result = score(runs)
    print(table(result, str(root.relative_to(ROOT))))
    print(f"\nmissed: {result['missed'] or 'none'}\nfalse alarms: {result['alarms'] or 'none'}")
    if options.verbose:
        for r in runs:
            print(f"{r.script.parent.name}/{r.script.name:10s} {r.status:10s} {r.wall_s:5.1f}s {r.rules}")


if __name__ == "__main__":
    main()
