"""LaProp: the gradient normalised by its running RMS before the momentum average."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    flag_field,
    mask_field,
    weight_decay_field,
)
from ..._core._moments import Moment, fields_of, ref
from ..._core._tree import abs_sq
from ._adam_like import AbstractAdamOptions, bias_corrections, ema, eps_field

# The authors' code runs this many steps uncentered before it subtracts the mean.
_UNCENTERED_STEPS = 10


class LaPropState(eqx.Module):
    """State of `LaProp`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of the normalised gradients, shaped like params.
    - `nu`: the mean of squared gradients, shaped like params.
    - `mean`: with `centered=True`, the mean of the gradients (decay `b2`), shaped
      like params; else `None`.
    - `nu_max`: with `amsgrad=True`, the running maximum of the (centered) second
      moment, shaped like params; else `None`.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    mean: PyTree[Float[Array, "..."] | None] = None
    nu_max: PyTree[Float[Array, "..."] | None] = None


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

    The authors' two options change what divides the gradient. With `centered`, a
    mean of the gradients $m \leftarrow b_2 m + (1 - b_2)\, g$ is kept, and from
    step 11 on $\nu$ is replaced by $\max(\nu - m^2, 0)$ inside the root (the
    first 10 steps are uncentered, as in that code; the clip at 0 only catches
    rounding). With `amsgrad`, the root takes the running maximum of that value
    instead (`state.nu_max`; with `centered`, kept from step 11 on). The
    published `centered` branch refers to a variable it never defines; this is
    the update its names and the authors' README describe.

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
    - `centered`: divide by the root of the centered second moment (a bool).
    - `amsgrad`: divide by the root of the running maximum of the second moment
      (a bool).
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in (`None`: the
      parameter's), or a block-wise storage such as `Blockwise8bit()`; `mean`
      and `nu_max` are stored in `nu_dtype`.
    """

    eps: ScalarOrSchedule = eps_field(1e-15)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    centered: bool = flag_field(False)
    amsgrad: bool = flag_field(False)

    state_type = LaPropState
    decay_mask = ref(mask)
    elementwise = True

    @property
    def moments(self) -> tuple[Moment, ...]:  # pyright: ignore[reportIncompatibleVariableOverride]
        # `mean` and `nu_max` are in the state only with their options.
        return (
            Moment("mu", dtype=fields_of(AbstractAdamOptions).mu_dtype),
            Moment(
                "nu", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True
            ),
            *(
                (Moment("mean", dtype=fields_of(AbstractAdamOptions).nu_dtype),)
                if self.centered
                else ()
            ),
            *(
                (
                    Moment(
                        "nu_max",
                        dtype=fields_of(AbstractAdamOptions).nu_dtype,
                        nonnegative=True,
                    ),
                )
                if self.amsgrad
                else ()
            ),
        )

    def step_values(self, step):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, *rest):
        *extra, decayed = rest  # `mean`, `nu_max` as the options keep them
        outs = []
        nu = ema(nu, abs_sq(g), h.b2)
        second = nu
        # The uncentered steps at the start, as the authors' code counts them.
        late = t > _UNCENTERED_STEPS
        if self.centered:
            mean = ema(extra.pop(0), g, h.b2)
            second = jnp.where(late, jnp.maximum(nu - abs_sq(mean), 0.0), nu)
            outs.append(mean)
        if self.amsgrad:
            old_max = extra.pop(0)
            nu_max = jnp.maximum(old_max, second)
            if self.centered:  # kept from the first centered step on
                nu_max = jnp.where(late, nu_max, old_max)
                second = jnp.where(late, nu_max, second)
            else:
                second = nu_max
            outs.append(nu_max)
        mu = ema(mu, g / (jnp.sqrt(second / h.bias2) + h.eps), h.b1)
        u = -h.learning_rate * mu / h.bias1
        if decayed:  # the stepped parameter, shrunk
            u = u - h.weight_decay * (p + u)
        return u, mu, nu, *outs
