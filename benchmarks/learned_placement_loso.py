"""Leave-one-set-out: what the learned placement adds to `explain()` on wordings it never saw.

Run: .venv/bin/python benchmarks/learned_placement_loso.py [--sets 5-N] [--thresholds 0.5,0.4]   (about 4 minutes
on 2 cores; --sets defaults to set 5 up to the last spent set in SPENT_HELDOUT; --thresholds scores other values
of LEARNED_THRESHOLD and LEARNED_NOT_PYTORCH than explain's own)

For each spent held-out set N, a model is trained by `tools/train_placement.py`'s own code on everything else
(the development corpus and the other spent sets), and `explain()` is scored on set N's messages whose wording is
new to that training data (`corpus_novelty.seen`), the way a fresh set is collected; once with the learned
placement, once without it. This is how LEARNED_THRESHOLD and LEARNED_NOT_PYTORCH were chosen; a fresh held-out
set, measured once, is the figure that counts (benchmarks/explain_heldout.py).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from corpus_novelty import DEVELOPMENT, SPENT_HELDOUT, seen, text_of  # noqa: E402
from train_placement import examples, train  # noqa: E402

from course_utils import learned_placement  # noqa: E402

explain_module = importlib.import_module("course_utils.explain")     # the module: the package exports the function


def scored(entries: list[dict]) -> tuple[int, int, int, int]:
    """(right chapter, PyTorch messages, unrelated errors given a chapter, unrelated errors) of explain()."""
    answers = [explain_module.explain(entry["message"]) for entry in entries]
    pytorch = [(e, got) for e, got in zip(entries, answers) if e["chapter"] is not None]
    unrelated = [got for e, got in zip(entries, answers) if e["chapter"] is None]
    return (sum(got is not None and got.chapter == e["chapter"] for e, got in pytorch), len(pytorch),
            sum(got is not None for got in unrelated), len(unrelated))


def fold(held_out: Path, folder: Path) -> dict[str, tuple[int, int, int, int]]:
    """explain() with and without a learned placement trained without `held_out`, on its new wordings."""
    training = examples([path for path in DEVELOPMENT if path != held_out])
    texts = [text_of(message) for message, _ in training]
    entries = [json.loads(line) for line in held_out.read_text(encoding="utf-8").splitlines() if line.strip()]
    new = [entry for entry in entries if not seen(entry["message"], texts)]
    weights = folder / f"{held_out.stem}.npz"
    np.savez_compressed(weights, **train(training))
    learned_placement.WEIGHTS = weights
    learned_placement._model.cache_clear()
    with_learned = scored(new)
    learned_chapter = explain_module.learned_chapter
    explain_module.learned_chapter = lambda text: None
    try:
        without = scored(new)
    finally:
        explain_module.learned_chapter = learned_chapter
    return {"with": with_learned, "without": without}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=f"5-{len(SPENT_HELDOUT)}", help="first-last spent set to hold out")
    parser.add_argument("--thresholds", help="LEARNED_THRESHOLD,LEARNED_NOT_PYTORCH to score instead of explain's")
    args = parser.parse_args(argv)
    first, last = map(int, args.sets.split("-"))
    chosen = (explain_module.LEARNED_THRESHOLD, explain_module.LEARNED_NOT_PYTORCH)
    if args.thresholds:
        explain_module.LEARNED_THRESHOLD, explain_module.LEARNED_NOT_PYTORCH = map(float, args.thresholds.split(","))
    totals = {"with": np.zeros(4, int), "without": np.zeros(4, int)}
    stored = learned_placement.WEIGHTS
    print("| held out | new wordings (PyTorch + not) | without the learned placement | with it |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for n in range(first, last + 1):
            result = fold(SPENT_HELDOUT[n - 1], Path(folder))
            cells = []
            for name in ("without", "with"):
                right, pytorch, alarms, unrelated = result[name]
                totals[name] += result[name]
                cells.append(f"{right}/{pytorch} = {right / pytorch:.0%} right, {alarms}/{unrelated} false alarms")
            print(f"| set {n} | {pytorch} + {unrelated} | {cells[0]} | {cells[1]} |", flush=True)
    cells = [f"{t[0] / t[1]:.1%} right, {t[2] / t[3]:.1%} false alarms" for t in (totals["without"], totals["with"])]
    print(f"| sets {first}–{last} | {totals['with'][1]} + {totals['with'][3]} | {cells[0]} | {cells[1]} |")
    learned_placement.WEIGHTS = stored
    learned_placement._model.cache_clear()
    explain_module.LEARNED_THRESHOLD, explain_module.LEARNED_NOT_PYTORCH = chosen
    return 0


if __name__ == "__main__":
    sys.exit(main())
