"""Schedule-Free SGD and AdamW (Defazio et al., 2024), with their evaluation
parameters."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import float_dtype_or_none, hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import (
    abs_sq,
    compute_dtype,
    float_leaves_like,
    increment,
    is_float_leaf,
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
    - `weight_sum`: float32 scalar, the sum of the averaging weights so far.
    - `max_lr`: float32 scalar, the largest learning rate seen so far.
    """

    step: Int[Array, ""]
    z: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    weight_sum: Float[Array, ""]
    max_lr: Float[Array, ""]


def _z_init(params: Params, dtype: Any) -> PyTree:
    def make(p):
        if not is_float_leaf(p):
            return None
        return jnp.array(p, dtype=p.dtype if dtype is None else dtype, copy=True)

    return jax.tree.map(make, params)


def _eval_params(b1: Array, state: ScheduleFreeState, params: Params) -> Params:
    def x_of(p, z):
        if z is None or not is_float_leaf(p):
            return p
        dtype = compute_dtype(p.dtype)
        y, z = p.astype(dtype), z.astype(dtype)
        return ((y - (1 - b1) * z) / b1).astype(p.dtype)

    return jax.tree.map(x_of, params, state.z, is_leaf=lambda x: x is None)


def _schedule_free_transform(
    opt: "ScheduleFreeSGD | ScheduleFreeAdamW",
    grads: Grads,
    state: ScheduleFreeState,
    params: Params,
    base_rule: Any,
    base_moments: tuple[PyTree, ...],
) -> tuple[Updates, tuple[PyTree, ...], Array, Array]:
    """The shared averaging: `base_rule(g, y, lr, *moments) -> (u, *moments)` is the
    base optimizer's step (the change of `z`)."""
    lr = opt.learning_rate(state.step)
    b1 = opt.b1
    max_lr = jnp.maximum(state.max_lr, lr)
    weight = max_lr**opt.weight_lr_power
    weight_sum = state.weight_sum + weight
    # 0 / 0 (a zero learning rate so far) gives 0: keep x where it is.
    ck = jnp.where(
        jnp.isnan(weight) | jnp.isnan(weight_sum),
        jnp.nan,
        jnp.nan_to_num(weight / weight_sum, nan=0.0, posinf=jnp.inf),
    )

    def rule(g, y, z, *moments):
        u, *moments = base_rule(g, y, lr, *moments)
        x = (y - (1 - b1) * z) / b1
        z = z + u
        x = (1 - ck) * x + ck * z
        new_y = b1 * x + (1 - b1) * z
        return (new_y - y, z, *moments)

    updates, moments = map_leaves(
        rule, grads, params, (state.z, *base_moments), elementwise=True
    )
    return updates, moments, weight_sum, max_lr


def _common_init(
    opt: "ScheduleFreeSGD | ScheduleFreeAdamW",
    learning_rate: Any,
    b1: Any,
    weight_decay: Any,
    weight_lr_power: Any,
    z_dtype: Any,
) -> None:
    opt.learning_rate = as_schedule("learning_rate", learning_rate)
    opt.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, low_open=True)
    opt.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
    opt.weight_lr_power = hyperparameter("weight_lr_power", weight_lr_power, low=0.0)
    opt.z_dtype = float_dtype_or_none("z_dtype", z_dtype)


class ScheduleFreeSGD(AbstractTransform):
    """Schedule-Free SGD (Defazio et al., 2024, "The Road Less Scheduled").

    The parameters the optimizer holds and steps are `y`, where gradients are
    taken; the state holds the SGD iterate `z`; the averaged sequence `x`, at which
    to evaluate the model, is `eval_params(state, params)`. With `lr` the learning
    rate at `step`:

    ```
    z' = z - lr * (g + weight_decay * y)
    max_lr = max(max_lr, lr);  w = max_lr**weight_lr_power;  W = W + w;  c = w / W
    x  = (y - (1 - b1) * z) / b1           (the previous x)
    x' = (1 - c) * x + c * z'
    y' = b1 * x' + (1 - b1) * z'
    ```

    The same as `optax.contrib.schedule_free_sgd`, except that the averaging
    weight uses the same learning rate as the step, `lr(step)` (optax evaluates a
    schedule at `step + 1` for the weight); with a constant learning rate the two
    agree exactly. For a warmup, pass a schedule, e.g.
    `WarmupCosine(peak, peak, warmup_steps, warmup_steps + 1)` (warmup, then
    constant).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: the interpolation between `x` and `z`, in `(0, 1]`.
    - `weight_decay`: L2 decay added to the gradient (at `y`), `>= 0`.
    - `weight_lr_power`: the averaging weight is `max_lr**weight_lr_power`, `>= 0`.
    - `z_dtype`: dtype to store `z` in (`None`: each parameter's dtype).
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    weight_decay: Float[Array, ""]
    weight_lr_power: Float[Array, ""]
    z_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any = 1.0,
        b1: Any = 0.9,
        weight_decay: Any = 0.0,
        weight_lr_power: Any = 2.0,
        *,
        z_dtype: Any = None,
    ):
        _common_init(self, learning_rate, b1, weight_decay, weight_lr_power, z_dtype)

    def init(self, params: Params) -> ScheduleFreeState:
        return ScheduleFreeState(
            step=zero_step(),
            z=_z_init(params, self.z_dtype),
            nu=None,
            weight_sum=jnp.zeros((), jnp.float32),
            max_lr=jnp.zeros((), jnp.float32),
        )

    def transform(
        self, grads: Grads, state: ScheduleFreeState, params: Params
    ) -> tuple[Updates, ScheduleFreeState]:
        wd = self.weight_decay

        def sgd(g, y, lr):
            return (-lr * (g + wd * y),)

        updates, (z,), weight_sum, max_lr = _schedule_free_transform(
            self, grads, state, params, sgd, ()
        )
        return updates, ScheduleFreeState(
            step=increment(state.step),
            z=z,
            nu=None,
            weight_sum=weight_sum.astype(jnp.float32),
            max_lr=max_lr.astype(jnp.float32),
        )

    def eval_params(self, state: ScheduleFreeState, params: Params) -> Params:
        """The averaged parameters `x = (y - (1 - b1) * z) / b1` at which to evaluate
        the model (as `optax.contrib.schedule_free_eval_params`); non-float leaves
        pass through, each leaf keeps its dtype."""
        return _eval_params(self.b1, state, params)


class ScheduleFreeAdamW(AbstractTransform):
    """Schedule-Free AdamW (Defazio et al., 2024, "The Road Less Scheduled").

    As `ScheduleFreeSGD`, with the base step of AdamW without momentum (the
    interpolation `b1` replaces it). With `t = step + 1`:

    ```
    nu = b2 * nu + (1 - b2) * g**2
    z' = z - lr * (g / (sqrt(nu / (1 - b2**t)) + eps) + weight_decay * y)
    ```

    followed by the averaging of `ScheduleFreeSGD`. The same as
    `optax.contrib.schedule_free_adamw` (with the same note on schedules); `eps`
    is outside the root and the decay uses `y`, as there. The reference PyTorch
    implementation instead folds `sqrt(1 - b2**t)` into the learning rate, which
    moves `eps` by that factor.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: the interpolation between `x` and `z`, in `(0, 1]`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay (at `y`), `>= 0`.
    - `weight_lr_power`: the averaging weight is `max_lr**weight_lr_power`, `>= 0`.
    - `z_dtype`: dtype to store `z` in (`None`: each parameter's dtype).
    - `nu_dtype`: dtype to store `nu` in (`None`: each parameter's dtype).
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    weight_decay: Float[Array, ""]
    weight_lr_power: Float[Array, ""]
    z_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any = 0.0025,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        weight_decay: Any = 0.0,
        weight_lr_power: Any = 2.0,
        *,
        z_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        _common_init(self, learning_rate, b1, weight_decay, weight_lr_power, z_dtype)
        self.b2 = hyperparameter(
            "b2", b2, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.nu_dtype = float_dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> ScheduleFreeState:
        return ScheduleFreeState(
            step=zero_step(),
            z=_z_init(params, self.z_dtype),
            nu=float_leaves_like(params, self.nu_dtype),
            weight_sum=jnp.zeros((), jnp.float32),
            max_lr=jnp.zeros((), jnp.float32),
        )

    def transform(
        self, grads: Grads, state: ScheduleFreeState, params: Params
    ) -> tuple[Updates, ScheduleFreeState]:
        t = increment(state.step)
        b2, eps, wd = self.b2, self.eps, self.weight_decay
        bias2 = 1 - b2**t

        def adam(g, y, lr, nu):
            nu = b2 * nu + (1 - b2) * abs_sq(g)
            u = g / (jnp.sqrt(nu / bias2) + eps) + wd * y
            return -lr * u, nu

        updates, (z, nu), weight_sum, max_lr = _schedule_free_transform(
            self, grads, state, params, adam, (state.nu,)
        )
        return updates, ScheduleFreeState(
            step=t,
            z=z,
            nu=nu,
            weight_sum=weight_sum.astype(jnp.float32),
            max_lr=max_lr.astype(jnp.float32),
        )

    def eval_params(self, state: ScheduleFreeState, params: Params) -> Params:
        """The averaged parameters `x = (y - (1 - b1) * z) / b1` at which to evaluate
        the model (as `optax.contrib.schedule_free_eval_params`); non-float leaves
        pass through, each leaf keeps its dtype."""
        return _eval_params(self.b1, state, params)
