"""AdEMAMix: AdamW with a mixture of a fast and a slow momentum; and its simplified
form with one momentum."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    dtype_field,
    learning_rate_field,
    mask_field,
    weight_decay_field,
)
from ..._core._moments import Moment, ref
from ..._core._tree import abs_sq
from ._adam_like import (
    AbstractBiasCorrected,
    b1_field,
    b2_field,
    bias_corrections,
    ema,
    eps_field,
    nonnegative_field,
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


class AdEMAMix(AbstractBiasCorrected):
    r"""AdEMAMix (Pagliardini et al., 2024): AdamW whose numerator mixes a fast and a
    very slow exponential moving average of the gradients.

    For each leaf, with `t = step + 1` and `lr`, `wd`, `alpha`, `b3` the values at
    `step` (each may be a schedule, as the paper warms up `alpha` and `b3`):

    $$
    \begin{aligned}
    m_1 &\leftarrow b_1 m_1 + (1 - b_1)\, g \\
    m_2 &\leftarrow b_3 m_2 + (1 - b_3)\, g && \text{(not bias-corrected)} \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    p &\leftarrow p - \mathrm{lr} \left(
        \frac{m_1 / (1 - b_1^t) + \alpha\, m_2}
            {\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

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

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = b1_field()
    b2: ScalarOrSchedule = b2_field()
    b3: ScalarOrSchedule = b1_field(0.9999)
    alpha: ScalarOrSchedule = nonnegative_field(5.0, kw_only=False)
    eps: ScalarOrSchedule = eps_field()
    eps_root: ScalarOrSchedule = nonnegative_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    mu_dtype: DTypeLike = dtype_field(storage=True)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = AdEMAMixState
    moments = (
        Moment("m1", dtype=mu_dtype),  # both first moments in `mu_dtype`
        Moment("m2", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, m1, m2, nu, decayed):
        del t  # the bias corrections are in `h`
        m1 = ema(m1, g, h.b1)
        m2 = ema(m2, g, h.b3)
        nu = ema(nu, abs_sq(g), h.b2)
        root = jnp.sqrt(nu / h.bias2 + h.eps_root)
        direction = (m1 / h.bias1 + h.alpha * m2) / (root + h.eps)
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, m1, m2, nu


class SimplifiedAdEMAMixState(eqx.Module):
    """State of `SimplifiedAdEMAMix`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum, a sum of past gradients (`b1 * mu + g`, not an
      average), shaped like params.
    - `nu`: the second moment, shaped like params.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class SimplifiedAdEMAMix(AbstractBiasCorrected):
    r"""Simplified AdEMAMix (Morwani et al., 2025, "Connections between
    Schedule-Free Optimizers, AdEMAMix, and Accelerated SGD Variants"): one
    momentum, an undamped sum of gradients, mixed with the current gradient.

    For each leaf, with `t = step + 1` and `lr`, `wd`, `alpha` the values at
    `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    p &\leftarrow p - \mathrm{lr} \left(
        \frac{\mu + \alpha\, g}
            {\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

    With `alpha = 0` this is Adam with a rescaled learning rate and no bias
    correction of the momentum. The same as `optax.contrib.simplified_ademamix`
    (its argument names, order and defaults). torch.optim has none.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the momentum, in `[0, 1)` (default `0.99`).
    - `b2`: decay of the second moment, in `(0, 1)` (default `0.95`).
    - `alpha`: weight of the current gradient, `>= 0` (default `0`), or a
      schedule.
    - `eps`, `eps_root`: as for `Adam`.
    - `weight_decay`: decoupled decay (default `0`), a float `>= 0` or a schedule.
    - `mask`: which leaves get weight decay, as for `AdamW`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = b1_field(0.99)
    b2: ScalarOrSchedule = b2_field(0.95)
    alpha: ScalarOrSchedule = nonnegative_field(0.0, kw_only=False)
    eps: ScalarOrSchedule = eps_field()
    eps_root: ScalarOrSchedule = nonnegative_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    mu_dtype: DTypeLike = dtype_field(storage=True)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = SimplifiedAdEMAMixState
    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, decayed):
        del t  # the bias correction is in `h`
        mu = h.b1 * mu + g
        nu = ema(nu, abs_sq(g), h.b2)
        root = jnp.sqrt(nu / h.bias2 + h.eps_root)
        direction = (mu + h.alpha * g) / (root + h.eps)
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, mu, nu
