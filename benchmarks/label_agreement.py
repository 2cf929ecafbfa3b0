"""How far two readers of the message alone agree with the held-out sets' labels: a ceiling for `explain()`.

Run: .venv/bin/python benchmarks/label_agreement.py     (prints the table stored in label_agreement/measured.txt)

Held-out sets 17 and 18 (429 messages, measured once before this) were labelled again, each message by two helper
sessions that saw only the message and the rubric's chapter table (`label_agreement/prompt.txt`,
`label_agreement/rubric_given.md`), never the thread, the collector's label or `explain()`: "A" and "B" are two
sessions per half-set, so eight in all. The collectors saw the whole thread. A message's label is right when it is
the collector's chapter; an error the collector called not PyTorch's gets a false alarm when a reader gave it a
chapter, as `benchmarks/explain_heldout.py` counts them for `explain()`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from corpus_novelty import heldout_path  # noqa: E402

LABELS = ROOT / "benchmarks" / "label_agreement" / "blind_labels.jsonl"


def collectors_labels(heldout_set: int) -> list[int | None]:
    path = heldout_path(heldout_set)
    return [json.loads(line)["chapter"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def rows(sets: tuple[int, ...]) -> list[tuple[int | None, dict]]:
    """(collector's chapter, {"A": reader A's label, "B": reader B's}) of each message of the sets."""
    collected = {n: collectors_labels(n) for n in sets}
    out = []
    for line in LABELS.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry["set"] in sets:
            out.append((collected[entry["set"]][entry["line"]], {"A": entry["A"], "B": entry["B"]}))
    return out


def figures(sets: tuple[int, ...]) -> list[str]:
    """The table's cells for these sets."""
    labelled = rows(sets)
    pytorch = [(chapter, readers) for chapter, readers in labelled if chapter is not None]
    unrelated = [readers for chapter, readers in labelled if chapter is None]
    cells = [f"set{'s' if len(sets) > 1 else ''} {' and '.join(map(str, sets))}: {len(pytorch)} + {len(unrelated)}"]
    for reader in ("A", "B"):
        right = sum(readers[reader]["chapter"] == chapter for chapter, readers in pytorch)
        alarms = sum(readers[reader]["chapter"] is not None for readers in unrelated)
        cells.append(f"{right}/{len(pytorch)} = {right / len(pytorch):.0%}; "
                     f"{alarms}/{len(unrelated)} = {alarms / len(unrelated):.0%}")
    same = sum(readers["A"]["chapter"] == readers["B"]["chapter"] for _, readers in labelled)
    cells.append(f"{same}/{len(labelled)} = {same / len(labelled):.0%}")
    sure = [(chapter, label) for chapter, readers in pytorch for label in readers.values() if label["sure"]]
    right_sure = sum(label["chapter"] == chapter for chapter, label in sure)
    cells.append(f"{right_sure}/{len(sure)} = {right_sure / len(sure):.0%}")
    return cells


def table() -> str:
    """The stored table: per set, each reader against the collectors, and the readers against each other."""
    lines = ["| messages (PyTorch + not) | reader A: right chapter; false alarms | reader B: right chapter; false "
             "alarms | A and B give the same label | PyTorch labels marked sure that are right |",
             "|---|---|---|---|---|"]
    for sets in ((17,), (18,), (17, 18)):
        lines.append("| " + " | ".join(figures(sets)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
