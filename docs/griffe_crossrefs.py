"""A griffe extension for the API reference: a public name in a docstring links to its
entry.

Docstrings name other entries as inline code (`` `Adam` ``, `` `eqxopt.Chain` ``).
Each such code span, outside fenced code blocks, becomes an autorefs link to the
entry (`[`Adam`][eqxopt.Adam]`), which mkdocs-autorefs resolves on whichever page the
entry is. Only names of `eqxopt.__all__` are linked, and every one of them has an
entry (tests/test_site.py checks it), so the strict build finds every target. An
entry's own name is left as text.
"""

import re
from typing import Any

import griffe

import eqxopt

PUBLIC = frozenset(eqxopt.__all__)
# A fenced code block, kept as it is (examples are code, not prose).
_FENCE = re.compile(r"^([ \t]*)```.*?^\1```[ \t]*$", re.S | re.M)
# An inline code span holding only a name, possibly qualified by `eqxopt.`.
_NAME_SPAN = re.compile(r"(?<![`\[])`(eqxopt\.)?([A-Za-z_]\w*)`(?![`\]])")


def _link_names(text: str, own: str) -> str:
    def link(match: re.Match) -> str:
        name = match.group(2)
        if name not in PUBLIC or name == own:
            return match.group(0)
        return f"[{match.group(0)}][eqxopt.{name}]"

    pieces, end = [], 0
    for fence in _FENCE.finditer(text):
        pieces.append(_NAME_SPAN.sub(link, text[end : fence.start()]))
        pieces.append(fence.group(0))
        end = fence.end()
    pieces.append(_NAME_SPAN.sub(link, text[end:]))
    return "".join(pieces)


def _walk(obj: griffe.Object, own: str) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _link_names(obj.docstring.value, own)
    for member in obj.members.values():
        if isinstance(member, griffe.Object) and member.parent is obj:
            _walk(member, own)


class LinkPublicNames(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for name, member in pkg.members.items():
            if name in PUBLIC:
                if isinstance(member, griffe.Alias):
                    member = member.final_target
                if isinstance(member, griffe.Object):
                    _walk(member, name)
