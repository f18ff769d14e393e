"""Schedule-Free around any base optimizer (Defazio et al., 2024;
`optax.contrib.schedule_free`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    dtype_field,
    hyper,
    learning_rate_field,
    values_at,
)
from .._core._schedule import value_at
from .._core._schedule_free import averaging_weight, eval_params, initial_z, interpolate
from .._core._tree import compute_dtype, default_float, increment, zero_step
from ._wrapper import AbstractSingleWrapper, inner_field, with_own_state


class ScheduleFreeWrapperState(eqx.Module):
    """State of `ScheduleFree`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `z`: the base optimizer's iterate, shaped like params (`None` at non-float
      leaves); the parameters are `y`, and `eval_params` recovers `x` from both.
    - `weight_sum`: scalar, the sum of the averaging weights so far.
    - `max_lr`: scalar, the largest learning rate seen so far.

    Both in the dtype of the learning rate: float32, or float64 under
    `jax_enable_x64`.
    - `inner`: the base optimizer's state.
    """

    step: Int[Array, ""]
    z: PyTree[Float[Array, "..."] | None]
    weight_sum: Float[Array, ""]
    max_lr: Float[Array, ""]
    inner: Any


class ScheduleFree(AbstractSingleWrapper):
    r"""Schedule-Free (Defazio et al., 2024, "The Road Less Scheduled") around any
    base optimizer: `inner`'s updates `u` move the iterate `z`, the parameters `y`
    interpolate between `z` and the running average `x`, and gradients are taken
    at `y`. With `lr` the learning rate at `step`:

    $$
    \begin{aligned}
    z' &= z + u && \text{($u$: inner's update at $y$)} \\
    \mathrm{max\_lr} &\leftarrow \max(\mathrm{max\_lr}, \mathrm{lr}), \quad
        w = \mathrm{max\_lr}^{\mathrm{weight\_lr\_power}} \\
    W &\leftarrow W + w, \quad c = w / W \\
    x &= \left(y - (1 - b_1)\, z\right) / b_1 && \text{(the previous $x$)} \\
    x' &= (1 - c)\, x + c\, z' \\
    y' &= b_1 x' + (1 - b_1)\, z'
    \end{aligned}
    $$

    Evaluate the model at `eval_params(state, params)` (`x`). Turn the base
    optimizer's momentum off (`Adam(lr, b1=0.0)`, `SGD(lr)`): the interpolation
    replaces it. `ScheduleFree(SGD(lr))` is `ScheduleFreeSGD(lr)` and
    `ScheduleFree(AdamW(lr, b1=0.0, weight_decay=wd))` is
    `ScheduleFreeAdamW(lr, weight_decay=wd)`.

    The same as `optax.contrib.schedule_free(inner, learning_rate, b1,
    weight_lr_power)` and `optax.contrib.schedule_free_eval_params`, except that a
    scheduled learning rate is read at `step`, as the base step reads it (optax
    reads the weight's at `step + 1`); with a constant learning rate the two agree.

    **Arguments:**

    - `inner`: the base optimizer (without momentum).
    - `learning_rate`: the learning rate the averaging weights are built from: a
      float `>= 0`, a scalar array or a schedule; `None` (the default) takes
      `inner.learning_rate` (an error if `inner` has none, such as a `Chain`).
    - `b1`: the interpolation between `x` and `z`, in `(0, 1]` (a number, not a
      schedule: `x` is recovered from `y` with the `b1` that built it).
    - `weight_lr_power`: the averaging weight is `max_lr**weight_lr_power`, `>= 0`.
    - `z_dtype`: dtype to store `z` in (`None`: each parameter's dtype).
    """

    reduces_over = "nothing"

    reads_params = "interpolation between the averaged and the fast iterate"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(base_optimizer=("inner",), state_dtype=("z_dtype",))

    inner: AbstractTransform = inner_field()
    learning_rate: ScalarOrSchedule = learning_rate_field(None, optional=True)
    # Not a schedule: `y = b1 * x + (1 - b1) * z`, and `x` is recovered from `y`
    # (at each step, and by `eval_params`) with the `b1` that built it.
    b1: Float[Array, ""] = hyper(0.9, low=0.0, high=1.0, low_open=True, schedule=False)
    weight_lr_power: ScalarOrSchedule = hyper(2.0, low=0.0)
    z_dtype: DTypeLike = dtype_field()

    def __check_init__(self):
        if self.learning_rate is None and (
            getattr(self.inner, "learning_rate", None) is None
        ):
            raise TypeError(
                f"ScheduleFree needs learning_rate=: its inner "
                f"{type(self.inner).__name__} has no learning_rate to build the "
                "averaging weights from"
            )

    def _learning_rate(self) -> Any:
        if self.learning_rate is not None:
            return self.learning_rate
        return getattr(self.inner, "learning_rate", None)

    def init(self, params: Params) -> ScheduleFreeWrapperState:
        return ScheduleFreeWrapperState(
            step=zero_step(),
            z=initial_z(params, self.z_dtype),
            # Statistics of the learning rate: in its dtype (`default_float`).
            weight_sum=jnp.zeros((), default_float()),
            max_lr=jnp.zeros((), default_float()),
            inner=self.inner.init(params),
        )

    def transform(
        self,
        grads: Grads,
        state: ScheduleFreeWrapperState,
        params: Params,
        **extra: Any,
    ) -> tuple[Updates, ScheduleFreeWrapperState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        h = values_at(self, state.step)
        lr = value_at(self._learning_rate(), state.step)
        ck, max_lr, weight_sum = averaging_weight(
            state.max_lr, state.weight_sum, lr, h.weight_lr_power
        )

        def rule(u: Any, y: Any, z: Any) -> tuple[Any, Any]:
            dtype = compute_dtype(y.dtype)
            y_ = y.astype(dtype)
            new_y, z_ = interpolate(y_, z.astype(dtype), u.astype(dtype), h.b1, ck)
            return new_y - y_, z_.astype(z.dtype)

        new_updates, z = with_own_state(rule, updates, params, state.z)
        new_updates = jax.tree.structure(params).unflatten(new_updates)
        return new_updates, ScheduleFreeWrapperState(
            step=increment(state.step),
            z=z,
            weight_sum=weight_sum.astype(state.weight_sum.dtype),
            max_lr=max_lr.astype(state.max_lr.dtype),
            inner=inner_state,
        )

    def eval_params(self, state: ScheduleFreeWrapperState, params: Params) -> Params:
        """The averaged parameters `x = (y - (1 - b1) * z) / b1` at which to evaluate
        the model (as `optax.contrib.schedule_free_eval_params`); non-float leaves
        pass through, each leaf keeps its dtype."""
        return eval_params(params, state.z, self.b1)
