"""Is a message's wording new to `explain()`'s development corpus? Used to build the held-out set.

A held-out message must not repeat a wording the rules were written from. The check compares the
message's *key sentences* (the text after each `...Error:` / `Exception:` label, or the whole
message when it has none), with numbers, quoted names and paths replaced by placeholders, against
every development message: it is "seen" when half or more of one key sentence's word 5-grams occur
in one of them.

    python tools/corpus_novelty.py "RuntimeError: optimizer got an empty parameter list"
    python tools/corpus_novelty.py --file candidates.jsonl     # one verdict per line ("message" field)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def heldout_path(n: int) -> Path:
    """The file of held-out set n (set 1's name has no number)."""
    return ROOT / "tests" / "data" / f"heldout{'' if n == 1 else n}_errors.jsonl"


# the corpus the rules are written from, and the held-out sets measured once each and since then the learned
# placement's training data (tools/train_placement.py): a new held-out set repeats no wording of either
SPENT_HELDOUT = [heldout_path(n) for n in range(1, 20)]
DEVELOPMENT = [ROOT / "tests" / "data" / "error_messages.jsonl", *SPENT_HELDOUT]
_LABEL = re.compile(r"(?:\b\w*(?:Error|Exception|Failure)\b|\berror)\s*:\s*", re.IGNORECASE)


def _canonical(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", text)
    text = re.sub(r"^\s*(\[(rank|default)\d+\]:)+", "", text, flags=re.MULTILINE)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", " Q ", text)
    text = re.sub(r"\S*[/\\]\S*", " P ", text)
    text = re.sub(r"\d+(\.\d+)?", " 0 ", text)
    return " ".join(re.findall(r"[a-z0-9_]+", text.lower()))


def key_sentences(message: str) -> list[str]:
    """What the error says, without the traceback around it: the text after each error label (the whole
    message when it has none), each with the two lines that follow it."""
    lines = [line for line in message.splitlines() if line.strip() and not line.strip().startswith("File ")]
    labelled = [i for i, line in enumerate(lines) if _LABEL.search(line)] or [0]
    if not lines:
        return [message]
    sentences = []
    for start in labelled:
        text = " ".join(lines[start:start + 3])
        found = list(_LABEL.finditer(lines[start]))
        sentences.append(text[found[-1].end():] if found and found[-1].end() < len(text) else text)
    return sentences


def _grams(words: list[str], n: int = 5) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1))}


def development_texts(paths=DEVELOPMENT) -> list[set[tuple[str, ...]]]:
    texts = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                texts.append(_grams(_canonical(json.loads(line)["message"]).split()))
    return texts


def seen(message: str, development: list[set[tuple[str, ...]]]) -> bool:
    """True when, for any of the message's key sentences, half or more of its word 5-grams occur in one
    development message."""
    for sentence in key_sentences(message):
        grams = _grams(_canonical(sentence).split())
        if any(len(grams & other) >= 0.5 * len(grams) for other in development):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message", nargs="?")
    parser.add_argument("--file", type=Path, help="a .jsonl file whose lines have a 'message' field")
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="more development files to compare with (besides tests/data/error_messages.jsonl)")
    args = parser.parse_args(argv)
    development = development_texts(DEVELOPMENT + args.against)
    if args.file:
        for n, line in enumerate(args.file.read_text().splitlines(), 1):
            if line.strip():
                print(f"line {n}: {'SEEN' if seen(json.loads(line)['message'], development) else 'new'}")
        return 0
    if args.message is None:
        parser.error("give a message or --file")
    print("SEEN" if seen(args.message, development) else "new")
    return 0


if __name__ == "__main__":
    sys.exit(main())
