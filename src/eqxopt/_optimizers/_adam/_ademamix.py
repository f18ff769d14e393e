"""AdEMAMix: AdamW with a mixture of a fast and a slow momentum."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step
from ._adam import (
    betas_and_eps,
    bias_correction,
    decay_flags,
    dtype_or_none,
    ema,
    float_or_schedule,
    freeze_mask,
    value_at,
    with_decay,
)


class AdEMAMixState(eqx.Module):
    """State of `AdEMAMix`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `m1`: the fast first moment (decay `b1`), shaped like params.
    - `m2`: the slow first moment (decay `b3`), shaped like params.
    - `nu`: the second moment, shaped like params.
    """

    step: Int[Array, ""]
    m1: PyTree[Float[Array, "..."] | None]
    m2: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class AdEMAMix(AbstractTransform):
    """AdEMAMix (Pagliardini et al., 2024): AdamW whose numerator mixes a fast and a
    very slow exponential moving average of the gradients.

    For each leaf, with `t = step + 1` and `lr`, `wd`, `alpha`, `b3` the values at
    `step` (each may be a schedule, as the paper warms up `alpha` and `b3`):

    ```
    m1 = b1 * m1 + (1 - b1) * g
    m2 = b3 * m2 + (1 - b3) * g                    (not bias-corrected)
    nu = b2 * nu + (1 - b2) * g**2
    p  = p - lr * ((m1 / (1 - b1**t) + alpha * m2)
                   / (sqrt(nu / (1 - b2**t) + eps_root) + eps) + wd * p)
    ```

    The same as `optax.contrib.ademamix` (which stores `nu` in `mu_dtype`; here it
    is `nu_dtype`). torch.optim has no AdEMAMix.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `b3`: decay of the slow moment, in `[0, 1)` (default `0.9999`), or a schedule.
    - `alpha`: weight of the slow moment, `>= 0` (default `5`), or a schedule.
    - `weight_decay`: decoupled decay (default `0`), a float `>= 0` or a schedule.
    - `mask`: which leaves get weight decay, as for `AdamW`.
    - `mu_dtype`: dtype of `m1` and `m2`; `nu_dtype`: of `nu` (as for `Adam`).
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    b3: Float[Array, ""] | AbstractSchedule
    alpha: Float[Array, ""] | AbstractSchedule
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    weight_decay: Float[Array, ""] | AbstractSchedule
    mask: Any = eqx.field(static=True)
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        b3: Any = 0.9999,
        alpha: Any = 5.0,
        eps: Any = 1e-8,
        *,
        eps_root: Any = 0.0,
        weight_decay: Any = 0.0,
        mask: Any = None,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.b3 = float_or_schedule("b3", b3, low=0.0, high=1.0, high_open=True)
        self.alpha = float_or_schedule("alpha", alpha, low=0.0)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.mask = freeze_mask(mask)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdEMAMixState:
        decay_flags(self.mask, params)
        return AdEMAMixState(
            step=zero_step(),
            m1=float_leaves_like(params, self.mu_dtype),
            m2=float_leaves_like(params, self.mu_dtype),
            nu=float_leaves_like(params, self.nu_dtype),
        )

    def transform(
        self, grads: Grads, state: AdEMAMixState, params: Params
    ) -> tuple[Updates, AdEMAMixState]:
        lr = self.learning_rate(state.step)
        wd = value_at(self.weight_decay, state.step)
        alpha = value_at(self.alpha, state.step)
        b3 = value_at(self.b3, state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        t = increment(state.step)
        bias1 = bias_correction(b1, t)
        bias2 = bias_correction(b2, t)

        def rule(g, p, m1, m2, nu, flag):
            m1 = ema(m1, g, b1)
            m2 = ema(m2, g, b3)
            nu = ema(nu, abs_sq(g), b2)
            direction = (m1 / bias1 + alpha * m2) / (
                jnp.sqrt(nu / bias2 + eps_root) + eps
            )
            return -lr * with_decay(direction, p, wd, flag), m1, m2, nu

        updates, (m1, m2, nu) = map_leaves(
            rule,
            grads,
            params,
            (state.m1, state.m2, state.nu),
            elementwise=True,
            flags=decay_flags(self.mask, params),
        )
        return updates, AdEMAMixState(step=t, m1=m1, m2=m2, nu=nu)
