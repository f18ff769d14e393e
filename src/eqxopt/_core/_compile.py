"""How eqxopt compiles what it runs for the user (`update`, `step`,
`make_train_step`, `LBFGS.value_and_grad`): each is `eqx.filter_jit` of a function,
and `FilteredJit` is the one place that calls it.

A call goes one of three ways:

- Inside someone else's trace (a leaf is a tracer) the function is called as it is:
  the enclosing `jit` compiles it, with whatever that `jit` donates.
- A donated call runs through `eqx.filter_jit(fn, donate="all-except-first")`
  itself, so its buffers, its waiting for the result and its errors
  (`eqx.error_if` raising `eqx.EquinoxRuntimeError`) are Equinox's.
- Any other call takes `jax.jit` over the flattened arguments, with the
  non-array leaves in the cache key, which is what `eqx.filter_jit` does with
  fewer Python steps per call, and without waiting for the result. A call that
  fails while it runs is run again through `eqx.filter_jit`, so that a failing
  `eqx.error_if` raises Equinox's own error (nothing was donated, so the inputs
  are still there).

Both ways trace the same function with the same traced and static parts, so they
compile the same program and give the same outputs, static ones included
(`tests/test_filtered_jit.py` runs both side by side). Static leaves are keyed by
type as well as value (`static_key`), so that `1`, `1.0` and `True`, equal in
Python, never share a trace.
"""

import collections
import dataclasses
import struct
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from . import _backend
from ._jax_api import array_type, holds_tracer, is_tracer

# Programs kept per compiled function (least recently used dropped first): each
# structure of the arguments and set of static leaves is one.
PROGRAMS_KEPT = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
    """A non-array leaf as a cache key (`static_key`): equal only to a leaf of the
    same type and the same value, bit for bit (`0.0` and `-0.0` differ; NaN equals
    itself). `obj` is the leaf."""

    key: Hashable
    obj: Any = dataclasses.field(compare=False)


def static_key(obj: Any) -> Static:
    """`obj` as a hashable cache key (`Static`); an unhashable one is keyed by its
    identity (and kept alive by the key)."""
    try:
        hash(obj)
    except TypeError:
        return Static(("id", id(obj)), obj)
    if isinstance(obj, float):
        return Static((type(obj), struct.pack("<d", obj)), obj)
    if isinstance(obj, complex):
        return Static((type(obj), struct.pack("<dd", obj.real, obj.imag)), obj)
    return Static((type(obj), obj), obj)


class _StaticOutputs:
    """Where a function's outputs are not arrays, carried through `jax.jit` as a
    pytree node without children: the outputs' treedef, per output leaf where it
    comes from (`None`: an array the program returns; `("in", k)`: the call's own
    `k`-th input leaf, which the trace passed through; `("new", obj)`: an object
    the trace made), and the positions of the arrays. `None` fields: every output
    leaf is an array. (A plain class, not a module: one is made on every call.)"""

    __slots__ = ("arrays_at", "treedef", "where")

    def __init__(self, treedef: Any, where: tuple | None, arrays_at: tuple | None):
        self.treedef, self.where, self.arrays_at = treedef, where, arrays_at

    def _key(self) -> tuple:
        return (self.treedef, self.where, self.arrays_at)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _StaticOutputs) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self.treedef)


jax.tree_util.register_pytree_node(
    _StaticOutputs, lambda o: ((), o._key()), lambda key, _: _StaticOutputs(*key)
)


def _merge(static: _StaticOutputs, arrays: list[Any], statics: tuple) -> Any:
    """The outputs, from the arrays the program returned and the call's static
    leaves (`statics`), so that a leaf passed through is the caller's own object.
    (A function, not a method: Equinox makes a bound method of a module on each
    read.)"""
    leaves = [
        None if w is None else statics[w[1]].obj if w[0] == "in" else w[1]
        for w in static.where  # pyright: ignore[reportOptionalIterable]
    ]
    for i, x in zip(static.arrays_at, arrays):  # pyright: ignore[reportArgumentType]
        leaves[i] = x
    return static.treedef.unflatten(leaves)


_ALL_ARRAYS = _StaticOutputs(None, None, None)


class _Program:
    """One `jax.jit` of the function for one structure of the arguments and one set
    of static leaves (`statics`: per leaf, `None` at an array, else the leaf's
    `static_key`)."""

    __slots__ = ("jitted",)

    def __init__(
        self,
        fn: Callable,
        key: Hashable,
        structure: tuple,
        statics: tuple,
        options: Any,
    ):
        def flat_fn(*arrays: Any) -> tuple[Any, _StaticOutputs]:
            it = iter(_unpack(structure[3], list(arrays)))
            leaves = [next(it) if s is None else s.obj for s in statics]
            out = fn(key, *_rebuild(structure, leaves))
            out_leaves, out_def = jax.tree.flatten(out)
            if all(map(eqx.is_array, out_leaves)):
                return out, _ALL_ARRAYS
            inputs = {id(s.obj): k for k, s in enumerate(statics) if s is not None}
            where = tuple(
                None
                if eqx.is_array(x)
                else ("in", inputs[id(x)])
                if id(x) in inputs
                else ("new", x)
                for x in out_leaves
            )
            arrays_at = tuple(i for i, x in enumerate(out_leaves) if eqx.is_array(x))
            returned = [out_leaves[i] for i in arrays_at]
            return returned, _StaticOutputs(out_def, where, arrays_at)

        self.jitted = jax.jit(flat_fn, compiler_options=options)


def _classify(leaves: list[Any]) -> tuple[list[Any], tuple] | None:
    """The array leaves of `leaves` and, per leaf, `None` at an array or the
    leaf's `static_key`; `None` when a leaf is a tracer (a call inside a
    trace)."""
    concrete = array_type()
    if set(map(type, leaves)) <= {concrete}:  # the common call: arrays only
        return leaves, (None,) * len(leaves)
    statics = []
    arrays = []
    for x in leaves:
        if type(x) is concrete:
            statics.append(None)
            arrays.append(x)
        elif eqx.is_array(x):
            if is_tracer(x):
                return None
            statics.append(None)
            arrays.append(x)
        else:
            statics.append(static_key(x))
    return arrays, tuple(statics)


def _rebuild(structure: tuple, leaves: list[Any]) -> tuple:
    """The arguments, from the leaves of the held argument and then of the rest
    (`structure`: the held argument's position and treedef, the rest's treedef,
    the held arrays' packing)."""
    at, held_def, rest_def, _ = structure
    n = held_def.num_leaves
    rest = rest_def.unflatten(leaves[n:])
    return (*rest[:at], held_def.unflatten(leaves[:n]), *rest[at:])


class _Held:
    """What is kept of the held argument (the optimizer, usually the same object
    call after call) between calls, by identity: its treedef, its leaves as
    `_classify` gives them, and its arrays as the program takes them (`packed`).
    An Equinox module is immutable, so this stands while it is the same object.

    Its scalar hyperparameters are stacked into one array per dtype (`layout`:
    per array, its dtype where it is stacked, else `None`), once per object:
    fewer arrays cross `jax.jit`'s boundary on every call, and the program reads
    one scalar buffer instead of one per hyperparameter. Only 0-d arrays that
    stacking leaves unchanged are stacked (not weak-typed, not committed to a
    device or sharding), two or more of a dtype."""

    __slots__ = ("layout", "obj", "packed", "programs", "statics", "treedef")

    def __init__(self, obj: Any, arrays: list, statics: tuple, treedef: Any):
        self.obj, self.statics, self.treedef = obj, statics, treedef
        # The last few programs called with it, by what else selects them (a
        # shorter key to hash than the whole one).
        self.programs: dict[Any, _Program] = {}
        codes = [
            None if x.ndim or x.weak_type or x.committed else x.dtype for x in arrays
        ]
        lone = {c for c in codes if codes.count(c) == 1}
        self.layout = tuple(None if c in lone else c for c in codes)
        groups: dict[Any, list] = {}
        others = []
        for x, code in zip(arrays, self.layout):
            (groups.setdefault(code, []) if code is not None else others).append(x)
        # Stacked on the host, once per object: no program to compile for each
        # new count of scalars, and concrete even inside someone else's trace.
        with jax.ensure_compile_time_eval():
            stacked = [
                jax.device_put(np.stack([np.asarray(x) for x in group]))
                for group in groups.values()
            ]
        self.packed = [*stacked, *others]


def _unpack(layout: tuple, arrays: list[Any]) -> list[Any]:
    """The held argument's arrays, from the front of the program's `arrays` (as
    `_Held.packed` orders them); the rest of `arrays` follows them."""
    codes = list(dict.fromkeys(c for c in layout if c is not None))
    packs, rest = arrays[: len(codes)], iter(arrays[len(codes) :])
    taken = dict.fromkeys(codes, 0)
    unpacked = []
    for code in layout:
        if code is None:
            unpacked.append(next(rest))
        else:
            unpacked.append(packs[codes.index(code)][taken[code]])
            taken[code] += 1
    return [*unpacked, *rest]


class FilteredJit:
    """`fn` compiled as `eqx.filter_jit` compiles it, for eqxopt's entry points:
    see the module docstring.

    **Arguments:**

    - `fn`: the function, `fn(static, *args)`: `static` is hashable and selects
      the program by value; `args` are pytrees whose arrays are traced and whose
      other leaves are static.
    - `donate_from`: the position in `args` from which arguments are donated when
      a call asks for it (`call(static, *args, donate=True)`): everything from
      there on, as `eqx.filter_jit(donate="all-except-first")` donates all but its
      first argument (`static` and the arguments before are passed to it as one
      tuple).
    - `compiler_options`: `jax.jit`'s compiler options, as hashable items.
    - `held`: the position in `args` of the argument that is usually the same
      object call after call (the optimizer): its flattening is kept between
      calls.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        donate_from: int = 1,
        compiler_options: tuple[tuple[str, Any], ...] = (),
        held: int = 0,
    ):
        self.fn = fn
        self.donate_from = donate_from
        self.held = held
        self._held: _Held | None = None
        self.compiler_options = compiler_options
        self._programs: collections.OrderedDict[Any, _Program] = (
            collections.OrderedDict()
        )
        options = dict(compiler_options) or None

        def regrouped(kept: tuple, *donated: Any) -> Any:
            return fn(*kept, *donated)

        regrouped.__name__ = regrouped.__qualname__ = getattr(fn, "__name__", "fn")
        # (`compiler_options` is one of `jax.jit`'s keywords, which Equinox's
        # overloads leave out.)
        self._equinox = eqx.filter_jit(  # pyright: ignore[reportCallIssue]
            fn, compiler_options=options
        )
        self._equinox_donated = eqx.filter_jit(  # pyright: ignore[reportCallIssue]
            regrouped, donate="all-except-first", compiler_options=options
        )
        _instances.add(self)

    def clear(self) -> None:
        """Forgets the fast path's programs."""
        self._programs.clear()
        self._held = None

    def _program(
        self, static: Hashable, structure: tuple, statics: tuple
    ) -> _Program | None:
        key = (static, structure, statics)
        try:
            program = self._programs.get(key)
        except TypeError:  # an unhashable static key: Equinox's error
            return None
        if program is None:
            options = dict(self.compiler_options) or None
            program = _Program(self.fn, static, structure, statics, options)
            self._programs[key] = program
            if len(self._programs) > PROGRAMS_KEPT:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return program

    def _flatten(self, args: tuple) -> tuple[list, tuple, tuple, _Held] | None:
        """The arrays of `args`, their structure (as `_rebuild` reads it) and
        static keys; `None` inside someone else's trace. The held argument's
        flattening is kept from the call before when it is the same object."""
        at = self.held
        held = self._held
        if held is None or held.obj is not args[at]:
            leaves, treedef = jax.tree.flatten(args[at])
            found = _classify(leaves)
            if found is None:
                return None
            held = _Held(args[at], *found, treedef)
            self._held = held
        leaves, rest_def = jax.tree.flatten((*args[:at], *args[at + 1 :]))
        found = _classify(leaves)
        if found is None:
            return None
        arrays, statics = found
        structure = (at, held.treedef, rest_def, held.layout)
        return held.packed + arrays, structure, held.statics + statics, held

    def __call__(self, static: Hashable, *args: Any, donate: bool = False) -> Any:
        """`fn(static, *args)`, compiled: `static` (hashable) selects the program
        by value, as a non-array leaf does; see the class docstring."""
        if donate:
            # Inside someone else's trace the arguments it keeps (the optimizer,
            # the gradients or the batch) are its values; the donated ones would
            # be too. (Read the kept ones only: the donated are the model's size.)
            split = self.donate_from
            if holds_tracer(args[:split]):
                return self.fn(static, *args)
            return self._equinox_donated((static, *args[:split]), *args[split:])
        found = self._flatten(args)
        if found is None:
            return self.fn(static, *args)
        arrays, structure, statics, held = found
        local = (static, structure[2], statics)
        program = held.programs.get(local)
        if program is None:
            program = self._program(static, structure, statics)
            if program is None:
                return self._equinox(static, *args)
            if len(held.programs) >= 8:
                held.programs.clear()
            held.programs[local] = program
        try:
            out, outputs = program.jitted(*arrays)
        except jax.errors.JaxRuntimeError:
            # Run it as `eqx.filter_jit` runs it: a failing `eqx.error_if` then
            # raises `eqx.EquinoxRuntimeError` with its message (any other error
            # comes back as it was).
            return self._equinox(static, *args)
        if outputs.treedef is None:  # every output leaf an array
            return out
        return _merge(outputs, out, statics)

    def lower(
        self, static: Hashable, *args: Any, donate: bool = False
    ) -> jax.stages.Lowered:
        """The program `__call__` would run for the same arguments, lowered:
        `.compile()` it to read XLA's `memory_analysis()` or its optimized HLO
        (`.as_text()`)."""
        found = self._flatten(args)
        if found is None:
            raise ValueError("lower takes concrete arrays, not the values of a trace")
        if donate:
            split = self.donate_from
            lowered = self._equinox_donated.lower(
                (static, *args[:split]), *args[split:]
            )
            return lowered.lowered
        arrays, structure, statics, _ = found
        program = self._program(static, structure, statics)
        if program is None:
            return self._equinox.lower(static, *args).lowered
        return program.jitted.lower(*arrays)


_instances: "weakref.WeakSet[FilteredJit]" = weakref.WeakSet()


def clear_caches() -> None:
    """Drops the fast path's programs of every `FilteredJit`, when the backend
    changes (the callers put the backend in their static arguments, so programs
    traced with the other backend are not reused either way)."""
    for compiled in list(_instances):
        compiled.clear()


_backend.on_change(clear_caches)


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
