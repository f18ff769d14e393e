"""README is the front door (and the site's home page): its Python snippets run as
written, in order, in one namespace, and it stays short."""

import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"
# optax's and Equinox's front pages are one or two screens; details live in docs/.
MAX_LINES = 250


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet that writes a file writes it here
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    # README is the front page; the longer examples are in docs/ (tests/test_docs.py)
    assert len(blocks) >= 4
    # Nothing is given to the first snippet: a reader copies it as it is.
    namespace: dict = {"__name__": "readme"}
    for index, block in enumerate(blocks):
        try:
            exec(compile(block, f"README block {index}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"README block {index} failed:\n{block}") from error


def test_readme_fits_on_a_few_screens():
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES})"


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_install_holds_user_commands_and_make_test_says_how_long():
    """A user's install section installs the library; the commands for working on
    eqxopt are in CONTRIBUTING.md, and README says what `make test` costs."""
    readme = README.read_text()
    install = _section(readme, "Install")
    assert "pip install" in install
    assert "make " not in install and "TEST_CACHE" not in install
    commands = _section(readme, "Two commands")
    assert re.search(r"`make test` takes about \d+ minutes on a quiet 2-core", commands)
    assert "CONTRIBUTING.md" in commands
    contributing = (README.parent / "CONTRIBUTING.md").read_text()
    for command in ("make test-slow", "make lint", "make docs", "make bench"):
        assert command in contributing
        assert command not in readme
