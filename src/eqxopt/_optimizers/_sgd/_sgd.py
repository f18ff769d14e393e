"""Stochastic gradient descent with (Nesterov) momentum."""

import functools
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Grads, Params
from ..._core._checks import renames
from ..._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    dtype_field,
    flag_field,
    hyper,
    learning_rate_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer, map_leaves
from ..._core._moments import Moment
from ..._core._schedule import AbstractSchedule, known_number
from ..._core._tree import increment, zero_step


class SGDState(eqx.Module):
    """State of `SGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `velocity`: the momentum buffer, shaped like params (`None` at non-float
      leaves); `None` as a whole for an `SGD` that keeps none (a momentum of
      plain `0`, the default).
    """

    step: Int[Array, ""]
    velocity: PyTree[Float[Array, "..."] | None]


class SGD(AbstractLeafwiseOptimizer):
    r"""Stochastic gradient descent, optionally with heavy-ball or Nesterov momentum.

    For each leaf, with `lr` the learning rate at the current step and `d` the
    dampening:

    $$
    \begin{aligned}
    v &\leftarrow \mathrm{momentum} \cdot v + (1 - d) \cdot g
        && (v \leftarrow g \text{ on the first step}) \\
    p &\leftarrow p - \mathrm{lr} \cdot v && \text{(nesterov=False)} \\
    p &\leftarrow p - \mathrm{lr} \cdot (g + \mathrm{momentum} \cdot v)
        && \text{(nesterov=True)}
    \end{aligned}
    $$

    With `dampening=0` (the default) the first step's `v = g` is the same formula
    from `v = 0`: the same as `optax.sgd`. The same as `torch.optim.SGD` for every
    `dampening`, including that torch starts the buffer at the undamped `g` and that
    `momentum=0` makes `dampening` do nothing.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `momentum`: in `[0, 1)`; `0` gives plain SGD. Given as a plain number `0`
      (the default), no momentum buffer is kept (`state.velocity` is `None`), as
      in `optax.sgd` and `torch.optim.SGD`: the state holds the step count only.
      Given as an array or a schedule, the buffer is kept whatever the value, so
      that a momentum that will change (a new `SGD` with another value, a
      schedule) reuses the compiled step and the state: pass
      `momentum=jnp.asarray(0.0)` to start at 0 and raise it later.
    - `nesterov`: use Nesterov momentum.
    - `dampening`: in `[0, 1]`, the fraction of the gradient left out of the
      momentum buffer after the first step (torch's `dampening`); Nesterov momentum
      needs `0`, as in torch.
    - `velocity_dtype`: dtype to store the momentum buffer in; `None` keeps each
      parameter's dtype (optax's `accumulator_dtype`; `jnp.float32` keeps the
      buffer of bf16 parameters accurate).

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.full(3, 0.5)}
    opt = eqxopt.SGD(learning_rate=0.1, momentum=0.9)
    state = opt.init(params)
    params, state = opt.step(grads, state, params)  # v = 0.5, p = 1 - 0.1 * 0.5
    params, state = opt.step(grads, state, params)  # v = 0.9 * 0.5 + 0.5 = 0.95
    assert jnp.allclose(params["w"], 0.95 - 0.1 * 0.95)
    assert jnp.allclose(state.velocity["w"], 0.95)
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(accumulator_dtype=("velocity_dtype",))

    learning_rate: ScalarOrSchedule = learning_rate_field()
    momentum: ScalarOrSchedule = hyper(0.0, low=0.0, high=1.0, high_open=True)
    nesterov: bool = flag_field(False, kw_only=False)
    velocity_dtype: DTypeLike = dtype_field(storage=True)
    dampening: ScalarOrSchedule = hyper(0.0, low=0.0, high=1.0, kw_only=True)

    # Whether the state keeps a momentum buffer: not for a momentum given as a
    # plain number 0 (set in `__init__`, from the value as given).
    keeps_velocity: bool = eqx.field(static=True, init=False, repr=False)

    state_type = SGDState
    moments = (Moment("velocity", dtype=velocity_dtype),)
    elementwise = True

    def __init__(
        self,
        learning_rate: ScalarOrSchedule,
        momentum: ScalarOrSchedule = 0.0,
        nesterov: bool = False,
        *,
        velocity_dtype: DTypeLike = None,
        dampening: ScalarOrSchedule = 0.0,
    ):
        # The fields' converters check and convert the values after this.
        self.learning_rate, self.momentum, self.nesterov = (
            learning_rate,
            momentum,
            nesterov,
        )
        self.velocity_dtype, self.dampening = velocity_dtype, dampening
        plain_zero = isinstance(momentum, (int, float)) and momentum == 0
        self.keeps_velocity = not plain_zero

    def __check_init__(self):
        # A traced dampening is not known until run time (and is not checked).
        if not self.nesterov:
            return
        if isinstance(self.dampening, AbstractSchedule):
            shown = "a schedule"
        else:
            number = known_number(self.dampening)
            if number is None or number == 0.0:
                return
            shown = repr(number)
        raise ValueError(
            f"nesterov=True needs dampening=0 (as in torch), got dampening={shown}"
        )

    def init(self, params: Params) -> SGDState:
        if self.keeps_velocity:
            return super().init(params)
        return SGDState(step=zero_step(), velocity=None)

    def run(
        self, grads: Grads, state: SGDState, params: Params, *, apply: bool
    ) -> tuple[Any, SGDState]:
        if self.keeps_velocity:
            return super().run(grads, state, params, apply=apply)
        rule = functools.partial(self.plain_leaf, self.step_values(state.step))
        out, _ = map_leaves(rule, grads, params, elementwise=True, apply=apply)
        return out, SGDState(step=increment(state.step), velocity=None)

    def plain_leaf(self, h, g, p):
        # Plain SGD, without a buffer: a momentum of 0 makes `v = g`, with or
        # without Nesterov.
        return (-h.learning_rate * g,)

    def leaf(self, h, t, g, p, v):
        # torch: no dampening where there is no buffer (momentum 0) and the buffer
        # starts at the undamped gradient; with dampening 0 both are today's
        # `momentum * v + g` exactly.
        undamped = (t == 1) | (h.momentum == 0)
        v = h.momentum * v + jnp.where(undamped, g, (1 - h.dampening) * g)
        direction = g + h.momentum * v if self.nesterov else v
        return -h.learning_rate * direction, v
