"""Tree utilities for users: reading and replacing a state field by name anywhere in
a (chained, wrapped) state, the norm of a tree, and casting its float leaves."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree

from ._norms import reduction_dtype, root, sum_of_squares
from ._shards import checked_axis_name, shard_max, shard_total
from ._tree import is_float_leaf

_MISSING = object()
# Names that optax's states use where eqxopt's differ, and what to read instead.
_OPTAX_NAMES = {
    "count": " (eqxopt's states count updates in 'step')",
    "hyperparams": " (eqxopt.hyperparameters(opt, state) gives the values in use)",
}


def _named(tree: Any, name: str, path: str = "") -> list[tuple[str, Any]]:
    # Every (path, value) reached through a module field or dict key called `name`,
    # outermost first; what is found is not searched further.
    found: list[tuple[str, Any]] = []
    if isinstance(tree, eqx.Module):
        children = [
            (f.name, getattr(tree, f.name))
            for f in dataclasses.fields(tree)
            if hasattr(tree, f.name)
        ]
        children = [(f"{path}.{k}" if path else k, k, v) for k, v in children]
    elif isinstance(tree, dict):
        children = [(f"{path}[{k!r}]", k, v) for k, v in tree.items()]
    elif isinstance(tree, (list, tuple)):
        fields = getattr(tree, "_fields", None)  # a NamedTuple
        keys = fields if fields is not None else range(len(tree))
        children = [
            (f"{path}.{k}" if fields is not None else f"{path}[{k}]", k, v)
            for k, v in zip(keys, tree)
        ]
    else:
        return found
    for child_path, key, value in children:
        if key == name:
            found.append((child_path, value))
        else:
            found.extend(_named(value, name, child_path))
    return found


def tree_get(tree: PyTree, name: str, default: Any = _MISSING) -> Any:
    """The value of the field (or dict key) called `name` in `tree`, at any depth:
    `tree_get(state, "mu")` reads AdamW's first moment from a `Chain`'s or a
    wrapper's state, as `optax.tree_utils.tree_get` does for optax states.

    **Arguments:**

    - `tree`: a pytree of Equinox modules (eqxopt states), dicts, lists, tuples and
      named tuples.
    - `name`: the field or key to find.
    - `default`: returned when there is no such field; without it, a `KeyError`.

    **Returns:** the value. A `KeyError` names every path when there are several
    (`tree_get(state["AdamW"], "mu")` then picks one link of a `Chain`).
    """
    found = _named(tree, name)
    if not found:
        if default is _MISSING:
            hint = _OPTAX_NAMES.get(name, "")
            raise KeyError(f"no field or key named {name!r} in the tree{hint}")
        return default
    if len(found) > 1:
        paths = ", ".join(path for path, _ in found)
        raise KeyError(
            f"{len(found)} fields named {name!r} ({paths}); pass the part of the "
            "tree that holds the one you want"
        )
    return found[0][1]


def tree_set(tree: PyTree, **values: Any) -> PyTree:
    """`tree` with every field (or dict key) called `name` replaced by
    `values[name]`, at any depth; the caller's tree is not changed.

    **Arguments:**

    - `tree`: as in `tree_get`.
    - `**values`: the new value for each name, such as
      `tree_set(state, mu=new_mu)`. Each name must occur in `tree` (else a
      `KeyError`); every occurrence is replaced.

    **Returns:** the new tree.
    """
    for name, value in values.items():
        found = _named(tree, name)
        if not found:
            raise KeyError(f"no field or key named {name!r} in the tree")
        tree = _replace(tree, name, value)
    return tree


def _replace(tree: Any, name: str, value: Any) -> Any:
    if isinstance(tree, eqx.Module):
        new = {
            f.name: value
            if f.name == name
            else _replace(getattr(tree, f.name), name, value)
            for f in dataclasses.fields(tree)
            if hasattr(tree, f.name)
        }
        out = object.__new__(type(tree))
        for key, child in new.items():
            object.__setattr__(out, key, child)
        return out
    if isinstance(tree, dict):
        return {
            k: value if k == name else _replace(v, name, value) for k, v in tree.items()
        }
    if isinstance(tree, (list, tuple)):
        fields = getattr(tree, "_fields", None)
        if fields is not None:
            return type(tree)(
                *(
                    value if k == name else _replace(v, name, value)
                    for k, v in zip(fields, tree)
                )
            )
        return type(tree)(_replace(v, name, value) for v in tree)
    return tree


def tree_norm(
    tree: PyTree,
    ord: int | float | str = 2,
    squared: bool = False,
    axis_name: Any = None,
) -> Array:
    """The norm of all float leaves of `tree` taken together, as one vector
    (`None` and non-float leaves are skipped); complex leaves by their magnitudes.

    **Arguments:**

    - `tree`: any pytree (gradients, updates, parameters, a model).
    - `ord`: `2` (Euclidean), `1` (sum of magnitudes) or `"inf"`/`jnp.inf`
      (largest magnitude).
    - `squared`: return the square of the norm (only with `ord=2`).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norm of the whole tree, each leaf's sum (or maximum) taken over the named
      axes it is split over and counted once where it is replicated. `None`
      (default): this device's values only.

    **Returns:** a float32 scalar (float64 for float64 leaves under x64). A NaN in
    any leaf gives NaN. With `ord=2` it is `eqxopt.global_norm` (the same sum), and
    its gradient at all-zero leaves is 0.
    """
    inf = ord in ("inf", jnp.inf)
    if ord not in (1, 2) and not inf:
        raise ValueError(f"ord must be 1, 2 or 'inf', got {ord!r}")
    if squared and ord != 2:
        raise ValueError(f"squared=True needs ord=2, got ord={ord!r}")
    axis_name = checked_axis_name("axis_name", axis_name)
    leaves = [x for x in jax.tree.leaves(tree) if is_float_leaf(x)]
    dtype = reduction_dtype(leaves)
    if ord == 2:
        total = sum_of_squares(leaves, axis_name, "tree_norm", dtype)
        return total if squared else root(total)
    if not leaves:
        return jnp.zeros((), dtype)
    if inf:
        parts = [
            shard_max(
                jnp.max(jnp.abs(x), initial=0.0).astype(dtype), axis_name, "tree_norm"
            )
            for x in leaves
        ]
        return jnp.max(jnp.stack(parts))
    sums = [jnp.sum(jnp.abs(x)) for x in leaves]
    return shard_total(sums, axis_name, "tree_norm", dtype)


def tree_cast(tree: PyTree, dtype: Any) -> PyTree:
    """`tree` with every float (or complex) array leaf cast to `dtype`; every other
    leaf (integer arrays, functions, `None`) is kept as it is. Unlike
    `optax.tree_utils.tree_cast`, integer buffers and step counters stay
    integers, so a whole Equinox model or an eqxopt state can be cast.

    **Arguments:**

    - `tree`: any pytree.
    - `dtype`: a floating-point dtype (such as `jnp.bfloat16`).
    """
    if dtype is None or not jnp.issubdtype(jnp.dtype(dtype), jnp.inexact):
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype!r}")
    return jax.tree.map(lambda x: x.astype(dtype) if is_float_leaf(x) else x, tree)
