"""A cheaper way into compiled code than `eqx.filter_jit`, for `update` and `step`.

Two paths, both keyed so that new hyperparameter *values* (array leaves) reuse the
compiled function, and neither waits for the result:

- The direct path, for the common case where every leaf is an array: the first
  argument (the optimizer, usually the same object call after call) is flattened
  once and remembered by identity, its scalar leaves stacked into one array per
  dtype (fewer arrays to cross into the compiled code); the other arguments go to a
  cached `jax.jit` as they are, so JAX's C++ code flattens them and unflattens the
  outputs. A leaf that
  is not an array (a function, a string) or may be a Python number makes the direct
  path step aside, and those argument types then always take the general path.
- The general path, as `eqx.filter_jit` treats arguments: the arguments are
  flattened in Python; array leaves become the traced inputs and every other leaf
  (activation functions, Python scalars, ...) becomes part of the cache key.

For trees of thousands of leaves, `eqxopt.pack` is the way to keep both the step and
its compile fast (`set_split_compilation` is a deprecated no-op).

Inside someone else's trace the direct path simply nests in the outer `jit` (the
general path calls the function), and the enclosing `jit` compiles it.
"""

import dataclasses
import functools
import itertools
import struct
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._native import _compat

_DYNAMIC = object()  # marks the position of an array leaf in a cache key


@functools.cache
def _all_arrays() -> frozenset[type]:
    # Found on first use, not at import (see `_compat.array_type`).
    return frozenset({_compat.array_type()})


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
    """A non-array leaf in a cache key (`static(obj)`): equal only to a leaf of the
    same type and the same value, bit for bit (`True`, `1`, `1.0` and an `IntEnum`
    member with value 1 compare equal in Python, as do `0.0` and `-0.0`, and NaN
    equals nothing); an unhashable leaf is equal only to itself. `obj` is the leaf."""

    key: Hashable
    obj: Any = dataclasses.field(compare=False)


def static(obj: Any) -> Static:
    try:
        hash(obj)
    except TypeError:
        return Static(("id", id(obj)), obj)  # `obj` is kept alive by the `Static`
    if isinstance(obj, float):
        return Static((type(obj), struct.pack("<d", obj)), obj)
    if isinstance(obj, complex):
        return Static((type(obj), struct.pack("<dd", obj.real, obj.imag)), obj)
    return Static((type(obj), obj), obj)


def _is_dynamic(leaf: Any) -> bool:
    # NumPy scalars are arrays, as for `eqx.is_array` (and the direct path).
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


class Carried:
    """What a traced function returns besides its arrays (their tree structure,
    leaves that are not arrays), carried out of `jax.jit` as a pytree node without
    leaves: JAX keeps each compiled program's output structure with that program,
    so every call gets back what the trace it runs produced. (Recorded once per
    cache key instead, a program traced for other shapes, such as another batch
    size, would hand back the values of whichever trace came last.)"""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


jax.tree_util.register_pytree_node(
    Carried, lambda c: ((), c.value), lambda value, _: Carried(value)
)


# Equinox's runtime errors (`eqx.error_if` in a loss or any function traced into a
# step) fail the program as a host callback; `eqx.filter_jit` turns that back into
# `eqx.EquinoxRuntimeError` with the user's message, and eqxopt's compiled calls do
# the same (`raise_equinox_error`). Equinox marks the failure with the name of its
# internal exception, followed by its message and a banner.
_EQUINOX_MARK = "_EquinoxRuntimeError: "
_EQUINOX_BANNER = "\n\n\n--------------------"


def raise_equinox_error(error: Exception) -> None:
    """Raises `eqx.EquinoxRuntimeError` with the message of the `eqx.error_if` that
    failed a compiled call with `error`, as `eqx.filter_jit` would; returns when
    `error` is something else."""
    text = str(error)
    start = text.find(_EQUINOX_MARK)
    if start < 0:
        return
    message = text[start + len(_EQUINOX_MARK) :]
    message = message.split(_EQUINOX_BANNER, 1)[0].strip()
    raise eqx.EquinoxRuntimeError(message) from None


@dataclasses.dataclass(eq=False)
class _Compiled:
    """One jitted program for one tree structure and one set of static leaves
    (`statics`: per leaf, the leaf or `_DYNAMIC`; `None`: every leaf is an array).

    Static leaves stay out of the program: where an output is one of the input
    leaves (a parameter passed through), each call returns the caller's own object
    at that place, never the one seen when tracing, which is only equal to it."""

    fn: Callable
    treedef: Any
    statics: list[Any] | None
    donate: tuple[int, ...]
    jitted: Any = None

    def __post_init__(self) -> None:
        self.jitted = jax.jit(self.flat_fn, donate_argnums=self.donate)

    def flat_fn(self, *groups: list[Any]) -> tuple[list[Any], Carried]:
        """The arrays of `fn`'s outputs and, `Carried`, their tree structure and,
        per output leaf (`None`: every output is an array), `_DYNAMIC`, the index
        of the input leaf it is, or `(obj,)` for an object made by `fn`."""
        dynamic = [x for group in groups for x in group]
        if self.statics is None:
            leaves = dynamic
        else:
            it = iter(dynamic)
            leaves = [next(it) if s is _DYNAMIC else s for s in self.statics]
        out = self.fn(*jax.tree.unflatten(self.treedef, leaves))
        out_leaves, out_def = jax.tree.flatten(out)
        if all(isinstance(x, jax.Array) for x in out_leaves):
            return out_leaves, Carried((out_def, None))
        position: dict[int, int] = {}
        for i, s in enumerate(self.statics or ()):
            if s is not _DYNAMIC:
                position.setdefault(id(s), i)
        out_statics = [
            _DYNAMIC if isinstance(x, jax.Array) else position.get(id(x), (x,))
            for x in out_leaves
        ]
        arrays = [x for x in out_leaves if isinstance(x, jax.Array)]
        return arrays, Carried((out_def, out_statics))

    def __call__(self, groups: list[list[Any]], leaves: list[Any]) -> Any:
        out, carried = self.jitted(*groups)
        out_def, out_statics = carried.value
        if out_statics is None:
            return out_def.unflatten(out)
        it = iter(out)
        return out_def.unflatten(
            [
                next(it) if s is _DYNAMIC else leaves[s] if type(s) is int else s[0]
                for s in out_statics
            ]
        )


@dataclasses.dataclass(eq=False)
class _Entry:
    """Everything cached for one tree structure of the arguments: where each
    argument's leaves are (`bounds`), the arguments' treedef, and the compiled
    programs."""

    bounds: list[slice]
    treedef: Any
    all_arrays: _Compiled | None = None
    by_statics: dict[Hashable, _Compiled] = dataclasses.field(default_factory=dict)


def _entry(first_def: Any, rest_def: Any) -> _Entry:
    sizes = [first_def.num_leaves]
    sizes += [child.num_leaves for child in rest_def.children()]
    starts = np.cumsum([0, *sizes]).tolist()
    treedef = jax.tree.structure(
        (
            first_def.unflatten([0] * first_def.num_leaves),
            *rest_def.unflatten([0] * rest_def.num_leaves),
        )
    )
    return _Entry([slice(a, b) for a, b in itertools.pairwise(starts)], treedef)


_cache: "weakref.WeakKeyDictionary[Callable, dict[Hashable, _Entry]]" = (
    weakref.WeakKeyDictionary()
)


@dataclasses.dataclass(eq=False)
class _First:
    """What is remembered of the first argument (the optimizer, usually the very
    same immutable object call after call), by identity: its leaves and treedef;
    for the direct path, which of its leaves are packed and how (`layout`), the
    packed leaves themselves once made, and the `_Direct` (or `None`: the general
    path) for each kind of call made with it."""

    obj: Any
    pack: bool = True
    leaves: list[Any] = dataclasses.field(init=False)
    treedef: Any = dataclasses.field(init=False)
    layout: tuple[Any, ...] | None = dataclasses.field(init=False)
    packed: Any = None
    direct: "dict[Hashable, _Direct | None]" = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.leaves, self.treedef = jax.tree.flatten(self.obj)
        self.layout = _layout(self.leaves, self.pack)


# --- Packed hyperparameters -------------------------------------------------------
#
# Every array crossing the `jax.jit` boundary costs the direct call about half a
# microsecond (AdamW has six scalar hyperparameters, more with a schedule). So the
# optimizer's scalar leaves are stacked into one array per dtype, once per
# optimizer object, and indexed back inside the compiled function: the same values,
# dtypes and shapes, and a new optimizer object with other values reuses the
# compiled step (the stacked arrays have the same shapes). Only leaves whose
# stacking changes nothing are packed: 0-d, not weak-typed (a stacked array would
# not be weak), not committed to a device or sharding, and two or more of a dtype.


def _layout(leaves: list[Any], pack: bool) -> tuple[Any, ...] | None:
    """Per leaf of the first argument, the dtype it is packed with (`None`: passed
    as it is); `None` when some leaf is not a concrete array (no direct path)."""
    # (`leaves and`: no array made when eqxopt is imported, see `_all_arrays`.)
    if leaves and not set(map(type, leaves)) <= _all_arrays():
        return None
    if not pack:
        return (None,) * len(leaves)
    codes = [
        None if a.shape or a.weak_type or x.committed else a.dtype
        for x in leaves
        for a in (x.aval,)
    ]
    if len(set(codes)) == len(codes):  # no dtype twice: nothing to pack
        return (None,) * len(codes)
    lone = {c for c in codes if codes.count(c) == 1}
    return tuple(None if c in lone else c for c in codes)


@jax.jit
def _stack(groups: list[list[Any]]) -> list[Any]:
    return [jax.numpy.stack(group) for group in groups]


def _pack(record: _First) -> tuple[list[Any], list[Any]]:
    """The first argument's leaves as the direct path passes them: the packed
    arrays (one per dtype, in order of first appearance) and the other leaves."""
    if record.packed is not None:
        return record.packed
    assert record.layout is not None
    groups: dict[Any, list[Any]] = {}
    others = []
    for x, code in zip(record.leaves, record.layout):
        if code is None:
            others.append(x)
        else:
            groups.setdefault(code, []).append(x)
    packed = (_stack(list(groups.values())) if groups else [], others)
    if not any(map(_compat.is_tracer, packed[0])):
        record.packed = packed  # (inside someone's trace it is made per call)
    return packed


def _unpacker(layout: tuple[Any, ...]) -> Callable[[Any], list[Any]]:
    """The inverse of `_pack` for one layout, for use inside the trace."""
    groups = list(dict.fromkeys(c for c in layout if c is not None))
    counters = dict.fromkeys(groups, 0)
    where: list[tuple[int, int] | None] = []
    for code in layout:
        if code is None:
            where.append(None)
        else:
            where.append((groups.index(code), counters[code]))
            counters[code] += 1

    def unpack(first: Any) -> list[Any]:
        packs, others = first
        it = iter(others)
        return [next(it) if w is None else packs[w[0]][w[1]] for w in where]

    return unpack


_last_first: list[_First] = [_First(None)]


def _first(first: Any, pack: bool = True) -> _First:
    record = _last_first[0]
    if record.obj is not first or record.pack is not pack:
        record = _last_first[0] = _First(first, pack)
    return record


class _NotPlain(Exception):
    """Raised while tracing the direct path: a leaf may have been a Python number
    (a weak-typed scalar; a weak-typed 0-d array lands here too, harmlessly) or,
    where the caller says Python bools may be (`bools`), a Python bool (traced as
    a 0-d bool array, which lands here too)."""


@dataclasses.dataclass(eq=False)
class _Direct:
    """`jax.jit` over `(first, *rest)`, the rest passed as pytrees.

    JAX flattens the pytrees in C++ and unflattens the outputs, so nothing is done
    per leaf in Python. This is only right when every leaf of the rest is an array:
    a Python number would be traced (as a weak-typed scalar) where `eqx.filter_jit`
    keeps it static, and a function or string is rejected by `jax.jit` with a
    `TypeError`; a Python bool would come back as an array. These send the call to
    the general path, which is then remembered for those argument types. `first` is
    the first argument's leaves as `_pack` makes them. `kinds` is its key in
    `_direct`.
    """

    fn: Callable
    first_def: Any
    layout: tuple[Any, ...]
    donate: tuple[int, ...]
    bools: tuple[int, ...] = ()
    kinds: tuple[Any, ...] = ()
    jitted: Any = None

    def __post_init__(self) -> None:
        self.unpack = _unpacker(self.layout)
        self.jitted = jax.jit(self.run, donate_argnums=self.donate)

    def run(self, first: Any, *rest: Any) -> Any:
        for i, arg in enumerate(rest, 1):
            for leaf in jax.tree.leaves(arg):
                if jax.numpy.ndim(leaf) == 0 and (
                    getattr(leaf, "weak_type", False)
                    or (i in self.bools and leaf.dtype == bool)
                ):
                    raise _NotPlain
        return self.fn(self.first_def.unflatten(self.unpack(first)), *rest)


_direct: dict[tuple[Any, ...], _Direct] = {}
_general: set[tuple[Any, ...]] = set()  # argument kinds the direct path cannot take


_use_direct = [True]


def set_split_compilation(enabled: bool) -> None:
    """Deprecated, and does nothing.

    It switched on a "split" path for steps of many leaves, which cut XLA's compile
    time at the cost of a slower step. `eqxopt.pack` (one buffer per dtype instead
    of thousands of leaves) makes both the step and its compile faster, so the split
    path is gone: pack the parameters instead.

    **Arguments:**

    - `enabled`: ignored.
    """
    del enabled
    warnings.warn(
        "eqxopt.set_split_compilation does nothing any more (the split path is "
        "gone); use eqxopt.pack for trees of many leaves",
        DeprecationWarning,
        stacklevel=2,
    )


def clear_caches() -> None:
    """Forgets every compiled step (the next call of each traces again): for
    switches that change what a trace produces, such as the native kernels."""
    _cache.clear()
    _direct.clear()
    _general.clear()
    _last_first[0] = _First(None)


def use_direct_path(enabled: bool) -> None:
    """Turns the direct path on (the default) or off, so that every call takes the
    general path (for tests comparing the two, and for debugging)."""
    _use_direct[0] = bool(enabled)


def call(
    fn: Callable,
    args: tuple[Any, ...],
    donate: tuple[int, ...] = (),
    pack: bool = True,
    bools: tuple[int, ...] = (),
) -> Any:
    """`fn(*args)`, compiled. `donate` lists positions of `args` whose array buffers
    XLA may reuse for the outputs (the caller must not use them afterwards). `pack`
    (for a first argument that is usually the same object call after call, such as
    the optimizer) passes its scalar leaves packed; a first argument that is new
    each call (a state) would pay for the packing every time. `bools` lists
    positions of `args` that may hold Python bools (params, keyword arguments: not
    a state): `jax.jit` would make them arrays, so a 0-d bool leaf there takes the
    general path, which keeps every non-array leaf as the caller's very object.

    An `eqx.error_if` that fires in the program raises `eqx.EquinoxRuntimeError`,
    as from `eqx.filter_jit`."""
    record = _first(args[0], pack)
    if record.layout is not None and _use_direct[0]:
        key = (fn, donate, *map(type, args))
        try:
            direct = record.direct[key]
        except KeyError:
            direct = record.direct[key] = _find_direct(fn, record, donate, bools, args)
        if direct is not None:
            try:
                return direct.jitted(_pack(record), *args[1:])
            except _NotPlain:
                pass
            except TypeError as error:
                if not _compat.is_not_an_array_error(error):
                    raise
            except Exception as error:
                raise_equinox_error(error)
                raise
            _general.add(direct.kinds)
            record.direct[key] = None
    try:
        return _general_call(fn, args, donate, record)
    except Exception as error:
        raise_equinox_error(error)
        raise


def _find_direct(
    fn: Callable,
    record: _First,
    donate: tuple[int, ...],
    bools: tuple[int, ...],
    args: tuple[Any, ...],
) -> "_Direct | None":
    assert record.layout is not None
    types = tuple(map(type, args))
    kinds = (fn, record.treedef, record.layout, donate, bools, types)
    if kinds in _general:
        return None
    direct = _direct.get(kinds)
    if direct is None:
        direct = _Direct(fn, record.treedef, record.layout, donate, bools, kinds)
        _direct[kinds] = direct
    return direct


def _general_call(
    fn: Callable, args: tuple[Any, ...], donate: tuple[int, ...], record: _First
) -> Any:
    first_leaves, first_def = record.leaves, record.treedef
    rest_leaves, rest_def = jax.tree.flatten(args[1:])
    leaves = first_leaves + rest_leaves
    per_fn = _cache.get(fn)
    if per_fn is None:
        per_fn = _cache.setdefault(fn, {})
    entry = per_fn.get((first_def, rest_def, donate))
    if entry is None:
        entry = per_fn[(first_def, rest_def, donate)] = _entry(first_def, rest_def)
    if set(map(type, leaves)) <= _all_arrays():
        compiled = entry.all_arrays
        if compiled is None:
            compiled = entry.all_arrays = _Compiled(fn, entry.treedef, None, donate)
        return compiled([leaves[b] for b in entry.bounds], leaves)
    if any(map(_compat.is_tracer, leaves)):
        return fn(*args)  # inside a trace: the outer jit compiles this
    statics = [_DYNAMIC if _is_dynamic(x) else x for x in leaves]
    # Each static leaf by type and value, and which earlier leaf it is the very
    # object of, so that an output leaf maps back to one input place.
    first_place: dict[int, int] = {}
    key = tuple(
        _DYNAMIC if s is _DYNAMIC else (static(s), first_place.setdefault(id(s), i))
        for i, s in enumerate(statics)
    )
    compiled = entry.by_statics.get(key)
    if compiled is None:
        compiled = entry.by_statics[key] = _Compiled(fn, entry.treedef, statics, donate)
    groups = [[x for x in leaves[b] if _is_dynamic(x)] for b in entry.bounds]
    return compiled(groups, leaves)


def lower(
    fn: Callable,
    args: tuple[Any, ...],
    donate: tuple[int, ...] = (),
    pack: bool = True,
) -> Any:
    """The `jax.stages.Lowered` program that `call(fn, args, donate, pack)` runs when
    every leaf is an array (for benchmarks: `.compile()` it, read
    `memory_analysis()`)."""
    record = _First(args[0], pack)
    assert record.layout is not None, "some leaf of the first argument is no array"
    direct = _Direct(fn, record.treedef, record.layout, donate)
    return direct.jitted.lower(_pack(record), *args[1:])


def cache_size(fn: Callable) -> int:
    """How many compiled programs `call` holds for `fn` (for tests and benchmarks)."""
    total = sum(
        _compat.jit_cache_size(d.jitted) for k, d in _direct.items() if k[0] is fn
    )
    for entry in _cache.get(fn, {}).values():
        compiled = [entry.all_arrays, *entry.by_statics.values()]
        total += sum(
            _compat.jit_cache_size(c.jitted) for c in compiled if c is not None
        )
    return total
