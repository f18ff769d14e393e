"""Adan: adaptive Nesterov momentum."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter, is_concrete
from ..._core._leafwise import map_leaves
from ..._core._masks import Mask, resolve_mask
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step


class AdanState(eqx.Module):
    """State of `Adan`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: moving average of gradients (optax's `m`), shaped like params.
    - `delta`: moving average of gradient differences `g - g_prev` (optax's `v`).
    - `nu`: moving average of the squared Nesterov term (optax's `n`).
    - `prev_grad`: the gradient of the previous update (optax's `g`).

    Every tree is shaped like params, with `None` at non-float leaves.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    delta: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    prev_grad: PyTree[Float[Array, "..."] | None]


class Adan(AbstractTransform):
    """Adan (Xie et al., 2022), as implemented by `optax.adan`.

    For each leaf, with `t = step + 1`, `lr` the learning rate at `step` and
    `d = g - prev_grad` (`d = 0` on the first update):

    ```
    mu    = b1 * mu + (1 - b1) * g
    delta = b2 * delta + (1 - b2) * d
    nu    = b3 * nu + (1 - b3) * (g + (1 - b2) * d)**2
    r     = (mu / (1 - b1**t) + (1 - b2) * delta / (1 - b2**t))
            / (sqrt(nu / (1 - b3**t) + eps_root) + eps)
    p     = p - lr * (r + weight_decay * p)      (decay only where `mask`)
    ```

    The betas are decay rates of the old value (as in Adam and optax's code; the
    paper writes `1 - beta`), and the moments are bias-corrected, as in optax. The
    weight decay is decoupled and linear (optax's form), not the paper's
    proximal `1 / (1 + lr * weight_decay)`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the gradient average, in `[0, 1)`.
    - `b2`: decay of the gradient-difference average, in `[0, 1)`.
    - `b3`: decay of the squared-term average, in `[0, 1)`.
    - `eps`: added to the root, `>= 0`.
    - `eps_root`: added inside the root, `>= 0`; `eps` and `eps_root` may not both
      be 0.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params), or a function of params returning one. An Equinox module is
      read as a tree of bools, never called.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    b3: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    weight_decay: Float[Array, ""]
    mask: Mask

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.98,
        b2: Any = 0.92,
        b3: Any = 0.99,
        eps: Any = 1e-8,
        eps_root: Any = 1e-8,
        weight_decay: Any = 0.0,
        mask: Mask = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter("b2", b2, low=0.0, high=1.0, high_open=True)
        self.b3 = hyperparameter("b3", b3, low=0.0, high=1.0, high_open=True)
        self.eps = hyperparameter("eps", eps, low=0.0)
        self.eps_root = hyperparameter("eps_root", eps_root, low=0.0)
        if _is_zero(self.eps) and _is_zero(self.eps_root):
            raise ValueError(
                "eps and eps_root must not both be 0 (a zero gradient would divide "
                "0 by 0)"
            )
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        self.mask = mask

    def init(self, params: Params) -> AdanState:
        return AdanState(
            step=zero_step(),
            mu=float_leaves_like(params),
            delta=float_leaves_like(params),
            nu=float_leaves_like(params),
            prev_grad=float_leaves_like(params),
        )

    def transform(
        self, grads: Grads, state: AdanState, params: Params
    ) -> tuple[Updates, AdanState]:
        lr = self.learning_rate(state.step)
        b1, b2, b3 = self.b1, self.b2, self.b3
        eps, eps_root, weight_decay = self.eps, self.eps_root, self.weight_decay
        first = state.step == 0
        t = increment(state.step)
        bias1, bias2, bias3 = 1 - b1**t, 1 - b2**t, 1 - b3**t

        def rule(g, p, mu, delta, nu, prev, decay):
            d = jnp.where(first, 0.0, g - prev)
            mu = b1 * mu + (1 - b1) * g
            delta = b2 * delta + (1 - b2) * d
            nesterov = g + (1 - b2) * d
            nu = b3 * nu + (1 - b3) * abs_sq(nesterov)
            r = (mu / bias1 + (1 - b2) * (delta / bias2)) / (
                jnp.sqrt(nu / bias3 + eps_root) + eps
            )
            if decay:
                r = r + weight_decay * p
            return -lr * r, mu, delta, nu, g

        updates, (mu, delta, nu, prev) = map_leaves(
            rule,
            grads,
            params,
            (state.mu, state.delta, state.nu, state.prev_grad),
            elementwise=True,
            flags=resolve_mask(self.mask, params),
        )
        return updates, AdanState(step=t, mu=mu, delta=delta, nu=nu, prev_grad=prev)


def _is_zero(x: Array) -> bool:
    return is_concrete(x) and float(x) == 0.0
