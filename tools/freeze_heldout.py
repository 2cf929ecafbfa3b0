"""Merge the collectors' parts of a held-out set of error messages into one frozen file, printing counts only.

    python tools/freeze_heldout.py tests/data/heldout4_parts/part_*.jsonl -o tests/data/heldout4_errors.jsonl

The rules (tests/data/HELDOUT_RUBRIC.md), applied mechanically and before anyone reads a message:
- every field of the rubric present, a chapter 1-6 or null, a source on GitHub;
- one entry per thread, none from a thread of another `tests/data/*.jsonl` file;
- a wording new to the development corpus (`corpus_novelty.seen`);
- at most MAX_SAME_WORDING entries of one wording, the first ones in the collectors' order: taking search
  results in order let one query fill a chapter with one message (nine copies of one optimizer error), which
  would weigh one rule like nine;
- at most MAX_PER_REPOSITORY entries of one repository in the whole set (from set 18 on: collectors working
  side by side cannot see each other's repositories; set 17's parts held up to eight of one between them).
It prints how many entries each rule removed and what remains per chapter, never a message.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_novelty import ROOT, Text, development_texts, seen, text_of  # noqa: E402

FIELDS = {"message", "source", "chapter", "topic", "torch_version", "platform", "wrapper", "year", "query", "part"}
MAX_SAME_WORDING = 2
MAX_PER_REPOSITORY = 2


def repository(source: str) -> str:
    """The "owner/name" of a GitHub thread's address."""
    return "/".join(source.removeprefix("https://github.com/").split("/")[:2]).lower()


def freeze(parts: list[Path], output: Path) -> tuple[list[dict], Counter]:
    entries = [json.loads(line) for part in parts for line in part.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    data = ROOT / "tests" / "data"
    used = {json.loads(line)["source"] for path in data.glob("*.jsonl") if path.resolve() != output.resolve()
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    development = development_texts()
    removed: Counter = Counter()
    kept: list[dict] = []
    kept_texts: list[Text] = []
    threads: set[str] = set()
    repositories: Counter = Counter()
    for entry in entries:
        if set(entry) != FIELDS or entry["chapter"] not in (None, 1, 2, 3, 4, 5, 6) or \
                not entry["source"].startswith("https://github.com/"):
            removed["malformed"] += 1
        elif entry["source"] in used or entry["source"] in threads:
            removed["thread already used"] += 1
        elif seen(entry["message"], development):
            removed["wording in the development corpus"] += 1
        elif sum(seen(entry["message"], [other]) for other in kept_texts) >= MAX_SAME_WORDING:   # same test, one by one
            removed[f"more than {MAX_SAME_WORDING} of one wording"] += 1
        elif repositories[repository(entry["source"])] >= MAX_PER_REPOSITORY:
            removed[f"more than {MAX_PER_REPOSITORY} of one repository"] += 1
        else:
            kept.append(entry)
            kept_texts.append(text_of(entry["message"]))
            threads.add(entry["source"])
            repositories[repository(entry["source"])] += 1
    return kept, removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    kept, removed = freeze(args.parts, args.output)
    args.output.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in kept), encoding="utf-8")
    print(f"kept {len(kept)}; removed: {dict(removed) or 'none'}")
    print("per chapter:", dict(sorted(Counter(str(e["chapter"]) for e in kept).items())))
    print("per part:", dict(sorted(Counter(e["part"] for e in kept).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
