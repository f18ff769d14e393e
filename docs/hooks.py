"""mkdocs hooks: pages that are files elsewhere in the repository, and the version.

- The home page is README.md, the benchmark notes are benchmarks/README.md and the
  changelog is CHANGELOG.md, read at build time so each has one source. Their
  relative links are rewritten to the site's: `docs/x.md` -> `x.md`,
  `benchmarks/README.md` -> `benchmarks.md`; an image outside docs/ (the benchmark
  chart) is added to the site under its repository path; a link to another file of
  the repository becomes that path in code.
- The header shows the version of pyproject.toml next to the site's name.
"""

import pathlib
import posixpath
import re

import tomllib
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
# page in docs/ -> the repository file it shows (the page holds only a comment)
INCLUDED = {
    "index.md": "README.md",
    "benchmarks.md": "benchmarks/README.md",
    "changelog.md": "CHANGELOG.md",
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


def on_page_markdown(markdown, page, config, files):
    source = INCLUDED.get(page.file.src_uri)
    if source is None:
        return markdown
    return _rewrite((ROOT / source).read_text(), source)
