"""MADGRAD: momentumized, adaptive, dual averaged gradient (Defazio & Jelassi, 2021)."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import (
    ScalarOrSchedule,
    StepValue,
    flag_field,
    hyper,
    learning_rate_field,
    replace,
    step_value,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._tree import abs_sq
from ._sums import copy_params


class MADGRADState(eqx.Module):
    """State of `MADGRAD`; every tree is shaped like params (`None` at non-float
    leaves).

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `grad_sum_sq`: `v`, the weighted sum of squared gradients.
    - `grad_sum`: `s`, the weighted sum of gradients.
    - `params0`: the parameters at `init` (the dual averaging's origin).
    """

    step: Int[Array, ""]
    grad_sum_sq: PyTree[Float[Array, "..."] | None]
    grad_sum: PyTree[Float[Array, "..."] | None]
    params0: PyTree[Float[Array, "..."] | None]


class MADGRAD(AbstractLeafwiseOptimizer):
    r"""MADGRAD (Defazio & Jelassi, 2021, "Adaptivity without Compromise: A
    Momentumized, Adaptive, Dual Averaged Gradient Method for Stochastic
    Optimization"): dual averaging with a cube-root AdaGrad scaling and momentum by
    averaging the iterates.

    For each element, with `k` the number of updates done before this one and
    `lr` the learning rate at `k`:

    $$
    \begin{aligned}
    g &\leftarrow g + \mathrm{weight\_decay} \cdot p
        && \text{(unless \texttt{decouple\_decay})} \\
    \lambda &= (\mathrm{lr} + \epsilon) \sqrt{k + 1} \\
    v &\leftarrow v + \lambda |g|^2 \\
    s &\leftarrow s + \lambda g \\
    z &= p_0 - \frac{s}{v^{1/3} + \epsilon}
        && \text{($s / 0$ read as 0 when $\epsilon = 0$)} \\
    p' &= \mathrm{momentum} \cdot p + (1 - \mathrm{momentum})\, z \\
    &\quad - (\mathrm{lr} + \epsilon)\, \mathrm{weight\_decay} \cdot p
        && \text{(if \texttt{decouple\_decay})}
    \end{aligned}
    $$

    The same as the authors' `madgrad.MADGRAD` (facebookresearch/madgrad) and
    `optax.contrib.madgrad` (which has no `decouple_decay`). Complex leaves
    accumulate `|g|**2`. torch has no equivalent.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module
      (default `1e-2`).
    - `momentum`: the weight of the current iterate in the average, in `[0, 1)`.
    - `weight_decay`: the decay coefficient, `>= 0`.
    - `eps`: added to the cube root and to the learning rate, `>= 0`.
    - `decouple_decay`: decay the parameters directly (AdamW style) instead of
      adding `weight_decay * p` to the gradient.
    """

    # Computed once per step (`step_values`).
    lr: StepValue = step_value()
    lamb: StepValue = step_value()

    reads_params = "dual averaging from the initial parameters"

    learning_rate: ScalarOrSchedule = learning_rate_field(1e-2)
    momentum: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0)
    decouple_decay: bool = flag_field(False)

    state_type = MADGRADState
    moments = (
        Moment("grad_sum_sq", nonnegative=True),
        Moment("grad_sum"),
        Moment("params0"),
    )
    elementwise = True

    def init(self, params: Params) -> MADGRADState:
        state = super().init(params)
        return eqx.tree_at(
            lambda s: s.params0, state, copy_params(params), is_leaf=_is_none
        )

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        h = replace(h, lr=h.learning_rate + h.eps)
        h = replace(h, lamb=h.lr * jnp.sqrt(step.astype(jnp.float32) + 1))
        return h

    def leaf(self, h, t, g, p, grad_sum_sq, grad_sum, p0):
        if not self.decouple_decay:
            g = g + h.weight_decay * p
        grad_sum_sq = jnp.real(grad_sum_sq) + h.lamb * abs_sq(g)
        grad_sum = grad_sum + h.lamb * g
        # The authors' pow(1/3) (optax's cbrt differs by rounding); the native
        # kernels have pow.
        rms = jnp.power(grad_sum_sq, 1 / 3) + h.eps
        # eps = 0 with no gradient yet: the authors read s / 0 as 0.
        rms = jnp.where(rms == 0, jnp.inf, rms)
        z = p0 - grad_sum / rms
        new = h.momentum * p + (1 - h.momentum) * z
        if self.decouple_decay:
            new = new - h.lr * h.weight_decay * p
        return new - p, grad_sum_sq, grad_sum, p0


def _is_none(x: Any) -> bool:
    return x is None
