"""ADOPT: Adam with the second moment taken from before the current gradient."""

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..._core._checks import renames
from ..._core._fields import (
    ScalarOrSchedule,
    StepValue,
    flag_field,
    replace,
    step_value,
)
from ..._core._real import RealOnly
from ..._core._tree import abs_sq
from ._adam_like import AbstractAdamLike, b2_field, ema, eps_field


class ADOPT(AbstractAdamLike):
    r"""ADOPT (Taniguchi et al., 2024): normalises the gradient by the second moment
    of the *previous* steps, then averages, so it converges for any `b2`.

    For each leaf, with `s = step` (before the increment) and `lr` the learning rate
    at `s`; on the first step (`s = 0`) `b1` is taken as `1` and `b2` as `0`, so the
    first update is zero and only initialises `nu = g**2`:

    $$
    \begin{aligned}
    x &= g / \max(\sqrt{\nu}, \epsilon) && \text{($\nu$ from the previous step)} \\
    x &\leftarrow \operatorname{clip}(x, -s^{1/4}, s^{1/4})
        && \text{(if \texttt{clip=True})} \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, x \\
    p &\leftarrow p - \mathrm{lr} \cdot \mu && \text{(\texttt{nesterov=False})} \\
    p &\leftarrow p - \mathrm{lr} \left(b_1 \mu + (1 - b_1)\, x\right)
        && \text{(\texttt{nesterov=True})}
    \end{aligned}
    $$

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

    # optax's spellings (`_checks.refuse_renamed`)
    # Computed once per step (`step_values`).
    bound: StepValue = step_value()

    renamed_arguments = renames(use_clipping=("clip",))

    b2: ScalarOrSchedule = b2_field(0.9999)
    eps: ScalarOrSchedule = eps_field(1e-6)
    nesterov: bool = flag_field(False)
    clip: bool = flag_field(True)

    real_only = RealOnly(
        "complex numbers have no order to clip by; clip=False takes them", when="clip"
    )

    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        # The first step only initialises `nu`: `b1` taken as 1 and `b2` as 0.
        first = step == 0
        h = replace(h, b1=jnp.where(first, 1.0, h.b1))
        h = replace(h, b2=jnp.where(first, 0.0, h.b2))
        h = replace(h, bound=step.astype(jnp.float32) ** 0.25)
        return h

    def direction(self, h, g, mu, nu):
        x = g / jnp.maximum(jnp.sqrt(nu), h.eps)
        if self.clip:
            x = jnp.clip(x, -h.bound, h.bound)
        nu = ema(nu, abs_sq(g), h.b2)
        mu = ema(mu, x, h.b1)
        direction = ema(mu, x, h.b1) if self.nesterov else mu
        return direction, h.learning_rate, mu, nu
