"""Stochastic gradient descent with (Nesterov) momentum."""

from typing import Any

import equinox as eqx
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import float_leaves_like, increment, zero_step


class SGDState(eqx.Module):
    """State of `SGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `velocity`: the momentum buffer, shaped like params (`None` at non-float
      leaves).
    """

    step: Int[Array, ""]
    velocity: PyTree[Float[Array, "..."] | None]


class SGD(AbstractTransform):
    """Stochastic gradient descent, optionally with heavy-ball or Nesterov momentum.

    For each leaf, with `lr` the learning rate at the current step:

    ```
    v = momentum * v + g
    p = p - lr * v                         (nesterov=False)
    p = p - lr * (g + momentum * v)        (nesterov=True)
    ```

    The same as `optax.sgd` and as `torch.optim.SGD` with `dampening=0`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `momentum`: in `[0, 1)`; `0` gives plain SGD.
    - `nesterov`: use Nesterov momentum.
    """

    learning_rate: AbstractSchedule
    momentum: Float[Array, ""]
    nesterov: bool = eqx.field(static=True)

    def __init__(self, learning_rate: Any, momentum: Any = 0.0, nesterov: bool = False):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.momentum = hyperparameter(
            "momentum", momentum, low=0.0, high=1.0, high_open=True
        )
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__}")
        self.nesterov = nesterov

    def init(self, params: Params) -> SGDState:
        return SGDState(step=zero_step(), velocity=float_leaves_like(params))

    def transform(
        self, grads: Grads, state: SGDState, params: Params
    ) -> tuple[Updates, SGDState]:
        lr = self.learning_rate(state.step)
        momentum = self.momentum

        def rule(g, p, v):
            v = momentum * v + g
            direction = g + momentum * v if self.nesterov else v
            return -lr * direction, v

        updates, (velocity,) = map_leaves(
            rule, grads, params, (state.velocity,), elementwise=True
        )
        return updates, SGDState(step=increment(state.step), velocity=velocity)
