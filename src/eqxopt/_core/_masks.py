"""Boolean masks over parameter trees (which leaves get weight decay, ...)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PyTree

from ._jax_api import is_tracer
from ._structure import FrozenTree, is_none, structure_mismatch

Mask = PyTree[bool] | Callable[[PyTree], PyTree[bool]] | None


def resolve_mask(mask: Mask, params: PyTree, name: str = "mask") -> list[bool]:
    """One Python bool per leaf of `params` (in `jax.tree.leaves` order).

    **Arguments:**

    - `mask`: `None` (every leaf), a tree of bools with the structure of `params` or
      a prefix of it (a bool covers the whole subtree below it), or a function of
      `params` returning such a tree. An Equinox module is always read as a tree of
      bools, never called as the function, even when it has a `__call__` (optax
      calls it; equinox issue 193).
    - `params`: the parameters.
    - `name`: the argument's name, for error messages.
    """
    n_leaves = len(jax.tree.leaves(params))
    if mask is None:
        return [True] * n_leaves
    if callable(mask) and not isinstance(mask, eqx.Module):
        mask = mask(params)
    mask_leaves, mask_def = jax.tree.flatten(mask, is_leaf=is_none)
    try:
        subtrees = mask_def.flatten_up_to(params)
    except (ValueError, TypeError):
        raise structure_mismatch(mask, name, params, "params") from None
    flags: list[bool] = []
    for path, value, sub in zip(
        [
            jax.tree_util.keystr(p)
            for p, _ in jax.tree.leaves_with_path(mask, is_leaf=is_none)
        ],
        mask_leaves,
        subtrees,
    ):
        flags.extend([_as_bool(name, path, value)] * len(jax.tree.leaves(sub)))
    return flags


def _as_bool(name: str, path: str, value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if (
        isinstance(value, (np.ndarray, jax.Array))
        and value.shape == ()
        and value.dtype == bool
    ):
        if is_tracer(value):
            raise TypeError(f"{name}{path} must be a concrete bool, got a traced value")
        return bool(value)
    raise TypeError(f"{name}{path} must be a bool, got {value!r}")


def freeze_mask(mask: Any, name: str = "mask") -> Any:
    """A weight-decay mask in a form fit for a static field.

    `None` stays `None`; a function of params (that is not an Equinox module) is kept
    as it is and called on the params at each step; anything else (a tree of bools,
    possibly an Equinox module whose leaves are bools) is read as the tree, never
    called, and its leaves are checked to be bools (`None` counts as `False`)."""
    if mask is None:
        return None
    if is_kept_function(name, mask):
        return mask
    treedef, leaves = checked_leaves(name, mask, _as_bool)
    return FrozenTree("mask", treedef, tuple(leaves))


def is_kept_function(name: str, value: Any) -> bool:
    """Whether a per-leaf option (a mask, multipliers) is a function of params to
    keep as it is and call at each step: callable and not an Equinox module (whose
    leaves are the tree itself). A function must be hashable (a static field)."""
    if not callable(value) or isinstance(value, eqx.Module):
        return False
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{name} must be hashable when it is a function") from None
    return True


def checked_leaves(
    name: str, tree: Any, check: Callable[[str, str, Any], Any]
) -> tuple[Any, list[Any]]:
    """`tree`'s treedef (`None` counting as a leaf) and its leaves, each but `None`
    passed through `check(name, path, leaf)` (which raises naming `name + path`)."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_none)
    leaves = [
        None if value is None else check(name, jax.tree_util.keystr(path), value)
        for path, value in with_paths
    ]
    return treedef, leaves


def decay_flags(mask: Any, params: PyTree, name: str = "mask") -> list[bool]:
    """One bool per leaf of `params`: whether it gets weight decay."""
    tree = mask.tree() if isinstance(mask, FrozenTree) else mask
    return resolve_mask(tree, params, name)
