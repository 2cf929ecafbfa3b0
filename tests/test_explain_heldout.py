"""The frozen held-out sets of real error messages, and README's figures on the latest, kept in step with the
code (benchmarks/explain_heldout.py). The sets measure explain(); nothing here tunes it."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import explain_heldout  # noqa: E402

FIELDS = {"chapter", "message", "source", "topic", "torch_version", "platform", "wrapper", "year", "query", "part"}


@pytest.mark.parametrize("heldout_set", sorted(explain_heldout.HELDOUT))
def test_a_heldout_set_is_well_formed(heldout_set):
    path = explain_heldout.HELDOUT[heldout_set]
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for entry in entries:
        assert set(entry) == FIELDS, entry
        assert entry["chapter"] in {None, 1, 2, 3, 4, 5, 6} and entry["message"].strip(), entry
        assert re.match(r"https://", entry["source"]), entry
    assert len({(e["source"], e["message"]) for e in entries}) == len(entries), "duplicate entries"
    assert sum(e["chapter"] is not None for e in entries) >= 100 and sum(e["chapter"] is None for e in entries) >= 20


# Set 1's collectors checked only that each wording was new; three of its threads also gave the development
# corpus another message. Sets 2 and 3 were collected from threads used nowhere else.
SHARED_BY_DESIGN = {("error_messages.jsonl", "heldout_errors.jsonl"): 3}


def test_the_sets_share_no_thread_with_each_other_or_the_development_corpus():
    sources = {}
    for name in ["error_messages.jsonl"] + [p.name for p in explain_heldout.HELDOUT.values()]:
        path = ROOT / "tests" / "data" / name
        sources[name] = {json.loads(line)["source"] for line in path.read_text(encoding="utf-8").splitlines()
                         if line.strip()}
    names = sorted(sources)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sources[a] & sources[b]
            assert len(shared) == SHARED_BY_DESIGN.get((a, b), 0), (a, b, sorted(shared)[:3])


def test_readme_shows_what_the_code_gives_on_the_latest_set():
    table = explain_heldout.table(explain_heldout.measure(explain_heldout.LATEST))
    assert table in (ROOT / "README.md").read_text(), (
        "README's held-out table differs from the code's; paste `python benchmarks/explain_heldout.py`:\n" + table)


def test_the_stored_label_agreement_is_what_the_blind_labels_give():
    import label_agreement
    stored = (ROOT / "benchmarks" / "label_agreement" / "measured.txt").read_text(encoding="utf-8")
    assert label_agreement.table() + "\n" == stored
    labelled = [json.loads(line) for line in label_agreement.LABELS.read_text(encoding="utf-8").splitlines()]
    for heldout_set in (17, 18):        # every message of both sets, labelled once by each reader
        lines = sorted(entry["line"] for entry in labelled if entry["set"] == heldout_set)
        assert lines == list(range(len(label_agreement.collectors_labels(heldout_set))))
