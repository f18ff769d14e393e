"""RAdam: Adam with a rectified adaptive learning rate."""

from typing import Any, Protocol, TypeVar

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StepValue,
    flag_field,
    mask_field,
    replace,
    step_value,
    weight_decay_field,
)
from ..._core._moments import ref
from ..._core._tree import abs_sq, increment, step_power
from ._adam_like import (
    AbstractAdamLike,
    ema,
    first_moment_hat,
    nonnegative_field,
)

_SERIES_STEPS = 1024


class _Rectified(Protocol):
    """What `rectification` reads and sets on an optimizer at the step."""

    b2: Any
    threshold: Any
    rectify: Any
    r: Any


_H = TypeVar("_H", bound=_Rectified)


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
    log_b2 = jnp.log(b2)
    tf = t.astype(log_b2.dtype)
    direct = rho_inf - 2 * tf * step_power(b2, t) / (1 - step_power(b2, t))
    i = jnp.arange(_SERIES_STEPS, dtype=log_b2.dtype)
    terms = jnp.exp(i * log_b2) * -jnp.expm1(jnp.maximum(tf - i, 0.0) * log_b2)
    series = 2 * jnp.sum(jnp.where(i < tf, terms, 0.0)) / -jnp.expm1(tf * log_b2) - 1
    return jnp.where(t <= _SERIES_STEPS, series, direct)


def rectification(h: _H, step: Int[Array, ""]) -> _H:
    """`h` (with `b2` and `threshold`) with, for `t = step + 1`, `h.rectify`
    (`rho_t >= threshold`) and the rectification factor `h.r` added: once per
    step, shared by `RAdam` and `ScaleByRadam`."""
    b2, t = h.b2, increment(step)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    rho = rho_t(b2, t)
    h = replace(h, rectify=rho >= h.threshold)
    # Clamped so the unselected branch stays finite while rho_t < 4.
    safe_rho = jnp.where(h.rectify, rho, 5.0)
    r = jnp.sqrt(
        (safe_rho - 4.0)
        * (safe_rho - 2.0)
        * rho_inf
        / ((rho_inf - 4.0) * (rho_inf - 2.0) * safe_rho)
    )
    return replace(h, r=r)


def radam_direction(
    h: Any, g: Array, mu: Array, nu: Array, nesterov: bool
) -> tuple[Array, Array, Array]:
    """RAdam's moment updates and direction (see `RAdam`; `h` from
    `bias_corrections` and `rectification`), shared with `ScaleByRadam`:
    `(direction, mu, nu)`."""
    mu = ema(mu, g, h.b1)
    nu = ema(nu, abs_sq(g), h.b2)
    m_hat = first_moment_hat(mu, g, h, nesterov)
    root = jnp.sqrt(nu / h.bias2 + h.eps_root)
    adaptive = h.r * m_hat / (root + h.eps)
    return jnp.where(h.rectify, adaptive, m_hat), mu, nu


class RAdam(AbstractAdamLike):
    r"""Rectified Adam (Liu et al., 2020).

    For each leaf, with `t = step + 1`, `lr`, `wd` the learning rate and weight decay
    at `step`, $\rho_\infty = 2 / (1 - b_2) - 1$ and
    $\rho_t = \rho_\infty - 2 t\, b_2^t / (1 - b_2^t)$:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    \hat m &= \mu / (1 - b_1^t) \\
    r &= \sqrt{\frac{(\rho_t - 4)(\rho_t - 2)\, \rho_\infty}
        {(\rho_\infty - 4)(\rho_\infty - 2)\, \rho_t}} \\
    u &= \begin{cases}
        \dfrac{r\, \hat m}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
            & \rho_t \ge \mathrm{threshold} \\
        \hat m & \text{otherwise}
    \end{cases} \\
    p &\leftarrow p - \mathrm{lr} \left(u + \mathrm{wd} \cdot p\right)
    \end{aligned}
    $$

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

    # Computed once per step (`step_values`).
    rectify: StepValue = step_value()
    r: StepValue = step_value()

    eps_root: ScalarOrSchedule = nonnegative_field()
    threshold: ScalarOrSchedule = nonnegative_field(5.0)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    nesterov: bool = flag_field(False)

    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return rectification(super().step_values(step), step)

    def direction(self, h, g, mu, nu):
        direction, mu, nu = radam_direction(h, g, mu, nu, self.nesterov)
        return direction, h.learning_rate, mu, nu
