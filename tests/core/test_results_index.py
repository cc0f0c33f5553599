"""The measurements as a record (docs/results/README.md): every page of docs/results/ has a row
in its index and every row names a page that exists; no script lives under docs/; the README
stays a guide of at most 10 KB."""

from __future__ import annotations

import re

from helpers import REPO

RESULTS = REPO / "docs" / "results"


def index_links() -> list[str]:
    rows = [line for line in (RESULTS / "README.md").read_text().splitlines() if line.startswith("| [")]
    return [re.match(r"\| \[[^\]]+\]\(([^)]+)\)", row).group(1) for row in rows]


def test_every_results_page_has_a_row_and_every_row_a_page():
    links = index_links()
    pages = {p.name + "/README.md" for p in RESULTS.iterdir() if p.is_dir()}
    pages |= {p.name for p in RESULTS.glob("*.md") if p.name != "README.md"}
    assert sorted(pages - set(links)) == [], "pages without a row in docs/results/README.md"
    assert [link for link in links if not (RESULTS / link).is_file()] == [], "rows whose page does not exist"
    assert len(links) == len(set(links)), "a page has two rows"


def test_no_python_under_docs():
    assert sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.py")) == [], "scripts belong in benchmarks/"


def test_the_readme_stays_a_guide():
    assert len((REPO / "README.md").read_bytes()) <= 10_000
