"""Optimistic Adam: Adam with an optimistic (extrapolated) step, for min-max games."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step
from ._adam import (
    betas_and_eps,
    bias_correction,
    check_bool,
    dtype_or_none,
    ema,
    init_moments,
    nesterov_mean,
)


class OptimisticAdamState(eqx.Module):
    """State of `OptimisticAdam`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment, shaped like params.
    - `nu`: second moment, shaped like params.
    - `previous`: the previous step's Adam direction `r`, shaped like params
      (stored in `mu_dtype`).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    previous: PyTree[Float[Array, "..."] | None]


class OptimisticAdam(AbstractTransform):
    """Optimistic Adam (Daskalakis et al., 2018): Adam's direction extrapolated with
    the previous one, which damps the cycling of plain Adam on saddle-point (GAN,
    min-max) problems.

    For each leaf, with `t = step + 1`, `lr` the learning rate at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    r  = m_hat / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    p  = p - lr * ((alpha + beta) * r - beta * r_prev)
    ```

    where `m_hat` is the Nesterov first moment (as `Adam(nesterov=True)`; plain
    `mu / (1 - b1**t)` with `nesterov=False`) and `r_prev` the previous step's `r`
    (`r` itself on the first step). The same as `optax.optimistic_adam_v2`; the
    deprecated `optax.optimistic_adam(lr, optimism)` is this with
    `learning_rate=1, alpha=lr, beta=optimism`. torch.optim has no such optimizer.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `alpha`: weight of the current direction, `>= 0` (default `1`).
    - `beta`: the optimism, weight of the difference to the previous direction,
      `>= 0` (default `1`).
    - `nesterov`: a bool (default `True`, as optax).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    alpha: Float[Array, ""]
    beta: Float[Array, ""]
    nesterov: bool = eqx.field(static=True)
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        *,
        alpha: Any = 1.0,
        beta: Any = 1.0,
        eps_root: Any = 0.0,
        nesterov: bool = True,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.alpha = hyperparameter("alpha", alpha, low=0.0)
        self.beta = hyperparameter("beta", beta, low=0.0)
        self.nesterov = check_bool("nesterov", nesterov)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> OptimisticAdamState:
        mu, nu = init_moments(params, self.mu_dtype, self.nu_dtype)
        previous = float_leaves_like(params, self.mu_dtype)
        return OptimisticAdamState(step=zero_step(), mu=mu, nu=nu, previous=previous)

    def transform(
        self, grads: Grads, state: OptimisticAdamState, params: Params
    ) -> tuple[Updates, OptimisticAdamState]:
        lr = self.learning_rate(state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        alpha, beta = self.alpha, self.beta
        first = state.step == 0
        t = increment(state.step)
        bias1 = bias_correction(b1, t)
        bias2 = bias_correction(b2, t)
        nesterov = self.nesterov

        def rule(g, p, mu, nu, previous):
            mu = ema(mu, g, b1)
            nu = ema(nu, abs_sq(g), b2)
            m_hat = nesterov_mean(mu, g, b1, t) if nesterov else mu / bias1
            r = m_hat / (jnp.sqrt(nu / bias2 + eps_root) + eps)
            previous = jnp.where(first, r, previous)
            return -lr * ((alpha + beta) * r - beta * previous), mu, nu, r

        updates, (mu, nu, previous) = map_leaves(
            rule,
            grads,
            params,
            (state.mu, state.nu, state.previous),
            elementwise=True,
        )
        return updates, OptimisticAdamState(step=t, mu=mu, nu=nu, previous=previous)
