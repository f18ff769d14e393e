"""The one way into compiled code: `update`, `step` and `make_train_step` all call
`call`.

It treats arguments as `eqx.filter_jit` does: array leaves are traced, every other
leaf (an activation function, a Python number, a string) is part of the cache key,
by type and value. New hyperparameter *values* (array leaves) therefore reuse the
compiled function. It is cheaper per call than `eqx.filter_jit` (one flatten per
argument, the first one remembered by identity, since it is usually the same
optimizer call after call) and does not wait for the result. Inside someone else's
trace it calls the function, and the enclosing `jit` compiles it.

Non-array outputs (a parameter that is a function, a Python number in `aux`) come
back through the compiled function's output structure, which JAX records per
compiled program, so each call gets the ones its own trace made; a non-array output
that is one of the inputs is the caller's very object.
"""

import dataclasses
import functools
import struct
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np

from . import _backend
from ._jax_api import array_type, is_tracer

_DYNAMIC = object()  # marks the position of an array leaf


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
    """A non-array leaf in a cache key (`static_key(obj)`): equal only to a leaf of the
    same type and the same value, bit for bit (`True`, `1`, `1.0` and an `IntEnum`
    member with value 1 compare equal in Python, as do `0.0` and `-0.0`, and NaN
    equals nothing); an unhashable leaf is equal only to itself. `obj` is the leaf."""

    key: Hashable
    obj: Any = dataclasses.field(compare=False)


def static_key(obj: Any) -> Static:
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
    # NumPy arrays and scalars are arrays, as for `eqx.is_array`.
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


class _Outputs:
    """The non-array outputs of one trace, carried in the compiled function's output
    structure (a pytree node without children), which JAX keeps per compiled
    program. `where`, per output leaf: `_DYNAMIC`, `("in", k)` for the `k`-th input
    leaf, or `("new", obj)` for an object the function made."""

    __slots__ = ("treedef", "where")

    def __init__(self, treedef: Any, where: tuple | None):
        self.treedef = treedef
        self.where = where

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Outputs)
            and self.treedef == other.treedef
            and self.where == other.where
        )

    def __hash__(self) -> int:
        return hash(self.treedef)


jax.tree_util.register_pytree_node(
    _Outputs,
    lambda o: ((), (o.treedef, o.where)),
    lambda aux, _: _Outputs(*aux),
)

# Every output leaf is an array: the compiled function returns its output as it is.
_ALL_ARRAYS = _Outputs(None, None)


# Equinox's runtime errors (`eqx.error_if` in a loss or any function traced into a
# step) fail the program as a host callback; `eqx.filter_jit` turns that back into
# `eqx.EquinoxRuntimeError` with the user's message, and `call` does the same
# (`raise_equinox_error`). Equinox marks the failure with the name of its internal
# exception, followed by its message and a banner.
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
class _Program:
    """One `jax.jit` of `fn(static, *args)` for one tree structure of the arguments
    and one set of non-array leaves (`statics`, per argument: its leaves, with
    `_DYNAMIC` at arrays): the general path."""

    fn: Callable[..., Any]
    static: Hashable
    treedefs: tuple[Any, ...]
    statics: tuple[tuple[Any, ...], ...]
    donate: tuple[int, ...]
    compiler_options: tuple[tuple[str, Any], ...]
    traces: int = 0
    jitted: Any = None

    def __post_init__(self) -> None:
        options = dict(self.compiler_options) or None
        self.jitted = jax.jit(
            self.flat_fn, donate_argnums=self.donate, compiler_options=options
        )

    def flat_fn(self, *groups: list[Any]) -> tuple[Any, _Outputs]:
        self.traces += 1
        args = []
        first_static: dict[int, int] = {}
        offset = 0
        for treedef, statics, group in zip(self.treedefs, self.statics, groups):
            it = iter(group)
            leaves = [next(it) if s is _DYNAMIC else s for s in statics]
            for k, s in enumerate(statics):
                if s is not _DYNAMIC:
                    first_static.setdefault(id(s), offset + k)
            offset += treedef.num_leaves
            args.append(treedef.unflatten(leaves))
        return _outputs(self.fn(self.static, *args), first_static)


def _outputs(out: Any, inputs: dict[int, int]) -> tuple[Any, "_Outputs"]:
    """What a compiled function returns for `out`: `out` itself if its leaves are
    all arrays, else its arrays, with where the others go (`_Outputs`); `inputs`
    maps the ids of the static input leaves to their positions."""
    out_leaves, out_def = jax.tree.flatten(out)
    if all(isinstance(x, jax.Array) for x in out_leaves):
        return out, _ALL_ARRAYS
    where = tuple(
        _DYNAMIC
        if isinstance(x, jax.Array)
        else ("in", inputs[id(x)])
        if id(x) in inputs
        else ("new", x)
        for x in out_leaves
    )
    arrays = [x for x in out_leaves if isinstance(x, jax.Array)]
    return arrays, _Outputs(out_def, where)


def _results(payload: Any, outputs: _Outputs, leaves: list[Any]) -> Any:
    """The caller's result from what the compiled function returned (`_outputs`);
    `leaves`: the call's input leaves."""
    if outputs.where is None:
        return payload
    it = iter(payload)
    return outputs.treedef.unflatten(
        [
            next(it) if w is _DYNAMIC else leaves[w[1]] if w[0] == "in" else w[1]
            for w in outputs.where
        ]
    )


@dataclasses.dataclass(eq=False)
class _First:
    """What is remembered of the first argument (usually the same optimizer object
    call after call), by identity: its leaves, treedef, whether every leaf is a
    concrete array and, if so, how its scalars are packed (`layout`, `packed`)."""

    obj: Any
    leaves: list[Any] = dataclasses.field(init=False)
    treedef: Any = dataclasses.field(init=False)
    all_arrays: bool = dataclasses.field(init=False)
    layout: tuple[Any, ...] | None = dataclasses.field(init=False)
    packed: Any = None
    direct: dict[tuple, "_Direct"] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.leaves, self.treedef = jax.tree.flatten(self.obj)
        self.all_arrays = set(map(type, self.leaves)) <= _concrete_types()
        self.layout = _layout(self.leaves) if self.all_arrays else None

    def pack(self) -> Any:
        """The leaves as the compiled function takes them (`_pack`)."""
        if self.packed is None:
            self.packed = _pack(self.leaves, self.layout)
        return self.packed


# --- Packed hyperparameters -------------------------------------------------------
#
# The optimizer's scalar leaves are stacked into one array per dtype, once per
# optimizer object, and indexed back inside the compiled function: the same values,
# dtypes and shapes, and a new optimizer object with other values reuses the
# compiled step (the stacked arrays have the same shapes). Fewer arrays then cross
# the `jax.jit` boundary, and every per-leaf kernel of the step reads one scalar
# buffer instead of one per hyperparameter, which XLA:CPU pays for per kernel
# (benchmarks/README.md). Only leaves whose stacking changes nothing are packed:
# 0-d, not weak-typed (a stacked array would not be weak), not committed to a
# device or sharding, and two or more of a dtype.


def _layout(leaves: list[Any]) -> tuple[Any, ...]:
    """Per leaf, the dtype it is packed with (`None`: passed as it is)."""
    codes = [
        None if a.shape or a.weak_type or x.committed else a.dtype
        for x in leaves
        for a in (x.aval,)
    ]
    lone = {c for c in codes if codes.count(c) == 1}
    return tuple(None if c in lone else c for c in codes)


@jax.jit
def _stack(groups: list[list[Any]]) -> list[Any]:
    return [jax.numpy.stack(group) for group in groups]


def _pack(leaves: list[Any], layout: Any) -> tuple[list[Any], list[Any]]:
    """The packed arrays (one per dtype, in order of first appearance) and the
    other leaves."""
    groups: dict[Any, list[Any]] = {}
    others = []
    for x, code in zip(leaves, layout):
        if code is None:
            others.append(x)
        else:
            groups.setdefault(code, []).append(x)
    return (_stack(list(groups.values())) if groups else [], others)


def _unpack(layout: tuple[Any, ...], first: Any) -> list[Any]:
    """The inverse of `_pack`, inside the trace."""
    packs, others = first
    codes = list(dict.fromkeys(c for c in layout if c is not None))
    counters = dict.fromkeys(codes, 0)
    it = iter(others)
    leaves = []
    for code in layout:
        if code is None:
            leaves.append(next(it))
        else:
            leaves.append(packs[codes.index(code)][counters[code]])
            counters[code] += 1
    return leaves


_last_first: list[_First | None] = [None]


def _first(obj: Any) -> _First:
    record = _last_first[0]
    if record is None or record.obj is not obj:
        record = _First(obj)
        if record.all_arrays:  # a first argument holding tracers is not kept
            _last_first[0] = record
    return record


@dataclasses.dataclass(eq=False)
class _Direct:
    """The `jax.jit`s of `fn(static, *args)` for calls whose leaves are all concrete
    arrays, with the first argument's structure and packing (`treedef`, `layout`):
    one per structure of the other arguments, which `call` flattens once and passes
    as plain arrays (flattening an Equinox module runs Python; `jax.jit` would
    flatten it a second time)."""

    fn: Callable[..., Any]
    static: Hashable
    treedef: Any
    layout: tuple[Any, ...]
    donate: tuple[int, ...]
    compiler_options: tuple[tuple[str, Any], ...]
    traces: int = 0
    by_structure: dict[Any, Any] = dataclasses.field(default_factory=dict)

    def jitted(self, rest_def: Any) -> Any:
        """The `jax.jit` taking `(packed first argument, *leaves of the others)`
        for the other arguments' structure `rest_def` (a tuple's treedef)."""
        found = self.by_structure.get(rest_def)
        if found is None:
            # Position 0 is the first argument; the others' leaves follow, in order.
            starts, start = {}, 1
            for position, child in enumerate(rest_def.children(), 1):
                starts[position] = (start, child.num_leaves)
                start += child.num_leaves
            donated = tuple(
                i
                for position in self.donate
                for i in range(starts[position][0], sum(starts[position]))
            )
            options = dict(self.compiler_options) or None
            found = jax.jit(
                functools.partial(self.run, rest_def),
                donate_argnums=donated,
                compiler_options=options,
            )
            self.by_structure[rest_def] = found
        return found

    def run(self, rest_def: Any, first: Any, *leaves: Any) -> tuple[Any, _Outputs]:
        self.traces += 1
        obj = self.treedef.unflatten(_unpack(self.layout, first))
        return _outputs(self.fn(self.static, obj, *rest_def.unflatten(leaves)), {})


_programs: dict[tuple, _Program | _Direct] = {}


def clear_caches() -> None:
    """Forgets every compiled program (the next call of each traces again): for
    switches that change what a trace produces, such as the native kernels."""
    _programs.clear()
    _last_first[0] = None


_backend.on_change(clear_caches)


@functools.cache
def _concrete_types() -> frozenset[type]:
    return frozenset({array_type()})


def _flat_concrete(args: Sequence[Any]) -> tuple[list[Any], Any] | None:
    """The leaves and treedef of `args` (one flatten) if every leaf is a concrete
    array, else `None`."""
    leaves, treedef = jax.tree.flatten(tuple(args))
    if set(map(type, leaves)) <= _concrete_types():
        return leaves, treedef
    return None


def _direct(
    first: _First,
    fn: Callable[..., Any],
    static: Hashable,
    donate: tuple[int, ...],
    compiler_options: tuple[tuple[str, Any], ...],
) -> _Direct:
    """The `_Direct` for a call, found once per first argument object (a new
    optimizer object of the same structure finds the same one)."""
    local = (fn, static, donate, compiler_options)
    found = first.direct.get(local)
    if found is None:
        assert first.layout is not None
        key = ("direct", fn, static, first.treedef, first.layout, donate)
        key += (compiler_options,)
        found = _programs.get(key)
        if found is None:
            found = _programs[key] = _Direct(
                fn, static, first.treedef, first.layout, donate, compiler_options
            )
        assert isinstance(found, _Direct)
        first.direct[local] = found
    return found


def _general(
    first: _First,
    fn: Callable[..., Any],
    static: Hashable,
    args: Sequence[Any],
    donate: tuple[int, ...],
    compiler_options: tuple[tuple[str, Any], ...],
) -> tuple[_Program, list[list[Any]], list[Any]] | None:
    """The general path, as `eqx.filter_jit` treats arguments: the program for a
    call with non-array leaves (part of its key), the arrays it takes (per
    argument) and every input leaf; `None` when some leaf is a tracer (the call is
    inside another trace)."""
    flat = [(first.leaves, first.treedef)]
    flat += [jax.tree.flatten(a) for a in args[1:]]
    if any(is_tracer(x) for leaves, _ in flat for x in leaves):
        return None
    statics = tuple(
        tuple(_DYNAMIC if _is_dynamic(x) else x for x in leaves) for leaves, _ in flat
    )
    key_statics = tuple(
        tuple(s if s is _DYNAMIC else static_key(s) for s in group) for group in statics
    )
    treedefs = tuple(treedef for _, treedef in flat)
    key = (fn, static, treedefs, key_statics, donate, compiler_options)
    program = _programs.get(key)
    if program is None:
        program = _programs[key] = _Program(
            fn, static, treedefs, statics, donate, compiler_options
        )
    assert isinstance(program, _Program)
    groups = [[x for x in leaves if _is_dynamic(x)] for leaves, _ in flat]
    leaves = [x for group, _ in flat for x in group]
    return program, groups, leaves


def call(
    fn: Callable[..., Any],
    static: Hashable,
    args: Sequence[Any],
    donate: tuple[int, ...] = (),
    compiler_options: tuple[tuple[str, Any], ...] = (),
) -> Any:
    """`fn(static, *args)`, compiled: `static` (hashable) is part of the cache key;
    `args` are pytrees, whose array leaves are traced and whose other leaves are
    part of the cache key. `donate` lists positions in `args` whose array buffers
    XLA may reuse for the outputs (the caller must not use them afterwards);
    `compiler_options` are `jax.jit`'s, as items. Inside another trace, `fn` is
    called as it is."""
    first = _first(args[0])
    try:
        flat = _flat_concrete(args[1:]) if first.layout is not None else None
        if flat is not None:
            direct = _direct(first, fn, static, donate, compiler_options)
            payload, outputs = direct.jitted(flat[1])(first.pack(), *flat[0])
            return _results(payload, outputs, [])
        general = _general(first, fn, static, args, donate, compiler_options)
        if general is None:
            return fn(static, *args)
        program, groups, leaves = general
        payload, outputs = program.jitted(*groups)
    except Exception as error:
        raise_equinox_error(error)
        raise
    return _results(payload, outputs, leaves)


def lower(
    fn: Callable[..., Any],
    static: Hashable,
    args: Sequence[Any],
    donate: tuple[int, ...] = (),
    compiler_options: tuple[tuple[str, Any], ...] = (),
) -> Any:
    """The `jax.stages.Lowered` program that `call` with the same arguments runs:
    `.compile()` it to read XLA's `memory_analysis()` or optimized HLO."""
    first = _first(args[0])
    flat = _flat_concrete(args[1:]) if first.layout is not None else None
    if flat is not None:
        direct = _direct(first, fn, static, donate, compiler_options)
        return direct.jitted(flat[1]).lower(first.pack(), *flat[0])
    general = _general(first, fn, static, args, donate, compiler_options)
    if general is None:
        raise ValueError("lower takes concrete arrays, not the values of a trace")
    program, groups, _ = general
    return program.jitted.lower(*groups)


def traces(fn: Callable[..., Any]) -> int:
    """How many times `call` has traced `fn` (every trace compiles a program)."""
    return sum(p.traces for p in _programs.values() if p.fn is fn)


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
