"""RAdam: Adam with a rectified adaptive learning rate."""

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
    betas_and_eps,
    bias_correction,
    check_bool,
    decay_flags,
    dtype_or_none,
    ema,
    float_or_schedule,
    freeze_mask,
    nesterov_mean,
    value_at,
    with_decay,
)

_SERIES_STEPS = 1024


def rho_t(b2: Array, t: Array) -> Array:
    """`rho_inf - 2 t b2**t / (1 - b2**t)`, accurate in float32.

    Written that way, the formula subtracts two numbers close to `rho_inf` (about
    2000 for `b2 = 0.999`, 20000 for `0.9999`) to get one of size about `t`: in
    float32 the early `rho_t` are off by up to 0.7% (`b2 = 0.999`) or 66%
    (`0.9999`). For `t <= 1024` this uses the equal form without cancellation,
    `rho_t = 2 sum_{i<t} b2**i (1 - b2**(t-i)) / (1 - b2**t) - 1` (all terms
    positive; relative error below 1e-5), and the direct formula after that, where
    it is accurate enough."""
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    direct = rho_inf - 2 * t * b2**t / (1 - b2**t)
    log_b2 = jnp.log(b2)
    tf = t.astype(log_b2.dtype)
    i = jnp.arange(_SERIES_STEPS, dtype=log_b2.dtype)
    terms = jnp.exp(i * log_b2) * -jnp.expm1(jnp.maximum(tf - i, 0.0) * log_b2)
    series = 2 * jnp.sum(jnp.where(i < tf, terms, 0.0)) / -jnp.expm1(tf * log_b2) - 1
    return jnp.where(t <= _SERIES_STEPS, series, direct)


class RAdam(AbstractTransform):
    """Rectified Adam (Liu et al., 2020).

    For each leaf, with `t = step + 1`, `lr`, `wd` the learning rate and weight decay
    at `step`, `rho_inf = 2 / (1 - b2) - 1` and
    `rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    m_hat = mu / (1 - b1**t)
    r = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))
    u = r * m_hat / (sqrt(nu / (1 - b2**t) + eps_root) + eps)   if rho_t >= threshold
    u = m_hat                                                   otherwise
    p = p - lr * (u + wd * p)
    ```

    `rho_t` is computed without cancellation (see `rho_t`), as accurate as torch's
    float64 value; `optax.radam` evaluates the formula above in float32, which
    cancels about `rho_inf` against itself, so its rectification factor `r` is off
    by about 1e-4 relative with `b2 = 0.999` in the first steps (more for `b2`
    closer to 1); otherwise this is `optax.radam` (which has no weight decay).
    `torch.optim.RAdam` differs in two small ways: it rectifies when `rho_t > 5`
    (strictly; here `rho_t >= threshold`, so they part only if `rho_t` is exactly
    5), and it adds `eps` to `sqrt(nu)` before the bias correction, i.e. divides by
    `sqrt(nu_hat) + eps / sqrt(1 - b2**t)` (a relative difference of order `eps`).
    Its `decoupled_weight_decay=True` is `weight_decay` here.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `threshold`: the `rho_t` from which the rectified step is used, `>= 0`
      (optax's default `5`).
    - `weight_decay`: decoupled decay (default `0`), a float `>= 0` or a schedule.
    - `mask`: which leaves get weight decay, as for `AdamW`.
    - `nesterov`: use the Nesterov first moment (as optax's `nesterov`).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    threshold: Float[Array, ""]
    weight_decay: Float[Array, ""] | AbstractSchedule
    mask: Any = eqx.field(static=True)
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
        eps_root: Any = 0.0,
        threshold: Any = 5.0,
        weight_decay: Any = 0.0,
        mask: Any = None,
        nesterov: bool = False,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.threshold = hyperparameter("threshold", threshold, low=0.0)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.mask = freeze_mask(mask)
        self.nesterov = check_bool("nesterov", nesterov)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        decay_flags(self.mask, params)
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        lr = self.learning_rate(state.step)
        wd = value_at(self.weight_decay, state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        t = increment(state.step)
        bias1 = bias_correction(b1, t)
        bias2 = bias_correction(b2, t)
        rho_inf = 2.0 / (1.0 - b2) - 1.0
        rho = rho_t(b2, t)
        rectify = rho >= self.threshold
        # Clamped so the unselected branch stays finite while rho_t < 4.
        safe_rho = jnp.where(rectify, rho, 5.0)
        r = jnp.sqrt(
            (safe_rho - 4.0)
            * (safe_rho - 2.0)
            * rho_inf
            / ((rho_inf - 4.0) * (rho_inf - 2.0) * safe_rho)
        )
        nesterov = self.nesterov

        def rule(g, p, mu, nu, flag):
            mu = ema(mu, g, b1)
            nu = ema(nu, abs_sq(g), b2)
            m_hat = nesterov_mean(mu, g, b1, t) if nesterov else mu / bias1
            adaptive = r * m_hat / (jnp.sqrt(nu / bias2 + eps_root) + eps)
            direction = jnp.where(rectify, adaptive, m_hat)
            return -lr * with_decay(direction, p, wd, flag), mu, nu

        updates, (mu, nu) = map_leaves(
            rule,
            grads,
            params,
            (state.mu, state.nu),
            elementwise=True,
            flags=decay_flags(self.mask, params),
        )
        return updates, AdamState(step=t, mu=mu, nu=nu)
