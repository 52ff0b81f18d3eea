"""Counts and lists that the docs state in prose match the registry ("fourteen" cannot go stale).

A count of schemes written as "all N registered schemes", "ships N schemes", a heading "The N
schemes", or certify's summary line "N schemes, ..." must equal ``len(ss.SCHEMES)``; every
registered scheme has a row in the README's scheme table and in the table of
``docs/choosing.md``, and a page in the mkdocs nav.
"""

from __future__ import annotations

import re
from pathlib import Path

import specsampling as ss

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
WORDS += " fifteen sixteen seventeen eighteen nineteen twenty"
NUMBERS = {word: n for n, word in enumerate(WORDS.split())}
COUNT = re.compile(
    r"(?i)(?:\ball (?P<a>\w+) registered|\bships (?P<b>\w+)|^#+ the (?P<c>\w+)) schemes\b"
    r"|^(?P<m>\d+) schemes, ",
    re.M,
)


def stated_counts(text: str) -> list[tuple[str, int | None]]:
    found = []
    for match in COUNT.finditer(text):
        word = next(w for w in match.group("a", "b", "c", "m") if w).lower()
        value = int(word) if word.isdigit() else NUMBERS.get(word)
        found.append((match[0], value))
    return found


def table_schemes(text: str) -> set[str]:
    """Scheme names in the first column of markdown tables (`` `name` `` or [`name`](...))."""
    return set(re.findall(r"^\| \[?`(\w+)`", text, re.M)) | set(
        re.findall(r"^\|[^|\n]*?, `(\w+)` \|", text, re.M)
    )


def test_stated_counts_match_the_registry() -> None:
    seen = 0
    for page in PAGES:
        for phrase, value in stated_counts(page.read_text()):
            seen += 1
            assert value == len(ss.SCHEMES), f"{page.relative_to(ROOT)}: {phrase!r}"
    assert seen >= 3


def test_counting_can_fail() -> None:
    text = "All nine registered schemes. The two schemes agree.\n## The eight schemes\n"
    assert stated_counts(text) == [
        ("All nine registered schemes", 9),
        ("## The eight schemes", 8),
    ]
    assert stated_counts("9 schemes, 1933 cases") == [("9 schemes, ", 9)]


def test_every_scheme_has_a_row_and_a_page() -> None:
    names = set(ss.SCHEMES)
    readme = table_schemes((ROOT / "README.md").read_text())
    choosing = table_schemes((ROOT / "docs" / "choosing.md").read_text())
    assert names <= readme, names - readme
    assert names <= choosing, names - choosing
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {name: name.removesuffix("_strong") for name in names}
    missing = [name for name, page in pages.items() if f"schemes/{page}.md" not in nav]
    assert not missing, missing
