"""The chapter a message is worded like: a linear classifier over its words, learned from labelled real messages.

The rules and PyTorch's own message templates place the wordings they were written from; the long tail of
wordings nobody wrote a rule for (a 1.x warning, a wrapper's report, a CUDA library's status string) needs what a
reader brings: which words go with which part of PyTorch. This layer learns that from the course's labelled
messages (`tools/train_placement.py`: the development corpus and the held-out sets that were measured once before
they joined it), for seven classes: chapters 1–6 and "not PyTorch's".

Features: the words and adjacent word pairs of the message as `explain` normalises it, lower-cased, hex addresses
and numbers left out, hashed into 2**BITS buckets (the hashing trick: no vocabulary to store; a word never seen
in training falls in a bucket whose weight is zero unless a trained word shares it: about 16 % of buckets hold
one). Each message's features weigh 1/sqrt(count), so a long traceback does not outvote a short error line. The
model is multinomial logistic regression, stored as int8 weights with one scale per class
(`data/learned_placement.npz`).

Written here, not taken from scikit-learn: the course does not depend on it, and the model is one sparse dot
product; training is a few lines of torch in the tool.
"""
from __future__ import annotations

import re
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np

WEIGHTS = Path(__file__).parent / "data" / "learned_placement.npz"
BITS = 18
CLASSES = (None, 1, 2, 3, 4, 5, 6)            # index 0: an error that is not PyTorch's
MIN_KNOWN = 3     # features with a weight a placement needs (leave-one-set-out on sets 5-18 gave the same figures
                  # as no minimum: it keeps a bare "KeyError: 'x'" from being read as a state_dict's missing key)
_WORD = re.compile(r"[a-z_][a-z0-9_]*[a-z0-9]")
_HEX = re.compile(r"0x[0-9a-f]+")


def features(text: str) -> list[int]:
    """The hashed buckets of a normalised message's words and word pairs (each once), in ascending order."""
    words = _WORD.findall(_HEX.sub(" ", text.lower()))
    terms = set(words) | {f"{a} {b}" for a, b in zip(words, words[1:])}
    # crc32, not hash(): Python salts str hashes per process, and the stored weights need the same buckets
    return sorted({zlib.crc32(term.encode()) % (1 << BITS) for term in terms})


@lru_cache(maxsize=1)
def _model() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 weights [2**BITS, 7], per-class scales [7], bias [7]), as tools/train_placement.py stored them."""
    with np.load(WEIGHTS) as stored:
        return stored["weights"], stored["scales"], stored["bias"]


def _probabilities(buckets: list[int]) -> np.ndarray:
    weights, scales, bias = _model()
    logits = bias.astype(np.float64)
    if buckets:
        logits = logits + weights[buckets].sum(axis=0, dtype=np.int64) * scales / np.sqrt(len(buckets))
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def probabilities(text: str) -> np.ndarray:
    """P(class | message) for CLASSES (not PyTorch's, chapters 1–6): shape [7], summing to 1."""
    return _probabilities(features(text))


def _known(buckets: list[int]) -> int:
    return int(np.count_nonzero(_model()[0][buckets].any(axis=1)))


def known_words(text: str) -> int:
    """How many of the message's features hold a learned weight (words and pairs seen in training, or sharing a
    bucket with one)."""
    return _known(features(text))


def learned_chapter(text: str) -> tuple[int | None, float] | None:
    """The most probable class of a normalised message (a chapter, or None: not PyTorch's) and its probability;
    None when fewer than MIN_KNOWN of its features hold a weight ("KeyError: 'x'" has one)."""
    buckets = features(text)
    if _known(buckets) < MIN_KNOWN:
        return None
    p = _probabilities(buckets)
    best = int(p.argmax())
    return CLASSES[best], float(p[best])
