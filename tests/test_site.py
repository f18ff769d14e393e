"""The documentation site builds as `make docs` builds it (`mkdocs build --strict`), and
what it shows is eqxopt's: every public name has an API entry, no entry prints a
docstring that is not eqxopt's (a builtin's, on a class attribute; `object.__init__`'s,
merged into a class), the header names the version, formulas are typeset when the
site is built, the examples page shows every script of `examples/`, and every code
block fits the content column. Then the built site is opened in headless Chromium,
served from this machine with every other address refused: no page asks the network
for anything or logs a JavaScript error, no code block is wider than its column at
1280 px, and a search finds what a reader looks for."""

import fcntl
import functools
import html
import http.server
import inspect
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

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
    """The site, built once per test run: under pytest-xdist, whose workers may
    each run some of this file's tests, the first worker to need it builds it in
    the directory the workers share, and the others wait for it and read it."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _build_site(tmp_path_factory.mktemp("site"))
    shared = tmp_path_factory.getbasetemp().parent  # this run's, every worker's
    out, built = shared / "site", shared / "site.built"
    with open(shared / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not built.exists():
            shutil.rmtree(out, ignore_errors=True)  # a build that failed
            _build_site(out)
            built.touch()
    return out


def _build_site(out: pathlib.Path) -> pathlib.Path:
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


def _pages(site: pathlib.Path) -> list[pathlib.Path]:
    return sorted(site.rglob("index.html"))


def test_formulas_are_typeset(site):
    """Formulas in pages and docstrings are typeset by KaTeX when the site is built
    (no LaTeX left for a script to typeset), with KaTeX's stylesheet and fonts in
    the site itself."""
    for page in ("catalog", "api/adam", "api/schedules", "api/engine"):
        source = (site / page / "index.html").read_text()
        assert 'class="katex"' in source, page
        assert "assets/katex/katex.min.css" in source, page
    for page in _pages(site):
        formulas = re.findall(
            r'class="arithmatex"[^>]*>(.{0,40})', page.read_text(), re.S
        )
        raw = [f for f in formulas if not f.startswith('<span class="katex')]
        assert raw == [], f"{page.relative_to(site)}: formulas not typeset: {raw}"
    css = (site / "assets" / "katex" / "katex.min.css").read_text()
    fonts = set(re.findall(r"url\((fonts/[\w-]+\.woff2)\)", css))
    assert fonts and all((site / "assets" / "katex" / f).is_file() for f in fonts)


def test_pages_load_nothing_from_another_host(site):
    """Every script, stylesheet and font a page loads is part of the site."""
    outside = []
    for page in _pages(site):
        source = page.read_text()
        for tag in re.findall(r"<(?:script|link|img)\b[^>]*>", source):
            url = re.search(r'(?:src|href)="([^"]+)"', tag)
            if url and re.match(r"^(?:[a-z]+:)?//", url.group(1)):
                if "<link" in tag and "stylesheet" not in tag and "icon" not in tag:
                    continue  # a link to another site, not something loaded
                outside.append(f"{page.relative_to(site)}: {tag}")
    assert outside == []


def test_search_index_holds_no_latex(site):
    """Search results show text: the LaTeX source of a formula stays out."""
    index = json.loads((site / "search" / "search_index.json").read_text())
    latex = re.compile(
        r"\\(?:frac|hat|beta|sqrt|mathrm|odot|left|right|operatorname)\b"
    )
    found = [doc["location"] for doc in index["docs"] if latex.search(doc["text"])]
    assert found == []


# The content column at 1280 px holds 80 characters of code: 656 px at 0.85 em of a
# 16 px font, in a monospace font whose characters are 0.6 em wide (Roboto Mono,
# DejaVu Sans Mono, Menlo); the browser test below measures it.
MAX_CODE_COLUMNS = 80


def test_code_blocks_fit_the_column(site):
    """No line of a code block (page, docstring example, signature, included
    script) is longer than the content column holds at 1280 px."""
    long = []
    for page in _pages(site):
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", page.read_text(), re.S):
            text = html.unescape(re.sub(r"<[^>]+>", "", block))
            long += [
                f"{page.parent.relative_to(site)}: {len(line)}: {line}"
                for line in text.splitlines()
                if len(line) > MAX_CODE_COLUMNS
            ]
    assert long == []


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


# ---------------------------------------------------------------- in a browser

# CI (.ci/run) installs Debian's chromium and sets this: there the browser checks
# must run, not skip.
REQUIRE_BROWSER = os.environ.get("EQXOPT_TEST_REQUIRE_BROWSER", "0") == "1"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _chromium() -> str | None:
    for name in (
        os.environ.get("EQXOPT_TEST_CHROMIUM"),
        "chromium",
        "chromium-browser",
    ):
        path = name and shutil.which(name)
        if path:
            return path
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request otherwise
        pass


@pytest.fixture(scope="module")
def browser_page(site):
    """A 1280 x 800 Chromium page, the site served on 127.0.0.1, every request to
    another address refused and recorded."""
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        reason = "needs playwright (the test extra) and Debian's chromium"
        if REQUIRE_BROWSER:
            pytest.fail(f"{reason}, and EQXOPT_TEST_REQUIRE_BROWSER=1")
        pytest.skip(reason)
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda request, address: None  # a cancelled request
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=CHROMIUM_FLAGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.base = base  # type: ignore[attr-defined]
        page.outside = []  # type: ignore[attr-defined]

        def route(request_route):
            url = request_route.request.url
            if url.startswith(base):
                request_route.continue_()
            else:
                page.outside.append(url)  # type: ignore[attr-defined]
                request_route.abort()

        page.route("**/*", route)
        yield page
        browser.close()
    server.shutdown()
    server.server_close()


# Code blocks wider than their column, with their longest line.
_WIDE_CODE = """() => [...document.querySelectorAll('.md-content pre > code')]
  .filter(code => code.scrollWidth > code.clientWidth + 1)
  .map(code => code.textContent.split('\\n')
    .reduce((a, line) => line.length > a.length ? line : a, ''))"""
# Whether a line of `n` characters fits a code block's column.
_FITS = """(n) => {
  const code = document.querySelector('.md-content pre > code');
  const line = document.createElement('span');
  line.textContent = 'x'.repeat(n);
  code.prepend(line, document.createElement('br'));
  const fits = code.scrollWidth <= code.clientWidth + 1;
  line.nextSibling.remove(); line.remove();
  return fits;
}"""


def test_every_page_works_offline_in_a_browser(site, browser_page):
    """Each page, opened in Chromium with no network: no request leaves this
    machine, no JavaScript error or failed load is logged, formulas are typeset,
    and every code block fits its column at 1280 px."""
    page = browser_page
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    found = {}
    for path in _pages(site):
        where = path.parent.relative_to(site).as_posix()
        errors.clear()
        page.goto(page.base + ("" if where == "." else where + "/"), wait_until="load")
        found[where] = {
            "errors": list(errors),
            "wide code": page.evaluate(_WIDE_CODE),
            "raw formulas": page.evaluate(
                "() => [...document.querySelectorAll('.arithmatex')]"
                ".filter(e => !e.querySelector('.katex')).length"
            ),
        }
    assert page.outside == []
    problems = {w: f for w, f in found.items() if any(f.values())}
    assert problems == {}
    # The column holds MAX_CODE_COLUMNS characters, and not many more.
    page.goto(page.base + "getting-started/", wait_until="load")
    assert page.evaluate(_FITS, MAX_CODE_COLUMNS)
    assert not page.evaluate(_FITS, MAX_CODE_COLUMNS + 5)


def test_search_finds_the_schedules_page_for_learning_rate(browser_page):
    page = browser_page
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(page.base, wait_until="load")
    # The search index is built in a web worker after the page loads, which on a
    # loaded machine can take a while: the query is typed again until results come.
    for _ in range(12):
        page.fill("input.md-search__input", "")
        page.fill("input.md-search__input", "learning rate")
        try:
            page.wait_for_selector(".md-search-result__item > a", timeout=10_000)
            break
        except PlaywrightTimeout:
            continue
    else:
        raise AssertionError("no search results for 'learning rate' within 2 minutes")
    first = page.eval_on_selector(".md-search-result__item > a", "a => a.href")
    assert first == page.base + "schedules/"
    excerpts = page.eval_on_selector_all(
        ".md-search-result__item", "items => items.map(i => i.innerText)"
    )
    assert not any(re.search(r"\\[a-z]+\{|\\\(", text) for text in excerpts)
