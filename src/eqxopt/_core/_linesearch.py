"""What the linesearches share (`LBFGS`'s zoom and
`ScaleByBacktrackingLinesearch`'s Armijo backtracking): inner products of lists
of leaves, the dtype of their scalars, and steps along a direction."""

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree

from . import _shards
from ._shards import AxisName
from ._tree import is_float_leaf, join_dtypes, real_compute_dtype


def vdot(
    a: list[Array], b: list[Array], axis_name: AxisName = None, owner: str = "LBFGS"
) -> Array:
    """The real part of `sum(vdot(x, y))` over the leaves (`x` conjugated); with
    `axis_name`, over every device's blocks (`owner` names the transform in the
    error when that fails)."""
    # Starting from float32 (not the default float, float64 under jax_enable_x64)
    # keeps the result in the leaves' precision.
    if axis_name is None:
        total = sum((jnp.vdot(x, y) for x, y in zip(a, b)), jnp.zeros((), jnp.float32))
        return jnp.real(total)
    # Inside shard_map: each leaf's inner product over its blocks on every device.
    partials = [jnp.vdot(x, y) for x, y in zip(a, b)]
    dtype = jnp.result_type(jnp.float32, *partials) if partials else jnp.float32
    return jnp.real(_shards.shard_total(partials, axis_name, owner, dtype))


def scalar_dtype(params: PyTree) -> Any:
    """The real dtype of a linesearch's scalars and of its state's: float32, or
    float64 when a float leaf is float64 or complex128."""
    dtype = jnp.dtype(jnp.float32)
    for p in jax.tree.leaves(params):
        if is_float_leaf(p):
            dtype = join_dtypes(dtype, real_compute_dtype(p.dtype))
    return dtype


def add_scale(a: list[Array], s: Array, b: list[Array]) -> list[Array]:
    """`a + s * b`, leaf by leaf."""
    return [x + s * y for x, y in zip(a, b)]
