"""COCOB-Backprop: learning-rate-free SGD by coin betting (Orabona & Tommasi, 2017)."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    hyper,
    learning_rate_field,
    mask_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment, ref
from ._sums import copy_params


class COCOBState(eqx.Module):
    """State of `COCOB`; every tree is shaped like params (`None` at non-float
    leaves).

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `params0`: the parameters at `init` (the starting point of the bets).
    - `grad_sum`: `C`, minus the sum of the (scaled) gradients.
    - `max_grad`: `L`, the largest `|c|` seen so far (starting at `eps`).
    - `abs_grad_sum`: `G`, the sum of `|c|`.
    - `reward`: `R`, the reward (wealth won so far), `>= 0`.
    """

    step: Int[Array, ""]
    params0: PyTree[Float[Array, "..."] | None]
    grad_sum: PyTree[Float[Array, "..."] | None]
    max_grad: PyTree[Float[Array, "..."] | None]
    abs_grad_sum: PyTree[Float[Array, "..."] | None]
    reward: PyTree[Float[Array, "..."] | None]


class COCOB(AbstractLeafwiseOptimizer):
    r"""COCOB-Backprop (Orabona & Tommasi, 2017, "Training Deep Networks without
    Learning Rates Through Coin Betting", Algorithm 2): each coordinate bets a
    fraction of the wealth it has won on the sign of minus the gradient.

    For each element, with `lr` the learning rate at the current step and `c`
    the scaled gradient:

    $$
    \begin{aligned}
    c &= \mathrm{lr} \cdot (g + \mathrm{weight\_decay} \cdot p)
        && \text{(decay only where \texttt{mask})} \\
    L &\leftarrow \max(L, |c|) && \text{($L$ starts at \texttt{eps})} \\
    G &\leftarrow G + |c| \\
    R &\leftarrow \max\left(R - \operatorname{Re}(\bar c\, (p - p_0)), 0\right) \\
    C &\leftarrow C - c \\
    p &\leftarrow p_0 + \frac{C}{L \max(G + L, \alpha L)}\, (L + R)
    \end{aligned}
    $$

    The same as `optax.contrib.cocob` (the learning rate there too scales the
    gradients, not the step; keep it at `1.0` unless you mean that). Complex
    leaves bet with `|c|` and the real inner product, so a common phase of the
    problem turns the iterates with it. torch has no equivalent.

    **Arguments:**

    - `learning_rate`: a factor on the gradients (a float `>= 0`, a scalar array
      or a schedule module; default `1.0`).
    - `alpha`: bounds the fraction of the wealth bet in the first steps, `> 0`.
    - `eps`: the starting `L`, which keeps the first division finite, `> 0`.
    - `weight_decay`: coefficient of `p` added to the gradient, `>= 0`.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params' structure), or a function of params returning one.
    """

    reads_params = "bets on the change from the initial parameters"

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    alpha: ScalarOrSchedule = hyper(100.0, low=0.0, low_open=True)
    # The state's starting L: used at `init`, so not a schedule.
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, schedule=False)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    mask: MaskLike = mask_field()

    state_type = COCOBState
    moments = (
        Moment("params0"),
        Moment("grad_sum"),
        Moment("max_grad", nonnegative=True, fill=eps),
        Moment("abs_grad_sum", nonnegative=True),
        Moment("reward"),
    )
    decay_mask = ref(mask)
    elementwise = True

    def init(self, params: Params) -> COCOBState:
        state = super().init(params)
        return eqx.tree_at(
            lambda s: s.params0, state, copy_params(params), is_leaf=_is_none
        )

    def leaf(self, h, t, g, p, p0, grad_sum, max_grad, abs_sum, reward, decayed):
        if decayed:
            g = g + h.weight_decay * p
        c = h.learning_rate * g
        if jnp.iscomplexobj(c):
            # L, G and R are real; stored in the leaf's (complex) dtype.
            max_grad, abs_sum, reward = (
                jnp.real(max_grad),
                jnp.real(abs_sum),
                jnp.real(reward),
            )
            bet = jnp.real(jnp.conj(c) * (p - p0))
        else:
            bet = c * (p - p0)
        max_grad = jnp.maximum(max_grad, jnp.abs(c))
        abs_sum = abs_sum + jnp.abs(c)
        reward = jnp.maximum(reward - bet, 0.0)
        grad_sum = grad_sum - c
        fraction = grad_sum / (
            max_grad * jnp.maximum(abs_sum + max_grad, h.alpha * max_grad)
        )
        new_p = p0 + fraction * (max_grad + reward)
        return new_p - p, p0, grad_sum, max_grad, abs_sum, reward


def _is_none(x: Any) -> bool:
    return x is None
