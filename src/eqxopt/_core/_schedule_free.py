"""The schedule-free averaging (Defazio et al., 2024) that both the schedule-free
optimizers and the `ScheduleFree` wrapper run around a base step: the iterate `z`
kept in the state, the averaging weight, the interpolation of the parameters `y`,
and the evaluation parameters `x`."""

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._base import Params
from ._tree import compute_dtype, is_float_leaf


def initial_z(params: Params, z_dtype: Any) -> Any:
    """`z` starts at the parameters (a copy, in `z_dtype` or each leaf's dtype);
    `None` at non-float leaves."""

    def z_of(p):
        if not is_float_leaf(p):
            return None
        return jnp.array(p, dtype=p.dtype if z_dtype is None else z_dtype, copy=True)

    return jax.tree.map(z_of, params)


def averaging_weight(
    max_lr: Float[Array, ""], weight_sum: Float[Array, ""], lr: Any, power: Any
) -> tuple[Array, Array, Array]:
    """The weight `c = w / W` of the new `z` in the average, with `w =
    max_lr**power` for the largest learning rate so far; and the new `max_lr` and
    `W`. A zero learning rate so far (0 / 0) gives `c = 0`: `x` stays where it is."""
    max_lr = jnp.maximum(max_lr, lr)
    weight = max_lr**power
    weight_sum = weight_sum + weight
    ck = jnp.where(
        jnp.isnan(weight) | jnp.isnan(weight_sum),
        jnp.nan,
        jnp.nan_to_num(weight / weight_sum, nan=0.0, posinf=jnp.inf),
    )
    return ck, max_lr, weight_sum


def interpolate(y: Array, z: Array, u: Array, b1: Any, ck: Any) -> tuple[Array, Array]:
    """One schedule-free step at a leaf, in the leaf's compute dtype: `z` moves by
    the base step `u`, `x` (recovered from `y` and the old `z`) moves towards it by
    `ck`; returns the new `y = b1 * x + (1 - b1) * z` and the new `z`."""
    x = (y - (1 - b1) * z) / b1
    z = z + u
    x = (1 - ck) * x + ck * z
    return b1 * x + (1 - b1) * z, z


def eval_params(params: Params, z_tree: Any, b1: Any) -> Params:
    """The averaged parameters `x = (y - (1 - b1) * z) / b1` at which to evaluate
    the model; non-float leaves pass through, each leaf keeps its dtype."""

    def x_of(p, z):
        if z is None or not is_float_leaf(p):
            return p
        dtype = compute_dtype(p.dtype)
        y, z = p.astype(dtype), z.astype(dtype)
        return ((y - (1 - b1) * z) / b1).astype(p.dtype)

    return jax.tree.map(x_of, params, z_tree, is_leaf=lambda x: x is None)
