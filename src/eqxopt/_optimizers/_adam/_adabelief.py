"""AdaBelief: Adam with the variance of the gradient around its mean."""

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array

from ..._core._fields import (
    ScalarOrSchedule,
    flag_field,
)
from ..._core._tree import abs_sq
from ._adam_like import (
    AbstractAdamLike,
    ema,
    eps_field,
    first_moment_hat,
    nonnegative_field,
)


def belief_direction(
    h: Any, g: Array, mu: Array, nu: Array, nesterov: bool
) -> tuple[Array, Array, Array]:
    """AdaBelief's moment updates and direction (see `AdaBelief`; `h` from
    `bias_corrections`), shared with `ScaleByBelief`: `(direction, mu, nu)`."""
    mu = ema(mu, g, h.b1)
    nu = ema(nu, abs_sq(g - mu), h.b2) + h.eps_root
    m_hat = first_moment_hat(mu, g, h, nesterov)
    return m_hat / (jnp.sqrt(nu / h.bias2) + h.eps), mu, nu


class AdaBelief(AbstractAdamLike):
    r"""AdaBelief (Zhuang et al., 2020): Adam whose second moment tracks how far each
    gradient is from the running mean (the "belief") rather than its size.

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2) (g - \mu)^2 + \epsilon_\mathrm{root} \\
    p &\leftarrow p - \mathrm{lr} \cdot
        \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t)} + \epsilon}
    \end{aligned}
    $$

    The same as `optax.adabelief`, including its defaults `eps = eps_root = 1e-16`
    (the paper uses `eps = 1e-8`, `eps_root = 0`), and `eps_root` added to the stored
    `nu` at every step. `nesterov=True` uses the Nesterov first moment (see `Adam`).
    torch.optim has no AdaBelief.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`: as for `Adam`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added to the second moment at each step, `>= 0`.
    - `nesterov`: a bool.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    eps: ScalarOrSchedule = eps_field(1e-16)
    eps_root: ScalarOrSchedule = nonnegative_field(1e-16)
    nesterov: bool = flag_field(False)

    elementwise = True

    def direction(self, h, g, mu, nu):
        direction, mu, nu = belief_direction(h, g, mu, nu, self.nesterov)
        return direction, h.learning_rate, mu, nu
