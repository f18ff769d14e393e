"""Whole-tree sums for the optimizers of this family whose step size is global."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from ..._core._leafwise import map_leaves
from ..._core._norms import reduction_dtype
from ..._core._shards import AxisName, shard_total
from ..._core._tree import is_float_leaf


def tree_sums(
    rule: Callable[..., tuple[Array, ...]],
    size: int,
    grads: PyTree,
    params: PyTree,
    moments: Sequence[PyTree] = (),
    flags: Sequence[Any] | None = None,
    *,
    axis_name: AxisName = None,
    owner: str = "",
) -> tuple[Float[Array, " size"], tuple[PyTree, ...]]:
    """Runs `rule(g, p, *moments[, flag]) -> (sums, *new_moments)` on every leaf
    that has a gradient (through the engine, so dtypes and `None` gradients are
    handled once) and adds up the `size` sums each leaf returns (with
    `axis_name`, over every device's block: `_shards.shard_total`), in the dtype
    of sums over `params` (`_norms.reduction_dtype`: float32, float64 for float64
    parameters under `jax_enable_x64`)."""
    per_leaf, new = map_leaves(rule, grads, params, moments, flags=flags)
    dtype = reduction_dtype(jax.tree.leaves(params))
    partials = [s.astype(dtype) for s in jax.tree.leaves(per_leaf)]
    total = jnp.zeros(size, dtype) + shard_total(partials, axis_name, owner, dtype)
    return total, new


def copy_params(params: PyTree) -> PyTree:
    """A copy of every float leaf (the starting point several rules measure
    distances from); `None` elsewhere."""
    return jax.tree.map(
        lambda p: jnp.array(p, copy=True) if is_float_leaf(p) else None, params
    )


def real_dtype(x: Array) -> Any:
    """The real dtype of `x`'s precision (float32 for complex64), to cast global
    scalars to before they meet a leaf."""
    return jnp.finfo(x.dtype).dtype


def re_dot(a: Array, b: Array) -> Array:
    """`sum(Re(conj(a) * b))`: the real inner product, also of complex leaves."""
    return jnp.real(jnp.vdot(a, b))
