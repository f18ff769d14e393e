"""Adadelta: steps scaled by the ratio of running RMS of updates and gradients."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    ScalarOrSchedule,
    hyper,
    learning_rate_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._tree import abs_sq


def adadelta_direction(
    h: Any, g: Array, eg: Array, edx: Array
) -> tuple[Array, Array, Array]:
    """Adadelta's averages and step (see `Adadelta`, `h.rho`, `h.eps`), shared with
    `ScaleByAdadelta`: `(delta, avg_sq_grad, avg_sq_delta)`."""
    rho, eps = h.rho, h.eps
    eg = rho * eg + (1 - rho) * abs_sq(g)
    delta = jnp.sqrt(edx + eps) / jnp.sqrt(eg + eps) * g
    edx = rho * edx + (1 - rho) * abs_sq(delta)
    return delta, eg, edx


class AdadeltaState(eqx.Module):
    """State of `Adadelta`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `avg_sq_grad`: running average of squared gradients, `E[g**2]`, shaped like
      params (`None` at non-float leaves).
    - `avg_sq_delta`: running average of squared (unscaled) updates, `E[dx**2]`.
    """

    step: Int[Array, ""]
    avg_sq_grad: PyTree[Float[Array, "..."] | None]
    avg_sq_delta: PyTree[Float[Array, "..."] | None]


class Adadelta(AbstractLeafwiseOptimizer):
    r"""Adadelta (Zeiler, 2012).

    For each leaf, with `lr` the learning rate at the current step:

    $$
    \begin{aligned}
    g &\leftarrow g + \mathrm{weight\_decay} \cdot p && \text{(L2 penalty)} \\
    E_g &\leftarrow \rho\, E_g + (1 - \rho)\, g^2 \\
    \Delta x &= \frac{\sqrt{E_{\Delta x} + \epsilon}}{\sqrt{E_g + \epsilon}}\, g \\
    E_{\Delta x} &\leftarrow \rho\, E_{\Delta x} + (1 - \rho)\, \Delta x^2 \\
    p &\leftarrow p - \mathrm{lr} \cdot \Delta x
    \end{aligned}
    $$

    The same as `optax.adadelta` (with `learning_rate=1.0` for its default
    `None`) and `torch.optim.Adadelta`; both add the weight decay to the gradient
    as here.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module;
      `1.0` (the default) is the method as published.
    - `rho`: decay of both running averages, in `[0, 1)`.
    - `eps`: added inside both roots, `> 0` (with `0` the first step, and so
      every step, would be zero).
    - `weight_decay`: coupled L2 penalty added to the gradient, `>= 0`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    rho: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)

    state_type = AdadeltaState
    moments = (
        Moment("avg_sq_grad", nonnegative=True),
        Moment("avg_sq_delta", nonnegative=True),
    )
    elementwise = True

    def leaf(self, h, t, g, p, eg, edx):
        delta, eg, edx = adadelta_direction(h, g + h.weight_decay * p, eg, edx)
        return -h.learning_rate * delta, eg, edx
