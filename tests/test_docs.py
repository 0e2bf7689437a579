"""The docs site as a reader meets it (docs/): every page has sections with headings, code that fits the column,
pictures that exist, and no paths of the machine a figure was measured on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if not p.name.endswith(".report.md"))  # (run reports: generated)
CODE_COLUMNS = 88
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|tmp|home|root|Users|var/folders)/")

RULES = ("headings", "code_columns", "machine_paths")


def name(page: Path) -> str:
    return str(page.relative_to(DOCS))


def breaks(rule: str, page: Path) -> list[str]:
    """What of `page` breaks `rule` (empty: it follows it)."""
    text = page.read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    if rule == "headings":
        return [] if re.search(r"^#{2,3} \S", prose, re.M) else ["no section headings (## or ###)"]
    if rule == "code_columns":
        code = [line for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S) for line in block.splitlines()]
        return [line for line in code if len(line) > CODE_COLUMNS]
    if rule == "machine_paths":
        return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]
    raise ValueError(rule)


@pytest.mark.parametrize("rule", RULES)
def test_every_page_follows_the_rule(rule):
    broken = {name(p): what[:3] for p in PAGES if (what := breaks(rule, p))}
    assert not broken, f"{rule}: {broken}"


def test_the_readme_and_the_benchmark_pages_name_no_machine_paths():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md"]  # (a script's documented default may be /tmp)
    found = {str(p.relative_to(ROOT)): breaks("machine_paths", p)[:3] for p in pages if breaks("machine_paths", p)}
    assert not found, found


def test_every_picture_a_page_shows_exists():
    missing = [(name(p), image) for p in PAGES
               for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", p.read_text(encoding="utf-8"))
               if not image.startswith("http") and not (p.parent / image).is_file()]  # fmt: skip
    assert not missing, missing


def test_the_home_page_starts_with_the_quick_start_and_a_start_here_table():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    assert text.index("python train.py +experiment=quickstart") < text.index("## I want to...")
    assert "| I want to... | start here |" in text
