"""Adan: adaptive Nesterov momentum."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    hyper,
    learning_rate_field,
    mask_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment, ref
from ..._core._schedule import known_range
from ..._core._tree import abs_sq, step_power


def check_adan_eps(eps: Any, eps_root: Any) -> None:
    """Refuses `eps = eps_root = 0` at some step, where known (a number 0 beside
    a number or schedule that reaches 0), shared with `ScaleByAdan`."""
    ranges = known_range(eps), known_range(eps_root)
    if any(r is None for r in ranges):
        return
    (eps_low, eps_high), (root_low, root_high) = ranges  # pyright: ignore
    if (eps_high == 0.0 and root_low == 0.0) or (root_high == 0.0 and eps_low == 0.0):
        raise ValueError(
            "eps and eps_root must not both be 0 (a zero gradient would divide 0 by 0)"
        )


def adan_direction(
    h: Any, t: Int[Array, ""], g: Array, mu: Array, delta: Array, nu: Array, prev: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """Adan's moment updates and direction at update `t` (see `Adan`), shared with
    `ScaleByAdan`: `(direction, mu, delta, nu, prev_grad)`."""
    b1, b2, b3 = h.b1, h.b2, h.b3
    d = jnp.where(t == 1, 0.0, g - prev)  # no previous gradient on the first
    mu = b1 * mu + (1 - b1) * g
    delta = b2 * delta + (1 - b2) * d
    nesterov = g + (1 - b2) * d
    nu = b3 * nu + (1 - b3) * abs_sq(nesterov)
    c1, c2, c3 = (1 - step_power(b, t) for b in (b1, b2, b3))
    r = (mu / c1 + (1 - b2) * (delta / c2)) / (jnp.sqrt(nu / c3 + h.eps_root) + h.eps)
    return r, mu, delta, nu, g


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


class Adan(AbstractLeafwiseOptimizer):
    r"""Adan (Xie et al., 2022), as implemented by `optax.adan`.

    For each leaf, with `t = step + 1`, `lr` the learning rate at `step` and
    `d = g - prev_grad` (`d = 0` on the first update):

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \delta &\leftarrow b_2 \delta + (1 - b_2)\, d \\
    \nu &\leftarrow b_3 \nu + (1 - b_3) \left(g + (1 - b_2)\, d\right)^2 \\
    r &= \frac{\mu / (1 - b_1^t) + (1 - b_2)\, \delta / (1 - b_2^t)}
        {\sqrt{\nu / (1 - b_3^t) + \epsilon_\mathrm{root}} + \epsilon} \\
    p &\leftarrow p - \mathrm{lr} \left(r + \mathrm{weight\_decay} \cdot p\right)
        && \text{(decay only where \texttt{mask})}
    \end{aligned}
    $$

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

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = hyper(0.98, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(0.92, low=0.0, high=1.0, high_open=True)
    b3: ScalarOrSchedule = hyper(0.99, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0)
    eps_root: ScalarOrSchedule = hyper(1e-8, low=0.0)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    mask: MaskLike = mask_field(kw_only=False)

    state_type = AdanState
    moments = (
        Moment("mu"),
        Moment("delta"),
        Moment("nu", nonnegative=True),
        Moment("prev_grad"),
    )
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def __check_init__(self):
        check_adan_eps(self.eps, self.eps_root)

    def leaf(self, h, t, g, p, mu, delta, nu, prev, decayed):
        r, mu, delta, nu, g = adan_direction(h, t, g, mu, delta, nu, prev)
        if decayed:
            r = r + h.weight_decay * p
        return -h.learning_rate * r, mu, delta, nu, g
