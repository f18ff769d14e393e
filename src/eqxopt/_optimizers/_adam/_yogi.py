"""Yogi: Adam with an additive second-moment update."""

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array

from ..._core._fields import (
    ScalarOrSchedule,
    hyper,
)
from ..._core._moments import Moment, fields_of
from ..._core._tree import abs_sq
from ._adam_like import (
    AbstractAdamLike,
    AbstractAdamOptions,
    ema,
    eps_field,
    nonnegative_field,
)


def yogi_direction(
    h: Any, g: Array, mu: Array, nu: Array
) -> tuple[Array, Array, Array]:
    """Yogi's moment updates and direction (see `Yogi`; `h` from
    `bias_corrections`), shared with `ScaleByYogi`: `(direction, mu, nu)`."""
    mu = ema(mu, g, h.b1)
    g2 = abs_sq(g)
    nu = nu - (1 - h.b2) * jnp.sign(nu - g2) * g2
    v_hat = nu / h.bias2
    return (mu / h.bias1) / (jnp.sqrt(v_hat + h.eps_root) + h.eps), mu, nu


class Yogi(AbstractAdamLike):
    r"""Yogi (Zaheer et al., 2018): the second moment moves towards `g**2` by a step
    of fixed size `(1 - b2) * g**2`, so the effective learning rate cannot jump up
    when gradients shrink.

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`, and
    both moments starting at `initial_accumulator_value`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow \nu - (1 - b_2) \operatorname{sign}(\nu - g^2)\, g^2 \\
    p &\leftarrow p - \mathrm{lr} \cdot
        \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} +
            \epsilon}
    \end{aligned}
    $$

    The same as `optax.yogi` (which bias-corrects both moments, as here; the paper
    does not). torch.optim has no Yogi.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`: as for `Adam`.
    - `eps`: added to the root, `> 0` (default `1e-3`, as in the paper and optax).
    - `eps_root`: added inside the root, `>= 0`.
    - `initial_accumulator_value`: the starting value of both moments, `>= 0`
      (default `1e-6`, as optax).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    eps: ScalarOrSchedule = eps_field(1e-3)
    eps_root: ScalarOrSchedule = nonnegative_field()
    # Not a schedule: it only sets the moments' starting value, at `init`.
    initial_accumulator_value: ScalarOrSchedule = hyper(
        1e-6, low=0.0, schedule=False, kw_only=True
    )

    moments = (  # both start at initial_accumulator_value
        Moment(
            "mu",
            dtype=fields_of(AbstractAdamOptions).mu_dtype,
            fill=initial_accumulator_value,
        ),
        Moment(
            "nu",
            dtype=fields_of(AbstractAdamOptions).nu_dtype,
            nonnegative=True,
            fill=initial_accumulator_value,
        ),
    )
    elementwise = True

    def direction(self, h, g, mu, nu):
        direction, mu, nu = yogi_direction(h, g, mu, nu)
        return direction, h.learning_rate, mu, nu
