"""User-facing text (README, benchmark notes, docs, docstrings) speaks of the library,
not of how the project is run: every issue or PR number it cites belongs to a named
project (optax, equinox, ...), no internal task names appear, and no sentence tells
the story of its development ("this stop", "the stop before")."""

import inspect
import pathlib
import re

import pytest

import eqxopt

ROOT = pathlib.Path(__file__).parent.parent
_PROJECTS = ("optax", "equinox", "jax", "torch", "pytorch", "flax")
_CITATION = re.compile(r"(\w+)\s+(?:issues?|PRs?)\s+#?\d+", re.I)
_INTERNAL = re.compile(r"\bseed[\s-]+0\d\d\b|\bissue\s+\d+\b", re.I)
# A "stop" is a stretch of development work: a reader of the docs has none.
_NARRATIVE = re.compile(
    r"\b(?:this|that|the|last|previous|later|earlier|an earlier)\s+stop(?:'s)?\b"
    r"|\bstops?\s+before\b",
    re.I,
)


def _texts() -> list[tuple[str, str]]:
    files = [ROOT / name for name in ("README.md", "CHANGELOG.md", "ARCHITECTURE.md")]
    files.append(ROOT / "benchmarks" / "README.md")
    files += sorted((ROOT / "docs").glob("**/*.md"))
    texts = [(str(f.relative_to(ROOT)), f.read_text()) for f in files if f.exists()]
    for name in dir(eqxopt):
        doc = inspect.getdoc(getattr(eqxopt, name))
        if not name.startswith("_") and doc:
            texts.append((f"eqxopt.{name}", doc))
    return texts


@pytest.mark.parametrize(("where", "text"), _texts(), ids=lambda x: x[:40])
def test_no_internal_issue_or_task_names(where, text):
    cited = {m.start(): m for m in _CITATION.finditer(text)}
    for match in _INTERNAL.finditer(text):
        # "issue 193" is fine inside "equinox issue 193"; a bare one is not.
        owner = next(
            (c for c in cited.values() if c.start() <= match.start() < c.end()), None
        )
        assert owner is not None and owner.group(1).lower() in _PROJECTS, (
            f"{where}: {text[max(0, match.start() - 40) : match.end() + 20]!r}"
        )


@pytest.mark.parametrize(("where", "text"), _texts(), ids=lambda x: x[:40])
def test_no_development_narrative(where, text):
    found = [
        text[max(0, match.start() - 40) : match.end() + 20]
        for match in _NARRATIVE.finditer(text)
    ]
    assert found == [], where
