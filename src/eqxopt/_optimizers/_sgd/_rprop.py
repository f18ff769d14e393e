"""Rprop: per-element step sizes adapted from the signs of successive gradients."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import ScalarOrSchedule, hyper
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._real import RealOnly
from ..._core._schedule import known_range

# The rule compares the signs of successive gradients: complex numbers have none.
_WHY = "the sign of g * g_prev decides the step; complex numbers have no sign"


def rprop_direction(h, g, size, prev):
    """`(size * sign(g), size, g)` for one leaf: the step (to be subtracted), the
    new step sizes and the new previous gradient, zeroed where the sign flipped
    (`h.eta_minus`, `h.eta_plus`, `h.min_step_size`, `h.max_step_size`). `Rprop`
    and `ScaleByRprop`."""
    q = g * prev
    factor = jnp.where(q > 0, h.eta_plus, jnp.where(q < 0, h.eta_minus, 1.0))
    size = jnp.clip(size * factor, h.min_step_size, h.max_step_size)
    g = jnp.where(q < 0, 0.0, g)
    return size * jnp.sign(g), size, g


def check_step_sizes(owner: Any) -> None:
    """`min_step_size <= max_step_size` at every step, refused where it is known
    to fail: exactly with a number on either side, and with two schedules where
    the least `min_step_size` exceeds the greatest `max_step_size`."""
    low, high = known_range(owner.min_step_size), known_range(owner.max_step_size)
    if low is None or high is None:
        return
    one_constant = low[0] == low[1] or high[0] == high[1]
    if (low[1] > high[0]) if one_constant else (low[0] > high[1]):
        shown = [
            f"{r[0]!r}" if r[0] == r[1] else f"a schedule from {r[0]:.6g} to {r[1]:.6g}"
            for r in (low, high)
        ]
        raise ValueError(
            "min_step_size must be <= max_step_size (at every step), got "
            f"min_step_size={shown[0]} and max_step_size={shown[1]}"
        )


class RpropState(eqx.Module):
    """State of `Rprop`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `step_sizes`: the current step size of every element, shaped like params
      (`None` at non-float leaves); starts at `learning_rate`.
    - `prev_grad`: the previous gradient, zeroed where its sign flipped (so the
      next step neither grows nor shrinks that element's step size).
    """

    step: Int[Array, ""]
    step_sizes: PyTree[Float[Array, "..."] | None]
    prev_grad: PyTree[Float[Array, "..."] | None]


class Rprop(AbstractLeafwiseOptimizer):
    r"""Rprop without weight backtracking (Riedmiller & Braun, 1993; Igel &
    Hüsken's iRprop-).

    For each element, with $q = g \cdot g_\mathrm{prev}$ and $\eta_+$, $\eta_-$ =
    `eta_plus`, `eta_minus`:

    $$
    \begin{aligned}
    f &= \begin{cases} \eta_+ & q > 0 \\ \eta_- & q < 0 \\ 1 & q = 0 \end{cases} \\
    \mathrm{size} &\leftarrow \operatorname{clip}(\mathrm{size} \cdot f,
        \mathrm{min\_step\_size}, \mathrm{max\_step\_size}) \\
    g &\leftarrow 0 \text{ where } q < 0 && \text{(no step after a sign flip)} \\
    p &\leftarrow p - \mathrm{size} \cdot \operatorname{sign}(g) \\
    g_\mathrm{prev} &\leftarrow g
    \end{aligned}
    $$

    The same as `torch.optim.Rprop` (`etas=(eta_minus, eta_plus)`,
    `step_sizes=(min_step_size, max_step_size)`).

    **Differs from optax 0.2.8**: `optax.rprop` returns each step's update one
    call late (its first update is zero, and the update at call `k` is the one
    computed at call `k - 1`, zeroed where the sign flips at `k`; optax pull
    request 1725). eqxopt applies each step when it is computed, as torch and the
    paper do. optax also skips the clipping on steps where `q == 0`, which only
    matters for a `learning_rate` outside `[min_step_size, max_step_size]`.

    **Arguments:**

    - `learning_rate`: the initial step size of every element, `> 0`. It is
      the starting value of the state, not a factor, so it cannot be a schedule.
    - `eta_minus`: step-size factor after a sign flip, in `(0, 1)`.
    - `eta_plus`: step-size factor while the sign holds, `> 1`.
    - `min_step_size`, `max_step_size`: bounds of the step size,
      `0 <= min_step_size <= max_step_size`, `max_step_size > 0`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    # The state's starting step size, used at `init`: not a schedule.
    learning_rate: ScalarOrSchedule = hyper(low=0.0, low_open=True, schedule=False)
    eta_minus: ScalarOrSchedule = hyper(
        0.5, low=0.0, high=1.0, low_open=True, high_open=True
    )
    eta_plus: ScalarOrSchedule = hyper(1.2, low=1.0, low_open=True)
    min_step_size: ScalarOrSchedule = hyper(1e-6, low=0.0)
    max_step_size: ScalarOrSchedule = hyper(50.0, low=0.0, low_open=True)

    real_only = RealOnly(_WHY)

    state_type = RpropState
    moments = (
        Moment("step_sizes", nonnegative=True, fill=learning_rate),
        Moment("prev_grad"),
    )
    elementwise = True

    def __check_init__(self):
        check_step_sizes(self)

    def leaf(self, h, t, g, p, size, prev):
        step, size, g = rprop_direction(h, g, size, prev)
        return -step, size, g
