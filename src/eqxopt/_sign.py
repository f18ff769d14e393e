"""Sign-based optimizers: SignSGD, Signum and Lion."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ._base import AbstractTransform, Grads, Params, Updates
from ._checks import float_dtype_or_none, hyperparameter
from ._leafwise import map_leaves
from ._masks import Mask, resolve_mask
from ._schedules import AbstractSchedule, as_schedule
from ._tree import float_leaves_like, increment, zero_step


class SignSGDState(eqx.Module):
    """State of `SignSGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    """

    step: Int[Array, ""]


class SignSGD(AbstractTransform):
    """SignSGD (Bernstein et al., 2018): steps of fixed size along the gradient's
    signs.

    For each element, with `lr` the learning rate at the current step:

    ```
    p = p - lr * sign(g)
    ```

    The same as `optax.sign_sgd` (torch has no equivalent).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    """

    learning_rate: AbstractSchedule

    def __init__(self, learning_rate: Any):
        self.learning_rate = as_schedule("learning_rate", learning_rate)

    def init(self, params: Params) -> SignSGDState:
        return SignSGDState(step=zero_step())

    def transform(
        self, grads: Grads, state: SignSGDState, params: Params
    ) -> tuple[Updates, SignSGDState]:
        lr = self.learning_rate(state.step)

        def rule(g, p):
            return (-lr * jnp.sign(g),)

        updates, _ = map_leaves(rule, grads, params, elementwise=True)
        return updates, SignSGDState(step=increment(state.step))


class SignumState(eqx.Module):
    """State of `Signum`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: exponential moving average of gradients, shaped like params (`None`
      at non-float leaves).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]


class Signum(AbstractTransform):
    """Signum (Bernstein et al., 2018): SignSGD on a moving average of gradients.

    For each element, with `lr` the learning rate at the current step:

    ```
    mu = beta * mu + (1 - beta) * g
    p  = p - lr * sign(mu)
    ```

    The same as `optax.signum` (no bias correction: it would not change the
    sign). torch has no equivalent.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: decay of the moving average, in `[0, 1)`.
    - `mu_dtype`: dtype to store the average in; `None` keeps each parameter's
      dtype (optax's `accumulator_dtype`).
    """

    learning_rate: AbstractSchedule
    beta: Float[Array, ""]
    mu_dtype: Any = eqx.field(static=True)

    def __init__(self, learning_rate: Any, beta: Any = 0.9, *, mu_dtype: Any = None):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.beta = hyperparameter("beta", beta, low=0.0, high=1.0, high_open=True)
        self.mu_dtype = float_dtype_or_none("mu_dtype", mu_dtype)

    def init(self, params: Params) -> SignumState:
        return SignumState(
            step=zero_step(), mu=float_leaves_like(params, self.mu_dtype)
        )

    def transform(
        self, grads: Grads, state: SignumState, params: Params
    ) -> tuple[Updates, SignumState]:
        lr = self.learning_rate(state.step)
        beta = self.beta

        def rule(g, p, mu):
            mu = beta * mu + (1 - beta) * g
            return -lr * jnp.sign(mu), mu

        updates, (mu,) = map_leaves(rule, grads, params, (state.mu,), elementwise=True)
        return updates, SignumState(step=increment(state.step), mu=mu)


class LionState(eqx.Module):
    """State of `Lion`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum (moving average of gradients with decay `b2`), shaped
      like params (`None` at non-float leaves).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]


class Lion(AbstractTransform):
    """Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms").

    For each element, with `lr` the learning rate at the current step:

    ```
    c  = b1 * mu + (1 - b1) * g
    p  = p - lr * (sign(c) + weight_decay * p)     (decay only where `mask`)
    mu = b2 * mu + (1 - b2) * g
    ```

    The decay uses the parameter from before the update and is multiplied by the
    learning rate, as in `optax.lion` (which this matches) and the paper's code.
    Lion usually wants a learning rate 3-10x smaller than AdamW's and a weight
    decay 3-10x larger.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: interpolation between momentum and gradient for the step, in `[0, 1)`.
    - `b2`: decay of the momentum, in `[0, 1)`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params' structure), or a function of params returning one. An
      Equinox module is always read as a tree of bools, never called.
    - `mu_dtype`: dtype to store the momentum in; `None` keeps each parameter's
      dtype.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    weight_decay: Float[Array, ""]
    mask: Mask
    mu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.99,
        weight_decay: Any = 1e-3,
        *,
        mask: Mask = None,
        mu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter("b2", b2, low=0.0, high=1.0, high_open=True)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        self.mask = mask
        self.mu_dtype = float_dtype_or_none("mu_dtype", mu_dtype)

    def init(self, params: Params) -> LionState:
        return LionState(step=zero_step(), mu=float_leaves_like(params, self.mu_dtype))

    def transform(
        self, grads: Grads, state: LionState, params: Params
    ) -> tuple[Updates, LionState]:
        lr = self.learning_rate(state.step)
        b1, b2, weight_decay = self.b1, self.b2, self.weight_decay

        def rule(g, p, mu, decayed):
            direction = jnp.sign(b1 * mu + (1 - b1) * g)
            if decayed:
                direction = direction + weight_decay * p
            return -lr * direction, b2 * mu + (1 - b2) * g

        updates, (mu,) = map_leaves(
            rule,
            grads,
            params,
            (state.mu,),
            elementwise=True,
            flags=resolve_mask(self.mask, params),
        )
        return updates, LionState(step=increment(state.step), mu=mu)
