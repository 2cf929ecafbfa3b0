"""The triage page's links each open a section that exists in the chapter they name."""
import re
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from course_utils.explain import heading_anchor

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
SAFE = "!$&'()*+,;=:@/?-._~"
LINK = re.compile(r"\]\((\d\d_\w+)\.ipynb#heading=((?:[^()\s]|\([^()\s]*\))+)\)")   # balanced () as CommonMark


def _headings(stem: str) -> list[str]:
    text = (NOTEBOOKS / f"{stem}.py").read_text()
    return [m.group(1).strip() for m in re.finditer(r"^# #{1,6} (.+)$", text, flags=re.MULTILINE)]


def _links() -> list[tuple[str, str]]:
    return LINK.findall((NOTEBOOKS / "triage.py").read_text())


def test_the_triage_table_links_every_chapter():
    assert {stem[:2] for stem, _ in _links()} == {"01", "02", "03", "04", "05", "06", "07"}


@pytest.mark.parametrize("stem, anchor", _links(), ids=lambda v: unquote(v)[:40])
def test_each_triage_link_opens_an_existing_heading(stem, anchor):
    anchors = {quote(heading_anchor(h), safe=SAFE): h for h in _headings(stem)}
    assert anchor in anchors, (f"triage.py links {stem}.ipynb#heading={anchor}, which no heading of that "
                               f"chapter produces; its headings: {list(anchors.values())}")
