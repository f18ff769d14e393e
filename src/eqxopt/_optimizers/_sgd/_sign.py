"""Sign-based optimizers: SignSGD, Signum and Lion."""

from typing import Any, Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._checks import renames
from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    dtype_field,
    hyper,
    learning_rate_field,
    mask_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment, ref

LionMode = Literal["hard", "smooth", "refined"]
LION_MODES = ("hard", "smooth", "refined")


def lion_direction(
    h: Any, g: Array, mu: Array, mode: LionMode = "hard"
) -> tuple[Array, Array]:
    """Lion's direction and momentum update (see `Lion`), shared with
    `ScaleByLion`: `(direction, mu)`. `mode` is how the interpolation `c` becomes
    the direction: `sign(c)` (`"hard"`, Lion's), `tanh(smooth_beta * c)`
    (`"smooth"`) or `c` clipped to `sign(c)` where `|c| >= 1` (`"refined"`)."""
    c = h.b1 * mu + (1 - h.b1) * g
    if mode == "smooth":
        direction = jnp.tanh(h.smooth_beta * c)
    elif mode == "refined":
        direction = jnp.where(jnp.abs(c) < 1.0, c, jnp.sign(c))
    else:
        direction = jnp.sign(c)
    return direction, h.b2 * mu + (1 - h.b2) * g


class SignSGDState(eqx.Module):
    """State of `SignSGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    """

    step: Int[Array, ""]


class SignSGD(AbstractLeafwiseOptimizer):
    r"""SignSGD (Bernstein et al., 2018): steps of fixed size along the gradient's
    signs.

    For each element, with `lr` the learning rate at the current step:

    $$
    p \leftarrow p - \mathrm{lr} \cdot \operatorname{sign}(g)
    $$

    The same as `optax.sign_sgd` (torch has no equivalent).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()

    state_type = SignSGDState
    moments = ()
    elementwise = True

    def leaf(self, h, t, g, p):
        return (-h.learning_rate * jnp.sign(g),)


class AbstractMomentumState(eqx.Module):
    """The state of a sign method with one moving average: the step count `step`
    and the average `mu` (`SignumState`, `LionState`)."""

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]


class SignumState(AbstractMomentumState):
    """State of `Signum`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: exponential moving average of gradients, shaped like params (`None`
      at non-float leaves).
    """


class Signum(AbstractLeafwiseOptimizer):
    r"""Signum (Bernstein et al., 2018): SignSGD on a moving average of gradients.

    For each element, with `lr` the learning rate at the current step:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta \mu + (1 - \beta)\, g \\
    p &\leftarrow p - \mathrm{lr} \cdot \operatorname{sign}(\mu)
    \end{aligned}
    $$

    The same as `optax.signum` (no bias correction: it would not change the
    sign). torch has no equivalent.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: decay of the moving average, in `[0, 1)`.
    - `mu_dtype`: dtype to store the average in; `None` keeps each parameter's
      dtype (optax's `accumulator_dtype`).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(accumulator_dtype=("mu_dtype",))

    learning_rate: ScalarOrSchedule = learning_rate_field()
    beta: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    mu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = SignumState
    moments = (Moment("mu", dtype=mu_dtype),)
    elementwise = True

    def leaf(self, h, t, g, p, mu):
        mu = h.beta * mu + (1 - h.beta) * g
        return -h.learning_rate * jnp.sign(mu), mu


class LionState(AbstractMomentumState):
    """State of `Lion`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum (moving average of gradients with decay `b2`), shaped
      like params (`None` at non-float leaves).
    """


class Lion(AbstractLeafwiseOptimizer):
    r"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms").

    For each element, with `lr` the learning rate at the current step, `wd` the
    weight decay and $\mu$ the momentum (`state.mu`):

    $$
    \begin{aligned}
    c &= b_1 \mu + (1 - b_1)\, g \\
    p &\leftarrow p - \mathrm{lr}
        \left( \operatorname{sign}(c) + \mathrm{wd} \cdot p \right)
        && \text{(decay only where mask)} \\
    \mu &\leftarrow b_2 \mu + (1 - b_2)\, g
    \end{aligned}
    $$

    The decay uses the parameter from before the update and is multiplied by the
    learning rate, as in `optax.lion` (which this matches) and the paper's code.
    Lion usually wants a learning rate 3-10x smaller than AdamW's and a weight
    decay 3-10x larger.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: interpolation between momentum and gradient for the step, in `[0, 1)`.
    - `b2`: decay of the momentum, in `[0, 1)`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params' structure), or a function of params returning one. An
      Equinox module is always read as a tree of bools, never called.
    - `mu_dtype`: dtype to store the momentum in; `None` keeps each parameter's
      dtype.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.array([1.0, 1.0])}
    grads = {"w": jnp.array([0.3, -0.01])}
    opt = eqxopt.Lion(learning_rate=1e-3, weight_decay=0.0)
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    # every element moves by lr, in the direction of the interpolated sign
    assert jnp.allclose(params["w"], jnp.array([1.0 - 1e-3, 1.0 + 1e-3]))
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(0.99, low=0.0, high=1.0, high_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(1e-3)
    mask: MaskLike = mask_field()
    mu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = LionState
    moments = (Moment("mu", dtype=mu_dtype),)
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def leaf(self, h, t, g, p, mu, decayed):
        direction, mu = lion_direction(h, g, mu)
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, mu
