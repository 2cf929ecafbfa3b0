"""Is a message's wording new to `explain()`'s development corpus? Used to build the held-out set.

A held-out message must not repeat a wording the rules were written from. The check compares the message's *key
sentences* (the text after each line's last `...Error:` / `Exception:` label with the two lines that follow, and the
rest of the line after each label; with no label, the first three lines that are not `File` lines), with numbers,
quoted names and paths replaced by placeholders, against every development message, reading backticks both as quotes
and as nothing: it is "seen" when half or more of one key sentence's word 5-grams occur in one of them; a key
sentence under five words, when its words occur in one of them in a row; and whenever a development message's own
key sentence (six words or more) lies whole inside it. The gaps that set 21's collectors and set 22's measurement
found, which these rules close, are in tests/data/README.md; tests/test_corpus_novelty.py holds a case for each.

    python tools/corpus_novelty.py "RuntimeError: optimizer got an empty parameter list"
    python tools/corpus_novelty.py --file candidates.jsonl     # one verdict per line ("message" field)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def heldout_path(n: int) -> Path:
    """The file of held-out set n (set 1's name has no number)."""
    return ROOT / "tests" / "data" / f"heldout{'' if n == 1 else n}_errors.jsonl"


# the corpus the rules are written from, and the held-out sets measured once each and since then the learned
# placement's training data (tools/train_placement.py): a new held-out set repeats no wording of either
SPENT_HELDOUT = [heldout_path(n) for n in range(1, 25)]
DEVELOPMENT = [ROOT / "tests" / "data" / "error_messages.jsonl", *SPENT_HELDOUT]
_PLACEHOLDERS = {"q", "p", "0"}      # what _canonical puts for a quoted name, a path and a number
_LABEL = re.compile(r"(?:\b\w*(?:Error|Exception|Failure)\b|\berror)\s*:\s*", re.IGNORECASE)


# a line of a message that is one quoted string is a pasted message (an issue's title in quotes), not a name in one
_QUOTED_LINE = re.compile(r"^([ \t]*)([\"'`])((?:(?!\2)[^\n])*)\2[ \t]*$", re.MULTILINE)


def _unquoted(message: str) -> str:
    return _QUOTED_LINE.sub(r"\1\3", message)


def _canonical(text: str, backticks: bool = True) -> str:
    """Lower-case words, with numbers, quoted names (up to 60 characters on one line) and paths as placeholders;
    `backticks` reads `x` as a quoted name, else as x (a paste may keep the backticks of PyTorch's message or lose
    them)."""
    text = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", text)
    text = re.sub(r"^\s*(\[(rank|default)\d+\]:)+", "", text, flags=re.MULTILINE)
    quoted = r"'[^'\n]{0,60}'|\"[^\"\n]{0,60}\"" + (r"|`[^`\n]{0,60}`" if backticks else "")   # a name, not a paste
    text = re.sub(quoted, " Q ", text if backticks else text.replace("`", " "))
    text = re.sub(r"\S*[/\\]\S*", " P ", text)
    text = re.sub(r"\d+(\.\d+)?", " 0 ", text)
    return " ".join(re.findall(r"[a-z0-9_]+", text.lower()))


def key_sentences(message: str) -> list[str]:
    """What the error says, without the traceback around it: the text after each labelled line's last error label
    with the two lines that follow it, and the rest of the line after each of its labels where text follows (with
    no label: the first three lines that are not a traceback's `File` lines)."""
    lines = [line for line in message.splitlines() if line.strip() and not line.strip().startswith("File ")]
    labelled = [i for i, line in enumerate(lines) if _LABEL.search(line)] or [0]
    if not lines:
        return [message]
    sentences = []
    for start in labelled:
        found = list(_LABEL.finditer(lines[start]))
        after = found[-1].end() if found else 0
        sentences.append(" ".join(lines[start:start + 3])[after:].strip() or lines[start])
        for label in found:          # each label's rest of the line: "RuntimeError: x did not converge (error: 11)"
            if label.end() < len(lines[start].rstrip()):
                sentences.append(lines[start][label.end():])
    return list(dict.fromkeys(sentences))


def _grams(words: list[str], n: int = 5) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1))}


@dataclass(frozen=True)
class Reading:
    """A message read one way: its canonical words (space-padded), their 5-grams, the 5-grams of its key
    sentences of six words or more."""

    words: str
    grams: set[tuple[str, ...]]
    sentences: list[set[tuple[str, ...]]]


Text = tuple[Reading, Reading]     # a message read with backticks as quotes, and without them


def text_of(message: str) -> Text:
    message = _unquoted(message)
    def reading(backticks: bool) -> Reading:
        words = _canonical(message, backticks).split()
        sentences = [_canonical(sentence, backticks).split() for sentence in key_sentences(message)]
        return Reading(f" {' '.join(words)} ", _grams(words), [_grams(s) for s in sentences if len(s) >= 6])
    return reading(True), reading(False)


def development_texts(paths=DEVELOPMENT) -> list[Text]:
    return [text_of(json.loads(line)["message"]) for path in paths for line in Path(path).read_text().splitlines()
            if line.strip()]


def seen(message: str, development: list[Text]) -> bool:
    """True when, read either way, a key sentence of the message has half or more of its word 5-grams in one
    development message (a sentence under five words: all its words there in a row, one of them a word, not a
    placeholder: a bare status code such as CUDNN_STATUS_EXECUTION_FAILED counts), or a development message's key
    sentence of six words or more lies whole inside it. A line that is one quoted string is read without its
    quotes."""
    message = _unquoted(message)
    for way, backticks in enumerate((True, False)):
        others = [text[way] for text in development]
        for sentence in key_sentences(message):
            words = _canonical(sentence, backticks).split()
            if len(words) < 5:
                in_a_row = f" {' '.join(words)} "
                if set(words) - _PLACEHOLDERS and any(in_a_row in o.words for o in others):
                    return True
            else:
                grams = _grams(words)
                if any(len(grams & o.grams) >= 0.5 * len(grams) for o in others):
                    return True
        message_grams = _grams(_canonical(message, backticks).split())
        if any(sentence <= message_grams for o in others for sentence in o.sentences):
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
