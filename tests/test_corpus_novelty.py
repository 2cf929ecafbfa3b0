"""tools/corpus_novelty.py decides which wordings a held-out set may hold: the gaps set 21's collectors found."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
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
])
def test_a_known_sentence_is_seen_however_it_was_pasted(message, development):
    assert seen(message, development)


@pytest.mark.parametrize("message", [
    "KeyError: 'optimizer'",                                   # only a placeholder after the label
    "got prompt\nValueError: the sampler's sigma schedule ran backwards at the last of its forty steps",
    "RuntimeError: the warp core breach alarm fired while the tensor was still in the replicator",
])
def test_a_new_wording_stays_new(message, development):
    assert not seen(message, development)


def test_a_labelled_line_is_also_read_alone_and_an_unlabelled_first_line_is_not():
    assert key_sentences("RuntimeError: one\ntwo\nthree") == ["one two three", "one"]
    assert key_sentences("got prompt\nnext line") == ["got prompt next line"]


def test_the_stored_corpus_reads_as_texts():
    texts = development_texts()
    assert len(texts) > 4000
    assert all(reading.words.startswith(" ") and reading.words.endswith(" ") for text in texts[:50] for reading in text)
