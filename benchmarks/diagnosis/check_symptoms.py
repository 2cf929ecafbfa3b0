"""Run every benchmark script and check that each planted bug shows its symptom.

Usage: .venv/bin/python benchmarks/diagnosis/check_symptoms.py [FILTER ...] [--no-correct] [--jobs N]

For each NNN_name/ pair both buggy.py and fixed.py are run as plain scripts (torchrun-like
environment: RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR=127.0.0.1, a free MASTER_PORT),
the last stdout line `RESULT {...}` is parsed, and case.json's symptom is asserted:
fixed[metric] is lower/higher than buggy[metric] by at least min_gap, or for booleans
fixed[metric] == fixed_is and buggy[metric] == (not fixed_is). Every correct/*.py script must
exit 0 and print RESULT. A table with each script's wall time is printed; the exit status is 1
if anything failed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PYTHON = os.environ.get("BENCH_PYTHON") or (str(ROOT / ".venv" / "bin" / "python")
                                            if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(path: Path, timeout: float = 120.0) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONHASHSEED="0")
    t0 = time.perf_counter()
    try:
        p = subprocess.run([PYTHON, path.name], cwd=path.parent, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout}s", "wall": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.strip().splitlines() if ln.strip()]
    out = {"ok": False, "rc": p.returncode, "wall": wall}
    if p.returncode != 0:
        out["error"] = f"exit {p.returncode}: " + p.stderr.strip()[-800:]
        return out
    if not lines or not lines[-1].startswith("RESULT "):
        out["error"] = "last stdout line is not RESULT: " + (lines[-1] if lines else "<empty>")
        return out
    try:
        out["result"] = json.loads(lines[-1][len("RESULT "):], parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError as e:
        out["error"] = f"bad RESULT json ({e}): {lines[-1]}"
        return out
    out["ok"] = True
    return out


def check_symptom(symptom: dict, buggy: dict, fixed: dict) -> tuple[bool, str]:
    m, want = symptom["metric"], symptom["fixed_is"]
    if m not in buggy or m not in fixed:
        return False, f"metric {m!r} missing"
    b, f = buggy[m], fixed[m]
    if isinstance(want, bool):
        ok = f is want and b is (not want)
        return ok, f"buggy={b} fixed={f} (want fixed={want})"
    gap = symptom.get("min_gap", 0.0)
    if want == "lower":
        ok = f <= b - gap
    elif want == "higher":
        ok = f >= b + gap
    else:
        return False, f"bad fixed_is {want!r}"
    return ok, f"buggy={b:.4g} fixed={f:.4g} gap={abs(f - b):.3g} (need {want}, >= {gap})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("filters", nargs="*", help="only cases/scripts whose name contains one of these")
    ap.add_argument("--no-correct", action="store_true")
    ap.add_argument("--no-pairs", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="scripts run in parallel (timings get noisier)")
    args = ap.parse_args()

    def wanted(name: str) -> bool:
        return not args.filters or any(f in name for f in args.filters)

    pairs = [] if args.no_pairs else sorted(d for d in HERE.iterdir() if d.is_dir() and (d / "case.json").exists() and wanted(d.name))
    correct = [] if args.no_correct else sorted(p for p in (HERE / "correct").glob("*.py") if wanted(p.name))
    jobs = [(d, "buggy") for d in pairs] + [(d, "fixed") for d in pairs] + [(p, None) for p in correct]
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        results = dict(zip(jobs, ex.map(lambda j: run_script(j[0] / f"{j[1]}.py" if j[1] else j[0]), jobs)))

    failures = 0
    print(f"{'case':<48} {'rule':<32} {'buggy s':>8} {'fixed s':>8}  symptom")
    for d in pairs:
        case = json.loads((d / "case.json").read_text())
        rb, rf = results[(d, "buggy")], results[(d, "fixed")]
        if not (rb["ok"] and rf["ok"]):
            ok, msg = False, "; ".join(f"{k}: {r.get('error')}" for k, r in (("buggy", rb), ("fixed", rf)) if not r["ok"])
        else:
            ok, msg = check_symptom(case["symptom"], rb["result"], rf["result"])
        failures += not ok
        print(f"{d.name:<48} {case['rule']:<32} {rb['wall']:8.2f} {rf['wall']:8.2f}  {'OK  ' if ok else 'FAIL'} {msg}")
    if correct:
        print(f"\n{'correct script':<48} {'wall s':>8}  result")
    for p in correct:
        r = results[(p, None)]
        failures += not r["ok"]
        print(f"{p.name:<48} {r['wall']:8.2f}  {'OK  ' + json.dumps(r['result']) if r['ok'] else 'FAIL ' + r['error']}")
    walls = [r["wall"] for r in results.values()]
    if walls:
        print(f"\n{len(pairs)} pairs, {len(correct)} correct scripts; wall time {min(walls):.2f}-{max(walls):.2f} s "
              f"(including interpreter start and `import torch`); {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
