"""Adagrad: steps scaled by the root of the sum of all squared gradients."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    ScalarOrSchedule,
    flag_field,
    hyper,
    learning_rate_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._tree import abs_sq


def rss_direction(
    h: Any, g: Array, s: Array, eps_in_sqrt: bool = True
) -> tuple[Array, Array]:
    """Adagrad's sum and scaled step (see `Adagrad`, `h.eps`), shared with
    `ScaleByRss`: `(u, sum_of_squares)`; 0 where the sum is 0."""
    s = s + abs_sq(g)
    positive = s > 0
    safe = jnp.where(positive, s, 1.0)
    root = jnp.sqrt(safe + h.eps) if eps_in_sqrt else jnp.sqrt(safe) + h.eps
    return jnp.where(positive, g * (1 / root), 0.0), s


class AdagradState(eqx.Module):
    """State of `Adagrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `sum_of_squares`: the accumulated squared gradients, shaped like params
      (`None` at non-float leaves); starts at `initial_accumulator_value`.
    """

    step: Int[Array, ""]
    sum_of_squares: PyTree[Float[Array, "..."] | None]


class Adagrad(AbstractLeafwiseOptimizer):
    r"""Adagrad (Duchi et al., 2011).

    For each leaf, with `lr` the learning rate at the current step:

    $$
    \begin{aligned}
    g &\leftarrow g + \mathrm{weight\_decay} \cdot p
        && \text{(L2 penalty, if \texttt{weight\_decay > 0})} \\
    s &\leftarrow s + g^2
        && \text{($s$ starts at \texttt{initial\_accumulator\_value})} \\
    p &\leftarrow p - \mathrm{lr} \cdot g / \sqrt{s + \epsilon}
        && \text{(\texttt{eps\_in\_sqrt=True}, optax)} \\
    p &\leftarrow p - \mathrm{lr} \cdot g / (\sqrt{s} + \epsilon)
        && \text{(\texttt{eps\_in\_sqrt=False}, torch)}
    \end{aligned}
    $$

    Where `s == 0` (only possible while every gradient so far was zero) the update
    is zero.

    **Conventions.** The defaults are `optax.adagrad`'s: `initial_accumulator_value
    = 0.1`, `eps = 1e-7` inside the root. `torch.optim.Adagrad` starts the sum at 0
    and adds `eps = 1e-10` outside the root: `Adagrad(lr,
    initial_accumulator_value=0.0, eps=1e-10, eps_in_sqrt=False)` matches it (its
    `lr_decay` is a schedule here: pass `learning_rate` as a schedule module).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `initial_accumulator_value`: the starting value of the sum, `>= 0` (a
      number, not a schedule).
    - `eps`: added inside or outside the root (see `eps_in_sqrt`), `>= 0`.
    - `eps_in_sqrt`: where `eps` goes; `True` as optax, `False` as torch.
    - `weight_decay`: coupled L2 penalty added to the gradient before it is
      accumulated (torch's `weight_decay`), `>= 0`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    # The state's starting value: used at `init`, so not a schedule.
    initial_accumulator_value: ScalarOrSchedule = hyper(0.1, low=0.0, schedule=False)
    eps: ScalarOrSchedule = hyper(1e-7, low=0.0)
    eps_in_sqrt: bool = flag_field(True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)

    state_type = AdagradState
    moments = (
        Moment("sum_of_squares", nonnegative=True, fill=initial_accumulator_value),
    )
    elementwise = True

    def leaf(self, h, t, g, p, s):
        u, s = rss_direction(h, g + h.weight_decay * p, s, self.eps_in_sqrt)
        return -h.learning_rate * u, s
