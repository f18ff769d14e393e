"""The documentation site builds as `make docs` builds it (`mkdocs build --strict`), and
what it shows is eqxopt's: every public name has an API entry, no entry prints a
docstring that is not eqxopt's (a builtin's, on a class attribute; `object.__init__`'s,
merged into a class), the header names the version, formulas are typeset, and the
examples page shows every script of `examples/`."""

import html
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import eqxopt

ROOT = pathlib.Path(__file__).parent.parent
# Text that inspection picks up from Python itself rather than from eqxopt.
BUILTINS = (float, int, bool, str, bytes, tuple, list, dict, set, frozenset, type)
NOT_EQXOPT = sorted(
    {(t.__doc__ or "").strip().splitlines()[0] for t in BUILTINS}
    | {"Initialize self.", "Create and return a new object."}
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=900,
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict failed (make test installs the docs extra):\n"
        f"{result.stdout}\n{result.stderr}"
    )
    return out


def _text(page: pathlib.Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


def _api_pages(site: pathlib.Path) -> list[pathlib.Path]:
    pages = sorted((site / "api").glob("*/index.html"))
    assert pages, "the site has no API reference pages"
    return pages


def test_api_reference_prints_no_text_of_python_itself(site):
    found = [
        f"{page.parent.name}: {text!r}"
        for page in _api_pages(site)
        for text in NOT_EQXOPT
        if text in _text(page)
    ]
    assert found == []


def test_api_reference_has_an_entry_for_every_public_name(site):
    anchors = set()
    for page in _api_pages(site):
        anchors |= set(re.findall(r'id="eqxopt\.(\w+)"', page.read_text()))
    assert [name for name in eqxopt.__all__ if name not in anchors] == []


def test_api_members_are_documented_methods(site):
    """An entry lists the members written for it (methods with a docstring), not
    the class attributes every optimizer declares for the engine."""
    members = []
    for page in _api_pages(site):
        members += re.findall(r'id="eqxopt\.(\w+\.\w+)"', page.read_text())
    engine = {"elementwise", "state_type", "moments", "decay_mask"}
    assert sorted(m for m in members if m.split(".")[1] in engine) == []
    for member in members:
        owner, name = member.split(".")
        obj = getattr(getattr(eqxopt, owner), name)
        assert callable(obj) or isinstance(obj, property), member


def test_api_entries_link_the_public_names_they_mention(site):
    """A public name written as inline code in a docstring (`Adam`) links to its
    entry, on the same page or another; code examples stay plain code."""
    targets, examples_with_links = [], []
    for page in _api_pages(site):
        source = page.read_text()
        examples_with_links += [
            page.parent.name
            for block in re.findall(r"<pre.*?</pre>", source, re.S)
            if "autorefs" in block
        ]
        for href in re.findall(r'<a class="autorefs[^"]*"[^>]*href="([^"]*)"', source):
            path, anchor = href.split("#")
            targets.append((page.parent.name, (page.parent / path).resolve(), anchor))
    assert examples_with_links == []
    for source_page, target, anchor in targets:
        assert f'id="{anchor}"' in (target / "index.html").read_text(), (
            f"{source_page} links to a missing entry {anchor}"
        )
    adam = (site / "api" / "adam").resolve()
    base = (site / "api" / "base").resolve()
    assert ("adam", adam, "eqxopt.Adam") in targets  # AdamW's "see `Adam`"
    assert ("transforms", base, "eqxopt.Chain") in targets  # across pages


def test_header_shows_the_version(site):
    header = re.search(
        r'class="md-header__topic">\s*<span class="md-ellipsis">\s*([^<]*?)\s*</span>',
        (site / "index.html").read_text(),
    )
    assert header is not None
    assert header.group(1) == f"eqxopt {eqxopt.__version__}"


def test_formulas_are_typeset(site):
    """Formulas in pages and docstrings are marked for KaTeX (pymdownx.arithmatex),
    and the page loads the script that typesets them."""
    for page in ("catalog", "api/adam", "api/schedules", "api/engine"):
        source = (site / page / "index.html").read_text()
        assert 'class="arithmatex"' in source, page
        assert "katex.min.js" in source and "javascripts/katex.js" in source, page


# Public classes whose formulas are still plain code blocks, each with the reason.
PLAIN_FORMULAS_ALLOWED = {
    "Shampoo": "converted separately",
    "SOAP": "converted separately",
    "PSGDKron": "converted separately",
    "SM3": "converted separately",
    "GaLore": "converted separately",
}
# A fenced block without a language (or "text") holding an assignment or update.
_PLAIN_FORMULA_BLOCK = re.compile(
    r"^[ \t]*```(?:text)?[ \t]*\n((?:(?![ \t]*```).*\n)*?)[ \t]*```", re.M
)
# An inline code span holding an equation with arithmetic, `u = g + wd * p`.
_INLINE_FORMULA = re.compile(r"`([^`\n]*\s=\s[^`\n]*[-+*/][^`\n]*)`")
_KATEX = re.compile(r"\$\$|(?<![$\w])\$[^$\n]+\$")


def _plain_formula(doc: str) -> str | None:
    """The first formula of a docstring written as code instead of for KaTeX."""
    for block in _PLAIN_FORMULA_BLOCK.findall(doc):
        if re.search(r"=|<-|\u2190", block):
            return block.strip().splitlines()[0]
    if not _KATEX.search(doc):
        inline = _INLINE_FORMULA.search(doc)
        if inline is not None:
            return inline.group(1)
    return None


def test_docstring_formulas_are_typeset():
    """A public class's formula is written for KaTeX ($$...$$ or $...$), not as a
    code block or, with no KaTeX anywhere in the docstring, an inline code span."""
    plain = {}
    for name in eqxopt.__all__:
        obj = getattr(eqxopt, name)
        if isinstance(obj, type):
            formula = _plain_formula(inspect.getdoc(obj) or "")
            if formula is not None:
                plain[name] = formula
    unexpected = {n: f for n, f in plain.items() if n not in PLAIN_FORMULAS_ALLOWED}
    assert unexpected == {}, f"formulas as code, not typeset: {unexpected}"
    typeset = sorted(set(PLAIN_FORMULAS_ALLOWED) - set(plain))
    assert typeset == [], f"typeset now: remove from PLAIN_FORMULAS_ALLOWED: {typeset}"


def test_examples_page_shows_every_script_and_its_plot(site):
    page = site / "examples" / "index.html"
    text = _text(page)
    for script in sorted((ROOT / "examples").glob("*.py")):
        first_line = script.read_text().split('"""')[1].splitlines()[0]
        assert f"examples/{script.name}" in text, script.name
        assert first_line in text, f"{script.name}'s source is not on the page"
    images = re.findall(r'<img[^>]+src="([^"]+)"', page.read_text())
    assert {pathlib.PurePosixPath(src).name for src in images} >= {
        "train_digits.png",
        "lowbit_lm.png",
    }
    for src in images:
        assert (page.parent / src).resolve().is_file(), src
