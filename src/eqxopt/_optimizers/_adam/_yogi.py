"""Yogi: Adam with an additive second-moment update."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step
from ._adam import (
    AdamState,
    betas_and_eps,
    bias_correction,
    dtype_or_none,
    ema,
    init_moments,
)


class Yogi(AbstractTransform):
    """Yogi (Zaheer et al., 2018): the second moment moves towards `g**2` by a step
    of fixed size `(1 - b2) * g**2`, so the effective learning rate cannot jump up
    when gradients shrink.

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`, and
    both moments starting at `initial_accumulator_value`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = nu - (1 - b2) * sign(nu - g**2) * g**2
    p  = p - lr * (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    ```

    The same as `optax.yogi` (which bias-corrects both moments, as here; the paper
    does not). torch.optim has no Yogi.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`: as for `Adam`.
    - `eps`: added to the root, `> 0` (default `1e-3`, as in the paper and optax).
    - `eps_root`: added inside the root, `>= 0`.
    - `initial_accumulator_value`: the starting value of both moments, `>= 0`
      (default `1e-6`, as optax).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    initial_accumulator_value: Float[Array, ""]
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-3,
        *,
        eps_root: Any = 0.0,
        initial_accumulator_value: Any = 1e-6,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.initial_accumulator_value = hyperparameter(
            "initial_accumulator_value", initial_accumulator_value, low=0.0
        )
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        fill = self.initial_accumulator_value
        _, nu = init_moments(params, self.mu_dtype, self.nu_dtype, nu_fill=fill)
        mu = float_leaves_like(params, self.mu_dtype, fill=fill)  # type: ignore[arg-type]
        return AdamState(step=zero_step(), mu=mu, nu=nu)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        lr = self.learning_rate(state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        t = increment(state.step)
        bias1 = bias_correction(b1, t)
        bias2 = bias_correction(b2, t)

        def rule(g, p, mu, nu):
            mu = ema(mu, g, b1)
            g2 = abs_sq(g)
            nu = nu - (1 - b2) * jnp.sign(nu - g2) * g2
            direction = (mu / bias1) / (jnp.sqrt(nu / bias2 + eps_root) + eps)
            return -lr * direction, mu, nu

        updates, (mu, nu) = map_leaves(
            rule, grads, params, (state.mu, state.nu), elementwise=True
        )
        return updates, AdamState(step=t, mu=mu, nu=nu)
