"""The seam between the entry points (`update`, `step`) and the per-leaf engine.

An entry traces its transform inside `traced`, which tells the engine (`map_leaves`)
whether its outputs may overwrite its inputs (a donated entry): only then may the
native kernels write in place. A donated entry also passes where its inputs live
(`placement`, read from the concrete arrays before tracing, and static data of the
compiled step), so that the kernels of sharded leaves can run per shard. Nothing
else crosses this seam; in particular the new parameters of a `step` come back
explicitly, as the result of `transform_step`.
"""

import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from .._native import _shard
from ._placement import Inputs

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One trace of an entry point, as the engine sees it.

    - `in_place`: the outputs may overwrite the inputs (`donate=True`).
    - `placement`: where the entry's inputs live (`placement`), or `None`.
    - `inputs`: the entry's inputs `(grads, params, state)` in this trace.
    - `grads_given`: the gradients were passed in as arrays, not computed in the
      program being traced (the step is its own program), so the native kernels
      need not wait for them (`_fused.waits`).
    - `params_given`: the caller passed the parameters (an `update(grads, state)`
      without them traces its transform on zeros shaped like the gradients; a
      transform that hands the parameters on, such as `FromOptax`, passes `None`
      there instead).
    """

    in_place: bool
    placement: Any = None
    inputs: Any = ()
    grads_given: bool = False
    params_given: bool = True


_current: contextvars.ContextVar[Entry | None] = contextvars.ContextVar(
    "eqxopt_entry", default=None
)


def current() -> Entry | None:
    """The entry being traced (`None` outside `update`/`step`, such as in a
    transform called directly)."""
    return _current.get()


def placement(inputs: Inputs | None) -> Any:
    """What a donated entry passes to `traced` of where its inputs live, from their
    shardings as read before the call (`inputs`, from `_placement.read`): `None`
    unless the call is donated and some inputs are sharded over a mesh of several
    devices; a pytree without leaves, whose static data keys the compiled step."""
    if inputs is None or not inputs.donated:
        return None
    return _shard.placement(inputs.leaves, inputs.shardings)


def typed_placement(inputs: Any, mesh: Any) -> Any:
    """`placement` for a donated entry inside a user's own `jit` on a mesh of
    Explicit axes (`mesh`), read from the types of `inputs` (its grads, params and
    state, traced)."""
    return _shard.typed_placement(jax.tree.leaves(inputs), mesh)


def traced(
    transform: Callable[[], _T],
    *,
    in_place: bool,
    placement: Any = None,
    inputs: Any = (),
    grads_given: bool = False,
    params_given: bool = True,
) -> _T:
    """`transform()`, traced for an entry whose outputs may (`in_place`) or may not
    overwrite its inputs; `placement` (from `placement`) says where `inputs` (the
    entry's grads, params and state, in this trace) live; `grads_given`,
    `params_given`: see `Entry`."""
    token = _current.set(Entry(in_place, placement, inputs, grads_given, params_given))
    try:
        return transform()
    finally:
        _current.reset(token)
