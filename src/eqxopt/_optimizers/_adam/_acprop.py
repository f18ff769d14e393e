"""ACProp: AdaBelief's centred second moment, used one step late."""

import jax.numpy as jnp
from jaxtyping import Array, Int

from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StepValue,
    mask_field,
    replace,
    step_value,
    weight_decay_field,
)
from ..._core._moments import ref
from ..._core._tree import abs_sq
from ._adam_like import (
    AbstractAdamLike,
    bias_correction,
    ema,
    eps_field,
    nonnegative_field,
)


class ACProp(AbstractAdamLike):
    r"""ACProp (Zhuang et al., 2021, "Momentum Centering and Asynchronous Update for
    Adaptive Gradient Methods"): the gradient divided by AdaBelief's centred second
    moment from *before* this step, so the step size does not depend on the
    current gradient.

    For each leaf, with `s = step` (0 for the first update) and `lr`, `wd` the
    learning rate and weight decay at `step`:

    $$
    \begin{aligned}
    d &= \begin{cases} 1 + \epsilon & s = 0 \\
        \sqrt{\nu / (1 - b_2^s)} + \epsilon & s > 0 \end{cases} \\
    \nu &\leftarrow b_2 \nu + (1 - b_2) (g - \mu)^2 + \epsilon_\mathrm{root} \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    p &\leftarrow p - \mathrm{lr} \left(\frac{g}{d} + \mathrm{wd} \cdot p\right)
    \end{aligned}
    $$

    `d` reads `nu` before it is updated, and the prediction error `g - mu` the
    first moment before it is updated. The same as `optax.contrib.acprop`
    (its argument names, order and defaults). torch.optim has no ACProp.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`: as for `Adam`.
    - `eps`: added to the root, `> 0` (default `1e-16`, as optax).
    - `eps_root`: added to the second moment at each step, `>= 0` (default
      `1e-16`).
    - `weight_decay`: added to the direction as `wd * p` before the learning rate
      (default `0`), a float `>= 0` or a schedule.
    - `mask`: which leaves get weight decay, as for `AdamW`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    # Computed once per step (`step_values`).
    first: StepValue = step_value()
    bias2_previous: StepValue = step_value()

    eps: ScalarOrSchedule = eps_field(1e-16)
    eps_root: ScalarOrSchedule = nonnegative_field(1e-16)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()

    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        # The previous step's bias correction; none before the first step.
        h = replace(h, first=step == 0)
        h = replace(
            h, bias2_previous=jnp.where(h.first, 1.0, bias_correction(h.b2, step))
        )
        return h

    def direction(self, h, g, mu, nu):
        root = jnp.sqrt(jnp.where(h.first, 1.0, nu / h.bias2_previous))
        direction = g / (root + h.eps)
        nu = ema(nu, abs_sq(g - mu), h.b2) + h.eps_root
        mu = ema(mu, g, h.b1)
        return direction, h.learning_rate, mu, nu
