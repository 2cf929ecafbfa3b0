"""tools/corpus_novelty.py decides which wordings a held-out set may hold: the gaps set 21's collectors and set 22's
measurement found."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
import corpus_novelty  # noqa: E402
from corpus_novelty import development_texts, key_sentences, seen, text_of  # noqa: E402

DEVELOPMENT = [
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total capacity)",
    "train.py:12: FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please use "
    "`torch.amp.autocast('cuda', args...)` instead.",
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
    "NaN or Inf found in input tensor.",
    "got prompt\nKeyError: 'model'",
    "NotImplementedError: The operator `aten::foo` is not currently implemented for the MPS device.",
    "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\nYou can try to repro this exception",
    "RuntimeError: svd_cuda: the updating process of SBDSDC did not converge (error: 2)",
]


@pytest.fixture(scope="module")
def development():
    return [text_of(message) for message in DEVELOPMENT]


@pytest.mark.parametrize("message", [
    "CUDA out of memory",                                                          # four words: no 5-gram
    "RuntimeError: CUDA error: out of memory",                                     # three, after the last label
    "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",                                  # one: a status code
    "FutureWarning: torch.cuda.amp.autocast(args...) is deprecated. Please use torch.amp.autocast('cuda', "
    "args...) instead.",                                                           # backticks dropped
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory\n"
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x6b (0x7f3b in libc10.so)\n"
    "frame #1: <unknown function> + 0x3a2 (0x7f3c in libtorch_cpu.so)",           # lines after the sentence
    "W1207 12:00:00.123 12345 summary.cc:45] NaN or Inf found in input tensor.",   # a log prefix
    "NotImplementedError: The operator `aten::bar` is not currently implemented for the MPS device.",  # as before
    '"RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity)"',  # quoted
    "RuntimeError: svd_cuda: the updating process of SBDSDC did not converge (error: 11)",  # a second label
    '"NaN or Inf found in input tensor."',                        # an issue's title in quotes: not a quoted name
    "`NaN or Inf found in input tensor.`",
])
def test_a_known_sentence_is_seen_however_it_was_pasted(message, development):
    assert seen(message, development)


@pytest.mark.parametrize("message", [
    "KeyError: 'optimizer'",                                   # only a placeholder after the label
    "got prompt\nValueError: the sampler's sigma schedule ran backwards at the last of its forty steps",
    "RuntimeError: the warp core breach alarm fired while the tensor was still in the replicator",
    "RuntimeError: the warp core failed to reach the replicator's batch (error: 11)",    # two labels, both new
    "RuntimeError:\nthe shuttle bay doors refused the batch because its dilithium crystals were cracked",
    "Traceback (most recent call last):\nKeyError: 'ensign'\n\nThe above exception was the direct cause of the "
    "following exception:\n\nRuntimeError: the tricorder lost its calibration while sampling the nebula",
])
def test_a_new_wording_stays_new(message, development):
    assert not seen(message, development)


def test_a_labelled_line_is_also_read_alone_when_words_follow_its_label():
    assert key_sentences("RuntimeError: one\ntwo\nthree") == ["one two three", "one"]
    assert key_sentences("RuntimeError:\ntwo\nthree") == ["two three"]            # nothing after the label
    assert key_sentences("got prompt\nnext line") == ["got prompt next line"]       # no label: no line alone
    assert key_sentences("RuntimeError: x failed (error: 11)") == ["11)", "x failed (error: 11)"]


def test_the_stored_corpus_sees_its_own_messages_and_not_a_new_one():
    development = development_texts()
    assert seen(json.loads(corpus_novelty.DEVELOPMENT[0].read_text().splitlines()[7])["message"], development)
    assert not seen("RuntimeError: the holodeck's safety limiter rejected the gradient of the bridge crew", development)
