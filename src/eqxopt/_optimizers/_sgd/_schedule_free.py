"""Schedule-Free SGD and AdamW (Defazio et al., 2024), with their evaluation
parameters."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Grads, Params, Updates
from ..._core._checks import renames
from ..._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    dtype_field,
    hyper,
    learning_rate_field,
    values_at,
    weight_decay_field,
)
from ..._core._leafwise import AbstractEngineTransform, map_leaves
from ..._core._moments import Moment, moment_like
from ..._core._schedule import value_at
from ..._core._schedule_free import (
    averaging_weight,
    eval_params,
    initial_z,
    interpolate,
)
from ..._core._tree import (
    abs_sq,
    default_float,
    increment,
    step_power,
    zero_step,
)


class ScheduleFreeState(eqx.Module):
    """State of `ScheduleFreeSGD` and `ScheduleFreeAdamW`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `z`: the base optimizer's iterate `z`, shaped like params (`None` at
      non-float leaves). The parameters the optimizer steps are `y`; the
      evaluation parameters `x` are recovered from `y` and `z` by `eval_params`.
    - `nu`: `ScheduleFreeAdamW`'s second moment, shaped like params;
      `None` for `ScheduleFreeSGD`.
    - `weight_sum`: scalar, the sum of the averaging weights so far.
    - `max_lr`: scalar, the largest learning rate seen so far.

    Both in the dtype of the learning rate: float32, or float64 under
    `jax_enable_x64`.
    """

    step: Int[Array, ""]
    z: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    weight_sum: Float[Array, ""]
    max_lr: Float[Array, ""]


class AbstractScheduleFree(AbstractEngineTransform):
    """The schedule-free averaging around a base optimizer's step (the change of
    `z`), shared by `ScheduleFreeSGD` and `ScheduleFreeAdamW`: a final subclass
    declares the fields below and its base step, `base`."""

    reads_params = "interpolation between the averaged and the fast iterate"

    learning_rate: eqx.AbstractVar[ScalarOrSchedule]
    b1: eqx.AbstractVar[ScalarOrSchedule]
    weight_decay: eqx.AbstractVar[ScalarOrSchedule]
    weight_lr_power: eqx.AbstractVar[ScalarOrSchedule]
    z_dtype: eqx.AbstractVar[DTypeLike]
    # The base step at one leaf, `base(h, t, g, y, *nu) -> (u, *nu)`: `z` moves by
    # `u`; `h` holds the hyperparameters at this step, `t` is the step count after.
    base: eqx.AbstractClassVar[Callable[..., tuple[Array, ...]]]

    @abc.abstractmethod
    def nu_init(self, params: Params) -> PyTree:
        """The state's `nu` (`None` for a base step without one)."""

    def init(self, params: Params) -> ScheduleFreeState:
        return ScheduleFreeState(
            step=zero_step(),
            z=initial_z(params, self.z_dtype),
            nu=self.nu_init(params),
            # Statistics of the learning rate: in its dtype (`default_float`).
            weight_sum=jnp.zeros((), default_float()),
            max_lr=jnp.zeros((), default_float()),
        )

    def run(
        self, grads: Grads, state: ScheduleFreeState, params: Params, *, apply: bool
    ) -> tuple[Updates, ScheduleFreeState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        ck, max_lr, weight_sum = averaging_weight(
            state.max_lr, state.weight_sum, h.learning_rate, h.weight_lr_power
        )

        def rule(g, y, z, *nu):
            u, *nu = self.base(h, t, g, y, *nu)
            new_y, z = interpolate(y, z, u, h.b1, ck)
            return (new_y - y, z, *nu)

        nu = () if state.nu is None else (state.nu,)
        updates, (z, *nu) = map_leaves(
            rule, grads, params, (state.z, *nu), elementwise=True, apply=apply
        )
        return updates, ScheduleFreeState(
            step=t,
            z=z,
            nu=nu[0] if nu else None,
            weight_sum=weight_sum.astype(state.weight_sum.dtype),
            max_lr=max_lr.astype(state.max_lr.dtype),
        )

    def eval_params(self, state: ScheduleFreeState, params: Params) -> Params:
        """The averaged parameters `x = (y - (1 - b1) * z) / b1` at which to evaluate
        the model (as `optax.contrib.schedule_free_eval_params`); non-float leaves
        pass through, each leaf keeps its dtype."""
        return eval_params(params, state.z, value_at(self.b1, state.step))


# optax's `warmup_steps` wraps the learning rate in a linear warmup from 0.
_WARMUP_AS_SCHEDULE = (
    "pass the warmup as the learning rate: "
    "learning_rate=eqxopt.WarmupConstant(0.0, lr, warmup_steps)"
)


class ScheduleFreeSGD(AbstractScheduleFree):
    r"""Schedule-Free SGD (Defazio et al., 2024, "The Road Less Scheduled").

    The parameters the optimizer holds and steps are `y`, where gradients are
    taken; the state holds the SGD iterate `z`; the averaged sequence `x`, at which
    to evaluate the model, is `eval_params(state, params)`. With `lr` the learning
    rate at `step`:

    $$
    \begin{aligned}
    z' &= z - \mathrm{lr} \cdot (g + \mathrm{weight\_decay} \cdot y) \\
    \mathrm{max\_lr} &\leftarrow \max(\mathrm{max\_lr}, \mathrm{lr}), \quad
        w = \mathrm{max\_lr}^{\mathrm{weight\_lr\_power}} \\
    W &\leftarrow W + w, \quad c = w / W \\
    x &= \left(y - (1 - b_1)\, z\right) / b_1 && \text{(the previous $x$)} \\
    x' &= (1 - c)\, x + c\, z' \\
    y' &= b_1 x' + (1 - b_1)\, z'
    \end{aligned}
    $$

    The same as `optax.contrib.schedule_free_sgd`, except that the averaging
    weight uses the same learning rate as the step, `lr(step)` (optax evaluates a
    schedule at `step + 1` for the weight); with a constant learning rate the two
    agree exactly. For a warmup, pass a schedule, e.g.
    `WarmupCosine(peak, peak, warmup_steps, warmup_steps + 1)` (warmup, then
    constant).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: the interpolation between `x` and `z`, in `(0, 1]` (a number, not a
      schedule: `x` is recovered from `y` with the `b1` that built it).
    - `weight_decay`: L2 decay added to the gradient (at `y`), `>= 0`.
    - `weight_lr_power`: the averaging weight is `max_lr**weight_lr_power`, `>= 0`.
    - `z_dtype`: dtype to store `z` in (`None`: each parameter's dtype).
    """

    reduces_over = "nothing"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(
        state_dtype=("z_dtype",), warmup_steps=_WARMUP_AS_SCHEDULE
    )

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    # Not a schedule: `y = b1 * x + (1 - b1) * z`, and `x` is recovered from `y`
    # (at each step, and by `eval_params`) with the `b1` that built it.
    b1: ScalarOrSchedule = hyper(
        0.9, low=0.0, high=1.0, low_open=True, schedule=False, kw_only=True
    )
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_lr_power: ScalarOrSchedule = hyper(2.0, low=0.0, kw_only=True)
    z_dtype: DTypeLike = dtype_field()  # z is not a moment

    def nu_init(self, params: Params) -> None:
        return None

    def base(self, h, t, g, y):
        return (-h.learning_rate * (g + h.weight_decay * y),)


class ScheduleFreeAdamW(AbstractScheduleFree):
    r"""Schedule-Free AdamW (Defazio et al., 2024, "The Road Less Scheduled").

    As `ScheduleFreeSGD`, with the base step of AdamW without momentum (the
    interpolation `b1` replaces it). With `t = step + 1`:

    $$
    \begin{aligned}
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    z' &= z - \mathrm{lr} \left(\frac{g}{\sqrt{\nu / (1 - b_2^t)} + \epsilon}
        + \mathrm{weight\_decay} \cdot y\right)
    \end{aligned}
    $$

    followed by the averaging of `ScheduleFreeSGD`. The same as
    `optax.contrib.schedule_free_adamw` (with the same note on schedules); `eps`
    is outside the root and the decay uses `y`, as there. The reference PyTorch
    implementation instead folds `sqrt(1 - b2**t)` into the learning rate, which
    moves `eps` by that factor.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: the interpolation between `x` and `z`, in `(0, 1]` (a number, not a
      schedule: `x` is recovered from `y` with the `b1` that built it).
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay (at `y`), `>= 0`.
    - `weight_lr_power`: the averaging weight is `max_lr**weight_lr_power`, `>= 0`.
    - `z_dtype`: dtype to store `z` in (`None`: each parameter's dtype).
    - `nu_dtype`: dtype to store `nu` in (`None`: each parameter's dtype).
    """

    reduces_over = "nothing"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(
        state_dtype=("z_dtype",), warmup_steps=_WARMUP_AS_SCHEDULE
    )

    learning_rate: ScalarOrSchedule = learning_rate_field(0.0025)
    # Not a schedule: `y = b1 * x + (1 - b1) * z`, and `x` is recovered from `y`
    # (at each step, and by `eval_params`) with the `b1` that built it.
    b1: ScalarOrSchedule = hyper(
        0.9, low=0.0, high=1.0, low_open=True, schedule=False, kw_only=True
    )
    b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_lr_power: ScalarOrSchedule = hyper(2.0, low=0.0, kw_only=True)
    z_dtype: DTypeLike = dtype_field()  # z is not a moment
    nu_dtype: DTypeLike = dtype_field(storage=True)

    moments = (Moment("nu", dtype=nu_dtype, nonnegative=True),)

    def nu_init(self, params: Params) -> PyTree:
        return moment_like(self, params, "nu")

    def base(self, h, t, g, y, nu):
        nu = h.b2 * nu + (1 - h.b2) * abs_sq(g)
        u = g / (jnp.sqrt(nu / (1 - step_power(h.b2, t))) + h.eps) + h.weight_decay * y
        return -h.learning_rate * u, nu
