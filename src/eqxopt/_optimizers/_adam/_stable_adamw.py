"""StableAdamW: AdamW with per-tensor update clipping."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq
from ._adam import (
    AdamState,
    adam_state,
    adam_transform,
    betas_and_eps,
    decay_flags,
    dtype_or_none,
    float_or_schedule,
    freeze_mask,
    value_at,
)


class StableAdamW(AbstractTransform):
    """StableAdamW (Wortsman et al., 2023, "Stable and low-precision training for
    large-scale vision-language models", Algorithm 2): AdamW whose step size is cut,
    per tensor, when the gradient is large compared with the second moment (the
    AdaFactor-style update clipping that prevents loss spikes).

    Per leaf, with `t = step + 1` and `lr`, `wd` the learning rate and weight decay
    at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    m_hat, v_hat = mu / (1 - b1**t), nu / (1 - b2**t)
    rms = sqrt(mean(g**2 / max(v_hat, eps**2)))          (over the leaf)
    eta = lr / max(1, rms)
    p  = p - eta * (m_hat / (sqrt(v_hat + eps_root) + eps) + wd * p)
    ```

    The paper writes the moments with bias-corrected decays
    `b_hat = b * (1 - b**(t-1)) / (1 - b**t)`, which gives exactly `m_hat` and
    `v_hat` above. The decay is clipped with the step, as in the paper, and uses the
    parameter from before the update. Neither optax nor torch.optim has this
    optimizer.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `weight_decay`, `mask`: as for `AdamW`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
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
        eps: Any = 1e-8,
        weight_decay: Any = 1e-4,
        *,
        eps_root: Any = 0.0,
        mask: Any = None,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.mask = freeze_mask(mask)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        decay_flags(self.mask, params)
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        eps = self.eps

        def clipped(g, mu, v_hat, direction, lr):
            rms = jnp.sqrt(jnp.mean(abs_sq(g) / jnp.maximum(v_hat, eps * eps)))
            return direction, lr / jnp.maximum(1.0, rms)

        # Not elementwise: the clipping factor is a mean over each leaf.
        return adam_transform(
            self,
            grads,
            state,
            params,
            value_at(self.weight_decay, state.step),
            decay_flags(self.mask, params),
            adjust=clipped,
        )
