"""Optimistic gradient descent (extrapolation from the previous gradient)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import ScalarOrSchedule, hyper, learning_rate_field
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment


def optimistic_direction(h, t, g, prev):
    """`((alpha + beta) g - beta g_prev, g)`: the optimistic direction of one leaf
    and the new previous gradient (`h.alpha`, `h.beta`; `t` the step count after
    this update). `OptimisticGradientDescent` and `ScaleByOptimisticGradient`."""
    prev = jnp.where(t == 1, g, prev)  # the first step: no previous gradient
    return (h.alpha + h.beta) * g - h.beta * prev, g


class OptimisticGradientDescentState(eqx.Module):
    """State of `OptimisticGradientDescent`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `prev_grad`: the previous gradient, shaped like params (`None` at
      non-float leaves).
    """

    step: Int[Array, ""]
    prev_grad: PyTree[Float[Array, "..."] | None]


class OptimisticGradientDescent(AbstractLeafwiseOptimizer):
    r"""Optimistic gradient descent (Mokhtari et al., 2019), the generalised form.

    For each leaf, with `lr` the learning rate at the current step:

    $$
    p \leftarrow p - \mathrm{lr} \left((\alpha + \beta)\, g
        - \beta\, g_\mathrm{prev}\right)
    $$

    where `g_prev` is the previous step's gradient, and the current gradient on
    the first step (so the first step is plain gradient descent with rate `lr *
    alpha`). With `alpha = beta = 1` this is `p - lr * (2 g - g_prev)`, the
    classic optimistic step for min-max games. The same as
    `optax.optimistic_gradient_descent` (torch has no equivalent). As there,
    "first step" is global: a leaf that had no gradient on step 0 extrapolates
    from a zero previous gradient when it first gets one.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `alpha`: weight of the current gradient, `>= 0`.
    - `beta`: weight of the extrapolation (negative momentum), `>= 0`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    alpha: ScalarOrSchedule = hyper(1.0, low=0.0)
    beta: ScalarOrSchedule = hyper(1.0, low=0.0)

    state_type = OptimisticGradientDescentState
    moments = (Moment("prev_grad"),)
    elementwise = True

    def leaf(self, h, t, g, p, prev):
        direction, prev = optimistic_direction(h, t, g, prev)
        return -h.learning_rate * direction, prev
