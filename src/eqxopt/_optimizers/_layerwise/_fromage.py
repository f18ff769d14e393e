"""Fromage: Frobenius-matched gradient descent."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import increment, zero_step
from ._lamb import trust_ratio


class FromageState(eqx.Module):
    """State of `Fromage`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (for learning-rate
      schedules).
    """

    step: Int[Array, ""]


class Fromage(AbstractTransform):
    """Fromage (Bernstein et al., 2020): steps of relative size `lr` per layer.

    For each leaf, with `lr` the learning rate at `step` and `|x|` the Frobenius norm
    of the whole leaf, each clipped below at `min_norm`:

    ```
    p = (p - lr * (|p| / |g|) * g) / sqrt(1 + lr**2)
    ```

    The same as `optax.fromage` (which writes it as the trust-ratio step scaled by
    `1 / sqrt(1 + lr**2)` plus a weight decay of `1 / sqrt(1 + lr**2) - 1`).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `min_norm`: lower bound of both norms in the ratio, `>= 0` (keeps the ratio
      finite for zero parameters or gradients).
    """

    learning_rate: AbstractSchedule
    min_norm: Float[Array, ""]

    def __init__(self, learning_rate: Any, min_norm: Any = 1e-6):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.min_norm = hyperparameter("min_norm", min_norm, low=0.0)

    def init(self, params: Params) -> FromageState:
        del params
        return FromageState(step=zero_step())

    def transform(
        self, grads: Grads, state: FromageState, params: Params
    ) -> tuple[Updates, FromageState]:
        lr = self.learning_rate(state.step)
        shrink = 1 / jnp.sqrt(1 + lr**2)
        min_norm = self.min_norm

        def rule(g, p):
            step = trust_ratio(g, p, min_norm=min_norm) * g
            # optax's order: -lr * shrink * step, plus (shrink - 1) * p.
            return ((-lr * shrink) * step + (shrink - 1) * p,)

        updates, _ = map_leaves(rule, grads, params, elementwise=False)
        return updates, FromageState(step=increment(state.step))
