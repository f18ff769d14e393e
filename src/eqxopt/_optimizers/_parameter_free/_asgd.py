"""Averaged SGD (Polyak & Juditsky, 1992), as `torch.optim.ASGD`."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import (
    ScalarOrSchedule,
    StepValue,
    hyper,
    learning_rate_field,
    replace,
    step_value,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._tree import is_float_leaf


class ASGDState(eqx.Module):
    """State of `ASGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `ax`: the averaged parameters, shaped like params (`None` at non-float
      leaves; zero until a leaf's first update).
    """

    step: Int[Array, ""]
    ax: PyTree[Float[Array, "..."] | None]


class ASGD(AbstractLeafwiseOptimizer):
    r"""Averaged SGD (Polyak & Juditsky, 1992; the step sizes of Xu, 2011), as
    `torch.optim.ASGD`: SGD with a decaying step size and a shrinkage of the
    parameters, which keeps a running average of its iterates from step `t0` on.

    With `k` the number of updates done before this one and `lr` the learning
    rate at `k`:

    $$
    \begin{aligned}
    \eta &= \mathrm{lr} / (1 + \lambda\, \mathrm{lr}\, k)^\alpha \\
    \mu &= 1 / \max(1, k - t_0) \\
    g &\leftarrow g + \mathrm{weight\_decay} \cdot p \\
    p &\leftarrow p\, (1 - \lambda \eta) - \eta\, g \\
    a &\leftarrow \begin{cases} p & \mu = 1 \\ a + \mu\, (p
        - a) & \text{otherwise} \end{cases}
    \end{aligned}
    $$

    The same as `torch.optim.ASGD` (its step sizes `eta` and `mu`, which torch
    keeps in the state, are functions of the step here; a learning-rate schedule
    enters `eta` at each step). The average is `state.ax`, or
    `eval_params(state, params)`. optax has no equivalent.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module
      (default `1e-2`).
    - `lambd`: the decay term, `>= 0`.
    - `alpha`: the power of the step size's decay, `>= 0`.
    - `t0`: the step from which the average starts, `>= 0`.
    - `weight_decay`: coefficient of `p` added to the gradient (L2), `>= 0`.
    """

    # Computed once per step (`step_values`).
    eta: StepValue = step_value()
    mu: StepValue = step_value()

    reads_params = "average of the parameters"

    learning_rate: ScalarOrSchedule = learning_rate_field(1e-2)
    lambd: ScalarOrSchedule = hyper(1e-4, low=0.0)
    alpha: ScalarOrSchedule = hyper(0.75, low=0.0)
    t0: ScalarOrSchedule = hyper(1e6, low=0.0)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)

    state_type = ASGDState
    moments = (Moment("ax"),)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        k = step.astype(jnp.float32)
        lr = h.learning_rate
        h = replace(h, eta=lr / (1 + h.lambd * lr * k) ** h.alpha)
        h = replace(h, mu=1 / jnp.maximum(1.0, k - h.t0))
        return h

    def leaf(self, h, t, g, p, ax):
        g = g + h.weight_decay * p
        new = p * (1 - h.lambd * h.eta) - h.eta * g
        ax = jnp.where(h.mu == 1, new, ax + h.mu * (new - ax))
        return new - p, ax

    def eval_params(self, state: ASGDState, params: Params) -> Params:
        """The averaged parameters (`state.ax`) where a leaf has one, each in its
        parameter's dtype; the parameters themselves elsewhere and before the
        first update."""

        def pick(p, ax):
            if ax is None or not is_float_leaf(p):
                return p
            return jnp.where(state.step > 0, ax.astype(p.dtype), p)

        return jax.tree.map(pick, params, state.ax, is_leaf=lambda x: x is None)
