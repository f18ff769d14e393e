"""C-AdamW: cautious AdamW, which drops update coordinates that disagree with the
current gradient."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._schedule import AbstractSchedule, as_schedule
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


class CAdamW(AbstractTransform):
    """Cautious AdamW (C-AdamW; Liang et al., 2024, "Cautious Optimizers").

    AdamW, except that each coordinate of the Adam direction whose sign disagrees
    with the current gradient is set to zero, and the rest are scaled up so the
    step keeps its size. Per leaf (tensor) `P` with `d` elements, with `t = step + 1`
    and `lr`, `wd` the learning rate and weight decay at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    u  = (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    phi = 1 where u * g > 0, else 0
    p  = p - lr * (u * phi * d / (sum(phi) + 1) + wd * p)
    ```

    This is Algorithm 1 of the paper as the authors' code (`kyleliang919/C-Optim`,
    `c_adamw.py`) implements it: the paper writes `u * g >= 0`, the code `> 0`
    (coordinates with a zero product are dropped here too), and the `+ 1` keeps the
    scale finite when every coordinate is dropped (so a 1-element leaf moves half as
    far as AdamW would move it). The decay uses the parameter from before the update
    (the authors' code, derived from an older Hugging Face AdamW, decays the updated
    parameter: a difference of order `lr**2 * wd`). Neither optax nor torch.optim
    has this optimizer.

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
        def cautious(g, mu, v_hat, u, lr):
            agree = (jnp.real(mu * jnp.conj(g)) > 0).astype(u.real.dtype)
            scale = agree.size / (jnp.sum(agree) + 1)
            return u * agree * scale, lr

        # Not elementwise: the rescaling counts the agreeing coordinates per leaf.
        return adam_transform(
            self,
            grads,
            state,
            params,
            value_at(self.weight_decay, state.step),
            decay_flags(self.mask, params),
            adjust=cautious,
        )
