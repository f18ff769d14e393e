"""Every count and figure has one source: the catalog's counts are those of
docs/make_catalog.py's table (which tests/test_docs.py holds to `eqxopt.__all__`),
and the benchmark tables of README.md and docs/performance.md are what
docs/make_figures.py writes from benchmarks/results.json."""

import pathlib
import re

import pytest

from helpers import load_script

ROOT = pathlib.Path(__file__).parent.parent
CATALOG = load_script("docs/make_catalog.py")
FIGURES = load_script("docs/make_figures.py")

_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
          "nine"]  # fmt: skip
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
          "seventeen", "eighteen", "nineteen"]  # fmt: skip
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
         "ninety"]  # fmt: skip
_WORD = (
    r"(?:" + "|".join(_TENS + _TEENS + _UNITS) + r")(?:-(?:" + "|".join(_UNITS) + "))?"
)
# "65 optimizers", "Fifty-five optimizers", "the 19 building blocks", "Optimizers (65)"
_COUNT = re.compile(
    rf"\b(\d+|{_WORD})\s+(?:eqxopt\s+)?(optimizers|building blocks)\b"
    r"|^#+\s*(Optimizers)\s*\((\d+)\)",
    re.I | re.M,
)


def _number(text: str) -> int:
    if text.isdigit():
        return int(text)
    words = text.lower().split("-")
    value = 0
    for word in words:
        if word in _TENS:
            value += 20 + 10 * _TENS.index(word)
        elif word in _TEENS:
            value += 10 + _TEENS.index(word)
        else:
            value += _UNITS.index(word)
    return value


def _texts() -> list[pathlib.Path]:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    return pages + sorted((ROOT / "docs").glob("**/*.md"))


def test_count_words_are_read_as_numbers():
    assert [_number(w) for w in ("65", "Fifty-five", "nineteen", "seven")] == [
        65,
        55,
        19,
        7,
    ]


@pytest.mark.parametrize("page", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_count_of_the_catalog_is_the_catalogs(page):
    counts = CATALOG.counts()
    found = []
    for match in _COUNT.finditer(page.read_text()):
        number, what = (
            (match.group(1), match.group(2))
            if match.group(1)
            else (
                match.group(4),
                match.group(3),
            )
        )
        found.append((what.lower(), _number(number)))
    assert [(w, n) for w, n in found if counts[w] != n] == [], (
        f"the catalog has {counts}"
    )


def test_the_counts_are_said_where_users_look():
    counts = CATALOG.counts()
    readme = (ROOT / "README.md").read_text()
    assert f"{counts['optimizers']} optimizers" in readme
    assert (
        f"### Optimizers ({counts['optimizers']})"
        in (ROOT / "CHANGELOG.md").read_text()
    )
    catalog = (ROOT / "docs" / "catalog.md").read_text()
    assert f"{counts['optimizers']} optimizers" in catalog


def test_the_changelog_names_every_optimizer_it_counts():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    names = [entry[0] for entry in CATALOG.CATALOG if entry[1] != "blocks"]
    assert [
        n for n in names if f"`{n}`" not in changelog and f"`{n}(" not in changelog
    ] == []


@pytest.mark.parametrize("page", FIGURES.PAGES, ids=lambda p: p.name)
def test_benchmark_figures_are_results_json(page):
    text = page.read_text()
    assert "<!-- figures: " in text
    assert text == FIGURES.render(page), (
        f"{page.name}'s figures are not benchmarks/results.json's: run "
        "`python docs/make_figures.py`"
    )


def test_figures_follow_the_results():
    """A figure moves with results.json: the tables are computed, not copied."""
    import json

    results = json.loads(FIGURES.RESULTS.read_text())
    model = results["train_step"][FIGURES.BIG]["variants"]["eqxopt helper native"]
    model["ratio"] = 9.876
    assert "| 9.88x the throughput" in FIGURES.readme(results)
    assert "| **9.88** |" in FIGURES.train_step(results)
