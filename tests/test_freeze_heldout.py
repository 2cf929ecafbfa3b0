"""tools/freeze_heldout.py applies the held-out rubric's mechanical rules when a set's parts are merged."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import freeze_heldout  # noqa: E402


def entry(message: str, source: str, part: str = "A") -> dict:
    return {"message": message, "source": source, "chapter": 2, "topic": "t", "torch_version": None,
            "platform": None, "wrapper": None, "year": 2024, "query": "q", "part": part}


def test_freezing_removes_used_threads_seen_wordings_third_copies_and_third_repositories(tmp_path):
    development = json.loads((ROOT / "tests" / "data" / "error_messages.jsonl").read_text().splitlines()[0])
    capacitor = "RuntimeError: the flux capacitor number {} of the rack ran out of plutonium pellets before the jump"
    warp = "TypeError: warp drive coils refuse to align while the shields are still raised around the hull"
    holodeck = "ValueError: the holodeck safety protocols were disabled by an unknown officer during the night"
    transporter = "KeyError: transporter buffer lost the pattern of the away team somewhere between the two ships"
    part_a = [entry(capacitor.format(1), "https://github.com/a/one/issues/1"),
              entry(warp, "https://github.com/a/one/issues/2"),
              entry(holodeck, "https://github.com/a/one/issues/3"),                  # a third of a/one
              entry(transporter, "https://github.com/a/one/issues/2"),               # its thread again
              entry(development["message"], "https://github.com/b/two/issues/9")]    # a development wording
    part_b = [entry(capacitor.format(2), "https://github.com/c/three/issues/4", "B"),  # 2nd copy of a wording
              entry(capacitor.format(3), "https://github.com/d/four/issues/5", "B"),   # its 3rd copy
              entry(transporter, "https://github.com/A/One/issues/6", "B"),          # a/one again, other case
              entry(transporter, development["source"], "B"),                       # a development thread
              entry(transporter, "https://example.com/x", "B")]                      # not a GitHub thread
    parts = []
    for name, rows in (("part_A.jsonl", part_a), ("part_B.jsonl", part_b)):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
        parts.append(tmp_path / name)
    kept, removed = freeze_heldout.freeze(parts, tmp_path / "out.jsonl")
    assert [e["source"].rsplit("/", 1)[-1] for e in kept] == ["1", "2", "4"]
    assert removed == {"more than 2 of one repository": 2, "thread already used": 2,
                       "wording in the development corpus": 1, "more than 2 of one wording": 1, "malformed": 1}
