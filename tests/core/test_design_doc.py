"""Every "docs/design.md invariant N" cited in the repository names an invariant that exists."""

from __future__ import annotations

import re

from helpers import REPO

CITATION = re.compile(r"docs/design\.md,?\s+invariants?\s+(\d+(?:(?:,\s*|\s+and\s+|\s+to\s+)\d+)*)")


def invariant_numbers() -> set[int]:
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("\n## Invariants\n", 1)[1].split("\n## ", 1)[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", section, flags=re.MULTILINE)]
    assert numbers == list(range(1, len(numbers) + 1)), "invariants are numbered 1, 2, 3, ... in order"
    return set(numbers)


def cited_numbers(text: str) -> set[int]:
    cited = set()
    for match in CITATION.finditer(text):
        spec = match.group(1)
        for low, high in re.findall(r"(\d+)\s+to\s+(\d+)", spec):
            cited |= set(range(int(low), int(high) + 1))
        cited |= {int(n) for n in re.findall(r"\d+", spec)}
    return cited


def test_every_cited_invariant_exists():
    known = invariant_numbers()
    files = [p for d in ("dflash", "tests", "scripts", "docs", "hydra_plugins") for p in (REPO / d).rglob("*") if p.is_file()]
    files.append(REPO / "README.md")
    missing, citing = {}, 0
    for path in files:
        if path.suffix not in {".py", ".md", ".yaml", ".toml"}:
            continue
        numbers = cited_numbers(path.read_text(encoding="utf-8", errors="replace"))
        citing += bool(numbers)
        if numbers - known:
            missing[str(path.relative_to(REPO))] = sorted(numbers - known)
    assert citing >= 10, "the citation pattern no longer matches how the code cites"
    assert not missing, f"cited invariants that docs/design.md does not have: {missing}"


def test_the_citation_pattern_reads_lists_and_ranges():
    assert cited_numbers("(docs/design.md invariants 3 to 6)") == {3, 4, 5, 6}
    assert cited_numbers("docs/design.md invariants 1, 3, 4 and 5") == {1, 3, 4, 5}
    assert cited_numbers("(docs/design.md invariant\n  4)") == {4}
