"""Keyword arguments a constructor does not take, each with the name to use instead
(read by `_checks.refuse_renamed`, which refuses them together with optax's
spellings in one error)."""

import difflib
import functools
import inspect
from collections.abc import Mapping
from typing import Any

# Spellings from other libraries (torch.optim, optax's aliases) that no eqxopt class
# takes, and eqxopt's names for them, offered where the class takes those names.
COMMON_SPELLINGS: Mapping[str, tuple[str, ...]] = {
    "lr": ("learning_rate",),
    "betas": ("b1", "b2"),
    "beta1": ("b1",),
    "beta2": ("b2",),
    "beta": ("b1",),
    "epsilon": ("eps",),
    "wd": ("weight_decay",),
}


@functools.cache
def accepted_keywords(cls: type) -> tuple[str, ...] | None:
    """The keyword arguments `cls(...)` takes, in order, or `None` where it takes
    any."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return tuple(
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def suggestion(key: str, accepted: tuple[str, ...]) -> str:
    """What to write instead of `key`, in words: `use learning_rate=`."""
    names = COMMON_SPELLINGS.get(key.lower(), ())
    if names and all(name in accepted for name in names):
        return "use " + " and ".join(f"{name}=" for name in names)
    close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
    if close:
        return f"use {close[0]}="
    if not accepted:
        return "it takes no keyword arguments"
    return "not an argument; the arguments are " + ", ".join(
        f"{name}=" for name in accepted
    )


def unknown_keywords(
    cls: type, kwargs: Mapping[str, Any], known: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """`(key, advice)` for each keyword of `kwargs` that `cls` does not take (those
    in `known` are answered elsewhere), in the order given."""
    accepted = accepted_keywords(cls)
    if accepted is None or kwargs.keys() <= set(accepted):
        return []
    return [
        (key, suggestion(key, accepted))
        for key in kwargs
        if key not in accepted and key not in known
    ]
