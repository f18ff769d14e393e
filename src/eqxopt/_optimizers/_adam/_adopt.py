"""ADOPT: Adam with the second moment taken from before the current gradient."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import reject_complex
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, increment
from ._adam import (
    AdamState,
    adam_state,
    betas_and_eps,
    check_bool,
    dtype_or_none,
    ema,
)


class ADOPT(AbstractTransform):
    """ADOPT (Taniguchi et al., 2024): normalises the gradient by the second moment
    of the *previous* steps, then averages, so it converges for any `b2`.

    For each leaf, with `s = step` (before the increment) and `lr` the learning rate
    at `s`; on the first step (`s = 0`) `b1` is taken as `1` and `b2` as `0`, so the
    first update is zero and only initialises `nu = g**2`:

    ```
    x  = g / max(sqrt(nu), eps)                       (nu from the previous step)
    x  = clip(x, -s**0.25, s**0.25)                   (if clip=True)
    nu = b2 * nu + (1 - b2) * g**2
    mu = b1 * mu + (1 - b1) * x
    p  = p - lr * mu                                  (nesterov=False)
    p  = p - lr * (b1 * mu + (1 - b1) * x)            (nesterov=True)
    ```

    The same as `optax.contrib.adopt` with its default `clip_value_fn = s**0.25`.
    torch.optim has no ADOPT.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)` (default `0.9999`).
    - `eps`: the floor of `sqrt(nu)`, `> 0` (default `1e-6`).
    - `nesterov`: a bool.
    - `clip`: clip the normalised gradient to `[-s**0.25, s**0.25]` (a bool).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    nesterov: bool = eqx.field(static=True)
    clip: bool = eqx.field(static=True)
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.9999,
        eps: Any = 1e-6,
        *,
        nesterov: bool = False,
        clip: bool = True,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, _ = betas_and_eps(b1, b2, eps)
        self.nesterov = check_bool("nesterov", nesterov)
        self.clip = check_bool("clip", clip)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        self._check_real(params)
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def _check_real(self, params: Params) -> None:
        if self.clip:
            reject_complex(
                params,
                "params",
                "ADOPT(clip=True)",
                "complex numbers have no order to clip by; clip=False takes them",
            )

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        self._check_real(params)
        lr = self.learning_rate(state.step)
        first = state.step == 0
        b1 = jnp.where(first, 1.0, self.b1)
        b2 = jnp.where(first, 0.0, self.b2)
        eps = self.eps
        bound = state.step.astype(jnp.float32) ** 0.25
        clip, nesterov = self.clip, self.nesterov

        def rule(g, p, mu, nu):
            x = g / jnp.maximum(jnp.sqrt(nu), eps)
            if clip:
                x = jnp.clip(x, -bound, bound)
            nu = ema(nu, abs_sq(g), b2)
            mu = ema(mu, x, b1)
            direction = ema(mu, x, b1) if nesterov else mu
            return -lr * direction, mu, nu

        updates, (mu, nu) = map_leaves(
            rule, grads, params, (state.mu, state.nu), elementwise=True
        )
        return updates, AdamState(step=increment(state.step), mu=mu, nu=nu)
