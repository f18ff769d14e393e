"""Adagrad: steps scaled by the root of the sum of all squared gradients."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import (
    abs_sq,
    float_leaves_like,
    increment,
    zero_step,
)


class AdagradState(eqx.Module):
    """State of `Adagrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `sum_of_squares`: the accumulated squared gradients, shaped like params
      (`None` at non-float leaves); starts at `initial_accumulator_value`.
    """

    step: Int[Array, ""]
    sum_of_squares: PyTree[Float[Array, "..."] | None]


class Adagrad(AbstractTransform):
    """Adagrad (Duchi et al., 2011).

    For each leaf, with `lr` the learning rate at the current step:

    ```
    g = g + weight_decay * p                    (L2 penalty, if weight_decay > 0)
    s = s + g**2                                (s starts at initial_accumulator_value)
    p = p - lr * g / sqrt(s + eps)              (eps_in_sqrt=True, optax)
    p = p - lr * g / (sqrt(s) + eps)            (eps_in_sqrt=False, torch)
    ```

    Where `s == 0` (only possible while every gradient so far was zero) the update
    is zero.

    **Conventions.** The defaults are `optax.adagrad`'s: `initial_accumulator_value
    = 0.1`, `eps = 1e-7` inside the root. `torch.optim.Adagrad` starts the sum at 0
    and adds `eps = 1e-10` outside the root: `Adagrad(lr,
    initial_accumulator_value=0.0, eps=1e-10, eps_in_sqrt=False)` matches it (its
    `lr_decay` is a schedule here: pass `learning_rate` as a schedule module).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `initial_accumulator_value`: the starting value of the sum, `>= 0`.
    - `eps`: added inside or outside the root (see `eps_in_sqrt`), `>= 0`.
    - `eps_in_sqrt`: where `eps` goes; `True` as optax, `False` as torch.
    - `weight_decay`: coupled L2 penalty added to the gradient before it is
      accumulated (torch's `weight_decay`), `>= 0`.
    """

    learning_rate: AbstractSchedule
    initial_accumulator_value: Float[Array, ""]
    eps: Float[Array, ""]
    weight_decay: Float[Array, ""]
    eps_in_sqrt: bool = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        initial_accumulator_value: Any = 0.1,
        eps: Any = 1e-7,
        *,
        eps_in_sqrt: bool = True,
        weight_decay: Any = 0.0,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.initial_accumulator_value = hyperparameter(
            "initial_accumulator_value", initial_accumulator_value, low=0.0
        )
        self.eps = hyperparameter("eps", eps, low=0.0)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        self.eps_in_sqrt = _flag("eps_in_sqrt", eps_in_sqrt)

    def init(self, params: Params) -> AdagradState:
        return AdagradState(
            step=zero_step(),
            sum_of_squares=float_leaves_like(
                params, fill=self.initial_accumulator_value
            ),
        )

    def transform(
        self, grads: Grads, state: AdagradState, params: Params
    ) -> tuple[Updates, AdagradState]:
        lr = self.learning_rate(state.step)
        eps, weight_decay = self.eps, self.weight_decay

        def rule(g, p, s):
            g = g + weight_decay * p
            s = s + abs_sq(g)
            positive = s > 0
            safe = jnp.where(positive, s, 1.0)
            if self.eps_in_sqrt:
                scale = 1 / jnp.sqrt(safe + eps)
            else:
                scale = 1 / (jnp.sqrt(safe) + eps)
            return -lr * jnp.where(positive, g * scale, 0.0), s

        updates, (sums,) = map_leaves(
            rule, grads, params, (state.sum_of_squares,), elementwise=True
        )
        return updates, AdagradState(step=increment(state.step), sum_of_squares=sums)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value
