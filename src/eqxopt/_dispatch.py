"""A cheaper way into compiled code than `eqx.filter_jit`, for `update` and `step`.

The arguments are flattened once; array leaves become the traced inputs of a cached
`jax.jit` function and every other leaf (activation functions, Python scalars, ...)
becomes part of the cache key, as `eqx.filter_jit` would treat them. The cache key is
the tree structure plus those static leaves, so new hyperparameter *values* (which are
array leaves) reuse the compiled function. The call does not wait for the result.

Inside someone else's trace (any leaf is a tracer) the function is simply called: the
enclosing `jit` compiles it.
"""

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

_DYNAMIC = object()  # marks the position of an array leaf in a cache key


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


class _Compiled:
    """One jitted program for one tree structure and one set of static leaves."""

    def __init__(
        self,
        fn: Callable,
        treedef: Any,
        statics: list[Any],
        group_sizes: tuple[int, ...],
        donate: tuple[int, ...],
    ):
        self.out_def: Any = None
        self.out_statics: list[Any] = []

        def flat_fn(*groups):
            dynamic = iter([x for group in groups for x in group])
            leaves = [next(dynamic) if s is _DYNAMIC else s for s in statics]
            out = fn(*jax.tree.unflatten(treedef, leaves))
            out_leaves, self.out_def = jax.tree.flatten(out)
            self.out_statics = [
                _DYNAMIC if isinstance(x, jax.Array) else x for x in out_leaves
            ]
            return [x for x in out_leaves if isinstance(x, jax.Array)]

        self.group_sizes = group_sizes
        self.jitted = jax.jit(flat_fn, donate_argnums=donate)

    def __call__(self, groups: list[list[Any]]) -> Any:
        out = iter(self.jitted(*groups))
        leaves = [next(out) if s is _DYNAMIC else s for s in self.out_statics]
        return jax.tree.unflatten(self.out_def, leaves)


_cache: "weakref.WeakKeyDictionary[Callable, dict[Hashable, _Compiled]]" = (
    weakref.WeakKeyDictionary()
)


def call(fn: Callable, args: tuple[Any, ...], donate: tuple[int, ...] = ()) -> Any:
    """`fn(*args)`, compiled. `donate` lists positions of `args` whose array buffers
    XLA may reuse for the outputs (the caller must not use them afterwards)."""
    groups: list[list[Any]] = []
    statics: list[Any] = []
    key: list[Hashable] = []
    treedefs = []
    for arg in args:
        leaves, treedef = jax.tree.flatten(arg)
        treedefs.append(treedef)
        group = []
        for leaf in leaves:
            if isinstance(leaf, jax.core.Tracer):
                return fn(*args)  # inside a trace: the outer jit compiles this
            if isinstance(leaf, (jax.Array, np.ndarray)):
                group.append(leaf)
                statics.append(_DYNAMIC)
                key.append(_DYNAMIC)
            else:
                statics.append(leaf)
                key.append(_static_key(leaf))
        groups.append(group)
    cache_key = (tuple(treedefs), tuple(key), donate)
    per_fn = _cache.setdefault(fn, {})
    compiled = per_fn.get(cache_key)
    if compiled is None:
        whole_def = jax.tree.structure(tuple(args))
        compiled = _Compiled(
            lambda *a: fn(*a),
            whole_def,
            statics,
            tuple(len(g) for g in groups),
            donate,
        )
        per_fn[cache_key] = compiled
    return compiled(groups)


def cache_size(fn: Callable) -> int:
    """How many compiled programs `call` holds for `fn` (for tests and benchmarks)."""
    return sum(c.jitted._cache_size() for c in _cache.get(fn, {}).values())
