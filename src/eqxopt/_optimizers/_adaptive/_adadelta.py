"""Adadelta: steps scaled by the ratio of running RMS of updates and gradients."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step


class AdadeltaState(eqx.Module):
    """State of `Adadelta`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `avg_sq_grad`: running average of squared gradients, `E[g**2]`, shaped like
      params (`None` at non-float leaves).
    - `avg_sq_delta`: running average of squared (unscaled) updates, `E[dx**2]`.
    """

    step: Int[Array, ""]
    avg_sq_grad: PyTree[Float[Array, "..."] | None]
    avg_sq_delta: PyTree[Float[Array, "..."] | None]


class Adadelta(AbstractTransform):
    """Adadelta (Zeiler, 2012).

    For each leaf, with `lr` the learning rate at the current step:

    ```
    g   = g + weight_decay * p                         (L2 penalty)
    Eg  = rho * Eg + (1 - rho) * g**2
    dx  = sqrt(Edx + eps) / sqrt(Eg + eps) * g
    Edx = rho * Edx + (1 - rho) * dx**2
    p   = p - lr * dx
    ```

    The same as `optax.adadelta` (with `learning_rate=1.0` for its default
    `None`) and `torch.optim.Adadelta`; both add the weight decay to the gradient
    as here.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module;
      `1.0` (the default) is the method as published.
    - `rho`: decay of both running averages, in `[0, 1)`.
    - `eps`: added inside both roots, `> 0` (with `0` the first step, and so
      every step, would be zero).
    - `weight_decay`: coupled L2 penalty added to the gradient, `>= 0`.
    """

    learning_rate: AbstractSchedule
    rho: Float[Array, ""]
    eps: Float[Array, ""]
    weight_decay: Float[Array, ""]

    def __init__(
        self,
        learning_rate: Any = 1.0,
        rho: Any = 0.9,
        eps: Any = 1e-6,
        weight_decay: Any = 0.0,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.rho = hyperparameter("rho", rho, low=0.0, high=1.0, high_open=True)
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)

    def init(self, params: Params) -> AdadeltaState:
        return AdadeltaState(
            step=zero_step(),
            avg_sq_grad=float_leaves_like(params),
            avg_sq_delta=float_leaves_like(params),
        )

    def transform(
        self, grads: Grads, state: AdadeltaState, params: Params
    ) -> tuple[Updates, AdadeltaState]:
        lr = self.learning_rate(state.step)
        rho, eps, weight_decay = self.rho, self.eps, self.weight_decay

        def rule(g, p, eg, edx):
            g = g + weight_decay * p
            eg = rho * eg + (1 - rho) * abs_sq(g)
            delta = jnp.sqrt(edx + eps) / jnp.sqrt(eg + eps) * g
            edx = rho * edx + (1 - rho) * abs_sq(delta)
            return -lr * delta, eg, edx

        updates, (eg, edx) = map_leaves(
            rule,
            grads,
            params,
            (state.avg_sq_grad, state.avg_sq_delta),
            elementwise=True,
        )
        return updates, AdadeltaState(
            step=increment(state.step), avg_sq_grad=eg, avg_sq_delta=edx
        )
