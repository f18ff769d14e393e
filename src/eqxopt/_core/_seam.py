"""The seam between the entry points (`update`, `step`) and the per-leaf engine.

An entry traces the transform through `run_update` or `run_step`, which tell the
engine (`map_leaves`) whether its outputs may overwrite its inputs (a donated entry)
and whether the updates are only going to be applied (`step`). In a `step`, the
engine may then form some leaves' new parameters itself, in the pass that makes
their updates (the native kernels do); it hands each such pair (update, new
parameter) back here, and `run_step` uses the new parameter wherever that very
update reaches the apply unchanged (a chained transform that rescales it makes a
new array, which is applied as usual). Nothing else in eqxopt sees these pairs.
"""

import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jaxtyping import PyTree

from ._tree import apply_update, is_none


@dataclasses.dataclass
class Entry:
    """One trace of an entry point, as the engine sees it.

    - `in_place`: the outputs may overwrite the inputs (`donate=True`).
    - `applying`: the updates are only applied (`step`), so the engine may form
      the new parameters itself and `add_applied` them.
    """

    in_place: bool
    applying: bool
    # id(update) -> (update, new parameter); the update is kept, so the id stays its.
    applied: dict[int, tuple[Any, Any]] = dataclasses.field(
        default_factory=dict, init=False
    )

    def add_applied(self, update: Any, param: Any) -> None:
        """`param` is the parameter `update` makes (`p + update`, in `p`'s dtype)."""
        self.applied[id(update)] = (update, param)

    def param_for(self, update: Any) -> Any:
        """The new parameter formed with this very `update`, or `None`."""
        hit = self.applied.get(id(update))
        return hit[1] if hit is not None and hit[0] is update else None


_current: contextvars.ContextVar[Entry | None] = contextvars.ContextVar(
    "eqxopt_entry", default=None
)


def current() -> Entry | None:
    """The entry being traced (`None` outside `update`/`step`, such as in a
    transform called directly)."""
    return _current.get()


def _traced(entry: Entry, transform: Callable[[], Any]) -> Any:
    token = _current.set(entry)
    try:
        return transform()
    finally:
        _current.reset(token)


def run_update(transform: Callable[[], Any], *, in_place: bool) -> Any:
    """`transform()` (returning `(updates, state)`) traced for `update`."""
    return _traced(Entry(in_place=in_place, applying=False), transform)


def run_step(
    transform: Callable[[], tuple[PyTree, Any]], params: PyTree, *, in_place: bool
) -> tuple[PyTree, Any]:
    """`(new_params, state)` for `step`, from `transform()` returning `(updates,
    state)`: each new parameter is the one the engine formed with that leaf's
    update, or `apply_updates`'s sum."""
    entry = Entry(in_place=in_place, applying=True)
    updates, state = _traced(entry, transform)

    def apply(u: Any, p: Any) -> Any:
        new = None if u is None else entry.param_for(u)
        return apply_update(u, p) if new is None else new

    return jax.tree.map(apply, updates, params, is_leaf=is_none), state
