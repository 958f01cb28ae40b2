"""The README is a front page that holds up: short, its commands parse, its links and the docs' links lead somewhere,
and the layout page names every package of harness/."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from harness.cli.main import build_parser
from tests.cli_runs import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: A Markdown link `[text](target)` whose target is not a web address.
LINK = re.compile(r"\[[^\]]*\]\((?!https?://|mailto:)([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of `page` (headings inside fenced code are none)."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (match := re.match(r"#+ (.*)", line)):
            found.add(slug(match.group(1).replace("`", "")))
    return found


def shown_commands(page: Path) -> list[str]:
    """The `$ attnbench ...` commands of a page's fenced blocks, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", page.read_text())
    return [line[len("$ attnbench "):] for line in text.splitlines() if line.startswith("$ attnbench ")]


def test_the_readme_is_a_front_page_of_at_most_200_lines():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for words in ("make bench", "make test", "make test-fast", "## Backends and plugins", "2026-11-29"):
        assert words in text, words


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_file() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.name} links to what is not there: {broken}"


def test_every_command_the_readme_shows_parses():
    commands = shown_commands(README)
    assert {c.split()[0] for c in commands} >= {"run", "recommend", "report"}, "the worked example goes from run to report"
    parser = build_parser()
    for command in commands:
        parser.parse_args(shlex.split(command))  # a UsageParser: a flag that is gone raises UserError naming it


def test_the_layout_page_names_every_package_of_harness():
    layout = (ROOT / "docs" / "layout.md").read_text()
    packages = sorted(p.parent.name for p in (ROOT / "harness").glob("*/__init__.py"))
    assert "history" in packages
    assert [name for name in packages if f"harness/{name}/" not in layout] == []
