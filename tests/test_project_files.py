"""The files users look for next to the code (LICENSE, CHANGELOG.md, CITATION.cff)
exist and say what pyproject.toml says: the license, the version and the name."""

import pathlib
import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import eqxopt

ROOT = pathlib.Path(__file__).parent.parent
# The headings of the Apache License 2.0's terms, in order.
APACHE_2_SECTIONS = (
    "1. Definitions.",
    "2. Grant of Copyright License.",
    "3. Grant of Patent License.",
    "4. Redistribution.",
    "5. Submission of Contributions.",
    "6. Trademarks.",
    "7. Disclaimer of Warranty.",
    "8. Limitation of Liability.",
    "9. Accepting Warranty or Additional Liability.",
)


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def _cff_field(key: str) -> str:
    """A top-level scalar of CITATION.cff (its values here are plain scalars)."""
    text = (ROOT / "CITATION.cff").read_text()
    match = re.search(rf"^{key}:[ \t]*(.+?)[ \t]*$", text, re.M)
    assert match is not None, f"CITATION.cff has no top-level {key!r}"
    return match.group(1).strip("\"'")


def test_license_is_the_apache_2_text_pyproject_names():
    assert _project()["license"] == {"text": "Apache-2.0"}
    text = " ".join((ROOT / "LICENSE").read_text().split())
    assert text.startswith("Apache License Version 2.0, January 2004")
    positions = [text.find(section) for section in APACHE_2_SECTIONS]
    assert -1 not in positions, "LICENSE lacks a section of the Apache License 2.0"
    assert positions == sorted(positions), "LICENSE's sections are out of order"
    assert "END OF TERMS AND CONDITIONS" in text


def test_citation_names_the_project_version_and_license():
    project = _project()
    assert _cff_field("cff-version").startswith("1.2")
    assert _cff_field("version") == project["version"]
    assert _cff_field("license") == project["license"]["text"]
    assert _cff_field("title").split(":")[0] == project["name"]


def test_changelog_has_a_section_for_the_version():
    version = _project()["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog\n")
    headings = re.findall(r"^## (\S+)", changelog, re.M)
    assert headings, "CHANGELOG.md has no version section"
    assert headings[0] == version, "the newest section is not pyproject's version"
    assert eqxopt.__version__ == version
