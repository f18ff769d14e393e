"""The Euclidean norm of a tree's float leaves taken together, computed one way for
every reduction in the library that takes one (`global_norm`, `ClipByGlobalNorm`,
`tree_norm`, `Monitor`, `SkipLargeUpdates`, `Mechanic`, `PolyakSGD`, `DoG`), so
that they agree on every input:

- a NaN anywhere makes the norm NaN, an infinity (without a NaN) makes it infinite,
  as in optax and torch: a guard such as `where(total > 0, sqrt(total), 0)` would
  turn a NaN into 0 and let a clip pass huge gradients;
- the squares are summed in the precision of the leaves' own maths
  (`reduction_dtype`): float32 for float32 and narrower leaves, float64 where a
  leaf is float64 (under `jax_enable_x64`), so a float64 model is not clipped by a
  float32 norm;
- the root has a zero gradient where the norm is 0 (not NaN), so the gradient of a
  norm of all-zero leaves is finite;
- inside `jax.shard_map` with `axis_name`, each leaf's sum is completed over the
  axes it is split over (`_shards.shard_total`).

`divisible` is the matching guard of a division by such a sum: it lets a NaN
through, where `total > 0` would not.
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._shards import AxisName, shard_total
from ._tree import (
    abs_sq,
    compute_dtype,
    is_float_leaf,
    join_dtypes,
    real_compute_dtype,
)


def reduction_dtype(leaves: Sequence[Any]) -> Any:
    """The real dtype a sum over the float arrays among `leaves` is taken in: the
    widest of their compute dtypes (`compute_dtype`, at least float32), real
    (complex128 leaves give float64); float32 when there are none."""
    dtypes = [real_compute_dtype(x.dtype) for x in leaves if is_float_leaf(x)]
    return functools.reduce(join_dtypes, dtypes, jnp.dtype(jnp.float32))


def sum_of_squares(
    leaves: Sequence[Any], axis_name: AxisName, owner: str, dtype: Any = None
) -> Array:
    """`sum over leaves of sum(|x|**2)` over the float arrays among `leaves`
    (`None` and other leaves skipped): each leaf summed in its compute dtype (bf16
    leaves in float32), the leaves' sums added in `dtype` (default
    `reduction_dtype(leaves)`); 0 for none. `owner` names the caller in
    `axis_name` errors."""
    floats = [x for x in leaves if is_float_leaf(x)]
    dtype = reduction_dtype(floats) if dtype is None else dtype
    squares = [jnp.sum(abs_sq(x.astype(compute_dtype(x.dtype)))) for x in floats]
    return shard_total(squares, axis_name, owner, dtype)


def root(total: Array) -> Array:
    """`sqrt(total)` for a sum of squares, with a zero gradient at 0 (sqrt's slope
    is infinite there): the root of 1 is taken where `total == 0` and replaced by 0.
    A NaN stays NaN (`NaN == 0` is false), an infinity stays infinite."""
    zero = total == 0
    return jnp.where(zero, jnp.zeros_like(total), jnp.sqrt(jnp.where(zero, 1, total)))


def norm(leaves: Sequence[Any], axis_name: AxisName, owner: str) -> Array:
    """The Euclidean norm of the float arrays among `leaves` taken together:
    `root(sum_of_squares(...))`, in `reduction_dtype(leaves)`."""
    return root(sum_of_squares(leaves, axis_name, owner))


def divisible(total: Array, floor: float = 0.0) -> Array:
    """Whether a sum over the tree (a norm, an inner product, a denominator) may be
    divided by: above `floor`, or NaN. The guard of every division by such a sum,
    so that a NaN gradient makes the result NaN, as in optax, rather than reading
    as "no gradient yet": a plain `total > 0` sends a NaN to the fallback, and an
    optimizer whose step size comes from the sum (Prodigy's and D-Adaptation's
    `d`, Momo's step) then freezes it and moves on with a corrupted statistic."""
    return (total > floor) | jnp.isnan(total)


def statistic_like(params: Any, fill: Any = 0.0, shape: tuple[int, ...] = ()) -> Array:
    """A whole-tree statistic of an optimizer's state at `init` (a `d`, a sum of
    squares, a distance): `fill` of `shape` in the dtype sums over `params` are
    taken in (`reduction_dtype`: float32, float64 for float64 parameters under
    `jax_enable_x64`), as a buffer of its own (a donated step may overwrite
    it)."""
    dtype = reduction_dtype(jax.tree.leaves(params))
    return jnp.array(jnp.broadcast_to(jnp.asarray(fill, dtype), shape), copy=True)
