"""The learned placement (course_utils.learned_placement), what explain() does with it, and its trainer,
tools/train_placement.py, kept in step with the stored weights."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from course_utils import error_origin, explain, learned_placement
from course_utils.error_origin import topic_of, vocabulary_area
from course_utils.explain import CHAPTER_TITLES, CHAPTERS, LEARNED_NOT_PYTORCH, normalise
from course_utils.learned_placement import MIN_KNOWN, features, known_words, learned_chapter, probabilities

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import explain_heldout  # noqa: E402
import train_placement  # noqa: E402
from corpus_novelty import DEVELOPMENT, SPENT_HELDOUT  # noqa: E402


@pytest.mark.slow
def test_the_stored_weights_are_what_the_trainer_makes_of_the_development_files():
    with np.load(learned_placement.WEIGHTS) as stored:
        stored = dict(stored)
    trained = train_placement.train(train_placement.examples())
    # the same data, seed and thread give the same weights; another torch release may round a last bit differently
    assert np.abs(stored["weights"].astype(int) - trained["weights"]).max() <= 1
    np.testing.assert_allclose(stored["scales"], trained["scales"], rtol=1e-3)
    np.testing.assert_allclose(stored["bias"], trained["bias"], atol=1e-3)
    assert list(stored["trained_on"]) == [str(path.relative_to(ROOT)) for path in DEVELOPMENT]


def test_the_held_out_set_being_measured_was_never_trained_on():
    latest = explain_heldout.HELDOUT[explain_heldout.LATEST]
    assert latest not in DEVELOPMENT
    assert SPENT_HELDOUT == [explain_heldout.HELDOUT[n] for n in range(1, len(SPENT_HELDOUT) + 1)]
    assert len(SPENT_HELDOUT) < explain_heldout.LATEST


def test_every_development_kind_has_a_chapter_or_is_unrelated(tmp_path):
    chapters = train_placement.chapter_of_kind()
    assert chapters["device-mismatch"] == 3 and chapters["area-distributed"] == 5 and chapters["area-import"] is None
    unknown = tmp_path / "error_messages.jsonl"
    unknown.write_text('{"kind": "no-such-kind", "message": "RuntimeError: x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="'no-such-kind' has no chapter"):
        train_placement.examples([unknown])
    held_out = tmp_path / "heldout.jsonl"
    held_out.write_text('{"chapter": 4, "message": "a"}\n{"chapter": null, "message": "b"}\n', encoding="utf-8")
    assert train_placement.examples([held_out]) == [("a", 4), ("b", None)]


def test_features_are_the_same_in_every_process_and_leave_addresses_out():
    text = normalise("RuntimeError: CUDA error: an illegal memory access was encountered at 0x7f3a2c")
    assert features(text) == features(text.replace("0x7f3a2c", "0x1b"))
    code = f"from course_utils.learned_placement import features; print(features({text!r}))"
    printed = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                              capture_output=True, text=True, check=True).stdout for seed in ("1", "2")}
    assert printed == {f"{features(text)}\n"}


def test_probabilities_cover_not_pytorchs_and_the_six_chapters():
    text = normalise("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, "
                     "unhandled system error, NCCL version 2.14.3")
    p = probabilities(text)
    assert p.shape == (7,) and abs(p.sum() - 1) < 1e-9 and (p > 0).all()
    assert learned_chapter(text)[0] == 5


def test_a_message_of_too_few_known_words_is_not_placed():
    assert known_words(normalise("KeyError: 'x'")) < MIN_KNOWN
    assert learned_chapter(normalise("KeyError: 'x'")) is None
    assert explain("KeyError: 'x'") is None


def test_a_real_warning_no_rule_knows_is_placed_by_its_words_at_low_confidence():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.autograd.Variable(torch.ones(2), volatile=True)          # 1.x's evaluation mode, a warning since 0.4
    message = f"UserWarning: {caught[0].message}"
    assert "no_grad" in message
    got = explain(message)
    assert (got.id, got.chapter, got.confidence, got.causes) == ("chapter-2", 2, "low", ())
    assert got.section == CHAPTER_TITLES[2] and "probability" in got.origin
    assert "Low confidence: only its words place it" in str(got)


def test_worded_like_errors_that_are_not_pytorchs_silences_a_placement_by_words_alone():
    message = "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"
    text = normalise(message)
    assert topic_of(text) is not None or vocabulary_area(text) is not None      # the words alone would place it
    chapter, probability = learned_chapter(text)
    assert chapter is None and probability >= LEARNED_NOT_PYTORCH
    assert explain(message) is None


def test_only_a_message_nothing_shows_to_be_pytorchs_can_be_silenced():
    # the innermost frame is PyTorch's: its area stands, however much the last line reads like another library's
    framed = ('  File "/venv/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl\n'
              '    return forward_call(*args, **kwargs)\n'
              'cupy.cuda.runtime.CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected')
    assert learned_chapter(normalise(framed))[0] is None                 # the words alone: not PyTorch's
    got = explain(framed)
    assert got is not None and (got.id, got.chapter) == ("area-cuda", 1)


def test_a_message_from_a_part_no_chapter_teaches_gets_no_chapter_from_its_words():
    message = "RuntimeError: module has no attribute 'forward'"      # a template of torch/ao, which no chapter teaches
    found = error_origin.origin(normalise(message))
    assert found is not None and found.found_by == "template" and found.area is None
    assert learned_chapter(normalise(message))[0] is not None          # its words alone would give one
    assert explain(message) is None


def test_each_chapters_title_is_its_notebooks_first_heading():
    for chapter, notebook in CHAPTERS.items():
        paired = (ROOT / "notebooks" / notebook).with_suffix(".py").read_text(encoding="utf-8")
        assert next(line for line in paired.splitlines() if line.startswith("# # ")) == f"# # {CHAPTER_TITLES[chapter]}"
