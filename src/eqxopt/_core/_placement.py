"""Outputs placed like the inputs they replace: each new parameter (and each update)
with its parameter's sharding, each new state leaf with its old leaf's sharding.

Without this, XLA's sharding propagation is free to choose the outputs' shardings:
with the parameters replicated and the state split over a mesh axis (ZeRO-1), the new
parameters came back split like the state, and donated buffers could not be reused
(their outputs were placed differently). Two cases:

- Meshes with Explicit axes carry the sharding in each array's type, so the traced
  entry reads it from its inputs and reshards each output to it (also inside a
  user's own `jit`).
- On Auto meshes the traced values know nothing of their placement, so `update` and
  `step` read the concrete inputs' shardings before the call (`signature`, only in a
  process with several devices, and only for inputs that span several devices) and
  the entry constrains each output to its input's sharding; the signature is part of
  the compiled function's cache key (`entry_for`).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax

from .._native import _compat
from . import _jax_api

_SINGLE = jax.sharding.SingleDeviceSharding
_several_devices: list[bool] = []


def _multi_device() -> bool:
    if not _several_devices:
        _several_devices.append(jax.device_count() > 1)
    return _several_devices[0]


def _spread(x: Any) -> Any:
    # Only arrays placed across several devices need their placement restated; a
    # tracer (inside a user's trace) has no concrete sharding to read.
    if _compat.is_tracer(x):
        return None
    sharding = getattr(x, "sharding", None)
    if sharding is None or type(sharding) is _SINGLE:
        return None
    if not isinstance(sharding, jax.sharding.Sharding) or len(sharding.device_set) < 2:
        return None
    return sharding


def signature(*trees: Any) -> tuple[tuple[Any, ...], ...] | None:
    """Per tree, per leaf (`jax.tree.leaves`), the sharding of that leaf where it
    spans several devices, else `None`; `None` when no leaf does (a one-device
    process: nothing is read)."""
    if not _multi_device():
        return None
    out = tuple(tuple(map(_spread, jax.tree.leaves(tree))) for tree in trees)
    if not any(s is not None for group in out for s in group):
        return None
    return out


_entries: dict[tuple[Callable, Any], Callable] = {}


def entry_for(entry: Callable, placement: Any) -> Callable:
    """`entry` with `placement=` bound: one object per placement, so the compiled
    functions are cached per placement as they are per entry."""
    if placement is None:
        return entry
    key = (entry, placement)
    fn = _entries.get(key)
    if fn is None:
        fn = _entries[key] = functools.partial(entry, placement=placement)
    return fn


def _is_none(x: Any) -> bool:
    return x is None


def keep(outs: Any, ins: Any, shardings: tuple[Any, ...] | None) -> Any:
    """Inside the trace: `outs` (a tree shaped like `ins`, `None` where no output)
    with each array leaf placed like the leaf of `ins` at its place: resharded to
    its type's sharding on an Explicit mesh, else constrained to `shardings` (the
    concrete inputs' shardings, leaf by leaf, from `signature`)."""
    in_leaves, in_def = jax.tree.flatten(ins, is_leaf=_is_none)
    out_leaves, out_def = jax.tree.flatten(outs, is_leaf=_is_none)
    if in_def != out_def:
        return outs
    present = [x for x in in_leaves if x is not None]
    if shardings is None or len(shardings) != len(present):
        shardings = (None,) * len(present)
    by_leaf = iter(shardings)
    placed = []
    for x, y in zip(in_leaves, out_leaves):
        sharding = None if x is None else next(by_leaf)
        if not isinstance(x, jax.Array) or not isinstance(y, jax.Array):
            placed.append(y)
            continue
        if x.shape != y.shape:
            placed.append(y)
            continue
        typed = _jax_api.explicit_sharding(x)
        if typed is not None:
            y = _jax_api.reshard(y, typed)
        elif sharding is not None:
            y = jax.lax.with_sharding_constraint(y, sharding)
        placed.append(y)
    return jax.tree.unflatten(out_def, placed)
