"""Rprop: per-element step sizes adapted from the signs of successive gradients."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter, is_concrete, reject_complex
from ..._core._leafwise import map_leaves
from ..._core._tree import float_leaves_like, increment, zero_step

# The rule compares the signs of successive gradients: complex numbers have none.
_WHY = "the sign of g * g_prev decides the step; complex numbers have no sign"


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


class Rprop(AbstractTransform):
    """Rprop without weight backtracking (Riedmiller & Braun, 1993; Igel &
    Hüsken's iRprop-).

    For each element, with `q = g * g_prev`:

    ```
    size   = clip(size * (eta_plus if q > 0 else eta_minus if q < 0 else 1),
                  min_step_size, max_step_size)
    g      = 0  where q < 0                  (after a sign flip: no step this time)
    p      = p - size * sign(g)
    g_prev = g
    ```

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

    learning_rate: Float[Array, ""]
    eta_minus: Float[Array, ""]
    eta_plus: Float[Array, ""]
    min_step_size: Float[Array, ""]
    max_step_size: Float[Array, ""]

    def __init__(
        self,
        learning_rate: Any,
        eta_minus: Any = 0.5,
        eta_plus: Any = 1.2,
        min_step_size: Any = 1e-6,
        max_step_size: Any = 50.0,
    ):
        self.learning_rate = hyperparameter(
            "learning_rate", learning_rate, low=0.0, low_open=True
        )
        self.eta_minus = hyperparameter(
            "eta_minus", eta_minus, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.eta_plus = hyperparameter("eta_plus", eta_plus, low=1.0, low_open=True)
        self.min_step_size = hyperparameter("min_step_size", min_step_size, low=0.0)
        self.max_step_size = hyperparameter(
            "max_step_size", max_step_size, low=0.0, low_open=True
        )
        if is_concrete(self.min_step_size) and is_concrete(self.max_step_size):
            if float(self.min_step_size) > float(self.max_step_size):
                raise ValueError(
                    "min_step_size must be <= max_step_size, got "
                    f"min_step_size={float(self.min_step_size)!r} and "
                    f"max_step_size={float(self.max_step_size)!r}"
                )

    def init(self, params: Params) -> RpropState:
        reject_complex(params, "params", "Rprop", _WHY)
        return RpropState(
            step=zero_step(),
            step_sizes=float_leaves_like(params, fill=self.learning_rate),
            prev_grad=float_leaves_like(params),
        )

    def transform(
        self, grads: Grads, state: RpropState, params: Params
    ) -> tuple[Updates, RpropState]:
        reject_complex(params, "params", "Rprop", _WHY)
        eta_minus, eta_plus = self.eta_minus, self.eta_plus
        low, high = self.min_step_size, self.max_step_size

        def rule(g, p, size, prev):
            q = g * prev
            factor = jnp.where(q > 0, eta_plus, jnp.where(q < 0, eta_minus, 1.0))
            size = jnp.clip(size * factor, low, high)
            g = jnp.where(q < 0, 0.0, g)
            return -size * jnp.sign(g), size, g

        updates, (sizes, prev) = map_leaves(
            rule,
            grads,
            params,
            (state.step_sizes, state.prev_grad),
            elementwise=True,
        )
        return updates, RpropState(
            step=increment(state.step), step_sizes=sizes, prev_grad=prev
        )
