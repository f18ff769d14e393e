"""A cheaper way into compiled code than `eqx.filter_jit`, for `update` and `step`.

Two paths, both keyed so that new hyperparameter *values* (array leaves) reuse the
compiled function, and neither waits for the result:

- The direct path, for the common case where every leaf is an array: the first
  argument (the optimizer, usually the same object call after call) is flattened
  once and remembered by identity; the other arguments go to a cached `jax.jit` as
  they are, so JAX's C++ code flattens them and unflattens the outputs. A leaf that
  is not an array (a function, a string) or may be a Python number makes the direct
  path step aside, and those argument types then always take the general path.
- The general path, as `eqx.filter_jit` treats arguments: the arguments are
  flattened in Python; array leaves become the traced inputs and every other leaf
  (activation functions, Python scalars, ...) becomes part of the cache key.

Inside someone else's trace the direct path simply nests in the outer `jit` (the
general path calls the function), and the enclosing `jit` compiles it.
"""

import itertools
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.core
import numpy as np

_DYNAMIC = object()  # marks the position of an array leaf in a cache key
_ARRAY_TYPE = type(jax.numpy.zeros(()))  # jaxlib's concrete array class
_ALL_ARRAYS = frozenset({_ARRAY_TYPE})


class _ByIdentity:
    """Stands in for an unhashable static leaf in a cache key."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj


def _static_key(leaf: Any) -> Hashable:
    try:
        hash(leaf)
    except TypeError:
        return _ByIdentity(leaf)
    return leaf


def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray))


class _Compiled:
    """One jitted program for one tree structure and one set of static leaves."""

    def __init__(
        self,
        fn: Callable,
        treedef: Any,
        statics: list[Any] | None,
        donate: tuple[int, ...],
    ):
        self.out_def: Any = None
        self.out_statics: list[Any] | None = None

        def flat_fn(*groups):
            dynamic = [x for group in groups for x in group]
            if statics is None:
                leaves = dynamic
            else:
                it = iter(dynamic)
                leaves = [next(it) if s is _DYNAMIC else s for s in statics]
            out = fn(*jax.tree.unflatten(treedef, leaves))
            out_leaves, self.out_def = jax.tree.flatten(out)
            if all(isinstance(x, jax.Array) for x in out_leaves):
                self.out_statics = None
                return out_leaves
            self.out_statics = [
                _DYNAMIC if isinstance(x, jax.Array) else x for x in out_leaves
            ]
            return [x for x in out_leaves if isinstance(x, jax.Array)]

        self.jitted = jax.jit(flat_fn, donate_argnums=donate)

    def __call__(self, groups: list[list[Any]]) -> Any:
        out = self.jitted(*groups)
        if self.out_statics is None:
            return self.out_def.unflatten(out)
        it = iter(out)
        leaves = [next(it) if s is _DYNAMIC else s for s in self.out_statics]
        return self.out_def.unflatten(leaves)


class _Entry:
    """Everything cached for one tree structure of the arguments."""

    __slots__ = ("all_arrays", "bounds", "by_statics", "treedef")

    def __init__(self, first_def: Any, rest_def: Any):
        sizes = [first_def.num_leaves]
        sizes += [child.num_leaves for child in rest_def.children()]
        starts = np.cumsum([0, *sizes]).tolist()
        self.bounds = [slice(a, b) for a, b in itertools.pairwise(starts)]
        self.treedef = jax.tree.structure(
            (
                first_def.unflatten([0] * first_def.num_leaves),
                *rest_def.unflatten([0] * rest_def.num_leaves),
            )
        )
        self.all_arrays: _Compiled | None = None
        self.by_statics: dict[Hashable, _Compiled] = {}


_cache: "weakref.WeakKeyDictionary[Callable, dict[Hashable, _Entry]]" = (
    weakref.WeakKeyDictionary()
)


_last_first: list[Any] = [
    (None, [], None)
]  # (the last first argument, its leaves, def)


def _flatten_first(first: Any) -> tuple[list[Any], Any]:
    # The first argument is the optimizer, usually the very same (immutable) object
    # call after call; its flattening is remembered by identity.
    last, leaves, treedef = _last_first[0]
    if first is not last:
        leaves, treedef = jax.tree.flatten(first)
        _last_first[0] = (first, leaves, treedef)
    return leaves, treedef


class _NotPlain(Exception):
    """Raised while tracing the direct path: a leaf may have been a Python number
    (a weak-typed scalar; a weak-typed 0-d array lands here too, harmlessly)."""


class _Direct:
    """`jax.jit` over `(first_leaves, *rest)`, the rest passed as pytrees.

    JAX flattens the pytrees in C++ and unflattens the outputs, so nothing is done
    per leaf in Python. This is only right when every leaf of the rest is an array:
    a Python number would be traced (as a weak-typed scalar) where `eqx.filter_jit`
    keeps it static, and a function or string is rejected by `jax.jit` with a
    `TypeError`. Both send the call to the general path, which is then remembered for
    those argument types.
    """

    def __init__(self, fn: Callable, first_def: Any, donate: tuple[int, ...]):
        def run(first_leaves, *rest):
            for leaf in jax.tree.leaves(rest):
                if getattr(leaf, "weak_type", False) and not jax.numpy.ndim(leaf):
                    raise _NotPlain
            return fn(first_def.unflatten(first_leaves), *rest)

        self.jitted = jax.jit(run, donate_argnums=donate)


# How `jax.jit` words its refusal of a leaf that is not an array (new and old JAX).
_NOT_AN_ARRAY = ("as an abstract array", "is not a valid JAX type")
_direct: dict[tuple[Any, ...], _Direct] = {}
_general: set[tuple[Any, ...]] = set()  # argument kinds the direct path cannot take


_use_direct = [True]


def use_direct_path(enabled: bool) -> None:
    """Turns the direct path on (the default) or off, so that every call takes the
    general path (for tests comparing the two, and for debugging)."""
    _use_direct[0] = bool(enabled)


def call(fn: Callable, args: tuple[Any, ...], donate: tuple[int, ...] = ()) -> Any:
    """`fn(*args)`, compiled. `donate` lists positions of `args` whose array buffers
    XLA may reuse for the outputs (the caller must not use them afterwards)."""
    first_leaves, first_def = _flatten_first(args[0])
    kinds = (fn, first_def, donate, tuple(map(type, args)))
    if (
        _use_direct[0]
        and kinds not in _general
        and set(map(type, first_leaves)) <= _ALL_ARRAYS
    ):
        direct = _direct.get(kinds)
        if direct is None:
            direct = _direct[kinds] = _Direct(fn, first_def, donate)
        try:
            return direct.jitted(first_leaves, *args[1:])
        except _NotPlain:
            pass
        except TypeError as error:
            if not any(m in str(error) for m in _NOT_AN_ARRAY):
                raise
        _general.add(kinds)
    return _general_call(fn, args, donate)


def _general_call(fn: Callable, args: tuple[Any, ...], donate: tuple[int, ...]) -> Any:
    first_leaves, first_def = _flatten_first(args[0])
    rest_leaves, rest_def = jax.tree.flatten(args[1:])
    leaves = first_leaves + rest_leaves
    per_fn = _cache.get(fn)
    if per_fn is None:
        per_fn = _cache.setdefault(fn, {})
    entry = per_fn.get((first_def, rest_def, donate))
    if entry is None:
        entry = per_fn[(first_def, rest_def, donate)] = _Entry(first_def, rest_def)
    if set(map(type, leaves)) <= _ALL_ARRAYS:
        compiled = entry.all_arrays
        if compiled is None:
            compiled = entry.all_arrays = _Compiled(fn, entry.treedef, None, donate)
        return compiled([leaves[b] for b in entry.bounds])
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return fn(*args)  # inside a trace: the outer jit compiles this
    statics = [_DYNAMIC if _is_dynamic(x) else x for x in leaves]
    key = tuple(_DYNAMIC if s is _DYNAMIC else _static_key(s) for s in statics)
    compiled = entry.by_statics.get(key)
    if compiled is None:
        compiled = entry.by_statics[key] = _Compiled(fn, entry.treedef, statics, donate)
    groups = [[x for x in leaves[b] if _is_dynamic(x)] for b in entry.bounds]
    return compiled(groups)


def lower(fn: Callable, args: tuple[Any, ...], donate: tuple[int, ...] = ()) -> Any:
    """The `jax.stages.Lowered` program that `call(fn, args, donate)` runs when every
    leaf is an array (for benchmarks: `.compile()` it, read `memory_analysis()`)."""
    first_leaves, first_def = jax.tree.flatten(args[0])
    return _Direct(fn, first_def, donate).jitted.lower(first_leaves, *args[1:])


def cache_size(fn: Callable) -> int:
    """How many compiled programs `call` holds for `fn` (for tests and benchmarks)."""
    total = sum(
        d.jitted._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
        for k, d in _direct.items()
        if k[0] is fn
    )
    for entry in _cache.get(fn, {}).values():
        compiled = [entry.all_arrays, *entry.by_statics.values()]
        total += sum(
            c.jitted._cache_size()  # pyright: ignore[reportAttributeAccessIssue]
            for c in compiled
            if c is not None
        )
    return total
