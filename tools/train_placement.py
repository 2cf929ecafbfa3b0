"""Train the learned placement (`course_utils/learned_placement.py`) on the course's labelled real messages.

    .venv/bin/python tools/train_placement.py            # writes course_utils/data/learned_placement.npz

The examples: every message of the development corpus (`tests/data/error_messages.jsonl`, its kind's chapter; an
unrelated error is "not PyTorch's") and of the held-out sets that were measured once and then joined it
(`corpus_novelty.SPENT_HELDOUT`, their collectors' chapter). A held-out set that has not been measured is never
read here. Multinomial logistic regression on the hashed features, full batch, Adam, a little L2, on one thread
with a fixed seed, so that the same data gives the same weights (`tests/test_learned_placement.py` retrains and
compares). EPOCHS, LEARNING_RATE and L2 below were compared by leave-one-set-out on the spent sets' wordings new
to the rest (benchmarks/learned_placement_loso.py does the same for the thresholds): L2 of 1e-6 or 3e-5, 2**16
buckets and character 4-grams all did worse.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from corpus_novelty import DEVELOPMENT  # noqa: E402

from course_utils.error_origin import AREAS, TOPICS  # noqa: E402
from course_utils.explain import RULES, _in_cuda_words, normalise  # noqa: E402
from course_utils.learned_placement import BITS, CLASSES, WEIGHTS, features  # noqa: E402

EPOCHS, LEARNING_RATE, L2 = 150, 0.2, 1e-5


def chapter_of_kind() -> dict[str, int | None]:
    """The chapter each development kind belongs to: a rule's chapter, or the chapter that teaches an area."""
    chapters = {rule.explanation.id: rule.explanation.chapter for rule in RULES}
    chapters.update({f"area-{area.id}": area.chapter for _, area in AREAS + TOPICS})
    return chapters


def examples(paths: list[Path] = DEVELOPMENT) -> list[tuple[str, int | None]]:
    """(message, chapter or None) of every labelled message in the development files, in file order."""
    chapters = chapter_of_kind()
    out = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            if "kind" in entry:                   # the development corpus: labelled by kind
                if entry["kind"] is not None and entry["kind"] not in chapters:
                    raise ValueError(f"{path.name}: kind {entry['kind']!r} has no chapter; add it to a rule or area")
                out.append((entry["message"], chapters.get(entry["kind"]) if entry["kind"] else None))
            else:                                 # a spent held-out set: labelled by chapter
                out.append((entry["message"], entry["chapter"]))
    return out


def train(data: list[tuple[str, int | None]]) -> dict[str, np.ndarray]:
    """Fit the classifier; the int8 weights, per-class scales and bias that learned_placement reads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                      # one summation order: the same weights on every run
    try:
        return _fit(data)
    finally:
        torch.set_num_threads(threads)


def _fit(data: list[tuple[str, int | None]]) -> dict[str, np.ndarray]:
    """The optimisation itself, from a fixed seed (train() fixes its thread count)."""
    torch.manual_seed(0)
    buckets, offsets, weights = [], [], []
    for message, _ in data:
        found = features(_in_cuda_words(normalise(message)))
        offsets.append(len(buckets))
        buckets += found
        weights += [1 / math.sqrt(max(1, len(found)))] * len(found)
    target = torch.tensor([CLASSES.index(chapter) for _, chapter in data])
    buckets, offsets, weights = torch.tensor(buckets), torch.tensor(offsets), torch.tensor(weights)
    table = torch.nn.EmbeddingBag(1 << BITS, len(CLASSES), mode="sum")
    torch.nn.init.zeros_(table.weight)
    bias = torch.zeros(len(CLASSES), requires_grad=True)
    optimizer = torch.optim.Adam([table.weight, bias], lr=LEARNING_RATE)
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        logits = table(buckets, offsets, per_sample_weights=weights) + bias
        loss = torch.nn.functional.cross_entropy(logits, target) + L2 * table.weight.pow(2).sum()
        loss.backward()
        optimizer.step()
    w = table.weight.detach().double().numpy()
    scales = np.abs(w).max(axis=0) / 127
    return {"weights": np.round(w / scales).astype(np.int8), "scales": scales, "bias": bias.detach().double().numpy()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=WEIGHTS)
    args = parser.parse_args(argv)
    data = examples()
    model = train(data)
    np.savez_compressed(args.output, **model, trained_on=np.array([str(p.relative_to(ROOT)) for p in DEVELOPMENT]))
    print(f"{args.output}: {len(data)} messages from {len(DEVELOPMENT)} files, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
