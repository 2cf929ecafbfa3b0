"""Run every held-out pair and correct script; assert each case's symptom.

Usage: python benchmarks/diagnosis_heldout/check_symptoms.py [ID_OR_NAME_FILTER ...]
Each script runs as a plain process (distributed ones with single-process
torchrun-style env vars and a free port). Prints wall time per script.
"""
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(script):
    env = dict(os.environ)
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONHASHSEED="0")
    t0 = time.time()
    p = subprocess.run([sys.executable, str(script)], cwd=str(script.parent), env=env,
                       capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    lines = p.stdout.strip().splitlines()
    result = None
    if lines and lines[-1].startswith("RESULT "):
        result = json.loads(lines[-1][len("RESULT "):])
    return p.returncode, result, wall, p.stderr


def finite_numbers(obj):
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return True
    if isinstance(obj, (int, float)):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(finite_numbers(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(finite_numbers(v) for v in obj)
    return False


def check_pair(case_dir):
    meta = json.loads((case_dir / "case.json").read_text())
    sym = meta["symptom"]
    out = {}
    problems = []
    for kind in ("buggy", "fixed"):
        rc, res, wall, err = run(case_dir / f"{kind}.py")
        out[kind] = (res, wall)
        if rc != 0:
            problems.append(f"{kind} exited {rc}: {err.strip().splitlines()[-1:] }")
        elif res is None:
            problems.append(f"{kind} printed no RESULT line")
        elif not finite_numbers(res):
            problems.append(f"{kind} RESULT has non-finite numbers")
    if not problems:
        b, f = out["buggy"][0][sym["metric"]], out["fixed"][0][sym["metric"]]
        if sym["fixed_is"] is True:
            ok = (f is True) and (b is False)
        elif sym["fixed_is"] == "lower":
            ok = f <= b - sym["min_gap"]
        elif sym["fixed_is"] == "higher":
            ok = f >= b + sym["min_gap"]
        else:
            ok = False
        if not ok:
            problems.append(f"symptom not shown: {sym} buggy={b} fixed={f}")
    status = "OK  " if not problems else "FAIL"
    walls = " ".join(f"{k}={out[k][1]:.1f}s" for k in out)
    metric = sym["metric"]
    vals = " ".join(f"{k}:{out[k][0].get(metric) if out[k][0] else None}" for k in out)
    print(f"{status} {case_dir.name:45s} [{meta['rule']}] {metric} {vals} ({walls})")
    for p in problems:
        print("     ", p)
    return not problems


def check_correct(script):
    rc, res, wall, err = run(script)
    ok = rc == 0 and res is not None and finite_numbers(res)
    print(f"{'OK  ' if ok else 'FAIL'} correct/{script.name:37s} {json.dumps(res)} ({wall:.1f}s)")
    if not ok:
        print("     ", err.strip().splitlines()[-3:])
    return ok


def main():
    filters = sys.argv[1:]
    want = lambda name: not filters or any(f in name for f in filters)
    pairs = sorted(d for d in HERE.iterdir() if d.is_dir() and (d / "case.json").exists())
    correct = sorted((HERE / "correct").glob("*.py")) if (HERE / "correct").exists() else []
    results = [check_pair(d) for d in pairs if want(d.name)]
    results += [check_correct(s) for s in correct if want("correct/" + s.name)]
    rules = {}
    for d in pairs:
        r = json.loads((d / "case.json").read_text())["rule"]
        rules[r] = rules.get(r, 0) + 1
    if not filters:
        assert len(pairs) >= 22, len(pairs)
        assert len(rules) >= 14, rules
        assert max(rules.values()) <= 2, rules
        assert len(correct) >= 10, len(correct)
    print(f"{sum(results)}/{len(results)} passed; {len(pairs)} pairs, {len(rules)} rules, {len(correct)} correct scripts")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
