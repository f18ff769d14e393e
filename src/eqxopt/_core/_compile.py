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

from . import _backend
from ._jax_api import array_type, is_tracer

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


class _StaticOutputs(eqx.Module):
    """Where a function's outputs are not arrays, carried through `jax.jit` as a
    pytree without leaves: the outputs' treedef, per output leaf where it comes
    from (`None`: an array the program returns; `("in", k)`: the call's own
    `k`-th input leaf, which the trace passed through; `("new", obj)`: an object
    the trace made), and the positions of the arrays. `None` fields: every output
    leaf is an array."""

    treedef: Any = eqx.field(static=True)
    where: tuple | None = eqx.field(static=True)
    arrays_at: tuple[int, ...] | None = eqx.field(static=True)


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

    def __init__(self, fn: Callable, treedef: Any, statics: tuple, options: Any):
        def flat_fn(*arrays: Any) -> tuple[Any, _StaticOutputs]:
            it = iter(arrays)
            leaves = [next(it) if s is None else s.obj for s in statics]
            out = fn(*treedef.unflatten(leaves))
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


def _arrays_and_key(args: tuple) -> tuple[list[Any], Any, tuple] | None:
    """The array leaves of `args`, their treedef and, per leaf, `None` at an array
    or the leaf's `static_key`; `None` when a leaf is a tracer (a call inside a
    trace)."""
    leaves, treedef = jax.tree.flatten(args)
    concrete = array_type()
    arrays = [x for x in leaves if type(x) is concrete]
    if len(arrays) == len(leaves):  # the common call: arrays only
        return arrays, treedef, (None,) * len(leaves)
    statics = []
    for x in leaves:
        if type(x) is concrete:
            statics.append(None)
        elif eqx.is_array(x):
            if is_tracer(x):
                return None
            arrays = None  # a NumPy array: taken in order below
            statics.append(None)
        else:
            statics.append(static_key(x))
    if arrays is None:
        arrays = [x for x in leaves if eqx.is_array(x)]
    return arrays, treedef, tuple(statics)


class FilteredJit:
    """`fn` compiled as `eqx.filter_jit` compiles it, for eqxopt's entry points:
    see the module docstring.

    **Arguments:**

    - `fn`: the function; its positional arguments are pytrees whose arrays are
      traced and whose other leaves are static.
    - `donate_from`: the position from which arguments are donated when a call
      asks for it (`call(..., donate=True)`): everything from there on, as
      `eqx.filter_jit(donate="all-except-first")` donates all but its first
      argument (the arguments before it are passed to it as one tuple).
    - `compiler_options`: `jax.jit`'s compiler options, as hashable items.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        donate_from: int = 1,
        compiler_options: tuple[tuple[str, Any], ...] = (),
    ):
        self.fn = fn
        self.donate_from = donate_from
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

    def _program(self, treedef: Any, statics: tuple) -> _Program | None:
        key = (treedef, statics)
        try:
            program = self._programs.get(key)
        except TypeError:  # an unhashable static key: Equinox's error
            return None
        if program is None:
            options = dict(self.compiler_options) or None
            program = _Program(self.fn, treedef, statics, options)
            self._programs[key] = program
            if len(self._programs) > PROGRAMS_KEPT:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return program

    def __call__(self, *args: Any, donate: bool = False) -> Any:
        if donate:
            found = _arrays_and_key(args)
            if found is None:
                return self.fn(*args)
            split = self.donate_from
            return self._equinox_donated(args[:split], *args[split:])
        found = _arrays_and_key(args)
        if found is None:
            return self.fn(*args)
        arrays, treedef, statics = found
        program = self._program(treedef, statics)
        if program is None:
            return self._equinox(*args)
        try:
            out, static = program.jitted(*arrays)
        except jax.errors.JaxRuntimeError:
            # Run it as `eqx.filter_jit` runs it: a failing `eqx.error_if` then
            # raises `eqx.EquinoxRuntimeError` with its message (any other error
            # comes back as it was).
            return self._equinox(*args)
        if static.treedef is None:  # every output leaf an array
            return out
        return _merge(static, out, statics)

    def lower(self, *args: Any, donate: bool = False) -> jax.stages.Lowered:
        """The program `__call__` would run for the same arguments, lowered:
        `.compile()` it to read XLA's `memory_analysis()` or its optimized HLO
        (`.as_text()`)."""
        found = _arrays_and_key(args)
        if found is None:
            raise ValueError("lower takes concrete arrays, not the values of a trace")
        if donate:
            split = self.donate_from
            lowered = self._equinox_donated.lower(args[:split], *args[split:])
            return lowered.lowered
        arrays, treedef, statics = found
        program = self._program(treedef, statics)
        if program is None:
            return self._equinox.lower(*args).lowered
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
