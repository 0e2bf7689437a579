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


# The guide (the nav's first part) is read to get a task done: short pages, commands in code blocks where they can
# be copied whole, figures named as their readers know them. Measurements live in the second part.
GUIDE_WORDS = 1500
COMMAND_IN_CELL = re.compile(r"`(?:python3?|torchrun|pip|bash|echo|curl|git|mkdocs|tensorboard) [^`]*`")
HOST_CODENAME = re.compile(r"\b(?:Z[2-5]|SPR|ICX|CLX|SKX|EMR|GNR)\b")  # our shorthand for CPUs: say "AMD EPYC Zen 4"


def nav() -> list:
    import yaml

    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]


def pages_of(section) -> list[str]:
    """The files of a nav section, in order."""
    if isinstance(section, str):
        return [section]
    if isinstance(section, list):
        return [page for item in section for page in pages_of(item)]
    return [page for value in section.values() for page in pages_of(value)]


def guide_pages() -> list[Path]:
    return [DOCS / page for page in pages_of(nav()[0])]


def table_cells(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [cell.strip() for line in prose.splitlines() if line.lstrip().startswith("|") for cell in line.split("|")]


def test_the_nav_puts_the_guide_first_and_the_measurements_after_it():
    parts = [next(iter(part)) for part in nav()]
    assert parts == ["Guide", "Benchmarks and experiments"], parts
    guide = pages_of(nav()[0])
    assert guide[0] == "index.md" and {"concepts.md", "troubleshooting.md", "auto.md", "api.md"} <= set(guide)
    assert not [p for p in guide if p.startswith("experiments") or p == "results.md"], guide
    assert {"results.md", "experiments.md"} <= set(pages_of(nav()[1]))


def test_guide_pages_stay_under_their_word_limit():
    long = {name(p): n for p in guide_pages() if (n := len(p.read_text(encoding="utf-8").split())) > GUIDE_WORDS}
    assert not long, f"guide pages over {GUIDE_WORDS} words (move measurements to results.md): {long}"


def test_no_command_sits_in_a_table_cell():
    """A command in a cell wraps mid-token and cannot be copied: it goes in a code block under the table."""
    found = {}
    for page in [*PAGES, ROOT / "README.md"]:
        cells = [c for c in table_cells(page.read_text(encoding="utf-8")) if COMMAND_IN_CELL.search(c)]
        if cells:
            found[name(page) if page.is_relative_to(DOCS) else page.name] = cells[:3]
    assert not found, found


def test_guide_pages_and_the_readme_name_cpus_without_codenames():
    found = {name(p) if p.is_relative_to(DOCS) else p.name: HOST_CODENAME.findall(text)[:3]
             for p in [*guide_pages(), ROOT / "README.md"]
             if HOST_CODENAME.search(text := p.read_text(encoding="utf-8"))}  # fmt: skip
    assert not found, found
