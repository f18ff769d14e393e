"""What GaLore and APOLLO share: which leaves they project to a low rank, and the
zeros of a moment kept for a projected matrix."""

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array

from ..._core._fields import DTypeLike
from ..._core._param_sharding import split_like
from ..._core._tree import is_float_leaf, stored_dtype


def matrix_plan(p: Any, rank: int) -> tuple[bool, int] | None:
    """For a float matrix leaf `(m, n)`: whether its rows are the long side (`m >=
    n`), and the rank `min(rank, m, n)` it is projected to; `None` for every other
    leaf (plain Adam)."""
    if not is_float_leaf(p) or p.ndim != 2:
        return None
    m, n = p.shape
    return m >= n, min(rank, m, n)


def low_rank_zeros(p: Array, rows: bool, r: int, dtype: DTypeLike) -> Array:
    """Zeros for a moment of the matrix `p` `(m, n)` projected to rank `r`: `(m, r)`
    where the projection keeps its rows, else `(r, n)`; stored in `dtype` (`None`:
    `p`'s) and split like the dimension of `p` it keeps (`split_like`)."""
    m, n = p.shape
    shape, dims = ((m, r), (0, None)) if rows else ((r, n), (None, 1))
    return split_like(jnp.zeros(shape, stored_dtype(dtype, p.dtype)), p, dims)
