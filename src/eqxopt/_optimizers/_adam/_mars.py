"""MARS: Adam on a variance-reduced gradient (MARS-AdamW)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    hyper,
    mask_field,
    weight_decay_field,
)
from ..._core._moments import Moment, fields_of, ref
from ..._core._tree import abs_sq
from ._adam_like import AbstractAdamOptions, b1_field, b2_field, bias_corrections, ema


class MARSState(eqx.Module):
    """State of `MARS`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment of the corrected gradients, shaped like params.
    - `nu`: second moment of the corrected gradients, shaped like params.
    - `prev_grad`: the gradient of the previous update (zeros before the first),
      shaped like params.

    Every tree has `None` at non-float leaves.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    prev_grad: PyTree[Float[Array, "..."] | None]


class MARS(AbstractAdamOptions):
    r"""MARS-AdamW (Yuan et al., 2024): AdamW on a variance-reduced gradient, the
    gradient plus a scaled difference from the previous one, clipped to norm 1.

    For each leaf, with `t = step + 1`, `lr` and `wd` the learning rate and weight
    decay at `step`, $g'$ the previous update's gradient (zero on the first) and
    $\|c\|$ the Frobenius norm of the whole leaf:

    $$
    \begin{aligned}
    c &= g + \gamma \, \frac{b_1}{1 - b_1} \, (g - g') \\
    c &\leftarrow c / \max(1, \|c\| / \mathrm{clip\_norm})
        && \text{(unless \texttt{clip\_norm=None})} \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, c, \qquad
        \nu \leftarrow b_2 \nu + (1 - b_2)\, c^2 \\
    p &\leftarrow p - \mathrm{lr} \left(
        \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t)} + \epsilon}
        + \mathrm{wd} \cdot p \right) && \text{(decay only where \texttt{mask})}
    \end{aligned}
    $$

    The update of the authors' reference code (`mars.py`, `mars_type="mars-adamw"`,
    its default approximate form that reuses the previous step's gradient) with
    `optimize_1d=True`, MARS on every leaf: the authors' default gives leaves that
    are not matrices AdamW of their own, which `Partition` of `MARS` and `AdamW`
    does. The defaults are the authors'. optax and torch.optim have no MARS.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)` (default `0.95`).
    - `b2`: decay of the second moment, in `(0, 1)` (default `0.99`).
    - `eps`: added to the root of the second moment, `> 0`.
    - `gamma`: the scale of the gradient correction, `>= 0` (`0`: AdamW on the
      clipped gradient).
    - `clip_norm`: the largest norm of a leaf's corrected gradient, `> 0` (the
      authors' `1.0`), or `None`: no clipping.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `mask`: which leaves decay: `None` (all), a tree of bools (or a prefix of
      params), or a function of params returning one.
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in (`None`: the
      parameter's), or a block-wise storage such as `Blockwise8bit()`.
    """

    b1: ScalarOrSchedule = b1_field(0.95)
    b2: ScalarOrSchedule = b2_field(0.99)
    gamma: ScalarOrSchedule = hyper(0.025, low=0.0, kw_only=True)
    clip_norm: ScalarOrSchedule | None = hyper(
        1.0, low=0.0, low_open=True, optional=True, kw_only=True
    )
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()

    state_type = MARSState
    moments = (
        Moment("mu", dtype=fields_of(AbstractAdamOptions).mu_dtype),
        Moment("nu", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True),
        Moment("prev_grad"),
    )
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = False

    def step_values(self, step):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, prev, decayed):
        del t  # the bias corrections are in `h`
        c = g + h.gamma * (h.b1 / (1 - h.b1)) * (g - prev)
        if h.clip_norm is not None:
            norm = jnp.sqrt(jnp.sum(abs_sq(c)))
            c = c / jnp.maximum(1.0, norm / h.clip_norm)
        mu = ema(mu, c, h.b1)
        nu = ema(nu, abs_sq(c), h.b2)
        direction = (mu / h.bias1) / (jnp.sqrt(nu) / jnp.sqrt(h.bias2) + h.eps)
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, mu, nu, g
