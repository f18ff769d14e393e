"""NovoGrad: layer-wise second moments."""

from typing import Any

import equinox as eqx
import jax
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
    is_float_leaf,
    scalar_for_leaf,
    zero_step,
)


class NovoGradState(eqx.Module):
    """State of `NovoGrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of normalised gradients, shaped like params (`None` at
      non-float leaves).
    - `nu`: one scalar per float leaf, the moving average of the squared norm of
      that leaf's gradient (`None` at non-float leaves).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, ""] | None]


class NovoGrad(AbstractTransform):
    """NovoGrad (Ginsburg et al., 2019): Adam-like steps with one second moment per
    layer.

    For each leaf, with `lr` the learning rate at `step` and `|g|` the Frobenius norm
    of the leaf's gradient:

    ```
    nu = |g|**2                                       (first step)
    nu = b2 * nu + (1 - b2) * |g|**2                  (later steps)
    r  = g / (sqrt(nu + eps_root) + eps) + weight_decay * p
    mu = r                                            (first step)
    mu = b1 * mu + r                                  (later steps)
    p  = p - lr * mu
    ```

    The same as `optax.novograd` (note `mu` is a sum, not an average: no `1 - b1`
    factor, no bias correction). "First step" is the optimizer's first update: a leaf
    whose gradient is `None` then starts its averages from 0 on its first gradient.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the momentum, in `[0, 1)`.
    - `b2`: decay of the per-layer second moment, in `[0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: coefficient of `p` added to the normalised gradient, `>= 0`.
    - `eps_root`: added inside the root, `>= 0`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    weight_decay: Float[Array, ""]
    eps_root: Float[Array, ""]

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.25,
        eps: Any = 1e-6,
        weight_decay: Any = 0.0,
        *,
        eps_root: Any = 0.0,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter("b2", b2, low=0.0, high=1.0, high_open=True)
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        self.eps_root = hyperparameter("eps_root", eps_root, low=0.0)

    def init(self, params: Params) -> NovoGradState:
        def scalar(p):
            return scalar_for_leaf(p) if is_float_leaf(p) else None

        return NovoGradState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=jax.tree.map(scalar, params),
        )

    def transform(
        self, grads: Grads, state: NovoGradState, params: Params
    ) -> tuple[Updates, NovoGradState]:
        lr = self.learning_rate(state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        weight_decay = self.weight_decay
        first = state.step == 0

        def rule(g, p, mu, nu):
            sq_norm = jnp.sum(abs_sq(g))
            nu = jnp.where(first, sq_norm, b2 * nu + (1 - b2) * sq_norm)
            r = g / (jnp.sqrt(nu + eps_root) + eps) + weight_decay * p
            mu = jnp.where(first, r, b1 * mu + r)
            return -lr * mu, mu, nu

        updates, (mu, nu) = map_leaves(
            rule, grads, params, (state.mu, state.nu), elementwise=False
        )
        return updates, NovoGradState(step=increment(state.step), mu=mu, nu=nu)
