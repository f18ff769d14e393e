"""LaProp: the gradient normalised by its running RMS before the momentum average."""

import jax.numpy as jnp

from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    mask_field,
    weight_decay_field,
)
from ..._core._moments import Moment
from ..._core._tree import abs_sq
from ._adam_like import AbstractAdamOptions, AdamState, bias_corrections, ema, eps_field


class LaProp(AbstractAdamOptions):
    r"""LaProp (Ziyin et al., 2020): Adam with the division by the second moment's
    root moved inside the momentum average, which separates momentum from
    adaptivity (any `b1 < 1` and `b2 < 1` work together, unlike Adam's
    `b1 <= sqrt(b2)`).

    For each leaf, with `t = step + 1`, `lr` and `wd` the learning rate and weight
    decay at `step`:

    $$
    \begin{aligned}
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\,
        \frac{g}{\sqrt{\nu / (1 - b_2^t)} + \epsilon} \\
    p &\leftarrow \left(p - \mathrm{lr} \, \frac{\mu}{1 - b_1^t}\right)
        (1 - \mathrm{wd}) && \text{(decay only where \texttt{mask})}
    \end{aligned}
    $$

    The bias corrections are the paper's. The weight decay is the authors' reference
    code's (`laprop.py`): the parameter after the step is multiplied by `1 - wd`, not
    scaled by the learning rate (a schedule of the learning rate does not schedule
    it; give `weight_decay` a schedule too). With a constant learning rate this is
    that code's update exactly; it keeps the learning rate inside the momentum
    (weighting each gradient by the learning rate of its step), which differs from
    the paper's form here only while the learning rate changes. optax and
    torch.optim have no LaProp.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the momentum, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0` (default `1e-15`, the
      authors').
    - `weight_decay`: the fraction of each decayed parameter removed per step,
      `>= 0`.
    - `mask`: which leaves decay: `None` (all), a tree of bools (or a prefix of
      params), or a function of params returning one.
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in (`None`: the
      parameter's), or a block-wise storage such as `Blockwise8bit()`.
    """

    eps: ScalarOrSchedule = eps_field(1e-15)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()

    state_type = AdamState
    moments = (
        Moment("mu", dtype="mu_dtype"),
        Moment("nu", dtype="nu_dtype", nonnegative=True),
    )
    decay_mask = "mask"
    elementwise = True

    def step_values(self, step):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, decayed):
        del t  # the bias corrections are in `h`
        nu = ema(nu, abs_sq(g), h.b2)
        mu = ema(mu, g / (jnp.sqrt(nu / h.bias2) + h.eps), h.b1)
        u = -h.learning_rate * mu / h.bias1
        if decayed:  # the stepped parameter, shrunk
            u = u - h.weight_decay * (p + u)
        return u, mu, nu
