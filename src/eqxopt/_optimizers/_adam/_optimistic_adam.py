"""Optimistic Adam: Adam with an optimistic (extrapolated) step, for min-max games."""

from typing import TypeVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    ScalarOrSchedule,
    StepValue,
    flag_field,
    hyper,
    replace,
    step_value,
)
from ..._core._moments import Moment, fields_of
from ._adam_like import (
    AbstractAdamOptions,
    AbstractBiasCorrected,
    adam_direction,
    b1_field,
    b2_field,
    bias_corrections,
    eps_field,
    nonnegative_field,
)

_H = TypeVar("_H", bound=AbstractBiasCorrected)  # an optimizer at the step


class OptimisticAdamState(eqx.Module):
    """State of `OptimisticAdam`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment, shaped like params.
    - `nu`: second moment, shaped like params.
    - `previous`: the previous step's Adam direction `r`, shaped like params
      (stored in `mu_dtype`).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    previous: PyTree[Float[Array, "..."] | None]


class OptimisticAdam(AbstractAdamOptions):
    r"""Optimistic Adam (Daskalakis et al., 2018): Adam's direction extrapolated with
    the previous one, which damps the cycling of plain Adam on saddle-point (GAN,
    min-max) problems.

    For each leaf, with `t = step + 1`, `lr` the learning rate at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    r &= \frac{\hat m}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon} \\
    p &\leftarrow p - \mathrm{lr} \left((\alpha + \beta)\, r
        - \beta\, r_\mathrm{prev}\right)
    \end{aligned}
    $$

    where `m_hat` is the Nesterov first moment (as `Adam(nesterov=True)`; plain
    `mu / (1 - b1**t)` with `nesterov=False`) and `r_prev` the previous step's `r`
    (`r` itself on the first step). The same as `optax.optimistic_adam_v2`; the
    deprecated `optax.optimistic_adam(lr, optimism)` is this with
    `learning_rate=1, alpha=lr, beta=optimism`, and `OptimisticAdamV1` takes its
    arguments. torch.optim has no such optimizer.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `alpha`: weight of the current direction, `>= 0` (default `1`).
    - `beta`: the optimism, weight of the difference to the previous direction,
      `>= 0` (default `1`).
    - `nesterov`: a bool (default `True`, as optax).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    # As optax's: only `learning_rate` by position.
    # Computed once per step (`step_values`).
    first: StepValue = step_value()

    b1: ScalarOrSchedule = b1_field(kw_only=True)
    b2: ScalarOrSchedule = b2_field(kw_only=True)
    eps: ScalarOrSchedule = eps_field(kw_only=True)
    alpha: ScalarOrSchedule = nonnegative_field(1.0)
    beta: ScalarOrSchedule = nonnegative_field(1.0)
    eps_root: ScalarOrSchedule = nonnegative_field()
    nesterov: bool = flag_field(True)

    state_type = OptimisticAdamState
    moments = (
        Moment("mu", dtype=fields_of(AbstractAdamOptions).mu_dtype),
        Moment("nu", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True),
        Moment("previous", dtype=fields_of(AbstractAdamOptions).mu_dtype),
    )
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return _with_first(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, previous):
        del t  # the bias corrections are in `h`
        direction, mu, nu, r = _optimistic(h, g, mu, nu, previous, self.nesterov)
        return -h.learning_rate * direction, mu, nu, r


def _with_first(h: _H, step: Int[Array, ""]) -> _H:
    """`h` with the bias corrections and `h.first`, whether this is the first
    step (which has no previous direction)."""
    h = bias_corrections(h, step)
    h = replace(h, first=step == 0)
    return h


def _optimistic(h, g, mu, nu, previous, nesterov, alpha=None, beta=None):
    """Adam's moments, direction `r` and the optimistic `(alpha + beta) * r - beta *
    r_prev` (`h.alpha`, `h.beta` unless given): `(direction, mu, nu, r)`."""
    alpha = h.alpha if alpha is None else alpha
    beta = h.beta if beta is None else beta
    r, mu, nu, _ = adam_direction(h, g, mu, nu, nesterov)
    previous = jnp.where(h.first, r, previous)  # `r` itself on the first step
    return (alpha + beta) * r - beta * previous, mu, nu, r


class OptimisticAdamV1(AbstractAdamOptions):
    r"""Optimistic Adam in the first form of `optax.optimistic_adam` (deprecated
    there for `optimistic_adam_v2`, which is `OptimisticAdam`): the same rule
    with the learning rate weighting the current direction and the optimism the
    difference to the previous one, each an absolute step size.

    For each leaf, with `t = step + 1`, `lr` and `o` the learning rate and the
    optimism at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    r &= \frac{\hat m}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon} \\
    p &\leftarrow p - \left((\mathrm{lr} + o)\, r - o\, r_\mathrm{prev}\right)
    \end{aligned}
    $$

    with `m_hat` and `r_prev` as for `OptimisticAdam`: this is
    `OptimisticAdam(1.0, alpha=lr, beta=o)`. A schedule for `learning_rate`
    scales the current direction only (optax refuses one); `OptimisticAdam`
    scales both terms. torch.optim has no such optimizer.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `optimism`: `o`, `>= 0`, or a schedule; `None` (default): the learning
      rate, as optax.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `nesterov`: a bool (default `True`, as optax).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    # As optax's `optimistic_adam` after `learning_rate`, but by keyword only:
    # eqxopt keeps `b1, b2, eps` by keyword for the whole optimistic family.
    # Computed once per step (`step_values`).
    first: StepValue = step_value()

    optimism: ScalarOrSchedule | None = hyper(
        None, low=0.0, optional=True, kw_only=True
    )
    b1: ScalarOrSchedule = b1_field(kw_only=True)
    b2: ScalarOrSchedule = b2_field(kw_only=True)
    eps: ScalarOrSchedule = eps_field(kw_only=True)
    eps_root: ScalarOrSchedule = nonnegative_field()
    nesterov: bool = flag_field(True)

    state_type = OptimisticAdamState
    moments = OptimisticAdam.moments
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return _with_first(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, previous):
        del t  # the bias corrections are in `h`
        optimism = h.learning_rate if h.optimism is None else h.optimism
        direction, mu, nu, r = _optimistic(
            h, g, mu, nu, previous, self.nesterov, h.learning_rate, optimism
        )
        return -direction, mu, nu, r
