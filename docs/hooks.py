"""mkdocs hooks: pages that are files elsewhere in the repository, and the version.

- The home page is README.md, the benchmark notes are benchmarks/README.md, the
  changelog is CHANGELOG.md and the contributing page CONTRIBUTING.md, read at
  build time so each has one source. Their
  relative links are rewritten to the site's: `docs/x.md` -> `x.md`,
  `benchmarks/README.md` -> `benchmarks.md`; an image outside docs/ (the benchmark
  chart) is added to the site under its repository path; a link to another file of
  the repository becomes that path in code.
- The header shows the version of pyproject.toml next to the site's name.
- Formulas (what pymdownx.arithmatex marks) are typeset with KaTeX when the site is
  built (katex/render.js, KaTeX from the npm registry: `make docs` installs it),
  and the site carries KaTeX's stylesheet and fonts: no page loads anything from
  the network, and a page shows its formulas without JavaScript. The search index
  gets the typeset text, not the LaTeX source.
"""

import atexit
import html
import json
import pathlib
import posixpath
import re
import subprocess

import tomllib
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
# page in docs/ -> the repository file it shows (the page holds only a comment)
INCLUDED = {
    "index.md": "README.md",
    "benchmarks.md": "benchmarks/README.md",
    "changelog.md": "CHANGELOG.md",
    "contributing.md": "CONTRIBUTING.md",
}
PAGE_OF = {source: page for page, source in INCLUDED.items()}
# files outside docs/ that included pages show (copied under their repository path)
ASSETS = ["benchmarks/results.png", "examples/results/lowbit_lm.png"]
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def on_config(config):
    with open(ROOT / "pyproject.toml", "rb") as file:
        version = tomllib.load(file)["project"]["version"]
    config["site_name"] = f"{config['site_name']} {version}"
    return config


def on_files(files, config):
    for path in ASSETS:
        files.append(
            File.generated(config, path, abs_src_path=str(ROOT / path))  # type: ignore[arg-type]
        )
    # KaTeX's stylesheet and its fonts (the stylesheet names them relative to itself)
    dist = _katex() / "dist"
    for source in [dist / "katex.min.css", *sorted((dist / "fonts").glob("*.woff2"))]:
        path = f"{KATEX_ASSETS}/{source.relative_to(dist).as_posix()}"
        files.append(File.generated(config, path, abs_src_path=str(source)))  # type: ignore[arg-type]
    return files


def _rewrite(text: str, source: str) -> str:
    base = posixpath.dirname(source)

    def link(match: re.Match) -> str:
        bang, label, target = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
            return match.group(0)  # a URL or an anchor on the same page
        path, _, anchor = target.partition("#")
        path = posixpath.normpath(posixpath.join(base, path))
        anchor = f"#{anchor}" if anchor else ""
        if path in PAGE_OF:
            return f"{bang}[{label}]({PAGE_OF[path]}{anchor})"
        if path.startswith("docs/"):
            return f"{bang}[{label}]({path[len('docs/') :]}{anchor})"
        if path in ASSETS:
            return f"{bang}[{label}]({path})"
        if (ROOT / path).exists() and not bang:
            return f"{label} (`{path}`)"  # a source file, not part of the site
        return match.group(0)  # left for mkdocs --strict to report

    return _LINK.sub(link, text)


# ------------------------------------------------------------------ formulas

KATEX_DIR = ROOT / "katex"
KATEX_ASSETS = "assets/katex"
# What pymdownx.arithmatex (generic) writes: \(...\) in a span, \[...\] in a div.
_FORMULA = re.compile(
    r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S
)
_renderer: subprocess.Popen | None = None
_typeset: dict[tuple[str, bool], str] = {}


def _katex() -> pathlib.Path:
    package = KATEX_DIR / "node_modules" / "katex"
    if not (package / "dist" / "katex.min.css").is_file():
        raise PluginError(
            "KaTeX is not installed: `make docs` installs it "
            "(npm ci --prefix katex, from katex/package-lock.json)"
        )
    return package


def _stop() -> None:
    global _renderer
    if _renderer is not None:
        _renderer.stdin.close()  # type: ignore[union-attr]
        _renderer.wait(timeout=30)
        _renderer = None


def _render(tex: str, display: bool, where: str) -> str:
    global _renderer
    key = (tex, display)
    if key not in _typeset:
        if _renderer is None:
            _katex()
            _renderer = subprocess.Popen(
                ["node", str(KATEX_DIR / "render.js")],
                cwd=KATEX_DIR,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            atexit.register(_stop)
        request = json.dumps({"tex": tex, "display": display})
        _renderer.stdin.write(request + "\n")  # type: ignore[union-attr]
        _renderer.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(_renderer.stdout.readline())  # type: ignore[union-attr]
        if "error" in answer:
            raise PluginError(
                f"{where}: KaTeX cannot typeset {tex!r}: {answer['error']}"
            )
        # The LaTeX source (KaTeX's MathML annotation) stays out of the search
        # index.
        _typeset[key] = answer["html"].replace(
            '<span class="katex-mathml">',
            '<span class="katex-mathml" data-search-exclude>',
        )
    return _typeset[key]


def on_page_content(content, page, config, files):
    def typeset(match: re.Match) -> str:
        tag, opening, tex = match.groups()
        display = opening == "["
        formula = _render(html.unescape(tex.strip()), display, page.file.src_uri)
        # A displayed formula's typeset text is a jumble out of its layout: it stays
        # out of the search index, where an inline one reads as text (`t=step+1`).
        exclude = " data-search-exclude" if display else ""
        return f'<{tag} class="arithmatex"{exclude}>{formula}</{tag}>'

    return _FORMULA.sub(typeset, content)


def on_post_build(config):
    _stop()
    # KaTeX's zero-width spaces would show in the search results' excerpts.
    index = pathlib.Path(config["site_dir"]) / "search" / "search_index.json"
    if index.is_file():
        index.write_text(index.read_text().replace("\\u200b", ""))


def on_page_markdown(markdown, page, config, files):
    source = INCLUDED.get(page.file.src_uri)
    if source is None:
        return markdown
    return _rewrite((ROOT / source).read_text(), source)
