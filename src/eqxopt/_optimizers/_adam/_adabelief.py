"""AdaBelief: Adam with the variance of the gradient around its mean."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, increment
from ._adam import (
    AdamState,
    adam_state,
    bias_correction,
    check_bool,
    dtype_or_none,
    ema,
    nesterov_mean,
)


class AdaBelief(AbstractTransform):
    """AdaBelief (Zhuang et al., 2020): Adam whose second moment tracks how far each
    gradient is from the running mean (the "belief") rather than its size.

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * (g - mu)**2 + eps_root
    p  = p - lr * (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t)) + eps)
    ```

    The same as `optax.adabelief`, including its defaults `eps = eps_root = 1e-16`
    (the paper uses `eps = 1e-8`, `eps_root = 0`), and `eps_root` added to the stored
    `nu` at every step. `nesterov=True` uses the Nesterov first moment (see `Adam`).
    torch.optim has no AdaBelief.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`: as for `Adam`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added to the second moment at each step, `>= 0`.
    - `nesterov`: a bool.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    nesterov: bool = eqx.field(static=True)
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-16,
        *,
        eps_root: Any = 1e-16,
        nesterov: bool = False,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter(
            "b2", b2, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.eps_root = hyperparameter("eps_root", eps_root, low=0.0)
        self.nesterov = check_bool("nesterov", nesterov)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        lr = self.learning_rate(state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        t = increment(state.step)
        bias1 = bias_correction(b1, t)
        bias2 = bias_correction(b2, t)
        nesterov = self.nesterov

        def rule(g, p, mu, nu):
            mu = ema(mu, g, b1)
            nu = ema(nu, abs_sq(g - mu), b2) + eps_root
            m_hat = nesterov_mean(mu, g, b1, t) if nesterov else mu / bias1
            direction = m_hat / (jnp.sqrt(nu / bias2) + eps)
            return -lr * direction, mu, nu

        updates, (mu, nu) = map_leaves(
            rule, grads, params, (state.mu, state.nu), elementwise=True
        )
        return updates, AdamState(step=t, mu=mu, nu=nu)
