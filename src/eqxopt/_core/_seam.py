"""The seam between the entry points (`update`, `step`) and the per-leaf engine.

An entry traces its transform inside `traced`, which tells the engine (`map_leaves`)
whether its outputs may overwrite its inputs (a donated entry): only then may the
native kernels write in place. Nothing else crosses this seam; in particular the new
parameters of a `step` come back explicitly, as the result of `transform_step`.
"""

import contextvars
import dataclasses
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One trace of an entry point, as the engine sees it.

    - `in_place`: the outputs may overwrite the inputs (`donate=True`).
    """

    in_place: bool


_current: contextvars.ContextVar[Entry | None] = contextvars.ContextVar(
    "eqxopt_entry", default=None
)


def current() -> Entry | None:
    """The entry being traced (`None` outside `update`/`step`, such as in a
    transform called directly)."""
    return _current.get()


def traced(transform: Callable[[], _T], *, in_place: bool) -> _T:
    """`transform()`, traced for an entry whose outputs may (`in_place`) or may not
    overwrite its inputs."""
    token = _current.set(Entry(in_place=in_place))
    try:
        return transform()
    finally:
        _current.reset(token)
