"""Skipping steps whose gradients are too large (optax's `skip_large_updates`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._core._base import AbstractTransform, Grads, Params
from .._core._fields import axis_name_field, hyper
from .._core._norms import reduction_dtype, sum_of_squares
from .._core._shards import AxisName
from .._core._tree import align_grads, is_float_leaf
from ._wrapper import AbstractGate, inner_field


class SkipLargeUpdatesState(eqx.Module):
    """State of `SkipLargeUpdates`.

    **Fields:**

    - `should_skip`: bool scalar, whether the last step was skipped.
    - `norm_squared`: scalar, the squared global norm of the last step's
      gradients (float32, or float64 for float64 parameters under
      `jax_enable_x64`).
    - `inner`: the wrapped optimizer's state.
    """

    should_skip: Bool[Array, ""]
    norm_squared: Float[Array, ""]
    inner: Any


class SkipLargeUpdates(AbstractGate):
    """Skips steps whose gradients have a squared global norm of `max_squared_norm`
    or more (or a NaN): the update is zero and the inner state does not change.
    The inner optimizer only runs on accepted steps (a `lax.cond`).

    The same as `optax.MultiSteps(inner, 1, should_skip_update_fn=
    functools.partial(optax.skip_large_updates, max_squared_norm=...))`, whose
    `updates` are the gradients: `||g||^2 < max_squared_norm` accepts a step.

    **Arguments:**

    - `inner`: the optimizer (or chain) to protect.
    - `max_squared_norm`: the bound on the squared global gradient norm, `> 0`
      (a number or scalar array; an array field, so changing it does not
      recompile).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norm of the whole model's gradients (each leaf summed over the named axes it
      is split over), so every device skips alike. `None` (default): this device's
      gradients only.
    """

    reduces_over = "tree"

    inner: AbstractTransform = inner_field()
    axis_name: AxisName = axis_name_field()
    # Read without a step count (the wrapper keeps none), so not a schedule.
    max_squared_norm: Float[Array, ""] = hyper(low=0.0, low_open=True, schedule=False)

    state_type = SkipLargeUpdatesState

    def start(self, params: Params) -> dict[str, Any]:
        dtype = reduction_dtype(jax.tree.leaves(params))
        return dict(should_skip=jnp.array(False), norm_squared=jnp.zeros((), dtype))

    def gate(
        self, grads: Grads, state: SkipLargeUpdatesState, params: Params
    ) -> tuple[Any, dict[str, Any]]:
        floats = [
            g
            for g, p in zip(align_grads(grads, params), jax.tree.leaves(params))
            if is_float_leaf(p)
        ]
        norm_sq = sum_of_squares(
            floats, self.axis_name, "SkipLargeUpdates", state.norm_squared.dtype
        )
        should_skip = jnp.logical_not(norm_sq < self.max_squared_norm)
        return jnp.logical_not(should_skip), dict(
            should_skip=should_skip, norm_squared=norm_sq
        )
