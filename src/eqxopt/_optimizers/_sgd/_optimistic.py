"""Optimistic gradient descent (extrapolation from the previous gradient)."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import float_leaves_like, increment, zero_step


class OptimisticGradientDescentState(eqx.Module):
    """State of `OptimisticGradientDescent`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `prev_grad`: the previous gradient, shaped like params (`None` at
      non-float leaves).
    """

    step: Int[Array, ""]
    prev_grad: PyTree[Float[Array, "..."] | None]


class OptimisticGradientDescent(AbstractTransform):
    """Optimistic gradient descent (Mokhtari et al., 2019), the generalised form.

    For each leaf, with `lr` the learning rate at the current step:

    ```
    p = p - lr * ((alpha + beta) * g - beta * g_prev)
    ```

    where `g_prev` is the previous step's gradient, and the current gradient on
    the first step (so the first step is plain gradient descent with rate `lr *
    alpha`). With `alpha = beta = 1` this is `p - lr * (2 g - g_prev)`, the
    classic optimistic step for min-max games. The same as
    `optax.optimistic_gradient_descent` (torch has no equivalent). As there,
    "first step" is global: a leaf that had no gradient on step 0 extrapolates
    from a zero previous gradient when it first gets one.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `alpha`: weight of the current gradient, `>= 0`.
    - `beta`: weight of the extrapolation (negative momentum), `>= 0`.
    """

    learning_rate: AbstractSchedule
    alpha: Float[Array, ""]
    beta: Float[Array, ""]

    def __init__(self, learning_rate: Any, alpha: Any = 1.0, beta: Any = 1.0):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.alpha = hyperparameter("alpha", alpha, low=0.0)
        self.beta = hyperparameter("beta", beta, low=0.0)

    def init(self, params: Params) -> OptimisticGradientDescentState:
        return OptimisticGradientDescentState(
            step=zero_step(), prev_grad=float_leaves_like(params)
        )

    def transform(
        self, grads: Grads, state: OptimisticGradientDescentState, params: Params
    ) -> tuple[Updates, OptimisticGradientDescentState]:
        lr = self.learning_rate(state.step)
        alpha, beta = self.alpha, self.beta
        first = state.step == 0

        def rule(g, p, prev):
            prev = jnp.where(first, g, prev)
            return -lr * ((alpha + beta) * g - beta * prev), g

        updates, (prev,) = map_leaves(
            rule, grads, params, (state.prev_grad,), elementwise=True
        )
        return updates, OptimisticGradientDescentState(
            step=increment(state.step), prev_grad=prev
        )
